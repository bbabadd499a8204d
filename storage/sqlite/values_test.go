package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"saguin.dev/storage"
)

func mustValues(t testing.TB, p *Provider, name string) storage.ValueStore {
	t.Helper()
	v, err := p.Values(name)
	if err != nil {
		t.Fatalf("Values(%q): %v", name, err)
	}
	return v
}

func valueRec(topic string, n int) storage.Record {
	r := record(topic, n)
	r.Topic = topic
	return r
}

// TestValuesOnDisk checks what an operator reads with sqlite3: a channels
// row of kind latest carrying the store's next, one latest_values row per
// topic with the record columns and its offset, the replaced row gone;
// and that the keys refuse what a Put must never do — a second row for a
// topic, or an offset used twice (invariant 9) — rather than replacing.
func TestValuesOnDisk(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	v := mustValues(t, p, "$saguin/retained")
	for _, r := range []storage.Record{valueRec("a", 3), valueRec("b", 4), valueRec("a", 5)} {
		if _, err := v.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := v.Remove("b"); !ok || err != nil {
		t.Fatalf("Remove(b) = %v, %v", ok, err)
	}
	db := rawDB(t, path)
	var kind string
	var next, floor, bytes int64
	if err := db.QueryRow(`SELECT kind, next, floor, bytes FROM channels WHERE name = '$saguin/retained'`).Scan(&kind, &next, &floor, &bytes); err != nil {
		t.Fatal(err)
	}
	if kind != "latest" || next != 4 || floor != 1 || bytes != 0 {
		t.Fatalf("channels row kind %s next %d floor %d bytes %d; want latest, 4, 1, 0 (value bytes are summed at open)", kind, next, floor, bytes)
	}
	rows, err := db.Query(`SELECT topic, "offset", message_id, size FROM latest_values ORDER BY topic`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var topic, id string
		var off, size int64
		if err := rows.Scan(&topic, &off, &id, &size); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s@%d:%s:%d", topic, off, id, size))
	}
	rows.Close()
	a := valueRec("a", 5)
	want := fmt.Sprintf("a@3:a:%d", a.Size())
	if strings.Join(got, " ") != want {
		t.Fatalf("latest_values holds %v, want [%s]", got, want)
	}
	id := v.(*valueStore).ch.id
	err = p.do(func(w *writer) error {
		insert := func(topic string, off int) error {
			_, err := w.conn.ExecContext(context.Background(),
				`INSERT INTO latest_values (channel, topic, "offset", message_id, timestamp, payload, retain, qos, publisher, bridge, size)
				 VALUES (?, ?, ?, 'dup', 0, x'', 0, 0, '', '', 0)`, id, topic, off)
			return err
		}
		if insert("a", 9) == nil {
			return errors.New("a second row for topic a was accepted")
		}
		if insert("z", 3) == nil {
			return errors.New("a second value at offset 3 was accepted")
		}
		if insert("", 9) == nil {
			return errors.New("a value without a topic was accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestValueTableIsPartOfVersion20: latest_values joined the schema at
// version 20 before any release; a version-20 database without it is
// refused by name rather than adopted half-made.
func TestValueTableIsPartOfVersion20(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	p.Close()
	if _, err := rawDB(t, path).Exec(`DROP TABLE latest_values`); err != nil {
		t.Fatal(err)
	}
	_, err := Open(testOptions(path))
	if err == nil || !strings.Contains(err.Error(), "latest_values is missing") {
		t.Fatalf("Open without latest_values = %v", err)
	}
}

// TestInvariant18_PutReturnsOnlyAfterCommit: once Put or Remove returns,
// a reader on another connection sees it.
func TestInvariant18_PutReturnsOnlyAfterCommit(t *testing.T) {
	p := openAt(t, newDB(t), func(o *Options) { o.ReadConnections = 2 })
	v := mustValues(t, p, "retained")
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			topic := fmt.Sprint("w/", w)
			for i := range 15 {
				r, err := v.Put(valueRec(topic, 4+(i*5)%11)) // growing and shrinking
				if err != nil {
					t.Error(err)
					return
				}
				got, ok, err := v.Get(topic)
				if err != nil || !ok || got.Offset != r.Offset {
					t.Errorf("value of %s at %d not visible after Put returned: offset %d, %v, %v", topic, r.Offset, got.Offset, ok, err)
					return
				}
				if i%5 == 4 {
					if ok, err := v.Remove(topic); !ok || err != nil {
						t.Errorf("Remove(%s) = %v, %v", topic, ok, err)
						return
					}
					if _, ok, err := v.Get(topic); ok || err != nil {
						t.Errorf("value of %s visible after Remove returned: %v", topic, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestShrinkingReplaceIsNotRefusedWithAFailingBatch: at the page ceiling,
// a Put that replaces a larger value shares a batch with a Put that
// cannot fit. The batch fails whole, but the replace was held out of it
// and commits alone in the reserve: it frees what it takes and is not
// refused (storage.ValueStore), while the other Put gets ErrFull.
func TestShrinkingReplaceIsNotRefusedWithAFailingBatch(t *testing.T) {
	const maxBytes, reserve = 128 << 10, 16 << 10
	path := newDB(t)
	bounded := func(o *Options) { o.MaxBytes, o.Reserve = maxBytes, reserve }
	p := openAt(t, path, bounded)
	v := mustValues(t, p, "retained")
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("the provider never refused a Put")
		}
		_, err := v.Put(valueRec(fmt.Sprintf("v/%04d", i), 1000))
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopened so that two Puts close a batch. The interval only matters
	// if the second is late; then each commits alone, which this test
	// also accepts.
	p = openAt(t, path, func(o *Options) {
		bounded(o)
		o.PublishCommitInterval = MaxCommitInterval
		o.PublishCommitMaxRecords = 2
	})
	v = mustValues(t, p, "retained")
	n, next := v.Len(), v.Next()
	var wg sync.WaitGroup
	var bigErr, smallErr error
	var small storage.Record
	wg.Go(func() { _, bigErr = v.Put(valueRec("big", 3*PageSize)) })
	wg.Go(func() { small, smallErr = v.Put(valueRec("v/0000", 10)) })
	wg.Wait()
	if !errors.Is(bigErr, storage.ErrFull) {
		t.Fatalf("a Put needing new pages at the ceiling: %v, want ErrFull", bigErr)
	}
	if smallErr != nil {
		t.Fatalf("a replace with a smaller value at the ceiling was refused: %v", smallErr)
	}
	if small.Offset != next || v.Next() != next+1 || v.Len() != n {
		t.Fatalf("after the pair: replace at %d, Next %d, Len %d; want %d, %d, %d", small.Offset, v.Next(), v.Len(), next, next+1, n)
	}
	if _, ok, err := v.Get("big"); ok || err != nil {
		t.Fatalf("the refused value is readable: %v, %v", ok, err)
	}
	if p.Bytes() > maxBytes {
		t.Fatalf("Bytes() %d over max_bytes %d", p.Bytes(), maxBytes)
	}
}
