package broker

import (
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// The rest of a retained pass. A new subscription's retained values are
// written on the connection's read loop, right after its SUBACK
// (retained.go). When the client's Receive Maximum is full before the last
// of them, the broker may send no more QoS 1/2 values until the client
// acknowledges some (MQTT 5 §3.3.4, MQTT-4.9.0-2), and the read loop must go
// back to reading those acknowledgements. So the values not yet sent are
// handed to a goroutine of the session's, which sends them in order as
// acknowledgements free room (session.roomFreed wakes it), and ends when
// they are all sent, when the connection is no longer the one the session
// serves (a stop, a takeover: session.stopPumps stops it first), or when
// the broker closes.
//
// What waiting rests hold is bounded per session by
// limits.session_queue_bytes (invariant 13), before a rest is kept: past it the values are
// not sent (one rate-limited line; the subscription itself stands), as the
// broadcast messages a session is owed are bounded by the same limit.

// retainedRest is one retained pass's values waiting for room.
type retainedRest struct {
	b     *Broker
	s     *session
	cl    *mqtt.Client
	sub   packets.Subscription
	recs  []storage.Record
	bytes int64
	wake  chan struct{} // capacity 1: room may have been freed
	quit  chan struct{} // closed by stop
	done  chan struct{} // closed when the goroutine has ended
}

// holdRetained keeps rest — the values of one retained pass that found no
// room — for a goroutine that sends them as room is freed.
func (b *Broker) holdRetained(s *session, cl *mqtt.Client, sub packets.Subscription, rest []storage.Record) {
	var n int64
	for i := range rest {
		n += rest[i].Size()
	}
	r := &retainedRest{b: b, s: s, cl: cl, sub: sub, recs: rest, bytes: n,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	// The first try is at once: an acknowledgement may have freed room
	// between the pass stopping and the rest being kept, and none may follow.
	r.wake <- struct{}{}
	// invariant 13: bounded before it is kept (session.keepRest).
	if over := s.keepRest(r, cl, func() {
		b.wg.Add(1)
		go r.run()
	}); over {
		b.refused(slog.LevelWarn, cl, refuseSubscribe, packets.ErrQuotaExceeded.Code,
			"retained values not sent: the client's Receive Maximum is full and the values already waiting for it reach limits.session_queue_bytes",
			"filter", sub.Filter, "values", len(rest), "bytes", n, "receive_maximum", clientReceiveMaximum(cl))
	}
}

// run sends the rest as room is freed, then ends.
func (r *retainedRest) run() {
	defer r.b.wg.Done()
	defer close(r.done)
	defer r.forget()
	for len(r.recs) > 0 {
		select {
		case <-r.wake:
		case <-r.quit:
			return
		case <-r.b.ctx.Done():
			return
		}
		n, full := r.b.writeRetained(r.s, r.cl, r.sub, r.recs)
		r.recs = r.recs[n:]
		if !full && len(r.recs) > 0 {
			return // the connection is no longer served, or a write failed
		}
	}
}

// poke tells the goroutine that room may have been freed.
func (r *retainedRest) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// stop ends the goroutine and waits for it: after stop returns it reserves
// nothing more (session.stopPumps, before the table is taken back).
func (r *retainedRest) stop() {
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	<-r.done
}

// forget removes the rest from its session, giving its bytes back.
func (r *retainedRest) forget() { r.s.forgetRest(r) }
