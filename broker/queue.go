package broker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// offerTick: new work and new workers are offered on a fixed 200ms tick; an
// answer, or the PUBACK that reopens a full window, offers at once (RFC 0003
// "Delivery"). Not configurable: nobody could reason about another value.
const offerTick = 200 * time.Millisecond

// offerScanLimit bounds how many stored jobs one offer pass reads past
// (jobs out with workers or waiting out a backoff) looking for one to hand
// over (invariant 13).
const offerScanLimit = 4096

// deliveryState is a job's state while it is out (RFC 0003 "States"):
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
	pid      uint16
	state    deliveryState
	written  bool      // the PUBLISH reached the connection
	counted  bool      // the attempt was counted (at PUBACK or answer)
	received time.Time // when the worker was handed the job: backoff is measured from here
	deadline time.Time // set at PUBACK (invariant 7), zero while delivering
}

// worker is one session consuming one queue through $saguin/queue/<name>.
type worker struct {
	sess    *session
	cl      *mqtt.Client
	holding *delivery // one job per worker per queue (RFC 0003 "Delivery")
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

	kick chan struct{}
}

func newQueueEngine(b *Broker, ch *channel) *queueEngine {
	return &queueEngine{
		b: b, ch: ch,
		out:     make(map[uint64]*delivery),
		byID:    make(map[string]*delivery),
		waiting: make(map[uint64]time.Time),
		kick:    make(chan struct{}, 1),
	}
}

func (q *queueEngine) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

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

// addWorker registers a session's connection as a worker of this queue.
func (q *queueEngine) addWorker(s *session, cl *mqtt.Client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.workers {
		if w.sess == s {
			w.cl = cl
			return
		}
	}
	q.workers = append(q.workers, &worker{sess: s, cl: cl})
}

// removeWorker drops a worker whose connection ended (or who unsubscribed)
// and returns the job it held, immediately: the broker knows which it is, so
// nothing waits for a deadline.
func (q *queueEngine) removeWorker(s *session, cl *mqtt.Client) {
	q.mu.Lock()
	var held *delivery
	for i, w := range q.workers {
		if w.sess == s && (cl == nil || w.cl == cl) {
			held = w.holding
			q.workers = append(q.workers[:i], q.workers[i+1:]...)
			break
		}
	}
	q.mu.Unlock()
	if held != nil {
		q.endLease(held, "session ended", held.received)
	}
}

// offer hands jobs to free workers, round-robin over those that are live,
// hold no job from this queue and have room in their window.
func (q *queueEngine) offer() {
	now := q.b.clock.Now()
	for {
		q.mu.Lock()
		w := q.freeWorkerLocked()
		q.mu.Unlock()
		if w == nil {
			return
		}
		item, ok := q.nextAvailable(now)
		if !ok {
			return
		}
		if exp := q.ch.cfg.JobExpiresAfter; exp > 0 && !item.Timestamp.IsZero() && now.Sub(item.Timestamp) > exp {
			// Out of time rather than out of attempts: dead-lettered whatever
			// its attempt count, without further delivery.
			q.deadLetter(item.Offset, "expired", nil)
			continue
		}
		if !q.handOver(w, item, now) {
			return
		}
	}
}

// freeWorkerLocked picks the next worker in round-robin order that can take
// a job now.
func (q *queueEngine) freeWorkerLocked() *worker {
	n := len(q.workers)
	start := 0
	for i, w := range q.workers {
		if w == q.last {
			start = i + 1
			break
		}
	}
	for i := 0; i < n; i++ {
		w := q.workers[(start+i)%n]
		if w.holding != nil || w.cl == nil || w.cl.Closed() || !windowFree(w.cl) {
			continue
		}
		return w
	}
	return nil
}

// nextAvailable finds the oldest job not out with a worker and not waiting
// out a backoff. A waiting job is skipped, never waited on.
func (q *queueEngine) nextAvailable(now time.Time) (storage.QueueItem, bool) {
	var after uint64
	scanned := 0
	for scanned < offerScanLimit {
		items, err := q.ch.queue.Items(after, 64)
		if err != nil {
			q.b.log.Error("reading queue", "queue", q.ch.name, "error", err)
			return storage.QueueItem{}, false
		}
		if len(items) == 0 {
			return storage.QueueItem{}, false
		}
		q.mu.Lock()
		for _, it := range items {
			after = it.Offset
			scanned++
			if q.out[it.Offset] != nil {
				continue
			}
			if until, ok := q.waiting[it.Offset]; ok {
				if now.Before(until) {
					continue
				}
				delete(q.waiting, it.Offset)
			}
			q.mu.Unlock()
			return it, true
		}
		q.mu.Unlock()
	}
	return storage.QueueItem{}, false
}

// newDeliveryID makes an opaque Delivery ID: the engine's epoch and eight
// random bytes, so it is unique per attempt and never guessable from another.
func (q *queueEngine) newDeliveryIDLocked() string {
	q.epoch++
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], q.epoch)
	_, _ = rand.Read(b[8:])
	return string(b[:])
}

// handOver gives one job to one worker: the job becomes DELIVERING and the
// PUBLISH is written on a goroutine of its own, so a worker that stops
// reading holds up its own delivery and nothing else (invariant 16).
func (q *queueEngine) handOver(w *worker, item storage.QueueItem, now time.Time) bool {
	q.mu.Lock()
	if w.holding != nil || q.out[item.Offset] != nil {
		q.mu.Unlock()
		return true
	}
	cl := w.cl
	pid, err := cl.NextPacketID()
	if err != nil {
		q.mu.Unlock()
		return false
	}
	d := &delivery{id: q.newDeliveryIDLocked(), offset: item.Offset, worker: w, pid: uint16(pid), received: now}
	// invariant 4: the job is out with exactly this delivery; every other
	// path checks q.out before handing it over again.
	q.out[item.Offset] = d
	q.byID[d.id] = d
	w.holding = d
	// Round-robin advances only on a handover: a pass that found no job
	// must not move it, or the choice would depend on how many ticks ran.
	q.last = w
	q.mu.Unlock()

	// The item was read before the claim; a resolve or dead-letter move that
	// finished in between is visible only to a read made after it. With the
	// claim in place no such move can start, so this read decides
	// (invariants 4, 5: a job never goes out after it left the queue).
	fresh, err := q.ch.queue.Get(item.Offset)
	if err != nil {
		q.mu.Lock()
		q.releaseLocked(d)
		q.mu.Unlock()
		if !errors.Is(err, storage.ErrNotFound) {
			q.b.log.Error("reading a job to offer", "queue", q.ch.name, "offset", item.Offset, "error", err)
			return false
		}
		return true
	}
	item = fresh

	pk := q.b.deliveryPacket(&item.Record, q.ch, matched{qos: 1}, now)
	pk.PacketID = d.pid
	pk.Properties.ResponseTopic = "$saguin/queue/" + q.ch.name + "/response"
	pk.Properties.CorrelationData = []byte(d.id)
	pk.Properties.User = append(pk.Properties.User,
		packets.UserProperty{Key: "saguin-attempt", Val: strconv.FormatUint(uint64(item.Attempts)+1, 10)})

	w.sess.mu.Lock()
	w.sess.pids[d.pid] = queueAck{q: q, d: d}
	w.sess.mu.Unlock()
	cl.State.Inflight.Set(pk)

	q.b.wg.Add(1)
	go func() {
		defer q.b.wg.Done()
		// A worker registered by a SUBSCRIBE still being answered gets its
		// SUBACK first.
		w.sess.subscribing.Lock()
		w.sess.subscribing.Unlock() //nolint:staticcheck // a gate, not a critical section
		err := cl.WritePacket(pk)
		q.written(d, cl, err)
	}()
	return true
}

// written learns whether the PUBLISH reached the connection. One that did
// not was never seen by the worker, so it goes back with its attempt unspent
// — by asking whether it was sent, never by a clock on DELIVERING
// (invariant 7).
func (q *queueEngine) written(d *delivery, cl *mqtt.Client, err error) {
	if err == nil {
		q.mu.Lock()
		d.written = true
		q.mu.Unlock()
		return
	}
	d.worker.sess.forget(d.pid)
	cl.State.Inflight.Delete(d.pid)
	q.mu.Lock()
	current := q.out[d.offset] == d
	if current {
		q.releaseLocked(d)
	}
	q.mu.Unlock()
	if errors.Is(err, packets.ErrPacketTooLarge) {
		// RFC 0003 §5: checked before handover; the chosen worker is
		// disconnected and the job goes back unspent.
		q.b.log.Warn("job larger than the worker's Maximum Packet Size: disconnecting", "queue", q.ch.name,
			"client", d.worker.sess.id, "offset", d.offset)
		_ = q.b.mqtt.DisconnectClient(cl, packets.ErrPacketTooLarge)
	}
	q.poke()
}

// releaseLocked takes a delivery out of every index: its ID is dead from
// here on (the epoch advanced), and its worker is free.
func (q *queueEngine) releaseLocked(d *delivery) {
	delete(q.out, d.offset)
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
	if _, err := q.ch.queue.CountAttempt(d.offset, now); err != nil {
		q.b.log.Error("counting an attempt", "queue", q.ch.name, "offset", d.offset, "error", err)
		q.mu.Lock()
		d.counted = false
		q.mu.Unlock()
	}
}

// answer applies a worker's ack or return. Invariant 3: it is applied only
// when the Delivery ID is known, is the job's current delivery, and the
// answering session is the one holding it; otherwise it changes nothing and
// is logged. The worker is told nothing either way.
func (q *queueEngine) answer(s *session, cl *mqtt.Client, id []byte, payload string) {
	now := q.b.clock.Now()
	q.mu.Lock()
	d, ok := q.byID[string(id)]
	switch {
	case !ok:
		q.mu.Unlock()
		q.b.log.Info("queue answer ignored: unknown or superseded delivery", "queue", q.ch.name, "client", s.id)
		return
	case q.out[d.offset] != d:
		q.mu.Unlock()
		q.b.log.Info("queue answer ignored: not the job's current delivery", "queue", q.ch.name, "client", s.id)
		return
	case d.worker.sess != s || d.worker.cl != cl:
		q.mu.Unlock()
		q.b.log.Info("queue answer ignored: another session holds the job", "queue", q.ch.name, "client", s.id,
			"holder", d.worker.sess.id)
		return
	case payload != "ack" && payload != "return":
		q.mu.Unlock()
		q.b.log.Info("queue answer ignored: payload is neither ack nor return", "queue", q.ch.name, "client", s.id)
		return
	}
	// Consuming the Delivery ID advances the epoch: a retry of this very
	// answer finds nothing (invariant 3).
	delete(q.byID, d.id)
	count := !d.counted
	d.counted = true
	q.mu.Unlock()
	if count {
		// Answering is the stronger evidence the worker had the job.
		q.countAttempt(d, now)
	}
	if payload == "ack" {
		if err := q.ch.queue.Resolve(d.offset); err != nil {
			q.b.log.Error("resolving a job", "queue", q.ch.name, "offset", d.offset, "error", err)
			// Unresolved: the job goes back and is offered again.
			q.endLease(d, "resolve failed", now)
			return
		}
		q.b.log.Debug("job acked", "queue", q.ch.name, "offset", d.offset, "client", s.id)
		q.mu.Lock()
		q.releaseLocked(d)
		delete(q.waiting, d.offset)
		q.mu.Unlock()
		q.poke()
		return
	}
	// A worker that answers is measured from its answer: it waits the
	// whole gap.
	q.endLease(d, "returned", now)
}

// endLease returns a job that was out: to AVAILABLE after what is left of
// the backoff gap (measured from since, when the worker last had it), or to
// the dead-letter channel when its attempts are spent.
func (q *queueEngine) endLease(d *delivery, why string, since time.Time) {
	q.mu.Lock()
	if q.out[d.offset] != d {
		q.mu.Unlock()
		return
	}
	// The Delivery ID dies now and the worker is free, but the job stays
	// marked out until it is decided: no offer may take a job that is about
	// to be dead-lettered (invariants 4, 5).
	delete(q.byID, d.id)
	if d.worker.holding == d {
		d.worker.holding = nil
	}
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		if q.out[d.offset] == d {
			delete(q.out, d.offset)
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
	if gap := q.backoff(item.Attempts); gap > 0 {
		q.mu.Lock()
		q.waiting[d.offset] = since.Add(gap)
		q.mu.Unlock()
	}
	q.b.log.Debug("job back in the queue", "queue", q.ch.name, "offset", d.offset, "why", why, "attempts", item.Attempts)
}

// backoff is the gap after n attempts (RFC 0003 "Backoff").
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
		if d.state == leased && !now.Before(d.deadline) {
			expired = append(expired, d)
		}
	}
	q.mu.Unlock()
	for _, d := range expired {
		q.b.log.Debug("visibility timeout: job taken back", "queue", q.ch.name, "offset", d.offset, "client", d.worker.sess.id)
		// Measured from when the worker received it: the timeout itself
		// served that much of the gap.
		q.endLease(d, "visibility timeout", d.received)
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
	defer func() {
		q.mu.Lock()
		if q.out[offset] == claim {
			delete(q.out, offset)
		}
		q.mu.Unlock()
	}()

	item, err := q.ch.queue.Get(offset)
	if err != nil {
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
	if _, err := q.ch.queue.DeadLetter(offset, dlqTopic, extra, now); err != nil {
		q.b.log.Error("dead-letter move failed; the job stays in the queue", "queue", q.ch.name, "offset", offset, "error", err)
		return
	}
	q.mu.Lock()
	delete(q.waiting, offset)
	q.mu.Unlock()
	q.b.log.Info("job dead-lettered", "queue", q.ch.name, "offset", offset, "reason", reason, "attempts", item.Attempts)
	if dlq := q.b.channels[q.ch.cfg.DeadLetter]; dlq != nil {
		dlq.notify()
	}
}
