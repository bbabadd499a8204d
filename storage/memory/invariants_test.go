package memory

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
	"saguin.dev/storage/storagetest"
)

func TestInvariant01_ReadBelowFloorIsRejectedAfterAgeAndSizeTrimAndRestart(t *testing.T) {
	storagetest.ReadBelowFloorIsRejected(t, open)
}

func TestInvariant02_FullProviderRefusesNeverEvictsAndReserveRelieves(t *testing.T) {
	storagetest.ProviderBoundAndReserve(t, open)
}

func TestInvariant08_DeadLetterKeepsMessageID(t *testing.T) {
	storagetest.DeadLetterKeepsMessageID(t, open)
}

func TestInvariant09_OffsetsNeverReusedAfterEmptyingAndRestart(t *testing.T) {
	storagetest.OffsetsNeverReused(t, open)
}

func TestInvariant15_AttemptsSurviveRestart(t *testing.T) {
	storagetest.AttemptsSurviveRestart(t, open)
}

var errInjected = errors.New("injected failure between the dead-letter halves")

func mustOpen(t *testing.T, o Options) *Provider {
	t.Helper()
	if o.Name == "" {
		o.Name = "mem"
	}
	if o.Writer == "" {
		o.Writer = "test-build"
	}
	p, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return p
}

func job(id string, n int) storage.Record {
	return storage.Record{MessageID: id, Topic: "jobs/" + id, Payload: bytes.Repeat([]byte{'j'}, n), QoS: 1}
}

// TestInvariant05_DeadLetterMoveIsAtomic injects a failure after the
// dead-letter log took the record and before the queue let go of it: the
// record must stay in the queue exactly as it was (attempts included), the
// dead-letter log must not have it and must not have spent its offset, and
// no byte count may move. Then, under concurrent moves that fail a third
// of the time, every job ends in exactly one place with no hole in the
// dead-letter offsets.
func TestInvariant05_DeadLetterMoveIsAtomic(t *testing.T) {
	var mu sync.Mutex
	failEvery := 0 // 0: never; n: every n-th call fails
	calls := 0
	faults := &Faults{BetweenDeadLetterHalves: func() error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if failEvery > 0 && calls%failEvery == 0 {
			return errInjected
		}
		return nil
	}}
	setFail := func(n int) { mu.Lock(); failEvery, calls = n, 0; mu.Unlock() }
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir, Faults: faults, MaxBytes: 1 << 20, Reserve: 1 << 10})
	qs, err := p.Queue("jobs", "jobs__dlq")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := qs.Enqueue(job(fmt.Sprint("j", i+1), 10+i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := qs.CountAttempt(2, storagetest.Base); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := qs.DeadLetter(1, "jobs/__dlq/j1", nil, storagetest.Base); err != nil {
		t.Fatal(err)
	}
	dlq := qs.DeadLetters()
	before, _ := qs.Get(2)
	depth, qBytes, dNext, dBytes, pBytes := qs.Depth(), qs.Bytes(), dlq.Next(), dlq.Bytes(), p.Bytes()

	setFail(1)
	_, err = qs.DeadLetter(2, "jobs/__dlq/j2", []storage.Header{{Name: "saguin-dlq-reason", Value: "attempts_exhausted"}}, storagetest.Base)
	if !errors.Is(err, errInjected) {
		t.Fatalf("DeadLetter with an injected failure: %v, want the injected error", err)
	}
	after, err := qs.Get(2)
	if err != nil {
		t.Fatalf("the record left the queue though the move failed: %v", err)
	}
	if d := storagetest.ItemDiff(before, after); d != "" {
		t.Fatalf("the failed move changed the record: %s", d)
	}
	if qs.Depth() != depth || qs.Bytes() != qBytes || dlq.Next() != dNext || dlq.Bytes() != dBytes || p.Bytes() != pBytes {
		t.Fatalf("a failed move changed counters: depth %d->%d, queue bytes %d->%d, dlq next %d->%d, dlq bytes %d->%d, provider bytes %d->%d",
			depth, qs.Depth(), qBytes, qs.Bytes(), dNext, dlq.Next(), dBytes, dlq.Bytes(), pBytes, p.Bytes())
	}
	if recs, _, _ := dlq.Read(1, 10); len(recs) != 1 || recs[0].MessageID != "j1" {
		t.Fatalf("dead-letter log after a failed move holds %v", recs)
	}
	setFail(0)
	if r, err := qs.DeadLetter(2, "jobs/__dlq/j2", nil, storagetest.Base); err != nil || r.Offset != dNext {
		t.Fatalf("retried move = offset %d, %v; want %d (the offset was handed back)", r.Offset, err, dNext)
	}

	// Concurrent movers, resolvers and producers with failures injected.
	setFail(3)
	const producers, perProducer = 4, 150
	var wg sync.WaitGroup
	resolved := make(chan string, producers*perProducer)
	for w := range producers {
		wg.Go(func() {
			for i := range perProducer {
				r, err := qs.Enqueue(job(fmt.Sprintf("w%d-%d", w, i), i%17))
				if err != nil {
					t.Error(err)
					return
				}
				switch i % 3 {
				case 0:
					for { // retried until it lands, as the broker retries
						_, err := qs.DeadLetter(r.Offset, "jobs/__dlq", nil, storagetest.Base)
						if err == nil {
							break
						}
						if !errors.Is(err, errInjected) {
							t.Error(err)
							return
						}
					}
				case 1:
					if err := qs.Resolve(r.Offset); err != nil {
						t.Error(err)
						return
					}
					resolved <- r.MessageID
				}
			}
		})
	}
	wg.Wait()
	close(resolved)
	setFail(0)

	check := func(what string, qs storage.QueueStore) {
		t.Helper()
		where := map[string]string{}
		put := func(id, place string) {
			if prev, ok := where[id]; ok {
				t.Fatalf("%s: %s is in %s and in %s", what, id, prev, place)
			}
			where[id] = place
		}
		items, err := qs.Items(0, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			put(it.MessageID, "the queue")
		}
		recs, _, err := qs.DeadLetters().Read(1, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range recs {
			if r.Offset != uint64(i+1) {
				t.Fatalf("%s: dead-letter offsets have a hole: %d at position %d", what, r.Offset, i)
			}
			put(r.MessageID, "the dead-letter log")
		}
		if n := qs.DeadLetters().Next(); n != uint64(len(recs)+1) {
			t.Fatalf("%s: dead-letter next %d after %d records", what, n, len(recs))
		}
		for id := range resolved {
			put(id, "the resolved set")
		}
		if want := 3 + producers*perProducer; len(where) != want {
			t.Fatalf("%s: %d jobs accounted for, want %d", what, len(where), want)
		}
	}
	check("after concurrent moves", qs)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	qs, err = p.Queue("jobs", "jobs__dlq")
	if err != nil {
		t.Fatal(err)
	}
	// Restart brings back exactly the queued jobs and the dead letters,
	// no resolved job and no half-moved one.
	items, _ := qs.Items(0, 1<<20)
	recs, _, _ := qs.DeadLetters().Read(1, 1<<20)
	if len(items)+len(recs) != 1+2+producers*perProducer*2/3 {
		t.Fatalf("after restart: %d queued + %d dead letters, want %d", len(items), len(recs), 1+2+producers*perProducer*2/3)
	}
}

// closedWith writes a snapshot holding one append channel and one queue
// and returns its directory.
func closedWith(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	p := mustOpen(t, Options{SnapshotDir: dir, Now: func() time.Time { return storagetest.Base }})
	l, _ := p.Append("events")
	for _, r := range storagetest.SampleRecords() {
		if _, err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := l.Trim(time.Time{}, l.Bytes()-1); err != nil {
		t.Fatal(err)
	}
	q, _ := p.Queue("jobs", "jobs__dlq")
	q.Enqueue(job("a", 3))
	q.Enqueue(job("b", 4))
	q.CountAttempt(1, storagetest.Base)
	q.DeadLetter(2, "jobs/__dlq/b", nil, storagetest.Base)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// openErr opens dir expecting a refusal and returns its message.
func openErr(t *testing.T, dir string) string {
	t.Helper()
	p, err := Open(Options{Name: "mem", SnapshotDir: dir})
	if err == nil {
		p.Close()
		t.Fatal("Open of a damaged snapshot succeeded: an empty or partial start destroys the evidence")
	}
	return err.Error()
}

func wantIn(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, s := range parts {
		if !strings.Contains(msg, s) {
			t.Fatalf("error %q does not mention %q", msg, s)
		}
	}
}

// reseal recomputes a file's checksum after a deliberate edit, so the edit
// reaches the checks behind the checksum.
func reseal(data []byte) []byte {
	end := len(data) - 4
	binary.LittleEndian.PutUint32(data[end:], crc32.Checksum(data[:end], crc32.MakeTable(crc32.Castagnoli)))
	return data
}

// TestInvariant14_CorruptSnapshotRefusesStart: a flipped byte anywhere, a
// wrong version, a truncation, a damaged manifest or a decoded value that
// breaks the post-checks is an Open error naming the file and what is
// wrong - never an empty start - and the damaged file is left as it was.
// A temporary file a crash left behind never replaces the good snapshot.
func TestInvariant14_CorruptSnapshotRefusesStart(t *testing.T) {
	dir := closedWith(t)
	events := filepath.Join(dir, "events.snapshot")
	good, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	damage := func(t *testing.T, path string, data []byte, parts ...string) {
		t.Helper()
		orig, _ := os.ReadFile(path)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		wantIn(t, openErr(t, dir), append([]string{`"mem"`, path}, parts...)...)
		if kept, _ := os.ReadFile(path); !bytes.Equal(kept, data) {
			t.Fatal("the refused file was changed: the evidence is gone")
		}
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("flipped byte", func(t *testing.T) {
		for _, at := range []int{0, 9, 12, 20, 40, snapshot.HeaderLen, len(good) / 2, len(good) - 5, len(good) - 1} {
			bad := bytes.Clone(good)
			bad[at] ^= 0x20
			damage(t, events, bad, "damaged")
		}
	})
	t.Run("wrong version", func(t *testing.T) {
		bad := bytes.Clone(good)
		binary.LittleEndian.PutUint32(bad[8:], 20)
		damage(t, events, reseal(bad), "format version 20", `"test-build"`, "2026-03-01T12:00:00Z", "version 21")
	})
	t.Run("checksum checked before version", func(t *testing.T) {
		bad := bytes.Clone(good)
		binary.LittleEndian.PutUint32(bad[8:], 20)
		damage(t, events, bad, "checksum")
	})
	t.Run("truncated", func(t *testing.T) {
		for _, n := range []int{0, 7, snapshot.HeaderLen, snapshot.HeaderLen + 4, len(good) / 2, len(good) - 1} {
			damage(t, events, good[:n], "damaged")
		}
	})
	t.Run("truncated body resealed", func(t *testing.T) {
		// A body cut short with a valid checksum: the decoder's own length
		// checks must catch it.
		bad := append(bytes.Clone(good[:len(good)-40]), 0, 0, 0, 0)
		damage(t, events, reseal(bad), "remain")
	})
	t.Run("damaged manifest", func(t *testing.T) {
		path := filepath.Join(dir, manifestName)
		m, _ := os.ReadFile(path)
		m[len(m)-2] ^= 1
		damage(t, path, m, "damaged")
	})
	t.Run("post-checks", func(t *testing.T) {
		cases := []struct {
			name string
			edit func(p *Provider)
			want string
		}{
			{"floor above next", func(p *Provider) { p.logs["events"].floor = p.logs["events"].next + 1 }, "floor"},
			{"next zero", func(p *Provider) { l := p.logs["events"]; l.next, l.floor, l.recs = 0, 0, deque[storage.Record]{} }, "next 0"},
			{"record at next", func(p *Provider) { p.logs["events"].next-- }, "record offset"},
			{"position past next", func(p *Provider) {
				l := p.logs["events"]
				l.positions["mqtt:x"] = storage.Position{Reader: "mqtt:x", Offset: l.next + 1, LastSeen: storagetest.Base, Expiry: time.Hour}
			}, "position"},
			{"queue item at next", func(p *Provider) { p.queues["jobs"].next = 1 }, "item offset"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				dir := closedWith(t)
				p := mustOpen(t, Options{SnapshotDir: dir, Now: func() time.Time { return storagetest.Base }})
				p.Append("events")
				p.Queue("jobs", "jobs__dlq")
				c.edit(p)
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				wantIn(t, openErr(t, dir), "mem", dir, c.want)
			})
		}
	})
	t.Run("renamed file", func(t *testing.T) {
		other := filepath.Join(dir, "other.snapshot")
		if err := os.WriteFile(other, good, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(other)
		wantIn(t, openErr(t, dir), other, `holds channel "events"`)
	})
	t.Run("leftover temporary file", func(t *testing.T) {
		// What a crash between writing and renaming leaves: a partial
		// replacement. It is never read, never renamed, and removed.
		tmp := filepath.Join(dir, "events.snapshot"+tmpMarker+"12345")
		if err := os.WriteFile(tmp, good[:len(good)/3], 0o600); err != nil {
			t.Fatal(err)
		}
		p := mustOpen(t, Options{SnapshotDir: dir})
		l, _ := p.Append("events")
		if l.Next() != uint64(len(storagetest.SampleRecords())+1) || l.Floor() != 2 {
			t.Fatalf("loaded next %d floor %d, not the good snapshot", l.Next(), l.Floor())
		}
		p.Close()
		if _, err := os.Stat(tmp); !os.IsNotExist(err) {
			t.Fatalf("leftover temporary file still there: %v", err)
		}
	})
	// After all that, the untouched snapshot still loads whole.
	p := mustOpen(t, Options{SnapshotDir: dir})
	defer p.Close()
	l, _ := p.Append("events")
	recs, _, err := l.Read(l.Floor(), 100)
	if err != nil || len(recs) != len(storagetest.SampleRecords())-1 {
		t.Fatalf("good snapshot: %d records, %v", len(recs), err)
	}
}

// TestInvariant13_DamagedCountRefusedBeforeAllocation: a count that claims
// more entries than the bytes present could hold is refused before
// anything is allocated for it.
func TestInvariant13_DamagedCountRefusedBeforeAllocation(t *testing.T) {
	dir := t.TempDir()
	e := snapshot.NewFile(snapshot.KindChannels, "test-build", storagetest.Base, 0)
	e.Uint8(kindAppend)
	e.String("events")
	e.String("events")
	e.Uint64(5)
	e.Uint64(1)
	// The count as the file holds it, four bytes: two billion records in a
	// few bytes, past the largest int of a 32-bit build.
	e.Uint32(1 << 31)
	e.Count(0)
	if err := os.WriteFile(filepath.Join(dir, snapshot.FileName("events")), e.Finish(), 0o600); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	msg := openErr(t, dir)
	runtime.ReadMemStats(&after)
	wantIn(t, msg, "events.snapshot", "record count 2147483648")
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("refusing the count allocated %d bytes", grew)
	}
}

// TestInvariant14_GoodSnapshotNeverOverwrittenBeforeReplacementSynced: the
// replacement is whole on disk before it is renamed over the known-good
// file (the hook sees both), and a failure at that point leaves the
// known-good file byte for byte as it was, so the next start loads it.
func TestInvariant14_GoodSnapshotNeverOverwrittenBeforeReplacementSynced(t *testing.T) {
	dir := t.TempDir()
	clock := storagetest.NewClock(storagetest.Base)
	p := mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now})
	l, _ := p.Append("events")
	for i := range 3 {
		l.Append(job(fmt.Sprint("a", i), 5))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "events.snapshot")
	old, _ := os.ReadFile(path)

	clock.Advance(time.Hour)
	var sawReplacement bool
	faults := &Faults{BeforeSnapshotRename: func(final string) error {
		if final != path {
			return nil
		}
		// The known-good file is still in place, unchanged...
		if cur, _ := os.ReadFile(path); !bytes.Equal(cur, old) {
			t.Error("the known-good snapshot changed before its replacement was renamed")
		}
		// ...and the replacement beside it is already complete.
		tmps, _ := filepath.Glob(path + tmpMarker + "*")
		if len(tmps) != 1 {
			t.Errorf("want one replacement beside %s, found %v", path, tmps)
			return errInjected
		}
		data, _ := os.ReadFile(tmps[0])
		if _, body, err := snapshot.Parse(data); err != nil || len(body) == 0 {
			t.Errorf("replacement not whole before rename: %v", err)
		}
		sawReplacement = true
		return errInjected
	}}
	p = mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now, Faults: faults})
	l, _ = p.Append("events")
	for i := range 2 {
		l.Append(job(fmt.Sprint("b", i), 5))
	}
	err := p.Close()
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "untouched") {
		t.Fatalf("Close with a failing replacement: %v", err)
	}
	if !sawReplacement {
		t.Fatal("the fault hook never saw the replacement")
	}
	if cur, _ := os.ReadFile(path); !bytes.Equal(cur, old) {
		t.Fatal("the known-good snapshot was overwritten by a replacement that failed")
	}
	if tmps, _ := filepath.Glob(filepath.Join(dir, "*"+tmpMarker+"*")); len(tmps) != 0 {
		t.Fatalf("failed replacement left behind: %v", tmps)
	}
	p = mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now})
	defer p.Close()
	l, _ = p.Append("events")
	recs, _, _ := l.Read(1, 10)
	if l.Next() != 4 || len(recs) != 3 || recs[2].MessageID != "a2" {
		t.Fatalf("after the failed shutdown: next %d, %d records; want the last good snapshot (next 4, 3 records)", l.Next(), len(recs))
	}
}
