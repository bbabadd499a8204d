package sqlite

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// readSamples alternate every optional part of a record — headers,
// properties, publisher, bridge, retain, each QoS, a zero timestamp — so a
// page that reuses one scan target for all its rows would hand a field of
// one record to the next; and their text holds what the JSON columns
// escape or keep raw.
func readSamples() []storage.Record {
	format, expiry := byte(1), uint32(3600)
	zeroFormat, zeroExpiry := byte(0), uint32(0)
	return []storage.Record{
		{MessageID: "m1", Topic: "a/b", Timestamp: storagetest.Base, Payload: []byte("one"), QoS: 1,
			Headers:     []storage.Header{{Name: "source", Value: "sensor-7"}, {Name: "unit", Value: "celsius"}},
			ContentType: "text/plain", ResponseTopic: "r/1", CorrelationData: []byte{0xde, 0xad, 0, 0xbe, 0xef},
			PayloadFormat: &format, MessageExpiry: &expiry, Retain: true, PublisherID: "client-1", Bridge: "uplink"},
		{MessageID: "m2", Topic: "a/c", Payload: []byte{}, QoS: 0},
		{MessageID: "m3", Topic: "a/d", Timestamp: storagetest.Base.Add(time.Second), Payload: make([]byte, 128), QoS: 2,
			Headers: []storage.Header{{Name: `quote"back\slash`, Value: "<tag>&amp;\u2028\u2029"},
				{Name: "ctl\x00\x01\n\t\x1f\x7f", Value: "é€😀\ufffd"}, {Name: "", Value: ""}, {Name: "dup", Value: "1"}, {Name: "dup", Value: "1"}},
			PublisherID: "client-2"},
		{MessageID: "m4", Topic: "a/e", Payload: []byte("four"), QoS: 1, Retain: true, Bridge: "b2",
			CorrelationData: []byte{}, PayloadFormat: &zeroFormat, MessageExpiry: &zeroExpiry},
		{MessageID: "m5", Topic: "a/f", Payload: []byte("five"), QoS: 0, Retain: true, Headers: []storage.Header{},
			ContentType: `a "quoted" type \ with/slash`},
		{MessageID: "m6", Topic: "a/g", Payload: []byte("six"), QoS: 2},
	}
}

// TestReadRoundTripsEveryField reads the samples back in pages of 1, 2,
// 4 and 256, from the read pool and on the writer, and compares every
// field.
func TestReadRoundTripsEveryField(t *testing.T) {
	for _, reads := range []int{DefaultReadConnections, 0} {
		p := openAt(t, newDB(t), func(o *Options) { o.ReadConnections = reads })
		l := mustLog(t, p, "events")
		want := readSamples()
		for i, r := range want {
			got, err := l.Append(r)
			if err != nil {
				t.Fatalf("Append %s: %v", r.MessageID, err)
			}
			want[i].Offset = got.Offset
		}
		for _, page := range []int{1, 2, 4, 256} {
			var got []storage.Record
			for from := uint64(1); ; {
				recs, floor, err := l.Read(from, page)
				if err != nil {
					t.Fatalf("read_connections %d: Read(%d, %d): %v", reads, from, page, err)
				}
				if floor != 1 || len(recs) > page {
					t.Fatalf("read_connections %d: Read(%d, %d): %d records, floor %d", reads, from, page, len(recs), floor)
				}
				if len(recs) == 0 {
					break
				}
				got = append(got, recs...)
				from = recs[len(recs)-1].Offset + 1
			}
			if len(got) != len(want) {
				t.Fatalf("read_connections %d, page %d: %d records, want %d", reads, page, len(got), len(want))
			}
			for i := range want {
				if d := storagetest.RecordDiff(want[i], got[i]); d != "" {
					t.Errorf("read_connections %d, page %d, %s: %s", reads, page, want[i].MessageID, d)
				}
			}
		}
	}
}

// TestReadRefusesDamagedRows: a row this provider would never write — a
// QoS no publish has, headers or properties that are not the JSON it
// writes, correlation data that is not base64 — fails the Read that meets
// it, naming its offset, and is never half-decoded into a record.
func TestReadRefusesDamagedRows(t *testing.T) {
	cases := []struct {
		name, set, want string
	}{
		{"qos 3", `qos = 3`, "qos outside 0–2"},
		{"negative qos", `qos = -1`, "qos outside 0–2"},
		{"huge qos", `qos = 9223372036854775807`, "qos outside 0–2"},
		{"headers not JSON", `headers = '[["a","b"]'`, "headers"},
		{"headers not pairs", `headers = '{"a":"b"}'`, "headers"},
		{"props not JSON", `props = '{"content_type":'`, "publish properties"},
		{"props wrong type", `props = '{"payload_format":"1"}'`, "publish properties"},
		{"payload format overflows", `props = '{"payload_format":256}'`, "publish properties"},
		{"correlation not base64", `props = '{"correlation_data":"***"}'`, "correlation data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := newDB(t)
			o := testOptions(path)
			p, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			l := mustLog(t, p, "events")
			for i := range 3 {
				if _, err := l.Append(record(string(rune('a'+i)), 8)); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = db.Exec(`UPDATE records SET ` + c.set + ` WHERE "offset" = 2`)
			if cerr := db.Close(); err != nil || cerr != nil {
				t.Fatalf("damage row 2: %v, %v", err, cerr)
			}

			p = openAt(t, path, nil)
			l = mustLog(t, p, "events")
			if recs, _, err := l.Read(1, 1); err != nil || len(recs) != 1 {
				t.Fatalf("Read(1, 1) before the damaged row: %d records, %v", len(recs), err)
			}
			recs, _, err := l.Read(1, 10)
			if err == nil || !strings.Contains(err.Error(), "offset 2") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Read over the damaged row: %d records, error %v; want one naming offset 2 and %q", len(recs), err, c.want)
			}
			if recs != nil {
				t.Fatalf("Read over the damaged row returned %d records with its error", len(recs))
			}
		})
	}
}

// A read that finds a page which is not SQLite's (the chaos finding of
// Step 8: SQLITE_NOTADB on a read connection after a power cut) leaves one
// line saying what the files looked like; any other read error leaves none.
func TestDamagedPageReadIsDescribedOnce(t *testing.T) {
	var logged bytes.Buffer
	p := openAt(t, newDB(t), func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logged, nil)) })

	garbage := filepath.Join(t.TempDir(), "garbage.db")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not sqlite "), 600), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", garbage)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	notADB := db.QueryRow(`SELECT count(*) FROM sqlite_master`).Scan(&n)
	if notADB == nil || !strings.Contains(notADB.Error(), "(26)") {
		t.Fatalf("reading a garbage file: %v, want SQLITE_NOTADB (26)", notADB)
	}

	logged.Reset() // the provider's "storage opened" line
	p.noteDamagedRead(errors.New("some other failure"))
	p.noteDamagedRead(fmt.Errorf("storage test: read events: %w", storage.ErrNotFound))
	if logged.Len() != 0 {
		t.Fatalf("a read error that is not a damaged page was described: %s", logged.String())
	}
	p.noteDamagedRead(fmt.Errorf("storage test: read events: read bounds: %w", notADB))
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line, got %d: %s", len(lines), logged.String())
	}
	for _, want := range []string{"level=ERROR", "not a database page", "code=26", "db_bytes=", "wal_bytes=", "shm_bytes=", "read_connections_open="} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %q lacks %q", lines[0], want)
		}
	}
	if strings.Contains(lines[0], "db_bytes=-1") {
		t.Errorf("the open provider's database was not found by stat: %s", lines[0])
	}
}
