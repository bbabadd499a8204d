package broker

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/metrics"
	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// offerTick: new work and new workers are offered on a fixed 200ms tick; an
// answer, or the PUBACK that reopens a full window, offers at once (docs/channels.md "`queue`"). Not configurable: nobody could reason about another value.
const offerTick = 200 * time.Millisecond

// deliveryState is a job's state while it is out (docs/channels.md "`queue`"):
// AVAILABLE and RESOLVED are not represented; a job in neither of these two
// is available or gone.
type deliveryState int

const (
	delivering deliveryState = iota // PUBLISH handed over, no PUBACK yet: no deadline runs
	leased                          // PUBACK received: the visibility deadline runs
)

// delivery is one attempt to have one worker process one job. It lives only
// in memory: nothing about it is stored, so a restart cannot resurrect it
// (invariant 15).
type delivery struct {
	id       string // the Delivery ID: opaque, unique per attempt, ≤ 32 bytes
	offset   uint64
	worker   *worker
	sink     deliverySink // the worker's connection it was offered on, as its sink
	pid      uint16
	state    deliveryState
	written  bool      // the PUBLISH reached the connection
	counted  bool      // the attempt was counted (at PUBACK or answer)
	ending   bool      // an answer or a lease end is deciding the job's fate: one decision per delivery
	received time.Time // when the worker was handed the job: backoff is measured from here
	deadline time.Time // set at PUBACK (invariant 7), zero while delivering
}

// worker is one session consuming one queue through $saguin/queue/<name>.
//
// The worker is served through its session's delivery sink for the
// connection it consumes on (delivery_sink.go): the engine reaches the
// session's deliveries only through it, as the append and latest pumps do
// (rfcs/delivery-seam.md "The delivery sink"). Two sinks of one session are
// equal exactly when they serve the same connection, which is how a worker
// is told from the same session's next one.
type worker struct {
	sess    *session
	sink    deliverySink
	holding *delivery // one job per worker per queue (docs/channels.md "`queue`")
}

// queueEngine runs one queue: the index of its workers, the jobs out with
// them, and the offer loop. Invariant 4: the broker alone picks the one
// worker a job goes to, from this index; no filter ever reaches a queue.
type queueEngine struct {
	b  *Broker
	ch *channel

	mu      sync.Mutex
	workers []*worker
	last    *worker              // the worker offered to last: round-robin starts after it
	out     map[uint64]*delivery // by offset: the job's current delivery
	byID    map[string]*delivery // current deliveries only: a superseded ID is absent
	waiting map[uint64]time.Time // backoff: not offered before this moment
	epoch   uint64

	// scanFrom: every unresolved job at or below this offset is in out, so
	// an offer pass starts reading after it instead of from the oldest job.
	// Only the offer loop raises it (over jobs it finds or puts in out);
	// every job that leaves out without leaving the queue lowers it below
	// itself (dropOutLocked), so a job that comes back is always read again.
	scanFrom uint64
	// changed: jobs whose stored state changed since the offer loop began
	// reading its current page (true: the job left the queue, resolved or
	// dead-lettered). A job handed over from the page whose entry is absent
	// is exactly as the page shows it (see claimLocked); changedAll says
	// the record overflowed changedLimit and nothing can be trusted.
	changed    map[uint64]bool
	changedAll bool
	// scanPrefix: every job the offer loop looked at since it last started
	// over at scanFrom was out or gone (or put out by it), and none came
	// back since. While it holds, scanFrom follows the loop, and the jobs
	// of page are exactly the next ones a read from scanFrom would find.
	scanPrefix bool

	// cameBack: a job left out without leaving the queue since the offer
	// loop last started over at scanFrom.
	cameBack bool

	// The offer loop's own: jobs read and not yet looked at, in offset
	// order, and the last offset read (the next read continues after it).
	page    []storage.QueueItem
	pageEnd uint64

	kick chan struct{}

	// What the metric catalogue counts of the queue (docs/operations.md "Metrics", "Queues").
	// Each delivery handed over ends in exactly one of acknowledged,
	// returned, redelivered or dead-lettered; dead-lettered and expired
	// also count jobs moved without a delivery (expired while waiting,
	// attempts spent before a restart).
	delivered, acknowledged, returned, redelivered, deadLettered, expired atomic.Uint64
}

// whyTimeout is the lease end a visibility timeout decides: a redelivery,
// where every other end of a delivery not answered ack is a return.
const whyTimeout = "visibility timeout"

func newQueueEngine(b *Broker, ch *channel) *queueEngine {
	return &queueEngine{
		b: b, ch: ch,
		out:     make(map[uint64]*delivery),
		byID:    make(map[string]*delivery),
		waiting: make(map[uint64]time.Time),
		changed: make(map[uint64]bool),
		kick:    make(chan struct{}, 1),
	}
}

func (q *queueEngine) poke() { signal(q.kick) }

// run is the offer loop: offers on every tick and every kick, expires
// leases and sweeps expired jobs. A deaf worker cannot freeze it: every
// write happens on a goroutine of its own (invariant 16).
func (q *queueEngine) run(ctx context.Context) {
	t := q.b.clock.NewTicker(offerTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			q.expireLeases()
		case <-q.kick:
		}
		q.offer()
	}
}

// addWorker registers a session's connection, served through sink k, as a
// worker of this queue.
func (q *queueEngine) addWorker(s *session, k deliverySink) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.workers {
		if w.sess == s {
			w.sink = k
			return
		}
	}
	q.workers = append(q.workers, &worker{sess: s, sink: k})
}

// removeWorker drops a worker whose connection ended (or who unsubscribed)
// and returns the job it held, immediately: the broker knows which it is, so
// nothing waits for a deadline.
func (q *queueEngine) removeWorker(s *session, k deliverySink) {
	q.mu.Lock()
	var held *delivery
	var heldOn deliverySink
	unacked := false
	for i, w := range q.workers {
		if w.sess == s && w.sink == k {
			held, heldOn = w.holding, w.sink
			unacked = held != nil && held.state == delivering
			q.workers = append(q.workers[:i], q.workers[i+1:]...)
			break
		}
	}
	q.mu.Unlock()
	if unacked && heldOn != nil {
		// invariants 4, 15: a delivery not yet PUBACKed leaves the
		// session's ack table with the lease (a stop has taken it out
		// already; an UNSUBSCRIBE has not), so no late PUBACK starts a lease
		// on a job the queue has just taken back and may offer to another
		// worker. (One PUBACKed already freed its packet id, which another
		// delivery may hold by now: release leaves that one alone.)
		heldOn.release(held.pid, queueAck{q: q, d: held})
	}
	if held != nil {
		q.endLease(held, "session ended", held.received)
	}
}

// written learns whether the PUBLISH reached the connection. One that did
// not was never seen by the worker, so it goes back with its attempt unspent
// — by asking whether it was sent, never by a clock on DELIVERING
// (invariant 7).
func (q *queueEngine) written(d *delivery, err error) {
	if err == nil {
		q.mu.Lock()
		d.written = true
		q.mu.Unlock()
		return
	}
	d.sink.release(d.pid, queueAck{q: q, d: d})
	q.mu.Lock()
	// A lease being ended decides the job itself.
	current := q.out[d.offset] == d && !d.ending
	if current {
		q.releaseLocked(d, false)
	}
	q.mu.Unlock()
	if current {
		q.returned.Add(1) // never reached the worker: back, attempt unspent
	}
	if errors.Is(err, packets.ErrPacketTooLarge) {
		// docs/channels.md "What a delivery carries": checked before handover; the chosen worker is
		// disconnected and the job goes back unspent.
		q.b.log.Warn("job larger than the worker's Maximum Packet Size: disconnecting", "queue", q.ch.name,
			"client", d.worker.sess.id, "offset", d.offset)
		d.sink.refuseTooLarge()
	}
	q.poke()
}

// releaseLocked takes a delivery out of every index: its ID is dead from
// here on (the epoch advanced), and its worker is free. left: the job's
// removal from the queue is stored (dropOutLocked).
func (q *queueEngine) releaseLocked(d *delivery, left bool) {
	q.dropOutLocked(d.offset, left)
	delete(q.byID, d.id)
	if d.worker.holding == d {
		d.worker.holding = nil
	}
}

// queueAck routes a worker's PUBACK to its delivery.
type queueAck struct {
	q *queueEngine
	d *delivery
}

// acked: the worker's PUBACK. The attempt is counted now (if an answer has
// not already counted it) and the visibility deadline starts now, never at
// the send: the deadline cannot overlap the transport in-flight window
// (invariant 7). PUBACK is not application acknowledgement (invariant 6).
func (a queueAck) acked(pid uint16) {
	q, d := a.q, a.d
	now := q.b.clock.Now()
	q.mu.Lock()
	if q.out[d.offset] != d {
		q.mu.Unlock()
		return // superseded: the PUBACK only freed the window slot
	}
	count := !d.counted
	d.counted = true
	q.mu.Unlock()
	// The count is stored before the lease starts, so a lease can never end
	// (and read the attempts back) ahead of the count that began it.
	if count {
		q.countAttempt(d, now)
	}
	q.mu.Lock()
	// invariants 6, 7: the PUBACK starts the lease and its deadline, now and not at the send; it resolves nothing.
	if q.out[d.offset] == d && d.state == delivering {
		d.state = leased
		d.deadline = now.Add(q.ch.cfg.VisibilityTimeout)
	}
	q.mu.Unlock()
	q.poke()
}

// countAttempt stores one more attempt. Never refused for capacity (the
// reserve); a failure for another reason is logged and the count is taken
// again when the lease ends.
func (q *queueEngine) countAttempt(d *delivery, now time.Time) {
	_, err := q.ch.queue.CountAttempt(d.offset, now)
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		q.b.log.Error("counting an attempt", "queue", q.ch.name, "offset", d.offset, "error", err)
		d.counted = false
		return
	}
	// Normally the job is still out and its release notes the change too;
	// a count that lands after a lease ended early is noted here.
	q.noteChangedLocked(d.offset, false)
}

// isVerdict reports whether an answer's payload is one of the two a worker
// may give (docs/channels.md "`queue`"): exactly "ack" or
// "return", case and bytes as written — anything else is ignored, never
// guessed at.
func isVerdict(payload string) bool { return payload == "ack" || payload == "return" }

// answer applies a worker's ack or return, brought by session s on the
// connection sink k serves. Invariant 3: it is applied only when the
// Delivery ID is known, is the job's current delivery, and the answering
// session is the one holding it, on the connection it was offered on;
// otherwise it changes nothing and says why it was ignored (and, when
// another session holds the job, which), for the caller to log. The worker
// is told nothing either way.
func (q *queueEngine) answer(s *session, k deliverySink, id []byte, payload string) (ignored, holder string) {
	now := q.b.clock.Now()
	q.mu.Lock()
	// invariant 3: only the current delivery, answered by its holder, decides anything.
	d, ok := q.byID[string(id)]
	switch {
	case !ok:
		q.mu.Unlock()
		return "unknown or superseded delivery", ""
	case q.out[d.offset] != d:
		q.mu.Unlock()
		return "not the job's current delivery", ""
	case d.worker.sess != s || d.worker.sink != k:
		q.mu.Unlock()
		return "another session holds the job", d.worker.sess.id
	case !isVerdict(payload):
		q.mu.Unlock()
		return "payload is neither ack nor return", ""
	}
	// Consuming the Delivery ID advances the epoch: a retry of this very
	// answer finds nothing (invariant 3). The answer decides the job's
	// fate: no lease end (timeout, session end) decides it meanwhile.
	delete(q.byID, d.id)
	d.ending = true
	count := !d.counted
	d.counted = true
	q.mu.Unlock()
	if count {
		// Answering is the stronger evidence the worker had the job.
		q.countAttempt(d, now)
	}
	if payload == "ack" {
		// invariant 6: only the worker's ack resolves a job, never its PUBACK.
		if err := q.ch.queue.Resolve(d.offset); err != nil {
			q.b.log.Error("resolving a job", "queue", q.ch.name, "offset", d.offset, "error", err)
			// Unresolved: the job goes back and is offered again.
			q.settle(d, "resolve failed", now)
			return "", ""
		}
		q.acknowledged.Add(1)
		q.b.log.Debug("job acked", "queue", q.ch.name, "offset", d.offset, "client", s.id)
		q.mu.Lock()
		q.releaseLocked(d, true)
		delete(q.waiting, d.offset)
		q.mu.Unlock()
		q.poke()
		return "", ""
	}
	// A worker that answers is measured from its answer: it waits the
	// whole gap.
	q.settle(d, "returned", now)
	return "", ""
}

// endLease returns a job that was out: to AVAILABLE after what is left of
// the backoff gap (measured from since, when the worker last had it), or to
// the dead-letter channel when its attempts are spent.
func (q *queueEngine) endLease(d *delivery, why string, since time.Time) {
	q.mu.Lock()
	if q.out[d.offset] != d || d.ending {
		q.mu.Unlock()
		return
	}
	// The Delivery ID dies now, but the job stays marked out until it is
	// decided: no offer may take a job that is about to be dead-lettered
	// (invariants 4, 5). The worker stays busy until then too, so the
	// offer that follows finds the job back in its offset order (docs/channels.md), as after an ack.
	d.ending = true
	delete(q.byID, d.id)
	q.mu.Unlock()
	q.settle(d, why, since)
}

// settle decides the fate of a job whose delivery is ending (d.ending set
// by the caller, under the lock): back to AVAILABLE, or dead-lettered.
func (q *queueEngine) settle(d *delivery, why string, since time.Time) {
	defer func() {
		q.mu.Lock()
		if q.out[d.offset] == d {
			q.dropOutLocked(d.offset, false)
		}
		if d.worker.holding == d {
			d.worker.holding = nil
		}
		q.mu.Unlock()
		q.poke()
	}()

	item, err := q.ch.queue.Get(d.offset)
	if err != nil {
		if !errors.Is(err, storage.ErrNotFound) {
			q.b.log.Error("reading a returned job", "queue", q.ch.name, "offset", d.offset, "error", err)
		}
		return
	}
	if max := q.ch.cfg.MaxAttempts; max > 0 && int(item.Attempts) >= max {
		q.deadLetter(d.offset, "attempts_exhausted", d)
		return
	}
	if why == whyTimeout {
		q.redelivered.Add(1)
	} else {
		q.returned.Add(1)
	}
	if gap := q.backoff(item.Attempts); gap > 0 {
		q.mu.Lock()
		q.waiting[d.offset] = since.Add(gap)
		q.mu.Unlock()
	}
	q.b.log.Debug("job back in the queue", "queue", q.ch.name, "offset", d.offset, "why", why, "attempts", item.Attempts)
}

// backoff is the gap after n attempts (docs/channels.md "`queue`").
func (q *queueEngine) backoff(n uint32) time.Duration {
	base := q.ch.cfg.BackoffBase
	if n == 0 || base <= 0 {
		return 0
	}
	switch q.ch.cfg.Backoff {
	case "linear":
		return base * time.Duration(n)
	case "exponential":
		if n > 40 {
			n = 40 // beyond any real max_attempts; keeps the shift defined
		}
		return base * time.Duration(uint64(1)<<(n-1))
	}
	return 0
}

// expireLeases ends every lease whose visibility deadline passed. Only
// LEASED jobs have a deadline; a DELIVERING one is never timed (invariant 7).
// Jobs waiting in the queue past job_expires_after are dead-lettered; jobs
// out with a worker are left alone (they expire at their next offer).
func (q *queueEngine) expireLeases() {
	now := q.b.clock.Now()
	var expired []*delivery
	q.mu.Lock()
	for _, d := range q.out {
		// invariant 7: only a leased (PUBACKed) job has a deadline; a delivering one is never timed.
		if d.state == leased && !d.ending && !now.Before(d.deadline) {
			expired = append(expired, d)
		}
	}
	q.mu.Unlock()
	for _, d := range expired {
		q.b.log.Debug("visibility timeout: job taken back", "queue", q.ch.name, "offset", d.offset, "client", d.worker.sess.id)
		// Measured from when the worker received it: the timeout itself
		// served that much of the gap.
		q.endLease(d, whyTimeout, d.received)
	}
}

// sweepExpired dead-letters waiting jobs older than job_expires_after. A job
// with no timestamp never expires.
func (q *queueEngine) sweepExpired() {
	exp := q.ch.cfg.JobExpiresAfter
	if exp <= 0 {
		return
	}
	now := q.b.clock.Now()
	var after uint64
	for {
		items, err := q.ch.queue.Items(after, 256)
		if err != nil || len(items) == 0 {
			return
		}
		for _, it := range items {
			after = it.Offset
			if it.Timestamp.IsZero() || now.Sub(it.Timestamp) <= exp {
				continue
			}
			// invariant 2: an expired job is dead-lettered, never dropped unprocessed.
			q.deadLetter(it.Offset, "expired", nil) // skipped if it is out with a worker
		}
	}
}

// deadLetter moves a job into <queue>__dlq in one storage transaction
// (invariant 5), keeping its Message ID (invariant 8) and adding the
// saguin-dlq-* headers. A failed move leaves the job where it was.
func (q *queueEngine) deadLetter(offset uint64, reason string, holder *delivery) {
	// Claim the job for the move: a job out with a worker other than the one
	// whose lease is ending here is left alone, and while the move runs no
	// offer can hand the job over (invariants 4, 5).
	claim := holder
	q.mu.Lock()
	if cur := q.out[offset]; cur != holder {
		q.mu.Unlock()
		return
	}
	if claim == nil {
		claim = &delivery{offset: offset, worker: &worker{}}
		q.out[offset] = claim
	}
	q.mu.Unlock()
	moved := false
	defer func() {
		q.mu.Lock()
		if q.out[offset] == claim {
			q.dropOutLocked(offset, moved)
		}
		q.mu.Unlock()
	}()

	item, err := q.ch.queue.Get(offset)
	if err != nil {
		moved = errors.Is(err, storage.ErrNotFound) // gone already
		return
	}
	now := q.b.clock.Now()
	ms := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return strconv.FormatInt(t.UnixMilli(), 10)
	}
	extra := []storage.Header{
		{Name: "saguin-dlq-channel", Value: q.ch.name},
		{Name: "saguin-dlq-offset", Value: strconv.FormatUint(offset, 10)},
		{Name: "saguin-dlq-attempts", Value: strconv.FormatUint(uint64(item.Attempts), 10)},
		{Name: "saguin-dlq-first", Value: ms(item.FirstDelivered)},
		{Name: "saguin-dlq-last", Value: ms(item.LastDelivered)},
		{Name: "saguin-dlq-at", Value: ms(now)},
		{Name: "saguin-dlq-reason", Value: reason},
	}
	dlqTopic, err := topic.DeadLetterTopic(q.ch.cfg.Filters[0], item.Topic)
	if err != nil {
		q.b.log.Error("dead-letter topic", "queue", q.ch.name, "topic", item.Topic, "error", err)
		return
	}
	// invariant 5: one storage operation moves the job; a failed move leaves it in the queue.
	if _, err := q.ch.queue.DeadLetter(offset, dlqTopic, extra, now); err != nil {
		q.b.log.Error("dead-letter move failed; the job stays in the queue", "queue", q.ch.name, "offset", offset, "error", err)
		return
	}
	moved = true
	q.deadLettered.Add(1)
	if reason == "expired" {
		q.expired.Add(1)
	}
	q.mu.Lock()
	delete(q.waiting, offset)
	q.mu.Unlock()
	q.b.log.Info("job dead-lettered", "queue", q.ch.name, "offset", offset, "reason", reason, "attempts", item.Attempts)
	if dlq := q.b.channels[q.ch.cfg.DeadLetter]; dlq != nil {
		dlq.notify()
	}
}

// figures is the queue's read-only view for the metric catalogue
// (metrics_snapshot.go): its counts, and how many jobs are out with a
// worker, under q.mu.
func (q *queueEngine) figures() metrics.QueueFigures {
	f := metrics.QueueFigures{Depth: int64(q.ch.queue.Depth()),
		Delivered: q.delivered.Load(), Acknowledged: q.acknowledged.Load(), Returned: q.returned.Load(),
		Redelivered: q.redelivered.Load(), DeadLettered: q.deadLettered.Load(), Expired: q.expired.Load()}
	q.mu.Lock()
	for _, d := range q.out {
		if d.worker.sess != nil { // not a dead-letter move's claim
			f.Inflight++
		}
	}
	q.mu.Unlock()
	return f
}

// jobView is what the operations listener shows of one job's delivery
// (ops_views.go): none while it waits.
type jobView struct {
	out, leased bool
	holder      string // the client id holding the lease
	leaseUntil  time.Time
}

// jobViews is the view of each item's delivery, in one critical section
// under q.mu.
func (q *queueEngine) jobViews(items []storage.QueueItem) []jobView {
	out := make([]jobView, len(items))
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, it := range items {
		d := q.out[it.Offset]
		if d == nil {
			continue
		}
		out[i].out = true
		if d.state == leased {
			out[i].leased, out[i].holder, out[i].leaseUntil = true, d.worker.sess.id, d.deadline
		}
	}
	return out
}

// unresolved lists up to max of the queue's unresolved jobs, oldest first
// (the operations listener's view).
func (q *queueEngine) unresolved(max int) ([]storage.QueueItem, error) {
	return q.ch.queue.Items(0, max)
}

// depth is how many of the queue's jobs are unresolved.
func (q *queueEngine) depth() int { return q.ch.queue.Depth() }
