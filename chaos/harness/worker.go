package harness

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	L "saguin.dev/linearizability"
)

// behaviour is what a worker does with one queue offer. The mix is what
// makes the queue's invariants observable: a stall past the visibility
// timeout followed by a late ack is invariant 3's scenario; an answer carried
// across a restart on a new connection is invariant 15's; a disconnect or a
// silent worker has the job return.
type behaviour int

const (
	bAck               behaviour = iota // ack at once
	bReturn                             // return at once
	bLateAck                            // stall past the visibility timeout, then ack (a superseded Delivery ID)
	bSilent                             // never answer: the lease times out
	bDisconnect                         // drop the connection without answering
	bHoldAcrossRestart                  // keep the Delivery ID; answer it on the next connection
	bDoubleAck                          // ack twice (a client retry)
	numBehaviours
)

var behaviourNames = [...]string{"ack", "return", "late-ack", "silent", "disconnect", "hold-across-restart", "double-ack"}

func (b behaviour) String() string { return behaviourNames[b] }

// defaultMix weighs the behaviours: mostly work done, enough trouble that
// every path is taken many times in a short campaign.
var defaultMix = [numBehaviours]int{bAck: 62, bReturn: 8, bLateAck: 8, bSilent: 6, bDisconnect: 5, bHoldAcrossRestart: 6, bDoubleAck: 5}

// worker consumes the queue with a stock client: QoS 1 subscription to
// $saguin/queue/jobs, answers published to the Response Topic with the
// Correlation Data echoed (docs/channels.md).
type worker struct {
	env     *env
	name    string
	durable bool // resume a session across connections (Clean Start 0)
	rng     *lockedRand
	started bool

	mu      sync.Mutex
	cur     *mconn
	changed chan struct{} // closed when cur changes

	leases sync.WaitGroup // one per offer being handled
	ctx    context.Context
}

type lease struct {
	conn          *mconn
	id            string
	delivery      []byte
	attempt       int
	receipt       int64
	responseTopic string
}

func newWorker(e *env, name string, durable bool, seed uint64) *worker {
	return &worker{env: e, name: name, durable: durable, rng: newLockedRand(seed), changed: make(chan struct{})}
}

func (w *worker) run(ctx context.Context) {
	w.ctx = ctx
	w.env.keepConnected(ctx, func() dialOpts {
		o := dialOpts{clientID: w.name, cleanStart: true, onPublish: w.onPublish}
		if w.durable {
			o.cleanStart = !w.started
			o.sessionExpiry = 30
		}
		w.started = true
		return o
	}, func(ctx context.Context, c *mconn) {
		w.setCurrent(c)
		if !c.sessionPresent() {
			code, err := c.subscribe(ctx, topicQueue, 1)
			if err != nil {
				c.abort()
				return
			}
			if code != 1 {
				w.env.protocolFinding(4, "subscribe-refused", chanJobs, fmt.Sprintf("%s: queue subscription granted 0x%02x", w.name, code))
				c.abort()
				return
			}
		}
		waitDead(ctx, c)
	})
}

func (w *worker) setCurrent(c *mconn) {
	w.mu.Lock()
	w.cur = c
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (w *worker) current() (*mconn, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur, w.changed
}

func (w *worker) pick() behaviour {
	if w.env.draining.Load() {
		return bAck
	}
	total := 0
	for _, n := range defaultMix {
		total += n
	}
	r := w.rng.intN(total)
	for b, n := range defaultMix {
		if r < n {
			return behaviour(b)
		}
		r -= n
	}
	return bAck
}

func (w *worker) onPublish(c *mconn, p *paho.Publish) {
	t := w.env.now()
	w.env.lastDelivery.Store(t)
	id := userString(p, "saguin-id")
	off, okOff := userInt(p, "saguin-offset")
	attempt, okAtt := userInt(p, "saguin-attempt")
	var delivery []byte
	var rt string
	if p.Properties != nil {
		delivery, rt = p.Properties.CorrelationData, p.Properties.ResponseTopic
	}
	if id == "" || !okOff || off < 1 || !okAtt || attempt < 1 || len(delivery) == 0 || rt == "" {
		// Every delivery attempt carries a Delivery ID (invariant 3); a
		// worker cannot answer an offer without one.
		w.env.protocolFinding(3, "delivery-headers", chanJobs,
			fmt.Sprintf("%s: offer on %s lacks saguin-id/offset/attempt, Correlation Data or Response Topic", w.name, p.Topic))
		return
	}
	w.env.write(L.Op{Client: c.id, Op: L.OpQueueDeliver, Channel: chanJobs, Call: t, Return: t,
		Input:  &L.Input{Dup: p.Duplicate()},
		Output: &L.Output{ID: id, Offset: off, Attempt: int(attempt), Delivery: delivery, Payload: p.Payload}})
	l := &lease{conn: c, id: id, delivery: delivery, attempt: int(attempt), receipt: t, responseTopic: rt}
	b := w.pick()
	w.env.outstanding.Add(1)
	w.leases.Add(1)
	go w.handle(l, b)
}

// answerResult says whether an answer was acknowledged on the lease's own
// connection, and when (no earlier than the history's return time).
type answerResult struct {
	onLeaseConn bool
	ok          bool
	at          int64
}

func (w *worker) handle(l *lease, b behaviour) {
	defer w.leases.Done()
	defer w.env.outstanding.Add(-1)
	ctx := w.ctx
	vt := w.env.vt
	deadline := l.receipt + int64(vt) // the earliest the visibility timeout can fire (invariant 7: it starts at the PUBACK, which is later)
	var res answerResult
	switch b {
	case bAck:
		res = w.answer(l, l.conn, L.ResultAck)
	case bReturn:
		res = w.answer(l, l.conn, L.ResultReturn)
	case bDoubleAck:
		res = w.answer(l, l.conn, L.ResultAck)
		w.answer(l, l.conn, L.ResultAck)
	case bLateAck:
		wait := time.Duration(deadline-w.env.now()) + w.rng.between(100*time.Millisecond, vt/2+100*time.Millisecond)
		if sleepCtx(ctx, wait) {
			res = w.answer(l, l.conn, L.ResultAck)
		}
	case bSilent:
	case bDisconnect:
		if sleepCtx(ctx, w.rng.between(0, vt/2)) {
			l.conn.abort()
		}
	case bHoldAcrossRestart:
		res = w.holdAcrossRestart(ctx, l)
	}
	w.finishLease(ctx, l, res, deadline)
}

// holdAcrossRestart keeps the offer until its connection ends (a restart, a
// cut...) and then answers it on the worker's next connection: the client
// retrying across the very restart that interrupted it (invariant 15). If
// the connection outlives three visibility timeouts, it acks late instead.
func (w *worker) holdAcrossRestart(ctx context.Context, l *lease) answerResult {
	timer := time.NewTimer(3 * w.env.vt)
	defer timer.Stop()
	select {
	case <-l.conn.dead:
	case <-timer.C:
		return w.answer(l, l.conn, L.ResultAck)
	case <-ctx.Done():
		return answerResult{}
	}
	bound := time.NewTimer(2 * w.env.opTimeout)
	defer bound.Stop()
	for {
		c, changed := w.current()
		if c != nil && c != l.conn && !c.isDead() {
			return w.answer(l, c, L.ResultAck)
		}
		select {
		case <-changed:
		case <-bound.C:
			return answerResult{}
		case <-ctx.Done():
			return answerResult{}
		}
	}
}

// answer publishes ack or return for the lease on connection c.
func (w *worker) answer(l *lease, c *mconn, result string) answerResult {
	if c == nil || c.isDead() {
		return answerResult{}
	}
	call, err := w.env.hist.Begin(c.id, L.OpQueueAnswer, chanJobs, &L.Input{ID: l.id, Delivery: l.delivery, Result: result})
	if err != nil {
		w.env.fail(fmt.Errorf("history: %w", err))
		return answerResult{}
	}
	resp := c.publish(context.WithoutCancel(w.ctx), &paho.Publish{Topic: l.responseTopic, QoS: 1, Payload: []byte(result),
		Properties: &paho.PublishProperties{CorrelationData: l.delivery}})
	if resp == nil {
		if err := call.Abandon(); err != nil {
			w.env.fail(fmt.Errorf("history: %w", err))
		}
		c.abort()
		return answerResult{onLeaseConn: c == l.conn}
	}
	if err := call.End(&L.Output{Reason: int(resp.ReasonCode)}); err != nil {
		w.env.fail(fmt.Errorf("history: %w", err))
		return answerResult{}
	}
	return answerResult{onLeaseConn: c == l.conn, ok: L.Succeeded(int(resp.ReasonCode)), at: w.env.now()}
}

// finishLease records when the lease could have ended without an answer
// that applied (queue.lease_end). Nothing is recorded for an answer
// acknowledged on the lease's own connection before the visibility timeout
// could fire: it applied while the lease was current. Otherwise the lease
// may have ended when its connection dropped, and at the timeout.
func (w *worker) finishLease(ctx context.Context, l *lease, res answerResult, deadline int64) {
	if res.onLeaseConn && res.ok && res.at <= deadline {
		return
	}
	if wait := time.Duration(deadline - w.env.now()); wait > 0 {
		timer := time.NewTimer(wait)
		select {
		case <-l.conn.dead:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
	}
	if l.conn.isDead() && l.conn.dropAt < deadline {
		w.leaseEnd(l, L.CauseDisconnect, max(l.conn.dropAt, l.receipt))
	}
	w.leaseEnd(l, L.CauseTimeout, deadline)
}

func (w *worker) leaseEnd(l *lease, cause string, at int64) {
	w.env.write(L.Op{Client: l.conn.id, Op: L.OpQueueLeaseEnd, Channel: chanJobs, Call: at, Return: L.Pending,
		Input: &L.Input{ID: l.id, Delivery: l.delivery, Cause: cause}})
}
