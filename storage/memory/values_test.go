package memory

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
	"saguin.dev/storage/storagetest"
)

// value is a record for topic whose Size is exactly n (n >= len(topic)).
func value(topic string, n int) storage.Record {
	return storage.Record{Topic: topic, Payload: make([]byte, n-len(topic)), QoS: 1}
}

func mustValues(t *testing.T, p *Provider, name string) storage.ValueStore {
	t.Helper()
	v, err := p.Values(name)
	if err != nil {
		t.Fatalf("Values(%q): %v", name, err)
	}
	return v
}

// TestValueStoreFileLayout: a value store is one file named like a channel
// ("$saguin/retained" -> %24saguin%2Fretained.snapshot, rfcs/storage-memory.md), of
// format 21 and file kind 1 (channels), whose body is kind byte 2, the
// name, next u64, the count and the values in topic order, each a whole
// record with its offset (storage-memory.md "kind 2"); the manifest lists
// it with kind 2.
func TestValueStoreFileLayout(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	v := mustValues(t, p, "$saguin/retained")
	for _, topic := range []string{"b", "a", "c"} {
		if _, err := v.Put(value(topic, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Put(value("a", 12)); err != nil { // a moves to offset 4
		t.Fatal(err)
	}
	if _, err := v.Remove("c"); err != nil { // next stays 5
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "%24saguin%2Fretained.snapshot"))
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := snapshot.Parse(data)
	if err != nil || h.Kind != snapshot.KindChannels {
		t.Fatalf("Parse = kind %d, %v", h.Kind, err)
	}
	d := snapshot.NewDecoder(body)
	if k, name, next := d.Uint8(), d.String("name"), d.Uint64(); k != 2 || name != "$saguin/retained" || next != 5 {
		t.Fatalf("body starts kind %d, name %q, next %d; want 2, $saguin/retained, 5", k, name, next)
	}
	n := d.Count("value", snapshot.MinRecordSize)
	var got []string
	for range n {
		r := d.Record()
		got = append(got, fmt.Sprintf("%s@%d", r.Topic, r.Offset))
	}
	// Then the held QoS 2 publishes (none here) end the file (rfcs/storage-memory.md).
	holds := d.Count("hold", snapshot.MinHeldSize)
	if err := d.End(); err != nil || strings.Join(got, " ") != "a@4 b@1" || holds != 0 {
		t.Fatalf("values %v, %d holds, %v; want a@4 b@1, no holds and nothing after", got, holds, err)
	}
	mdata, _ := os.ReadFile(filepath.Join(dir, manifestName))
	_, mbody, _ := snapshot.Parse(mdata)
	md := snapshot.NewDecoder(mbody)
	if c := md.Count("entry", 5); c != 1 || md.String("name") != "$saguin/retained" || md.Uint8() != 2 || md.End() != nil {
		t.Fatalf("manifest does not list the value store with kind 2")
	}
}

// writeValues writes a value store file by hand, so the decoder's checks
// can be reached with what a writer never produces.
func writeValues(t *testing.T, dir, name string, next uint64, count uint32, recs []storage.Record) {
	t.Helper()
	e := snapshot.NewFile(snapshot.KindChannels, "test-build", storagetest.Base, 0)
	e.Uint8(kindLatest)
	e.String(name)
	e.Uint64(next)
	e.Uint32(count) // as the file holds it: a damaged count may pass a 32-bit int
	for i := range recs {
		e.Record(&recs[i])
	}
	e.Count(0) // no held QoS 2 publishes
	if err := os.WriteFile(filepath.Join(dir, snapshot.FileName(name)), e.Finish(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestInvariant14_DamagedValueStoreRefusesStart: a value store file that
// breaks the post-checks (topics out of order, repeated or empty; an
// offset at or past next, zero, or held twice; next zero) is an Open error
// naming the file and what is wrong, never an empty start.
func TestInvariant14_DamagedValueStoreRefusesStart(t *testing.T) {
	at := func(topic string, off uint64) storage.Record {
		r := value(topic, 8)
		r.Offset = off
		return r
	}
	cases := []struct {
		name string
		next uint64
		recs []storage.Record
		want string
	}{
		{"topics out of order", 5, []storage.Record{at("b", 1), at("a", 2)}, `topic "a" after "b"`},
		{"topic twice", 5, []storage.Record{at("a", 1), at("a", 2)}, `topic "a" after "a"`},
		{"empty topic", 5, []storage.Record{at("", 1)}, `topic "" after ""`},
		{"offset at next", 3, []storage.Record{at("a", 1), at("b", 3)}, "value offset 3"},
		{"offset zero", 3, []storage.Record{at("a", 0)}, "value offset 0"},
		{"offset twice", 5, []storage.Record{at("a", 2), at("b", 2)}, "offset 2 held twice"},
		{"next zero", 0, nil, "next 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeValues(t, dir, "retained", c.next, uint32(len(c.recs)), c.recs)
			wantIn(t, openErr(t, dir), `"mem"`, "retained.snapshot", c.want)
		})
	}
	// The well-formed version of the same file loads.
	dir := t.TempDir()
	writeValues(t, dir, "retained", 5, 2, []storage.Record{at("a", 4), at("b", 1)})
	p := mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	v := mustValues(t, p, "retained")
	if v.Len() != 2 || v.Next() != 5 || v.Bytes() != 16 {
		t.Fatalf("loaded Len %d Next %d Bytes %d; want 2, 5, 16", v.Len(), v.Next(), v.Bytes())
	}
}

// TestInvariant13_DamagedValueCountRefusedBeforeAllocation: a value count
// the bytes present cannot hold is refused before the slice is made.
func TestInvariant13_DamagedValueCountRefusedBeforeAllocation(t *testing.T) {
	dir := t.TempDir()
	writeValues(t, dir, "retained", 5, 1<<31, nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	msg := openErr(t, dir)
	runtime.ReadMemStats(&after)
	wantIn(t, msg, "retained.snapshot", "value count 2147483648")
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("refusing the count allocated %d bytes", grew)
	}
}

// TestValueBytesShareTheProviderBound: value bytes count in the provider's
// one counter with every channel's, exactly (Record.Size): a Put is charged
// its growth over the value it replaces and refused at max_bytes less the
// reserve; a replace with a smaller or equal value and a Remove are never
// refused and give bytes back; restored values are charged when the store
// is asked for, even over a smaller bound.
func TestValueBytesShareTheProviderBound(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir, MaxBytes: 1000, Reserve: 200})
	l, _ := p.Append("events")
	v := mustValues(t, p, "retained")
	for range 4 {
		if _, err := l.Append(value("e", 100)); err != nil {
			t.Fatal(err)
		}
	}
	for _, topic := range []string{"a", "b", "c"} {
		if _, err := v.Put(value(topic, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if p.Bytes() != 700 || v.Bytes() != 300 {
		t.Fatalf("provider bytes %d, store bytes %d; want 700, 300", p.Bytes(), v.Bytes())
	}
	if _, err := v.Put(value("a", 201)); err == nil || !strings.Contains(err.Error(), "reserve") {
		t.Fatalf("replace growing by 101 over the publish limit (800): %v", err)
	}
	if _, err := v.Put(value("a", 200)); err != nil || p.Bytes() != 800 {
		t.Fatalf("replace growing exactly to the publish limit: %v (provider bytes %d)", err, p.Bytes())
	}
	if _, err := v.Put(value("d", 1)); err == nil {
		t.Fatal("a new topic over the publish limit was accepted")
	}
	if _, err := l.Append(value("e", 1)); err == nil {
		t.Fatal("values did not count against the append channel's room")
	}
	if _, err := v.Put(value("a", 200)); err != nil {
		t.Fatalf("replace with an equal value at the limit: %v", err)
	}
	if _, err := v.Put(value("a", 50)); err != nil || p.Bytes() != 650 {
		t.Fatalf("replace with a smaller value at the limit: %v (provider bytes %d, want 650)", err, p.Bytes())
	}
	if ok, err := v.Remove("b"); !ok || err != nil || p.Bytes() != 550 || v.Bytes() != 150 {
		t.Fatalf("Remove: %v, %v; provider bytes %d, store bytes %d; want 550, 150", ok, err, p.Bytes(), v.Bytes())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, Options{SnapshotDir: dir, MaxBytes: 400, Reserve: 200})
	defer p.Close()
	if p.Bytes() != 0 {
		t.Fatalf("charged %d before the store was asked for", p.Bytes())
	}
	v = mustValues(t, p, "retained")
	if p.Bytes() != 150 || v.Len() != 2 || v.Next() != 7 {
		t.Fatalf("restored: provider bytes %d, Len %d, Next %d; want 150, 2, 7", p.Bytes(), v.Len(), v.Next())
	}
	l, _ = p.Append("events")
	if _, err := v.Put(value("z", 51)); err == nil {
		t.Fatalf("a Put over the bound after restore was accepted (provider bytes %d)", p.Bytes())
	}
	if _, err := v.Put(value("c", 100)); err != nil {
		t.Fatalf("an equal replace over the bound after restore: %v", err)
	}
}

// TestValueStoreKindsAreKeptInTheSnapshot: a restored value store's name
// names it only: asked for as an append channel or a queue (even before
// the store itself), it is refused, and the store then loads whole.
func TestValueStoreKindsAreKeptInTheSnapshot(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	v := mustValues(t, p, "retained")
	v.Put(value("a", 5))
	p.Close()
	p = mustOpen(t, Options{SnapshotDir: dir, Now: func() time.Time { return storagetest.Base }})
	defer p.Close()
	if _, err := p.Append("retained"); err == nil || !strings.Contains(err.Error(), "value store") {
		t.Fatalf("Append on a restored value store: %v", err)
	}
	if _, err := p.Queue("retained", "retained__dlq"); err == nil || !strings.Contains(err.Error(), "value store") {
		t.Fatalf("Queue on a restored value store: %v", err)
	}
	if v = mustValues(t, p, "retained"); v.Len() != 1 || v.Next() != 2 {
		t.Fatalf("restored store Len %d Next %d", v.Len(), v.Next())
	}
}
