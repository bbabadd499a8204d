package broker

import (
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"

	"saguin.dev/broker/internal/metrics"
)

// The counters the metric catalogue reads that the broker did not hold
// before it (rfcs/metrics.md). Two kinds, by how often they move:
//
//   - per packet (bytes, publishes received, deliveries written, broadcast
//     publishes): in wireShards, one shard per group of connections, each
//     on cache lines of its own, summed at the recompute. A connection
//     only ever touches its own shard, so no atomic is shared by every
//     connection's goroutine (docs/operations.md "Metrics": the QoS 1 broadcast row of
//     make bench may not drop by more than 3%).
//   - per connection, session, Will or refusal: plain atomics here, or on
//     the structure that already exists per channel or queue (channel.go,
//     queue.go), where the path already takes that channel's lock.

// wireShardCount is how many shards the per-packet counters are spread
// over: far more than the cores a gateway has, so two connections busy at
// the same moment rarely share one.
const wireShardCount = 64

// wireShard is one group of connections' per-packet counts.
type wireShard struct {
	bytesIn, bytesOut atomic.Uint64
	publishesIn       atomic.Uint64 // PUBLISH packets read from clients
	deliveriesOut     atomic.Uint64 // PUBLISH packets written to subscribers
	broadcast         atomic.Uint64 // broadcast publishes handed to fan-out
	unmatched         atomic.Uint64 // of those, the ones nobody subscribed to
	// Two cache lines a shard: a neighbour's counts never share a line
	// with this one's, whichever way the hardware prefetches pairs.
	_ [128 - 6*8]byte
}

// wireShards are the per-packet counters of every connection.
type wireShards struct {
	next   atomic.Uint32 // round-robin over the shards at accept
	shards [wireShardCount]wireShard
}

// assign gives a new connection its shard: once per accept.
func (w *wireShards) assign() *wireShard {
	return &w.shards[w.next.Add(1)%wireShardCount]
}

// wireTotals are the per-packet counts summed over the shards.
type wireTotals struct {
	bytesIn, bytesOut, publishesIn, deliveriesOut, broadcast, unmatched uint64
}

// sum adds the shards up. Each shard's counters only grow, so the sums
// never go down from one recompute to the next.
func (w *wireShards) sum() wireTotals {
	var t wireTotals
	for i := range w.shards {
		s := &w.shards[i]
		t.bytesIn += s.bytesIn.Load()
		t.bytesOut += s.bytesOut.Load()
		t.publishesIn += s.publishesIn.Load()
		t.deliveriesOut += s.deliveriesOut.Load()
		t.broadcast += s.broadcast.Load()
		t.unmatched += s.unmatched.Load()
	}
	return t
}

// shard is the connection's shard of the per-packet counters. A
// connection made by a test without an accept counts in the first.
func (c *clientConn) shard() *wireShard {
	if c.wire != nil {
		return c.wire
	}
	return &c.l.g.wire.shards[0]
}

// shardOf is the shard of cl's connection; an in-process client (a Will's
// stand-in) counts in the first shard.
func (b *Broker) shardOf(cl *mqtt.Client) *wireShard {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		return cc.shard()
	}
	if b.gate == nil {
		return nil
	}
	return &b.gate.wire.shards[0]
}

// eventCounts are the counters that move once per connection, session,
// Will, refusal or shared-group step: rare enough that one atomic each,
// shared by every goroutine, costs nothing measurable.
type eventCounts struct {
	connectionsAccepted atomic.Uint64
	// sessionStoreFull: CONNECTs refused 0x97 for a Will the session
	// store has no room for; sessionStoreFailed: refused 0x83 because the
	// store failed.
	sessionStoreFull, sessionStoreFailed atomic.Uint64
	// By cause, as many as the snapshot has.
	willsPublished   [len(metrics.BrokerFigures{}.WillsPublished)]atomic.Uint64
	willsCancelled   atomic.Uint64
	sessionsRestored atomic.Uint64
	sessionsDropped  [len(metrics.BrokerFigures{}.SessionsDropped)]atomic.Uint64
	expiryShortened  atomic.Uint64
	// sharesHeld and sharesDrained: deliveries put on a shared group's
	// backlog and handed from it to a member (share.go; the drops are
	// fanout's).
	sharesHeld, sharesDrained atomic.Uint64
}

// willPublished counts one Will published for cause.
func (e *eventCounts) willPublished(cause metrics.WillCause) {
	e.willsPublished[cause].Add(1)
}

// eventFigures are the event counters, copied for the metric catalogue: a
// plain value the snapshot formats.
type eventFigures struct {
	connectionsAccepted                  uint64
	sessionStoreFull, sessionStoreFailed uint64
	willsPublished                       [len(metrics.BrokerFigures{}.WillsPublished)]uint64
	willsCancelled                       uint64
	sessionsRestored                     uint64
	sessionsDropped                      [len(metrics.BrokerFigures{}.SessionsDropped)]uint64
	expiryShortened                      uint64
	sharesHeld, sharesDrained            uint64
}

// view loads each event counter once (atomics: no lock).
func (e *eventCounts) view() eventFigures {
	v := eventFigures{
		connectionsAccepted: e.connectionsAccepted.Load(),
		sessionStoreFull:    e.sessionStoreFull.Load(),
		sessionStoreFailed:  e.sessionStoreFailed.Load(),
		willsCancelled:      e.willsCancelled.Load(),
		sessionsRestored:    e.sessionsRestored.Load(),
		expiryShortened:     e.expiryShortened.Load(),
		sharesHeld:          e.sharesHeld.Load(),
		sharesDrained:       e.sharesDrained.Load(),
	}
	for c := range v.willsPublished {
		v.willsPublished[c] = e.willsPublished[c].Load()
	}
	for c := range v.sessionsDropped {
		v.sessionsDropped[c] = e.sessionsDropped[c].Load()
	}
	return v
}
