package sqlite

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"saguin.dev/storage"
)

// emptyAndRestart is the invariant 1 and 9 scenario: fill a channel, trim
// it to empty, close, reopen, append. It returns every way the reopened
// provider breaks the invariants, so the same check can be shown to catch
// the bug when Faults re-create it.
func emptyAndRestart(t *testing.T, faults *Faults) []string {
	t.Helper()
	path := newDB(t)
	mod := func(o *Options) { o.Faults = faults }
	p := openAt(t, path, mod)
	l := mustLog(t, p, "events")
	for i := range 5 {
		if _, err := l.Append(record(fmt.Sprint("r", i), 10)); err != nil {
			t.Fatal(err)
		}
	}
	if removed, _, err := l.Trim(time.Time{}, 1); err != nil || removed != 5 {
		t.Fatalf("Trim to empty = %d, %v", removed, err)
	}
	if l.Next() != 6 || l.Floor() != 6 || l.Bytes() != 0 {
		t.Fatalf("emptied: next %d floor %d bytes %d", l.Next(), l.Floor(), l.Bytes())
	}
	// A consumer had read and acknowledged everything: its position is 6.
	if err := l.SavePosition(storage.Position{Reader: "bridge:b", Offset: 6}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = openAt(t, path, mod)
	l = mustLog(t, p, "events")
	var bad []string
	if l.Next() != 6 {
		bad = append(bad, fmt.Sprintf("invariant 9: next after reopen is %d, want 6", l.Next()))
	}
	if l.Floor() != 6 {
		bad = append(bad, fmt.Sprintf("invariant 1: floor after reopen is %d, want 6", l.Floor()))
	}
	if _, _, err := l.Read(1, 10); !errors.Is(err, storage.ErrBelowFloor) {
		bad = append(bad, fmt.Sprintf("invariant 1: Read(1) on the emptied channel = %v, want ErrBelowFloor", err))
	}
	r, err := l.Append(record("after", 10))
	if err != nil {
		t.Fatal(err)
	}
	if r.Offset != 6 {
		bad = append(bad, fmt.Sprintf("invariant 9: the first append after reopen took offset %d, want 6", r.Offset))
	}
	// The stored position must still name the record after everything it
	// acknowledged, not an old offset handed out again.
	pos, _, err := l.Position("bridge:b")
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := l.Read(pos.Offset, 1)
	if err != nil || len(got) != 1 || got[0].MessageID != "after" {
		bad = append(bad, fmt.Sprintf("invariant 9: the consumer's position %d does not lead to the new record (%v, %v)", pos.Offset, got, err))
	}
	return bad
}

func TestInvariant01_EmptiedChannelKeepsItsFloorAcrossRestart(t *testing.T) {
	if bad := emptyAndRestart(t, nil); len(bad) > 0 {
		t.Fatal(bad)
	}
}

func TestInvariant09_OffsetsContinueAfterEmptyingAndRestart(t *testing.T) {
	if bad := emptyAndRestart(t, nil); len(bad) > 0 {
		t.Fatal(bad)
	}
}

// TestInvariant09_NegativeControlMaxPlusOneIsCaught switches on the bug the
// invariant forbids (next = MAX(offset)+1 at open) and shows the check
// above notices it: an offset is handed out again.
func TestInvariant09_NegativeControlMaxPlusOneIsCaught(t *testing.T) {
	bad := emptyAndRestart(t, &Faults{NextOffsetFromMaxPlusOne: true})
	if len(bad) == 0 {
		t.Fatal("with NextOffsetFromMaxPlusOne the emptied-channel check found nothing: it cannot guard invariant 9")
	}
	reused := false
	for _, b := range bad {
		if b == "invariant 9: the first append after reopen took offset 1, want 6" {
			reused = true
		}
	}
	if !reused {
		t.Fatalf("expected offset 1 to be reissued, got %v", bad)
	}
}

// TestInvariant09_ConcurrentAppendsTakeDenseUniqueOffsets: 64 goroutines on
// two channels; group commit must give every record its own offset, dense
// from 1, and the stored next must agree.
func TestInvariant09_ConcurrentAppendsTakeDenseUniqueOffsets(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	logs := []storage.AppendLog{mustLog(t, p, "a"), mustLog(t, p, "b")}
	const workers, each = 64, 40
	var mu sync.Mutex
	got := map[storage.AppendLog]map[uint64]string{logs[0]: {}, logs[1]: {}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			l := logs[w%2]
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				r, err := l.Append(record(id, 16))
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				mu.Lock()
				if prev, dup := got[l][r.Offset]; dup {
					t.Errorf("offset %d given to %s and %s", r.Offset, prev, id)
				}
				got[l][r.Offset] = id
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	check := func(what string, p *Provider) {
		for i, name := range []string{"a", "b"} {
			l := mustLog(t, p, name)
			want := uint64(workers / 2 * each)
			if l.Next() != want+1 {
				t.Fatalf("%s: %s next %d, want %d", what, name, l.Next(), want+1)
			}
			recs, _, err := l.Read(1, int(want)+10)
			if err != nil || uint64(len(recs)) != want {
				t.Fatalf("%s: %s holds %d records, %v; want %d", what, name, len(recs), err, want)
			}
			for k, r := range recs {
				if r.Offset != uint64(k+1) || got[logs[i]][r.Offset] != r.MessageID {
					t.Fatalf("%s: %s record %d is offset %d id %s; the appender was told %s", what, name, k, r.Offset, r.MessageID, got[logs[i]][r.Offset])
				}
			}
		}
	}
	check("live", p)
	if s := p.Stats(); s.CommittedRecords != workers*each {
		t.Fatalf("committed %d records, want %d", s.CommittedRecords, workers*each)
	}
	p.Close()
	check("reopened", openAt(t, path, nil))
}

// TestInvariant09_FailedBatchHandsBackItsOffsets: concurrent appenders on
// two channels run a small provider into its bound. Batches that fail
// (SQLITE_FULL aborts the whole transaction) must hand back exactly their
// offsets: what was acknowledged is dense from 1, nothing refused was
// stored, and next is one past the last acknowledged offset.
func TestInvariant09_FailedBatchHandsBackItsOffsets(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, func(o *Options) { o.MaxBytes, o.Reserve = 160<<10, 8<<10 })
	logs := []storage.AppendLog{mustLog(t, p, "a"), mustLog(t, p, "b")}
	var refused atomic.Int64
	var mu sync.Mutex
	acked := map[storage.AppendLog][]uint64{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			l := logs[w%2]
			for i := 0; ; i++ {
				r, err := l.Append(record(fmt.Sprintf("w%d-%d", w, i), 900))
				if errors.Is(err, storage.ErrFull) {
					refused.Add(1)
					return
				}
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				mu.Lock()
				acked[l] = append(acked[l], r.Offset)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if refused.Load() != 16 {
		t.Fatalf("%d appenders were refused, want all 16", refused.Load())
	}
	for _, l := range logs {
		offs := acked[l]
		slices.Sort(offs)
		for i, o := range offs {
			if o != uint64(i+1) {
				t.Fatalf("acknowledged offsets are not dense from 1: position %d holds %d", i, o)
			}
		}
		if l.Next() != uint64(len(offs))+1 {
			t.Fatalf("next %d after %d acknowledged appends: failed batches did not hand back their offsets", l.Next(), len(offs))
		}
		recs, _, err := l.Read(1, len(offs)+10)
		if err != nil || len(recs) != len(offs) {
			t.Fatalf("log holds %d records, %v; %d were acknowledged", len(recs), err, len(offs))
		}
	}
	// Room made by retention: the next append takes the very next offset.
	if _, _, err := logs[0].Trim(time.Time{}, 1); err != nil {
		t.Fatal(err)
	}
	n := logs[0].Next()
	if r, err := logs[0].Append(record("after", 10)); err != nil || r.Offset != n {
		t.Fatalf("append after trim = offset %d, %v; want %d", r.Offset, err, n)
	}
}

// TestInvariant09_RefusedRecordTakesNoOffset: in one batch, a record its
// channel's max_bytes refuses is answered before the transaction and takes
// no offset; the records around it are stored densely.
func TestInvariant09_RefusedRecordTakesNoOffset(t *testing.T) {
	p := openAt(t, newDB(t), nil)
	l := mustLog(t, p, "a")
	small, big := record("s", 10), record("b", 5000)
	l.SetMaxBytes(4000)
	var wg sync.WaitGroup
	var bigRefused atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			r := small
			if w%4 == 0 {
				r = big
			}
			_, err := l.Append(r)
			switch {
			case errors.Is(err, storage.ErrFull) && w%4 == 0:
				bigRefused.Add(1)
			case err != nil:
				t.Errorf("Append %d: %v", w, err)
			}
		})
	}
	wg.Wait()
	if bigRefused.Load() != 8 {
		t.Fatalf("%d oversized records refused, want 8", bigRefused.Load())
	}
	recs, _, err := l.Read(1, 100)
	if err != nil || len(recs) != 24 || l.Next() != 25 {
		t.Fatalf("%d records, next %d, %v; want 24, 25", len(recs), l.Next(), err)
	}
	for i, r := range recs {
		if r.Offset != uint64(i+1) || r.MessageID != "s" {
			t.Fatalf("record %d: offset %d id %s", i, r.Offset, r.MessageID)
		}
	}
}

// TestInvariant01_ReadNeverStraddlesATrim: while one goroutine appends and
// trims, readers ask for offsets that are being removed. Each answer is
// either ErrBelowFloor or records starting exactly at the offset asked,
// contiguous, never the oldest survivor.
func TestInvariant01_ReadNeverStraddlesATrim(t *testing.T) {
	for _, rc := range []int{2, 0} {
		t.Run(fmt.Sprint("read_connections=", rc), func(t *testing.T) {
			p := openAt(t, newDB(t), func(o *Options) { o.ReadConnections = rc })
			l := mustLog(t, p, "events")
			x := record("x", 20)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				defer close(stop)
				for range 60 {
					for range 4 {
						if _, err := l.Append(x); err != nil {
							t.Error(err)
							return
						}
					}
					if _, _, err := l.Trim(time.Time{}, 3*x.Size()); err != nil {
						t.Error(err)
						return
					}
				}
			})
			var served, refused atomic.Int64
			for range 2 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						from := l.Floor()
						recs, floor, err := l.Read(from, 8)
						switch {
						case errors.Is(err, storage.ErrBelowFloor):
							if floor <= from {
								t.Errorf("Read(%d) refused with floor %d", from, floor)
							}
							refused.Add(1)
						case err != nil:
							t.Error(err)
							return
						default:
							if floor > from {
								t.Errorf("Read(%d) served with floor %d above it", from, floor)
							}
							for i, r := range recs {
								if r.Offset != from+uint64(i) {
									t.Errorf("Read(%d) record %d has offset %d", from, i, r.Offset)
								}
							}
							served.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if served.Load() == 0 {
				t.Fatal("no read was served")
			}
		})
	}
}

// TestInvariant05_DeadLetterMoveIsAtomic: a failure between the two halves
// of the move (record written to the dead-letter log, not yet removed from
// the queue) rolls back both. The record is still in the queue with its
// attempts, the dead-letter log is unchanged, and its next offset was not
// consumed — in memory and after a restart.
func TestInvariant05_DeadLetterMoveIsAtomic(t *testing.T) {
	path := newDB(t)
	var fail atomic.Bool
	faults := &Faults{BetweenDeadLetterHalves: func() error {
		if fail.Load() {
			return errors.New("injected failure between the halves")
		}
		return nil
	}}
	p := openAt(t, path, func(o *Options) { o.Faults = faults })
	q := mustQueue(t, p, "jobs")
	for i := range 3 {
		if _, err := q.Enqueue(record(fmt.Sprint("job", i), 50)); err != nil {
			t.Fatal(err)
		}
	}
	// One earlier, successful move so the log has a next of 2.
	if _, err := q.DeadLetter(1, "jobs/__dlq", nil, time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	at1, at2 := time.Unix(200, 0), time.Unix(300, 0)
	for _, at := range []time.Time{at1, at2} {
		if _, err := q.CountAttempt(2, at); err != nil {
			t.Fatal(err)
		}
	}
	before, err := q.Get(2)
	if err != nil {
		t.Fatal(err)
	}
	d := q.DeadLetters()
	dlqBefore, _, _ := d.Read(1, 10)
	dNext, dBytes, qDepth, qBytes := d.Next(), d.Bytes(), q.Depth(), q.Bytes()

	fail.Store(true)
	_, err = q.DeadLetter(2, "jobs/__dlq", []storage.Header{{Name: "saguin-dlq-reason", Value: "x"}}, time.Unix(400, 0))
	if err == nil {
		t.Fatal("DeadLetter succeeded through an injected failure")
	}
	check := func(what string, q storage.QueueStore) {
		t.Helper()
		it, err := q.Get(2)
		if err != nil {
			t.Fatalf("%s: the record left the queue: %v", what, err)
		}
		if it.Attempts != 2 || !it.FirstDelivered.Equal(at1) || !it.LastDelivered.Equal(at2) || it.MessageID != before.MessageID {
			t.Fatalf("%s: queue item changed: %+v", what, it)
		}
		d := q.DeadLetters()
		if d.Next() != dNext || d.Bytes() != dBytes || q.Depth() != qDepth || q.Bytes() != qBytes {
			t.Fatalf("%s: counters moved: dlq next %d bytes %d, queue depth %d bytes %d; want %d %d %d %d",
				what, d.Next(), d.Bytes(), q.Depth(), q.Bytes(), dNext, dBytes, qDepth, qBytes)
		}
		recs, _, err := d.Read(1, 10)
		if err != nil || len(recs) != len(dlqBefore) || recs[0].MessageID != dlqBefore[0].MessageID {
			t.Fatalf("%s: dead-letter log changed: %d records, %v", what, len(recs), err)
		}
	}
	check("after the failed move", q)
	p.Close()
	p = openAt(t, path, func(o *Options) { o.Faults = faults })
	q = mustQueue(t, p, "jobs")
	check("after restart", q)

	// The offset not consumed is the one the next successful move takes.
	fail.Store(false)
	moved, err := q.DeadLetter(2, "jobs/__dlq", nil, time.Unix(500, 0))
	if err != nil || moved.Offset != dNext || moved.MessageID != before.MessageID {
		t.Fatalf("move after the failure = offset %d id %s, %v; want %d %s", moved.Offset, moved.MessageID, err, dNext, before.MessageID)
	}
	if _, err := q.Get(2); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("moved record still in the queue: %v", err)
	}
}

// TestInvariant18_AppendReturnsOnlyAfterCommit: the moment Append returns,
// another connection (the read pool sees only committed data) finds the
// record. Run concurrently so group commits are exercised.
func TestInvariant18_AppendReturnsOnlyAfterCommit(t *testing.T) {
	p := openAt(t, newDB(t), func(o *Options) { o.ReadConnections = 2 })
	l := mustLog(t, p, "events")
	q := mustQueue(t, p, "jobs")
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 20 {
				id := fmt.Sprintf("w%d-%d", w, i)
				r, err := l.Append(record(id, 8))
				if err != nil {
					t.Error(err)
					return
				}
				got, _, err := l.Read(r.Offset, 1)
				if err != nil || len(got) != 1 || got[0].MessageID != id {
					t.Errorf("record %s at %d not visible to a reader after Append returned: %v %v", id, r.Offset, got, err)
					return
				}
				j, err := q.Enqueue(record(id, 8))
				if err != nil {
					t.Error(err)
					return
				}
				if it, err := q.Get(j.Offset); err != nil || it.MessageID != id {
					t.Errorf("job %s at %d not visible after Enqueue returned: %v", id, j.Offset, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestTheIntervalIsNotAWaitForAReader: while a publish transaction waits
// for company, reads and other transactions on the writer still run — the
// leader waits holding nothing (rfcs/storage-sqlite.md).
func TestTheIntervalIsNotAWaitForAReader(t *testing.T) {
	p := openAt(t, newDB(t), func(o *Options) {
		o.ReadConnections = 0 // every read must pass through the writer
		o.PublishCommitInterval = MaxCommitInterval
		o.PublishCommitMaxRecords = 2
	})
	// An interval far longer than any test: if a read waited for it, the
	// test would time out rather than pass by luck.
	p.opts.commitInterval = time.Hour
	l := mustLog(t, p, "events")
	first := make(chan error, 1)
	go func() {
		_, err := l.Append(record("first", 10))
		first <- err
	}()
	for !p.w.waiting.Load() {
		time.Sleep(time.Millisecond)
	}
	if recs, floor, err := l.Read(1, 10); err != nil || len(recs) != 0 || floor != 1 {
		t.Fatalf("Read during the wait = %d records, floor %d, %v", len(recs), floor, err)
	}
	if err := l.SavePosition(storage.Position{Reader: "bridge:b", Offset: 1}); err != nil {
		t.Fatalf("SavePosition during the wait: %v", err)
	}
	select {
	case err := <-first:
		t.Fatalf("the first append returned before its batch closed: %v", err)
	default:
	}
	// The second record closes the batch by count.
	if r, err := l.Append(record("second", 10)); err != nil || r.Offset != 2 {
		t.Fatalf("second append = %d, %v", r.Offset, err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.CommitsByRecords != 1 || s.CommitsByInterval != 0 || s.CommittedRecords != 2 {
		t.Fatalf("stats %+v: want one transaction of two records closed by count", s)
	}
}

// The batch-size counters count each committed publish transaction once,
// in the bucket of the records it carried, and the close line states them:
// what the benchmark reads to see how full group commit got.
func TestBatchCountersAndCloseLine(t *testing.T) {
	var logged strings.Builder
	var mu sync.Mutex
	p := openAt(t, newDB(t), func(o *Options) {
		o.PublishCommitInterval = MaxCommitInterval
		o.PublishCommitMaxRecords = 3
		o.Logger = slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logged.Write(b)
		}), nil))
	})
	p.opts.commitInterval = time.Hour // only the count closes a batch
	l := mustLog(t, p, "events")
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			if _, err := l.Append(record(fmt.Sprint("r", i), 10)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	s := p.Stats()
	if s.Batches != [5]uint64{0, 1, 0, 0, 0} || s.LargestBatch != 3 || s.BatchedRecords != 3 {
		t.Fatalf("stats %+v: want one transaction of 3 records, in the 2-7 bucket", s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := `msg="storage closed" provider=test type=sqlite publish_transactions=1 publish_records=3 largest_transaction=3 transactions_by_records="1:0 2-7:1 8-63:0 64-255:0 256+:0"`
	if !strings.Contains(logged.String(), want) {
		t.Fatalf("close line missing; want %s in:\n%s", want, logged.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// invariant 18: a submitted record is answered only once the transaction
// carrying it has committed. With the commit held, nothing submitted is
// answered; the records submitted meanwhile wait in the queue and go
// together in the next transaction, and each is answered as its own
// transaction commits, in submission order.
func TestInvariant18_SubmitAnsweredOnlyAfterItsCommit(t *testing.T) {
	held := make(chan int, 8)
	release := make(chan struct{})
	p := openAt(t, newDB(t), func(o *Options) {
		o.Faults = &Faults{BeforePublishCommit: func(n int) error {
			held <- n
			<-release
			return nil
		}}
	})
	l := mustLog(t, p, "events")
	sub := l.(storage.Submitter)
	first := sub.Submit(record("first", 10))
	if n := <-held; n != 1 {
		t.Fatalf("the first transaction carries %d records, want 1", n)
	}
	var rest []storage.Pending
	for i := range 20 {
		rest = append(rest, sub.Submit(record(fmt.Sprint("r", i), 10)))
	}
	for i, pd := range append([]storage.Pending{first}, rest...) {
		select {
		case <-pd.Done():
			t.Fatalf("submission %d answered while the first commit is held", i)
		default:
		}
	}
	release <- struct{}{}
	<-first.Done()
	if rec, err := first.Result(); err != nil || rec.Offset != 1 {
		t.Fatalf("first: offset %d, %v; want 1", rec.Offset, err)
	}
	if n := <-held; n != 20 {
		t.Fatalf("the second transaction carries %d records, want the 20 submitted meanwhile", n)
	}
	for i, pd := range rest {
		select {
		case <-pd.Done():
			t.Fatalf("submission %d answered before its commit", i+1)
		default:
		}
	}
	release <- struct{}{}
	for i, pd := range rest {
		<-pd.Done()
		if rec, err := pd.Result(); err != nil || rec.Offset != uint64(i+2) {
			t.Fatalf("submission %d: offset %d, %v; want %d", i+1, rec.Offset, err, i+2)
		}
	}
}

// invariant 9 (what a client is told of the log's end): Next never answers
// below an offset a read connection can already see. A record is readable
// the moment its COMMIT is, a consumer may hand it to a client at once, and
// that client's seek to the head answers Next: a Next behind the COMMIT
// would tell it the record's offset is still free. Found by the chaos
// harness (a seek to -1 answered next=5285 after offset 5285 had been
// delivered). With the writer held just after the COMMIT, a Read sees the
// record; Next, asked then, must not answer at or below it.
func TestInvariant09_NextNeverBehindWhatAReaderSees(t *testing.T) {
	committed := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	p := openAt(t, newDB(t), func(o *Options) {
		o.Faults = &Faults{AfterPublishCommit: func() {
			once.Do(func() {
				committed <- struct{}{}
				<-release
			})
		}}
	})
	l := mustLog(t, p, "events")
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(record("r1", 10))
		appended <- err
	}()
	<-committed
	recs, _, err := l.Read(1, 10)
	if err != nil || len(recs) != 1 {
		close(release)
		t.Fatalf("a read after the COMMIT: %d records, %v; want the one committed", len(recs), err)
	}
	next := make(chan uint64, 1)
	go func() { next <- l.Next() }()
	select {
	case n := <-next:
		close(release)
		if n <= recs[0].Offset {
			t.Fatalf("Next answered %d while a reader already sees offset %d", n, recs[0].Offset)
		}
	case <-time.After(200 * time.Millisecond):
		// Next waits for the counters to move with the COMMIT; let it.
		close(release)
		if n := <-next; n <= recs[0].Offset {
			t.Fatalf("Next answered %d after the COMMIT of offset %d", n, recs[0].Offset)
		}
	}
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
}
