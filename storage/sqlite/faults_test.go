package sqlite

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"saguin.dev/storage"
)

// The switches the chaos negative controls turn on (chaos/harness, through
// the saguinfaults build of the daemon) must really break what they claim
// to: a control whose broker is not broken proves nothing about the check
// that passes it.

// TestInvariant05_NegativeControlSplitDeadLetterLeavesTheJobInBothPlaces:
// with SplitDeadLetter, a failure between the two transactions leaves the
// job in the queue and in the dead-letter log — after a restart too — which
// is what the atomic move (TestInvariant05_DeadLetterMoveIsAtomic) forbids.
// A later move of the same job writes it to the log a second time.
func TestInvariant05_NegativeControlSplitDeadLetterLeavesTheJobInBothPlaces(t *testing.T) {
	path := newDB(t)
	injected := errors.New("dying between the two transactions")
	halves := 0
	faults := &Faults{SplitDeadLetter: true, BetweenDeadLetterHalves: func() error {
		halves++
		return injected
	}}
	p := openAt(t, path, func(o *Options) { o.Faults = faults })
	q := mustQueue(t, p, "jobs")
	if _, err := q.Enqueue(record("job", 50)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.CountAttempt(1, time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.DeadLetter(1, "jobs/__dlq", nil, time.Unix(200, 0)); !errors.Is(err, injected) {
		t.Fatalf("DeadLetter = %v, want the injected failure", err)
	}
	if halves != 1 {
		t.Fatalf("the hook between the halves ran %d times, want 1", halves)
	}
	inBoth := func(what string, q storage.QueueStore, copies int) {
		t.Helper()
		it, err := q.Get(1)
		if err != nil || it.MessageID != "job" || it.Attempts != 1 {
			t.Fatalf("%s: the job is not in the queue with its attempt: %+v, %v", what, it, err)
		}
		recs, _, err := q.DeadLetters().Read(1, 10)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.MessageID == "job" {
				n++
			}
		}
		if n != copies || q.DeadLetters().Next() != uint64(copies)+1 {
			t.Fatalf("%s: %d copies of the job in the dead-letter log (next %d), want %d", what, n, q.DeadLetters().Next(), copies)
		}
	}
	inBoth("after the split move failed", q, 1)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// Restarted with the split but no failure: the job's attempts are spent,
	// so it is moved again, and the log now holds it twice.
	faults.BetweenDeadLetterHalves = nil
	p = openAt(t, path, func(o *Options) { o.Faults = faults })
	q = mustQueue(t, p, "jobs")
	inBoth("after restart", q, 1)
	moved, err := q.DeadLetter(1, "jobs/__dlq", nil, time.Unix(300, 0))
	if err != nil || moved.Offset != 2 {
		t.Fatalf("second move = offset %d, %v; want 2", moved.Offset, err)
	}
	if _, err := q.Get(1); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a completed split move left the job in the queue: %v", err)
	}
	recs, _, err := q.DeadLetters().Read(1, 10)
	if err != nil || len(recs) != 2 || recs[0].MessageID != "job" || recs[1].MessageID != "job" {
		t.Fatalf("dead-letter log = %v, %v; want the job twice", recs, err)
	}
}

// synchronousOf reads PRAGMA synchronous on the writer connection and on a
// read connection (0 OFF, 1 NORMAL, 2 FULL).
func synchronousOf(t *testing.T, p *Provider) (onWriter, onReader int) {
	t.Helper()
	err := p.do(func(w *writer) error {
		return w.conn.QueryRowContext(context.Background(), `PRAGMA synchronous`).Scan(&onWriter)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.readDB.QueryRow(`PRAGMA synchronous`).Scan(&onReader); err != nil {
		t.Fatal(err)
	}
	return onWriter, onReader
}

// TestInvariant14_NegativeControlSyncOffNeverFsyncs: SyncOff runs every
// connection with synchronous=OFF and the flusher never fsyncs, so nothing
// bounds what a power cut takes. The default is NORMAL with the periodic
// fsync (the loss window invariant 14 promises).
func TestInvariant14_NegativeControlSyncOffNeverFsyncs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  *Faults
		sync    int
		flushes bool
	}{
		{"default", nil, 1, true},
		{"sync-off", &Faults{SyncOff: true}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := openAt(t, newDB(t), func(o *Options) { o.Faults = tc.faults })
			w, r := synchronousOf(t, p)
			if w != tc.sync || r != tc.sync {
				t.Fatalf("synchronous = %d (writer), %d (reader); want %d", w, r, tc.sync)
			}
			l := mustLog(t, p, "events")
			for i := range 3 {
				if _, err := l.Append(record(fmt.Sprint("r", i), 10)); err != nil {
					t.Fatal(err)
				}
				if err := p.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			if got := p.Stats().Flushes > 0; got != tc.flushes {
				t.Fatalf("WAL fsyncs done: %d; want any: %v", p.Stats().Flushes, tc.flushes)
			}
		})
	}
}
