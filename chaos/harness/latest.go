package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	L "saguin.dev/linearizability"
)

// The latest channel's workload (docs/channels.md "`latest`"): producers set and delete a
// few keys (producer, with keys), point readers ask $saguin/kv/get for one
// key at a time, and a durable subscriber holds the whole channel. Every
// value is unique, so each read names the write it saw, and the latest
// model (a register with delete per key) judges them all.

const (
	// latestKeys is how many keys the producers share: few, so that writes
	// to one key overlap each other and the reads of it.
	latestKeys = 4
	// latestDeleteOneIn: one publish in this many is a delete.
	latestDeleteOneIn = 8
	// latestProducers, pointReaders: how many of each; latestInterval is
	// the mean pause of each between two operations.
	latestProducers = 2
	pointReaders    = 2
	latestInterval  = 50 * time.Millisecond
)

// stateKeys are the topics the latest producers write.
func stateKeys() []string {
	keys := make([]string, latestKeys)
	for i := range keys {
		keys[i] = topicState + "k" + strconv.Itoa(i)
	}
	return keys
}

// unsetKey is a key of the channel nobody ever writes: every point read of
// it must answer "no value".
const unsetKey = topicState + "unset"

// pointReader asks for one key at a time with a QoS 1 PUBLISH to
// $saguin/kv/get (payload = the key, a Response Topic it subscribed to
// first, Correlation Data of its own) and records the answer as a
// latest.read: call = the request sent, return = the answer received, so
// the value must be one the key held at some moment in between. Reads are
// sequential on a connection. Refusals come on the PUBACK (0x90, 0x83): a
// refused read of a key the latest channel holds is a finding — except a
// 0x83 while the broker is being stopped, its store failing under it — and
// so is a PUBACK of success with no answer on a connection that stayed up
// (the broker writes the answer before the PUBACK).
type pointReader struct {
	env      *env
	name     string
	keys     []string
	rng      *lockedRand
	interval time.Duration
	replies  chan kvReply
	n        int
}

// kvReply is an answer and when it was received.
type kvReply struct {
	t int64
	p *paho.Publish
}

func newPointReader(e *env, name string, keys []string, seed uint64) *pointReader {
	return &pointReader{env: e, name: name, keys: keys, rng: newLockedRand(seed), interval: latestInterval,
		replies: make(chan kvReply, 16)}
}

func (r *pointReader) replyTopic() string { return replyPrefix + r.name }

func (r *pointReader) run(ctx context.Context) {
	r.env.keepConnected(ctx, func() dialOpts {
		return dialOpts{clientID: r.name, cleanStart: true, onPublish: func(_ *mconn, m *paho.Publish) {
			if m.Topic != r.replyTopic() {
				return
			}
			select {
			case r.replies <- kvReply{t: r.env.now(), p: m}:
			default: // an answer nobody waits for any more
			}
		}}
	}, r.serve)
}

func (r *pointReader) serve(ctx context.Context, c *mconn) {
	code, err := c.subscribe(ctx, r.replyTopic(), 1)
	if err != nil {
		c.abort()
		return
	}
	if code >= 0x80 {
		r.env.protocolFinding(0, "subscribe-refused", chanState, fmt.Sprintf("%s: SUBSCRIBE %s refused 0x%02x", r.name, r.replyTopic(), code))
		c.abort()
		return
	}
	for ctx.Err() == nil && !c.isDead() {
		if !r.readOne(ctx, c) {
			return
		}
		if !sleepCtx(ctx, r.rng.between(r.interval/2, r.interval*3/2)) {
			return
		}
	}
}

// readOne asks for one key and records the answer; false when the
// connection is no longer usable.
func (r *pointReader) readOne(ctx context.Context, c *mconn) bool {
	r.n++
	corr := r.name + "-" + strconv.Itoa(r.n)
	key := r.keys[r.rng.intN(len(r.keys))]
	stops := r.env.stops.Load()
	call := r.env.now()
	resp := c.publish(ctx, &paho.Publish{Topic: topicKVGet, QoS: 1, Payload: []byte(key),
		Properties: &paho.PublishProperties{ResponseTopic: r.replyTopic(), CorrelationData: []byte(corr)}})
	switch {
	case resp == nil:
		// No PUBACK: the link is gone or the broker frozen. An answer
		// that arrived before is still what the broker told.
		if rep, ok := r.await(ctx, corr, 0); ok {
			r.record(c, key, call, rep)
		}
		c.abort()
		return false
	case resp.ReasonCode == 0x83 && (stops%2 == 1 || r.env.stops.Load() != stops):
		// "Cannot act": what a broker answers when its store fails under
		// it — the disk cut before the kill, the store closing in a
		// SIGTERM. While the broker is being stopped that is no finding,
		// and nothing was read.
		return true
	case resp.ReasonCode >= 0x80:
		reason := ""
		if resp.Properties != nil {
			reason = resp.Properties.ReasonString
		}
		r.env.protocolFinding(0, "point-read-refused", chanState,
			fmt.Sprintf("%s: point read of %s (a key of latest channel %s) refused 0x%02x %q", r.name, key, chanState, resp.ReasonCode, reason))
		return true
	}
	rep, ok := r.await(ctx, corr, r.env.opTimeout)
	if !ok {
		if ctx.Err() == nil && !c.isDead() {
			r.env.protocolFinding(0, "point-read-unanswered", chanState,
				fmt.Sprintf("%s: point read of %s acknowledged 0x%02x, and no answer with its Correlation Data %q came within %s",
					r.name, key, resp.ReasonCode, corr, r.env.opTimeout))
		}
		c.abort()
		return false
	}
	r.record(c, key, call, rep)
	return true
}

// await waits up to d (0: does not wait) for the answer carrying corr,
// skipping late answers to earlier reads.
func (r *pointReader) await(ctx context.Context, corr string, d time.Duration) (kvReply, bool) {
	mine := func(rep kvReply) bool {
		return rep.p.Properties != nil && string(rep.p.Properties.CorrelationData) == corr
	}
	if d <= 0 {
		for {
			select {
			case rep := <-r.replies:
				if mine(rep) {
					return rep, true
				}
			default:
				return kvReply{}, false
			}
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case rep := <-r.replies:
			if mine(rep) {
				return rep, true
			}
		case <-timer.C:
			return kvReply{}, false
		case <-ctx.Done():
			return kvReply{}, false
		}
	}
}

func (r *pointReader) record(c *mconn, key string, call int64, rep kvReply) {
	r.env.write(L.Op{Client: c.id, Op: L.OpLatestRead, Channel: chanState, Call: call, Return: max(rep.t, call),
		Input: &L.Input{Key: key}, Output: &L.Output{ID: userString(rep.p, "saguin-id"), Payload: rep.p.Payload}})
}

// latestSubscriber is a durable subscriber of the whole latest channel
// (Clean Start 0 after its first connection, Session Expiry 3600, QoS 1).
// Each value it is sent is recorded as a latest.read with call = the moment
// the SUBSCRIBE in force was sent: the catch-up pass after a SUBACK, the
// diff on a resumed session and the live changes are all values the key
// held at some moment since then, so the latest model judges them with
// the point reads. On each connection, a topic's offsets must never go back
// (docs/channels.md "`latest`" "never older after newer": the latest-order check).
type latestSubscriber struct {
	env     *env
	name    string
	started bool
	// subCall is when the SUBSCRIBE the session holds was sent; call is
	// the connection being made's own copy (opts and serve run in turn on
	// the connecting goroutine, which alone touches these two).
	subCall int64
	call    *atomic.Int64
}

func (s *latestSubscriber) run(ctx context.Context) {
	s.env.keepConnected(ctx, func() dialOpts {
		clean := !s.started
		s.started = true
		// Each connection's values are judged from the SUBSCRIBE in force
		// when they were sent: the session's, until this connection sends
		// its own. Per connection, so a late delivery of a dead one is
		// never stamped with a newer SUBSCRIBE.
		call := new(atomic.Int64)
		call.Store(s.subCall)
		s.call = call
		return dialOpts{clientID: s.name, cleanStart: clean, sessionExpiry: 3600, receiveMax: 64,
			onPublish: func(c *mconn, p *paho.Publish) { s.onPublish(c, p, call.Load()) }}
	}, s.serve)
}

func (s *latestSubscriber) serve(ctx context.Context, c *mconn) {
	s.env.note(Note{Kind: NoteConnack, Conn: c.id, ClientID: s.name, Channel: chanState, SessionPresent: c.sessionPresent()})
	if !c.sessionPresent() {
		// Before the SUBSCRIBE leaves: nothing is sent for it earlier,
		// and every value it brings was current at some moment after.
		s.subCall = s.env.now()
		s.call.Store(s.subCall)
		code, err := c.subscribe(ctx, filterState, 1)
		if err != nil {
			c.abort()
			return
		}
		if code >= 0x80 {
			s.env.protocolFinding(0, "subscribe-refused", chanState, fmt.Sprintf("%s: SUBSCRIBE %s refused 0x%02x", s.name, filterState, code))
			c.abort()
			return
		}
	}
	waitDead(ctx, c)
}

func (s *latestSubscriber) onPublish(c *mconn, p *paho.Publish, call int64) {
	if !strings.HasPrefix(p.Topic, topicState) {
		return
	}
	t := s.env.now()
	off, okOff := userInt(p, "saguin-offset")
	if !okOff || off < 1 {
		// Every latest value carries its offset (docs/channels.md "`latest`"), a deletion
		// included: it is what "newer than" is judged by.
		s.env.protocolFinding(8, "delivery-headers", chanState,
			fmt.Sprintf("%s: value of %s without saguin-offset: %v", s.name, p.Topic, p.Properties))
		return
	}
	s.env.write(L.Op{Client: c.id, Op: L.OpLatestRead, Channel: chanState, Call: min(call, t), Return: t,
		Input: &L.Input{Key: p.Topic}, Output: &L.Output{ID: userString(p, "saguin-id"), Offset: off, Payload: p.Payload}})
}
