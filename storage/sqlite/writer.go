package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"saguin.dev/storage"
)

// The writer owns the provider's one write connection. Every write runs on
// its goroutine, so transactions are serial, a deferred transaction never
// loses a lock upgrade to a sibling, and the in-memory counters (next,
// floor, bytes) have a single writer that advances them only after a commit
// (storage/storage.go "Counters can't fail").
//
// Two kinds of work reach it:
//   - publishes (Append, Enqueue, value Put), collected into group commits: one
//     transaction for up to batchMax records, one counter-row UPDATE per
//     channel per batch, offsets taken in transaction order (invariant 16:
//     a publisher waits on storage, bounded by commits of a known size);
//   - relief writes (counting a queue attempt, resolving a job), collected
//     into groups of their own of up to reliefMax that never wait for
//     company (relief.go);
//   - ops: any other transaction (trim, the dead-letter move, positions,
//     opening a channel, and reads when there is no read pool), each in its
//     own transaction.
//
// A caller returns only after its transaction commits or fails (invariant
// 18: nothing is acknowledged before it is stored).
type writer struct {
	p       *Provider
	conn    *sql.Conn
	st      stmtSet
	pubs    chan *pubReq
	reliefs chan *reliefReq
	ops     chan *opReq
	close   chan struct{} // closed by Provider.Close
	done    chan struct{} // closed when run returns

	ceiling int64 // max_page_count currently set (0: unbounded)
	// waiting is true while a batch waits for company (tests observe it).
	waiting atomic.Bool

	batch       []*pubReq
	reliefBatch []*reliefReq
	touched     []*touch
	// touchedChans are touched's channels, in the order their locks are
	// taken across a COMMIT (txnPublishing).
	touchedChans []*channel
	// pending is what value Puts earlier in the batch being built give
	// their topics (size), so a later Put of the same topic is judged
	// against the value it will actually replace.
	pending map[valueKey]int64
	stats   *stats
}

type valueKey struct {
	ch    *channel
	topic string
}

// pubReq is one record waiting for a publish transaction.
type pubReq struct {
	ch  *channel
	rec storage.Record
	enc encoded
	// alone: a value Put committed by itself, in its place in the batch.
	alone bool
	done  chan struct{}
	out   storage.Record
	err   error
}

// opReq is one transaction run on the writer goroutine.
type opReq struct {
	fn   func(w *writer) error
	done chan error // buffered: the writer never blocks on a caller
}

// touch is a channel's counters as a batch moves them before commit.
// depth is a queue's unresolved items or a value store's values.
type touch struct {
	ch    *channel
	next  uint64
	bytes int64
	depth int
}

type stats struct {
	commitsByRecords  atomic.Uint64
	commitsByInterval atomic.Uint64
	commitsByCommit   atomic.Uint64
	commitsUnbatched  atomic.Uint64
	committedRecords  atomic.Uint64
	commits           atomic.Uint64 // every committed write transaction
	reliefGroups      atomic.Uint64 // relief transactions tried (groups and writes run alone)
	// failures counts calls that failed for a reason no caller expects
	// (wrap): storage.Counters' Errors, with the flusher's.
	failures atomic.Uint64
	// batches counts committed publish transactions (a value Put committed
	// alone included) by how many records each carried, in the buckets
	// batchBuckets names; largestBatch is the most any carried.
	batches      [len(batchBuckets)]atomic.Uint64
	batchRecords atomic.Uint64
	largestBatch atomic.Uint64
}

// batchBuckets are the lower bounds of the batch-size buckets Stats
// reports: how full group commit gets under a load is what they show.
var batchBuckets = [...]int{1, 2, 8, 64, 256}

// batchCommitted counts one committed publish transaction of n records.
func (s *stats) batchCommitted(n int) {
	i := len(batchBuckets) - 1
	for i > 0 && n < batchBuckets[i] {
		i--
	}
	s.batches[i].Add(1)
	s.batchRecords.Add(uint64(n))
	for {
		old := s.largestBatch.Load()
		if uint64(n) <= old || s.largestBatch.CompareAndSwap(old, uint64(n)) {
			break
		}
	}
}

func (w *writer) run() {
	defer func() {
		// done first, then the queue emptied: a submitter whose send lands
		// after this drain sees done closed and empties it itself.
		close(w.done)
		w.failQueued()
	}()
	for {
		select {
		case <-w.close:
			return
		case op := <-w.ops:
			op.done <- op.fn(w)
		case r := <-w.reliefs:
			w.commitReliefs(r)
		case r := <-w.pubs:
			w.collect(r)
		}
	}
}

// collect gathers a batch behind its first record and commits it.
func (w *writer) collect(first *pubReq) {
	batch := append(w.batch[:0], first)
	limit := w.p.opts.batchMax
	closedBy := &w.stats.commitsByCommit
	switch {
	case limit == 1:
		closedBy = &w.stats.commitsUnbatched
	case w.p.opts.commitInterval == 0:
		// Collect without waiting: whatever queued while the previous
		// transaction committed goes now, up to limit. Yielding once lets
		// publishers the last commit woke, runnable but not yet run, send
		// their next record; it waits for nobody.
		runtime.Gosched()
	gather:
		for len(batch) < limit {
			select {
			case r := <-w.pubs:
				batch = append(batch, r)
			default:
				break gather
			}
		}
		if len(batch) == limit {
			closedBy = &w.stats.commitsByRecords
		}
	default:
		// Wait up to the interval for company. The wait holds nothing: other
		// transactions (and reads on the writer) still run meanwhile, so the
		// interval is never a wait for a reader.
		timer := time.NewTimer(w.p.opts.commitInterval)
		closedBy = &w.stats.commitsByInterval
		w.waiting.Store(true)
	wait:
		for len(batch) < limit {
			select {
			case r := <-w.pubs:
				batch = append(batch, r)
			case op := <-w.ops:
				op.done <- op.fn(w)
			case r := <-w.reliefs:
				w.commitReliefs(r)
			case <-timer.C:
				break wait
			case <-w.close:
				break wait
			}
		}
		timer.Stop()
		w.waiting.Store(false)
		if len(batch) == limit {
			closedBy = &w.stats.commitsByRecords
		}
	}
	w.commitPublishes(batch, closedBy)
	clear(batch)
	w.batch = batch[:0]
}

// commitPublishes stores a batch in as few transactions as its order
// allows, and answers each record once the transaction carrying it has
// committed (invariant 18), in the batch's order.
//
// A value Put that replaces a value at least as large is never refused
// (it frees what it takes), but a transaction fails whole, so such a Put
// is committed alone, as a relief transaction (putAlone). It is committed
// in its place: the records before it in the batch go in one transaction
// first, those after it in the next. Held out and committed after the whole
// batch, it took an offset after records submitted later and, replacing a
// later Put of its own topic, left the older value current — one
// publisher's latest values stored out of the order it sent them (MQTT 5
// §4.6), once a connection could have several in flight (storage.Submitter).
func (w *writer) commitPublishes(batch []*pubReq, closedBy *atomic.Uint64) {
	for len(batch) > 0 {
		n := w.commitSegment(batch, closedBy)
		// invariant 18: answered only once the transaction carrying the
		// record has committed (or failed).
		for _, r := range batch[:n] {
			close(r.done)
		}
		batch = batch[n:]
		if len(batch) > 0 && batch[0].alone {
			w.putAlone(batch[0])
			close(batch[0].done)
			batch = batch[1:]
		}
	}
}

// commitSegment stores, in one transaction, the records of batch up to the
// first value Put that must commit alone (marked alone, and not consumed),
// and reports how many it consumed. A record its channel's max_bytes
// refuses is answered before the transaction opens; if the transaction
// fails, every record in it fails and the in-memory counters are
// untouched, so the segment hands back exactly its offsets — none skipped,
// none reused (invariant 9). What a Put replaces is known by a pre-read on
// this connection, which nothing else writes.
func (w *writer) commitSegment(batch []*pubReq, closedBy *atomic.Uint64) int {
	w.touched = w.touched[:0]
	clear(w.pending)
	accepted, n := 0, 0
	for _, r := range batch {
		if r.err != nil {
			n++
			continue
		}
		var old int64
		var replaces bool
		if r.ch.kind == kindLatest {
			var err error
			if old, replaces, err = w.replacedSize(r); err != nil {
				r.err = w.p.wrap("latest "+r.ch.name+": read the value of "+r.rec.Topic, err)
				n++
				continue
			}
			if replaces && old >= r.enc.size {
				r.alone = true
				break
			}
		}
		n++
		t := w.touch(r.ch)
		if bound := r.ch.maxBytes.Load(); bound > 0 && t.bytes+r.enc.size > bound {
			r.err = fmt.Errorf("storage %s: %s %s is at its max_bytes %d: %w", w.p.opts.Name, r.ch.kind, r.ch.name, bound, storage.ErrFull)
			continue
		}
		r.out = cloneRecord(r.rec)
		r.out.Offset = t.next
		t.next++
		t.bytes += r.enc.size - old
		switch {
		case r.ch.kind == kindQueue:
			t.depth++
		case r.ch.kind == kindLatest:
			if !replaces {
				t.depth++
			}
			if w.pending == nil {
				w.pending = map[valueKey]int64{}
			}
			w.pending[valueKey{r.ch, r.rec.Topic}] = r.enc.size
		}
		accepted++
	}
	segment := batch[:n]
	if accepted == 0 {
		return n
	}
	slices.SortFunc(w.touched, func(a, b *touch) int { return cmp.Compare(a.ch.id, b.ch.id) })
	w.touchedChans = w.touchedChans[:0]
	for _, t := range w.touched {
		w.touchedChans = append(w.touchedChans, t.ch)
	}
	err := w.txnPublishing(false, w.touchedChans, func(ctx context.Context) error {
		for _, r := range segment {
			if r.err != nil {
				continue
			}
			if err := w.insert(ctx, r); err != nil {
				return fmt.Errorf("%s %s offset %d: %w", r.ch.kind, r.ch.name, r.out.Offset, err)
			}
		}
		// One counter-row UPDATE per channel per transaction, with the
		// totals. Queue and value bytes are summed at open, not stored.
		for _, t := range w.touched {
			var err error
			if t.ch.kind != kindAppend {
				_, err = w.st[stUpdateNext].ExecContext(ctx, t.next, t.ch.id)
			} else {
				_, err = w.st[stUpdateNextBytes].ExecContext(ctx, t.next, t.bytes, t.ch.id)
			}
			if err != nil {
				return fmt.Errorf("%s %s counters: %w", t.ch.kind, t.ch.name, err)
			}
		}
		return w.beforePublishCommit(accepted)
	}, func() {
		for _, t := range w.touched { // their locks are held (txnPublishing)
			t.ch.next = t.next
			t.ch.bytes = t.bytes
			t.ch.depth = t.depth
		}
	})
	if err != nil {
		err = w.p.wrap("store "+fmt.Sprint(accepted)+" records", err)
		for _, r := range segment {
			if r.err == nil {
				r.err = err
				r.out = storage.Record{}
			}
		}
		return n
	}
	closedBy.Add(1)
	w.stats.committedRecords.Add(uint64(accepted))
	w.stats.batchCommitted(accepted)
	return n
}

// beforePublishCommit runs the test hook Faults.BeforePublishCommit.
func (w *writer) beforePublishCommit(records int) error {
	if f := w.p.opts.Faults; f != nil && f.BeforePublishCommit != nil {
		return f.BeforePublishCommit(records)
	}
	return nil
}

// replacedSize is the size of the value a Put of r replaces: the one an
// earlier Put in this batch gives its topic, else the stored one.
func (w *writer) replacedSize(r *pubReq) (int64, bool, error) {
	if size, ok := w.pending[valueKey{r.ch, r.rec.Topic}]; ok {
		return size, true, nil
	}
	return w.storedValueSize(r.ch, r.rec.Topic)
}

func (w *writer) storedValueSize(ch *channel, topic string) (int64, bool, error) {
	var size int64
	err := w.st[stValueSize].QueryRowContext(context.Background(), ch.id, topic).Scan(&size)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return size, true, nil
}

// putAlone commits one value Put in its own transaction, after the batch it
// was held out of. It reads again what it replaces (the batch may have
// changed it): when that is at least as large the transaction may use the
// reserve, so the Put is not refused for capacity; otherwise it is an
// ordinary write. Either way the delete, the insert and the counter row are
// one transaction, and the counters move only after it commits.
func (w *writer) putAlone(r *pubReq) {
	ch := r.ch
	old, replaces, err := w.storedValueSize(ch, r.rec.Topic)
	if err != nil {
		r.err = w.p.wrap("latest "+ch.name+": read the value of "+r.rec.Topic, err)
		return
	}
	ch.mu.Lock()
	next, bytes, depth := ch.next, ch.bytes, ch.depth
	ch.mu.Unlock()
	out := cloneRecord(r.rec)
	out.Offset = next
	r.out = out
	if !replaces {
		depth++
	}
	err = w.txnPublishing(replaces && old >= r.enc.size, []*channel{ch}, func(ctx context.Context) error {
		if err := w.insert(ctx, r); err != nil {
			return fmt.Errorf("latest %s offset %d: %w", ch.name, next, err)
		}
		if _, err := w.st[stUpdateNext].ExecContext(ctx, int64(next+1), ch.id); err != nil {
			return fmt.Errorf("latest %s counters: %w", ch.name, err)
		}
		return w.beforePublishCommit(1)
	}, func() {
		ch.next, ch.bytes, ch.depth = next+1, bytes+r.enc.size-old, depth
	})
	if err != nil {
		r.err = w.p.wrap("store the value of "+r.rec.Topic+" in "+ch.name, err)
		r.out = storage.Record{}
		return
	}
	w.stats.committedRecords.Add(1)
	w.stats.batchCommitted(1)
}

func (w *writer) touch(ch *channel) *touch {
	for _, t := range w.touched {
		if t.ch == ch {
			return t
		}
	}
	ch.mu.Lock()
	t := &touch{ch: ch, next: ch.next, bytes: ch.bytes, depth: ch.depth}
	ch.mu.Unlock()
	w.touched = append(w.touched, t)
	return t
}

func (w *writer) insert(ctx context.Context, r *pubReq) error {
	rec, e := &r.out, &r.enc
	args := []any{r.ch.id, int64(rec.Offset), rec.MessageID, rec.Topic, e.ts, e.headers,
		e.payload, e.props, rec.Retain, int64(rec.QoS), rec.PublisherID, rec.Bridge, e.size}
	switch r.ch.kind {
	case kindQueue:
		_, err := w.st[stInsertItem].ExecContext(ctx, args...)
		return err
	case kindLatest:
		// Delete and insert, never INSERT OR REPLACE (rfcs/storage-sqlite.md): the
		// replaced value goes in the same transaction the new one comes in.
		if _, err := w.st[stDeleteValue].ExecContext(ctx, r.ch.id, rec.Topic); err != nil {
			return fmt.Errorf("remove the value it replaces: %w", err)
		}
		_, err := w.st[stInsertValue].ExecContext(ctx, args...)
		return err
	}
	_, err := w.st[stInsertRecord].ExecContext(ctx, args...)
	return err
}

// txn runs fn in one write transaction. relief transactions may use the
// reserve: the page ceiling is raised inside them and restored on both the
// commit and the rollback path, because a pragma is not undone by rollback
// (docs/configuration.md "`broker.storage`" "The reserve").
func (w *writer) txn(relief bool, fn func(ctx context.Context) error) (err error) {
	return w.txnPublishing(relief, nil, fn, nil)
}

// txnPublishing is txn for a transaction that gives records offsets in
// chans: apply moves those channels' in-memory counters (next, bytes,
// depth), and runs under their locks, taken before the COMMIT and let go
// after it. So Next never answers below an offset a read connection can
// already see: a consumer may read a record the moment its COMMIT is
// visible, hand it to a client, and that client's seek to the head
// (Next) must then come back past it — it waits for apply instead of
// reading the counter the COMMIT is about to move. Found by the chaos
// harness: a seek to -1 answered next=5285 after a reader had been sent
// offset 5285 (rfcs/storage-sqlite.md "Counters move with the COMMIT").
// Only the writer goroutine takes more than one channel's lock, in the
// order of chans (callers pass them sorted by id, or one), and no other
// holder of a channel's lock waits on the writer, so none of this can
// deadlock. A failed COMMIT runs no apply: the counters stay where the
// stored state is.
func (w *writer) txnPublishing(relief bool, chans []*channel, fn func(ctx context.Context) error, apply func()) (err error) {
	ctx := context.Background()
	want := w.p.opts.ordinaryPages
	if relief {
		want = w.p.opts.reliefPages
	}
	// Set before every transaction, not just restored after relief: if a
	// restore ever failed, the next ordinary write must fail rather than eat
	// the reserve.
	if err := w.setCeiling(ctx, want); err != nil {
		return err
	}
	if relief {
		defer func() {
			if cerr := w.setCeiling(ctx, w.p.opts.ordinaryPages); cerr != nil {
				w.p.opts.Logger.Error("storage could not restore its page ceiling after a relief write; the next write retries",
					"provider", w.p.opts.Name, "error", cerr)
			}
		}()
	}
	if _, err := w.st[stBegin].ExecContext(ctx); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(ctx); err != nil {
		// SQLite may already have rolled back (it may on SQLITE_FULL or an
		// I/O error); a ROLLBACK finding no transaction is not news.
		if _, rbErr := w.st[stRollback].ExecContext(ctx); rbErr != nil && !isNoTxn(rbErr) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		if errors.Is(err, errNoChange) {
			return nil
		}
		return err
	}
	for _, ch := range chans {
		ch.mu.Lock()
	}
	_, err = w.st[stCommit].ExecContext(ctx)
	if err == nil && apply != nil {
		if f := w.p.opts.Faults; f != nil && f.AfterPublishCommit != nil {
			f.AfterPublishCommit()
		}
		apply()
	}
	for i := len(chans) - 1; i >= 0; i-- {
		chans[i].mu.Unlock()
	}
	if err != nil {
		// A failed COMMIT may leave the transaction open; end it so the
		// connection is clean for the next one.
		if _, rbErr := w.st[stRollback].ExecContext(ctx); rbErr != nil && !isNoTxn(rbErr) {
			return errors.Join(fmt.Errorf("commit: %w", err), fmt.Errorf("rollback: %w", rbErr))
		}
		return fmt.Errorf("commit: %w", err)
	}
	w.stats.commits.Add(1)
	w.refreshPages(ctx)
	return nil
}

// readTxn runs a read on the writer connection (read_connections: 0).
func (w *writer) readTxn(fn func(q querier) error) error {
	ctx := context.Background()
	if _, err := w.st[stBegin].ExecContext(ctx); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err := fn(writerQuerier{w})
	if _, cerr := w.st[stCommit].ExecContext(ctx); cerr != nil && err == nil {
		err = fmt.Errorf("end read: %w", cerr)
	}
	return err
}

func (w *writer) setCeiling(ctx context.Context, pages int64) error {
	if pages == 0 || pages == w.ceiling {
		return nil
	}
	if _, err := w.conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		w.ceiling = -1
		return fmt.Errorf("set page ceiling %d: %w", pages, err)
	}
	w.ceiling = pages
	return nil
}

func (w *writer) refreshPages(ctx context.Context) {
	var n int64
	if err := w.st[stPageCount].QueryRowContext(ctx).Scan(&n); err == nil {
		w.p.pages.Store(n)
	}
}

func isNoTxn(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR
}

// isFull reports SQLITE_FULL: the page ceiling, or the disk itself.
func isFull(err error) bool {
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL
}

// publish hands a record to the writer and waits for its transaction.
func (p *Provider) publish(ch *channel, rec storage.Record) (storage.Record, error) {
	r := p.submit(ch, rec)
	<-r.done
	return r.out, r.err
}

// submit gives rec its place in the writer's queue of publishes and
// returns at once: the queue is one FIFO for every channel of the
// provider, and batches are committed (and answered) in its order, so one
// goroutine's submissions take offsets, and are answered, in the order it
// made them (storage.Submitter). The send waits only while the queue is
// full (batchMax records waiting behind the transaction committing):
// backpressure, bounded by the writer's progress (invariant 13).
func (p *Provider) submit(ch *channel, rec storage.Record) *pubReq {
	r := &pubReq{ch: ch, rec: rec, done: make(chan struct{})}
	if p.closed.Load() {
		r.fail(p.errClosed())
		return r
	}
	enc, err := encodeRecord(&r.rec)
	if err != nil {
		r.fail(fmt.Errorf("storage %s: %s %s: %w", p.opts.Name, ch.kind, ch.name, err))
		return r
	}
	r.enc = enc
	select {
	case p.w.pubs <- r:
	case <-p.w.close:
		r.fail(p.errClosed())
		return r
	}
	// A writer that has stopped takes nothing more from the queue: what
	// is left there (r, if the send raced the close) is answered here.
	select {
	case <-p.w.done:
		p.w.failQueued()
	default:
	}
	return r
}

// failQueued answers ErrClosed to every publish left in the queue once the
// writer has stopped: none of them was stored, and none may be left
// waiting. Run by the writer as it stops and by a submitter that finds it
// stopped; a record is received from the queue once, so answered once.
func (w *writer) failQueued() {
	for {
		select {
		case r := <-w.pubs:
			r.fail(w.p.errClosed())
		default:
			return
		}
	}
}

// fail answers a publish that was never stored.
func (r *pubReq) fail(err error) {
	r.out, r.err = storage.Record{}, err
	close(r.done)
}

// Done and Result make a pubReq the storage.Pending that Submit returns.
func (r *pubReq) Done() <-chan struct{}           { return r.done }
func (r *pubReq) Result() (storage.Record, error) { return r.out, r.err }

// do runs fn as one op on the writer goroutine and waits for it.
func (p *Provider) do(fn func(w *writer) error) error {
	if p.closed.Load() {
		return p.errClosed()
	}
	op := &opReq{fn: fn, done: make(chan error, 1)}
	select {
	case p.w.ops <- op:
	case <-p.w.close:
		return p.errClosed()
	}
	select {
	case err := <-op.done:
		return err
	case <-p.w.done:
		select {
		case err := <-op.done:
			return err
		default:
			return p.errClosed()
		}
	}
}

// wrap names the provider and turns SQLITE_FULL into storage.ErrFull.
func (p *Provider) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrNotFound) ||
		errors.Is(err, storage.ErrClosed) || errors.Is(err, storage.ErrBelowFloor) ||
		errors.Is(err, storage.ErrBeyondEnd) {
		return err
	}
	if isFull(err) {
		return fmt.Errorf("storage %s: %s: %w (%w)", p.opts.Name, what, storage.ErrFull, err)
	}
	p.stats.failures.Add(1)
	return fmt.Errorf("storage %s: %s: %w", p.opts.Name, what, err)
}

func (p *Provider) errClosed() error {
	return fmt.Errorf("storage %s: %w", p.opts.Name, storage.ErrClosed)
}
