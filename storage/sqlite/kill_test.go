package sqlite

import (
	"saguin.dev/storage/storagetest/emulate"

	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"saguin.dev/storage"
)

// The child side of TestInvariant14_KillNineKeepsEveryAcknowledgedRecord:
// it appends and enqueues from several goroutines and prints each
// acknowledgement, until the parent kills it. It does nothing in a normal
// run.
func TestHelperKilledBroker(t *testing.T) {
	dir := os.Getenv("SAGUIN_SQLITE_KILL_CHILD")
	if dir == "" {
		return
	}
	p, err := Open(testOptions(filepath.Join(dir, "saguin.db")))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	l, err := p.Append("events")
	if err != nil {
		os.Exit(2)
	}
	q, err := p.Queue("jobs", "jobs__dlq")
	if err != nil {
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				kind := "a"
				var r storage.Record
				if i%3 == 2 {
					kind = "q"
					r, err = q.Enqueue(record(id, 64))
				} else {
					r, err = l.Append(record(id, 64))
				}
				if err != nil {
					os.Exit(3)
				}
				mu.Lock()
				fmt.Fprintf(out, "%s %d %s\n", kind, r.Offset, id)
				out.Flush()
				mu.Unlock()
			}
		}()
	}
	select {} // until killed
}

// TestInvariant14_KillNineKeepsEveryAcknowledgedRecord: a broker killed
// with SIGKILL — no Close, no checkpoint, no final fsync — loses nothing it
// acknowledged: every record and job it answered for is there at the next
// open, at the offset it was given, with no hole below, and the stale lock
// file does not stop the restart.
func TestInvariant14_KillNineKeepsEveryAcknowledgedRecord(t *testing.T) {
	dir := t.TempDir()
	// Through emulate: under make test-32 this test binary may be running
	// under qemu-user, and so must the child it re-executes.
	cmd, err := emulate.Command(os.Args[0], "-test.run=^TestHelperKilledBroker$", "-test.count=1")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "SAGUIN_SQLITE_KILL_CHILD="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acks := map[string]map[uint64]string{"a": {}, "q": {}}
	sc := bufio.NewScanner(stdout)
	n := 0
	killed := false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue // a line cut by the kill
		}
		off, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil || acks[f[0]] == nil {
			t.Fatalf("child said %q", sc.Text())
		}
		acks[f[0]][off] = f[2]
		if n++; n == 600 && !killed {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	cmd.Wait()
	if !killed {
		t.Fatalf("the child stopped on its own after %d acknowledgements", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "saguin.db-wal")); err != nil {
		t.Fatalf("no WAL left behind: the child was not killed mid-run? %v", err)
	}

	p := openAt(t, filepath.Join(dir, "saguin.db"), nil)
	l := mustLog(t, p, "events")
	recs, floor, err := l.Read(1, 1<<20)
	if err != nil || floor != 1 {
		t.Fatal(floor, err)
	}
	for i, r := range recs {
		if r.Offset != uint64(i+1) {
			t.Fatalf("hole in the log: record %d has offset %d", i, r.Offset)
		}
	}
	if l.Next() != uint64(len(recs))+1 {
		t.Fatalf("next %d over %d records", l.Next(), len(recs))
	}
	for off, id := range acks["a"] {
		if off > uint64(len(recs)) || recs[off-1].MessageID != id {
			t.Fatalf("acknowledged record %s at offset %d is missing after kill -9", id, off)
		}
	}
	q := mustQueue(t, p, "jobs")
	items, err := q.Items(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	byOffset := map[uint64]string{}
	for _, it := range items {
		byOffset[it.Offset] = it.MessageID
	}
	for off, id := range acks["q"] {
		if byOffset[off] != id {
			t.Fatalf("acknowledged job %s at offset %d is missing after kill -9", id, off)
		}
	}
	if q.Next() != uint64(len(items))+1 || q.Depth() != len(items) {
		t.Fatalf("queue next %d depth %d over %d items", q.Next(), q.Depth(), len(items))
	}
	// Offsets continue after the crash.
	if r, err := l.Append(record("after", 1)); err != nil || r.Offset != uint64(len(recs))+1 {
		t.Fatalf("append after restart = %d, %v", r.Offset, err)
	}
}

// TestInvariant14_CloseAndReopenKeepsEverything: a clean close and reopen
// keeps records, counters, queue items with their history, and positions.
func TestInvariant14_CloseAndReopenKeepsEverything(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	l := mustLog(t, p, "events")
	q := mustQueue(t, p, "jobs")
	for i := range 30 {
		if _, err := l.Append(record(fmt.Sprint("r", i), i)); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Enqueue(record(fmt.Sprint("j", i), i)); err != nil {
			t.Fatal(err)
		}
	}
	if removed, _, err := l.Trim(time.Time{}, l.Bytes()-1); err != nil || removed != 1 {
		t.Fatal(removed, err)
	}
	for i := range 10 {
		if i%2 == 0 {
			if err := q.Resolve(uint64(i + 1)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := q.CountAttempt(uint64(i+1), record("x", 0).Timestamp); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.DeadLetter(30, "jobs/__dlq", nil, record("x", 0).Timestamp); err != nil {
		t.Fatal(err)
	}
	if err := l.SavePosition(storage.Position{Reader: "bridge:b", Offset: 31}); err != nil {
		t.Fatal(err)
	}
	type snapshot struct {
		next, floor uint64
		bytes       int64
		recs        []storage.Record
		items       []storage.QueueItem
		qNext       uint64
		depth       int
		qBytes      int64
		dNext       uint64
		positions   []storage.Position
	}
	take := func(p *Provider) snapshot {
		l, q := mustLog(t, p, "events"), mustQueue(t, p, "jobs")
		recs, _, err := l.Read(l.Floor(), 100)
		if err != nil {
			t.Fatal(err)
		}
		items, err := q.Items(0, 100)
		if err != nil {
			t.Fatal(err)
		}
		pos, err := l.Positions()
		if err != nil {
			t.Fatal(err)
		}
		return snapshot{l.Next(), l.Floor(), l.Bytes(), recs, items, q.Next(), q.Depth(), q.Bytes(), q.DeadLetters().Next(), pos}
	}
	before := take(p)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	after := take(openAt(t, path, nil))
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("reopen changed the provider:\nbefore %v\nafter  %v", before, after)
	}
	if before.floor != 2 || before.next != 31 || len(before.items) != 24 || before.dNext != 2 {
		t.Fatalf("scenario did not run as meant: %+v", before)
	}
}
