package memory

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// TestSnapshotHeaderIsFormat21 checks the exact bytes of the header and
// trailer rfcs/storage-memory.md fixes, on a channel file and on the manifest.
func TestSnapshotHeaderIsFormat21(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 5, 4, 3, 2, 1, 987654321, time.UTC)
	p := mustOpen(t, Options{SnapshotDir: dir, Writer: "0123456789abcdef0123456789abcdef-too-long", Now: func() time.Time { return at }})
	l, _ := p.Append("a.b")
	l.Append(job("x", 3))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for name, kind := range map[string]byte{"a%2Eb.snapshot": 1, manifestName: 2} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data[:8], []byte{'s', 'a', 'g', 'u', 'i', 'n', 0x1A, 0x00}) {
			t.Errorf("%s: magic % x", name, data[:8])
		}
		if v := binary.LittleEndian.Uint32(data[8:12]); v != 21 {
			t.Errorf("%s: format version %d", name, v)
		}
		if data[12] != kind {
			t.Errorf("%s: kind %d, want %d", name, data[12], kind)
		}
		if w := string(data[13:37]); w != "0123456789abcdef01234567" {
			t.Errorf("%s: writer %q, want the build truncated to 24 bytes", name, w)
		}
		if ns := int64(binary.LittleEndian.Uint64(data[37:45])); ns != at.UnixNano() {
			t.Errorf("%s: written at %d, want %d", name, ns, at.UnixNano())
		}
		end := len(data) - 4
		if got, want := binary.LittleEndian.Uint32(data[end:]), crc32.Checksum(data[:end], crc32.MakeTable(crc32.Castagnoli)); got != want {
			t.Errorf("%s: checksum %08x, want CRC32C %08x", name, got, want)
		}
	}
	// A short writer is NUL-padded.
	dir = t.TempDir()
	p = mustOpen(t, Options{SnapshotDir: dir, Writer: "abc"})
	p.Append("x")
	p.Close()
	data, _ := os.ReadFile(filepath.Join(dir, "x.snapshot"))
	if !bytes.Equal(data[13:37], append([]byte("abc"), make([]byte, 21)...)) {
		t.Errorf("short writer: % x", data[13:37])
	}
}

// TestQueueAndDeadLettersShareOneFile: one file per channel, a queue's
// dead-letter log inside its queue's file, and a manifest listing them.
func TestQueueAndDeadLettersShareOneFile(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	p.Append("events")
	p.Append("$saguin/retained")
	q, _ := p.Queue("jobs", "jobs__dlq")
	q.Enqueue(job("a", 1))
	q.DeadLetter(1, "jobs/__dlq/a", nil, storagetest.Base)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"%24saguin%2Fretained.snapshot", "events.snapshot", "jobs.snapshot", lockName, manifestName}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("snapshot directory holds %v, want %v", names, want)
	}
	// The dead-letter log comes back with its queue, whichever is asked for first.
	p = mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	d, err := p.Append("jobs__dlq")
	if err != nil || d.Next() != 2 {
		t.Fatalf("Append(jobs__dlq) after restart: %v", err)
	}
	q2, err := p.Queue("jobs", "jobs__dlq")
	if err != nil || q2.DeadLetters() != d || q2.Next() != 2 {
		t.Fatalf("Queue(jobs) after its dead-letter log: %v", err)
	}
}

// TestLockRefusesSecondOpen: one provider per snapshot directory; the
// refusal names the provider and the lock, and the lock goes with Close.
func TestLockRefusesSecondOpen(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	_, err := Open(Options{Name: "second", SnapshotDir: dir})
	if err == nil {
		t.Fatal("a second provider opened a locked snapshot directory")
	}
	wantIn(t, err.Error(), `"second"`, filepath.Join(dir, lockName), "held")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, Options{SnapshotDir: dir})
	p.Close()
	// A refused start releases the lock too.
	os.WriteFile(filepath.Join(dir, "events.snapshot"), []byte("junk"), 0o600)
	openErr(t, dir)
	os.Remove(filepath.Join(dir, "events.snapshot"))
	mustOpen(t, Options{SnapshotDir: dir}).Close()
}

type captured struct {
	mu   sync.Mutex
	msgs []string
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, r.Message)
	return nil
}
func (c *captured) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *captured) WithGroup(string) slog.Handler      { return c }
func (c *captured) has(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestManifestDisagreementsAreWarnings covers rfcs/storage-memory.md "Loading": a
// listed channel with no file, a channel file from an earlier shutdown
// than the manifest, one newer than the manifest, and no manifest at all
// are each reported and none stops the start.
func TestManifestDisagreementsAreWarnings(t *testing.T) {
	dir := t.TempDir()
	clock := storagetest.NewClock(storagetest.Base)
	start := func(f *Faults) (*Provider, *captured) {
		c := &captured{}
		return mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now, Faults: f, Logger: slog.New(c)}), c
	}
	p, _ := start(nil)
	for _, n := range []string{"a", "b", "c"} {
		l, _ := p.Append(n)
		l.Append(job(n, 1))
	}
	p.Close()

	// Second shutdown: b's replacement fails, so b stays from the first.
	clock.Advance(time.Minute)
	failB := &Faults{BeforeSnapshotRename: func(path string) error {
		if strings.HasSuffix(path, "b.snapshot") {
			return errInjected
		}
		return nil
	}}
	p, _ = start(failB)
	for _, n := range []string{"a", "b", "c"} {
		p.Append(n)
	}
	if err := p.Close(); err == nil {
		t.Fatal("Close hid a failed channel file")
	}
	os.Remove(filepath.Join(dir, "c.snapshot"))
	p, logs := start(nil)
	if !logs.has("earlier shutdown") {
		t.Errorf("no warning for b written before the manifest: %v", logs.msgs)
	}
	if !logs.has("has no snapshot file") {
		t.Errorf("no warning for c listed but missing: %v", logs.msgs)
	}
	if logs.has("newer than the manifest") || logs.has("no manifest") {
		t.Errorf("spurious warning: %v", logs.msgs)
	}
	p.Append("a")
	p.Append("b")

	// Third shutdown: the manifest fails, the channels are written.
	clock.Advance(time.Minute)
	failManifest := &Faults{BeforeSnapshotRename: func(path string) error {
		if strings.HasSuffix(path, manifestName) {
			return errInjected
		}
		return nil
	}}
	p.faults = *failManifest
	if err := p.Close(); err == nil {
		t.Fatal("Close hid a failed manifest")
	}
	p, logs = start(nil)
	if !logs.has("newer than the manifest") {
		t.Errorf("no warning for channels newer than the manifest: %v", logs.msgs)
	}
	p.Close()

	os.Remove(filepath.Join(dir, manifestName))
	p, logs = start(nil)
	if !logs.has("no manifest") {
		t.Errorf("no warning for a missing manifest: %v", logs.msgs)
	}
	p.Close()
}

// TestUnaskedChannelsAreLeftOnDisk: a snapshot file for a channel nobody
// asks for (no longer configured) is neither rewritten, deleted nor
// charged; switching the channel back finds it (docs/operations.md "Storage files").
func TestUnaskedChannelsAreLeftOnDisk(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	l, _ := p.Append("old")
	l.Append(job("x", 10))
	p.Close()
	path := filepath.Join(dir, "old.snapshot")
	before, _ := os.ReadFile(path)

	p = mustOpen(t, Options{SnapshotDir: dir, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if p.Bytes() != 0 {
		t.Fatalf("a channel nobody asked for is charged %d bytes", p.Bytes())
	}
	p.Append("new")
	p.Close()
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Fatal("the unasked channel's file was rewritten")
	}
	p = mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	l, _ = p.Append("old")
	if l.Next() != 2 || p.Bytes() != sizeOf([]storage.Record{job("x", 10)}) {
		t.Fatalf("old channel came back with next %d, provider bytes %d", l.Next(), p.Bytes())
	}
}

// TestKindsAreKept: a name is an append channel or a queue, in memory and
// in the snapshot, and asking for the other kind is refused by name.
func TestKindsAreKept(t *testing.T) {
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir})
	p.Append("events")
	p.Queue("jobs", "jobs__dlq")
	for _, err := range []error{
		second(p.Queue("events", "events__dlq")),
		second(p.Append("jobs")),
		second(p.Queue("jobs", "other__dlq")),
		second(p.Queue("q2", "events")),
		second(p.Queue("q3", "q3")),
	} {
		if err == nil {
			t.Fatal("a kind mismatch was accepted")
		}
	}
	p.Close()
	p = mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	if _, err := p.Append("jobs"); err == nil || !strings.Contains(err.Error(), "queue") {
		t.Fatalf("Append on a restored queue: %v", err)
	}
	if _, err := p.Queue("events", "events__dlq"); err == nil || !strings.Contains(err.Error(), "append") {
		t.Fatalf("Queue on a restored append channel: %v", err)
	}
	if _, err := p.Queue("jobs", "jobs_dead"); err == nil || !strings.Contains(err.Error(), "jobs__dlq") {
		t.Fatalf("Queue with another dead-letter name than the snapshot's: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestProviderBoundIsExact: the memory provider counts Record.Size, so its
// bound is exact: publishes stop at max_bytes less the reserve, relief
// operations reach into the reserve, and restored data is charged when its
// channel is asked for, even over the bound.
func TestProviderBoundIsExact(t *testing.T) {
	if _, err := Open(Options{Name: "tight", MaxBytes: 300, Reserve: 200}); err == nil ||
		!strings.Contains(err.Error(), "300") || !strings.Contains(err.Error(), "200") {
		t.Fatalf("max_bytes below twice the reserve: %v", err)
	}
	r := job("id", 100-len("id")-len("jobs/id")) // Size 100
	if r.Size() != 100 {
		t.Fatalf("test record size %d", r.Size())
	}
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir, MaxBytes: 1000, Reserve: 200})
	q, _ := p.Queue("jobs", "jobs__dlq")
	l, _ := p.Append("events")
	q.Enqueue(r)
	q.Enqueue(r)
	for range 6 {
		if _, err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if p.Bytes() != 800 {
		t.Fatalf("provider bytes %d, want 800", p.Bytes())
	}
	if _, err := l.Append(job("", 0)); err == nil || !strings.Contains(err.Error(), "reserve") {
		t.Fatalf("append of %d bytes over the publish limit: %v", sizeOf([]storage.Record{job("", 0)}), err)
	}
	if _, err := q.Enqueue(job("", 0)); err == nil {
		t.Fatal("enqueue over the publish limit accepted")
	}
	l.Trim(time.Time{}, 500) // one record goes: 700
	if _, err := l.Append(r); err != nil || p.Bytes() != 800 {
		t.Fatalf("append landing exactly on the publish limit: %v (provider bytes %d)", err, p.Bytes())
	}
	if _, err := q.DeadLetter(1, "jobs/__dlq/id", []storage.Header{{Name: "saguin-dlq-reason", Value: strings.Repeat("x", 80)}}, storagetest.Base); err != nil {
		t.Fatal(err)
	}
	if p.Bytes() <= 800 || p.Bytes() > 1000 {
		t.Fatalf("after a move into the reserve provider bytes %d, want within (800, 1000]", p.Bytes())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Restart with a smaller bound: loaded whole, charged on attach, and
	// publishes refused until there is room.
	p = mustOpen(t, Options{SnapshotDir: dir, MaxBytes: 400, Reserve: 200})
	defer p.Close()
	if p.Bytes() != 0 {
		t.Fatalf("charged %d before any channel was asked for", p.Bytes())
	}
	l, _ = p.Append("events")
	q, _ = p.Queue("jobs", "jobs__dlq")
	if p.Bytes() != l.Bytes()+q.Bytes()+q.DeadLetters().Bytes() || p.Bytes() <= 400 {
		t.Fatalf("provider bytes %d after restore, want all of it (%d)", p.Bytes(), l.Bytes()+q.Bytes()+q.DeadLetters().Bytes())
	}
	if _, err := l.Append(job("", 0)); err == nil {
		t.Fatal("publish accepted over the bound after restore")
	}
	if err := q.Resolve(2); err != nil {
		t.Fatalf("resolve over the bound: %v", err)
	}
}

// TestConcurrentAppendReadTrim runs appenders, readers and a trimmer
// together (under -race in CI): offsets are unique and consecutive, reads
// never see below their floor or a gap, and the byte counts add up.
func TestConcurrentAppendReadTrim(t *testing.T) {
	p := mustOpen(t, Options{})
	defer p.Close()
	l, _ := p.Append("events")
	const writers, each = 4, 400
	var wg sync.WaitGroup
	seen := make([][]uint64, writers)
	for w := range writers {
		wg.Go(func() {
			for range each {
				r, err := l.Append(job("w", 20))
				if err != nil {
					t.Error(err)
					return
				}
				seen[w] = append(seen[w], r.Offset)
			}
		})
	}
	done := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				from := l.Floor()
				recs, floor, err := l.Read(from, 50)
				if err != nil {
					if errors.Is(err, storage.ErrBelowFloor) {
						continue // trimmed between Floor and Read: refused, as it must be
					}
					t.Error(err)
					return
				}
				for i, r := range recs {
					if r.Offset < floor || (i > 0 && r.Offset != recs[i-1].Offset+1) {
						t.Errorf("read from %d (floor %d) returned %d after %d", from, floor, r.Offset, recs[max(i-1, 0)].Offset)
						return
					}
				}
			}
		})
	}
	readers.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
				l.Trim(time.Time{}, 2000)
			}
		}
	})
	wg.Wait()
	close(done)
	readers.Wait()
	all := map[uint64]bool{}
	for _, s := range seen {
		for _, o := range s {
			if all[o] {
				t.Fatalf("offset %d handed out twice", o)
			}
			all[o] = true
		}
	}
	if l.Next() != writers*each+1 || len(all) != writers*each {
		t.Fatalf("next %d after %d appends", l.Next(), len(all))
	}
	recs, _, _ := l.Read(l.Floor(), 1<<20)
	if l.Bytes() != sizeOf(recs) || p.Bytes() != l.Bytes() {
		t.Fatalf("log bytes %d, provider bytes %d, held records sum to %d", l.Bytes(), p.Bytes(), sizeOf(recs))
	}
}

// TestRemovalStaysProportionalAndMemoryBounded looks inside: the dead
// prefix never exceeds half the slice, trimmed records are cleared, an
// emptied log gives its array back, and a queue resolved out of order
// keeps at most as many tombstones as live items.
func TestRemovalStaysProportionalAndMemoryBounded(t *testing.T) {
	p := mustOpen(t, Options{})
	defer p.Close()
	a, _ := p.Append("events")
	l := a.(*appendLog)
	for i := range 20000 {
		l.Append(job("x", i%50))
		if i%7 == 0 {
			l.Trim(time.Time{}, l.Bytes()*9/10)
		}
		d := &l.recs
		if len(d.chunks) > 1 && (d.head >= chunkLen || len(d.chunks[0]) != chunkLen) {
			t.Fatalf("first of %d chunks has %d values, %d dead", len(d.chunks), len(d.chunks[0]), d.head)
		}
		if len(d.chunks) == 1 && d.head > 0 && 2*d.head >= len(d.chunks[0]) {
			t.Fatalf("dead prefix %d of %d in a single chunk", d.head, len(d.chunks[0]))
		}
		if slots := len(d.chunks) * chunkLen; d.n > 0 && slots > d.n+2*chunkLen {
			t.Fatalf("%d chunks for %d records", len(d.chunks), d.n)
		}
		if len(d.chunks) == 0 {
			continue
		}
		for _, r := range d.chunks[0][:d.head] {
			if r.Payload != nil || r.MessageID != "" {
				t.Fatal("a trimmed record is still referenced")
			}
		}
	}
	l.Trim(time.Time{}, 1)
	if l.recs.chunks != nil || l.recs.Len() != 0 {
		t.Fatalf("emptied log keeps %d chunks", len(l.recs.chunks))
	}

	qs, _ := p.Queue("jobs", "jobs__dlq")
	q := qs.(*queueStore)
	for range 5000 {
		q.Enqueue(job("j", 10))
	}
	for o := 5000; o >= 2; o -= 3 { // from the back, leaving holes
		if err := q.Resolve(uint64(o)); err != nil {
			t.Fatal(err)
		}
		if tomb := q.head + q.gone; tomb > 0 && tomb >= q.live {
			t.Fatalf("%d tombstones (head %d) for %d live items in %d", q.gone, q.head, q.live, len(q.items))
		}
	}
	items, _ := q.Items(0, 1<<20)
	if len(items) != q.Depth() {
		t.Fatalf("Items %d, Depth %d", len(items), q.Depth())
	}
}

func TestSavePositionChecksReaderNames(t *testing.T) {
	p := mustOpen(t, Options{})
	defer p.Close()
	l, _ := p.Append("events")
	for _, r := range []string{"", "mqtt:", "bridge:", "client", "sess:x"} {
		if err := l.SavePosition(storage.Position{Reader: r, Offset: 1}); err == nil {
			t.Errorf("reader %q accepted", r)
		}
	}
}

// TestNoneKeepsNothing: snapshot_dir none keeps nothing across a restart
// and takes no lock, so it needs no directory.
func TestNoneKeepsNothing(t *testing.T) {
	p := mustOpen(t, Options{})
	l, _ := p.Append("events")
	l.Append(job("x", 1))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, Options{})
	defer p.Close()
	l, _ = p.Append("events")
	if l.Next() != 1 {
		t.Fatalf("none kept something: next %d", l.Next())
	}
}
