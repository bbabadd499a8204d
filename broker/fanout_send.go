package broker

import (
	"bytes"
	"context"
	"errors"
	"saguin.dev/broker/partition"
	"slices"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// The sender: one goroutine per connection that drains its session's
// broadcast outbox (fanout.go). It is the only goroutine that waits on this
// connection's socket for broadcast, so a subscriber that stops reading
// holds up its own sender and nothing else, until limits.write_timeout ends
// the connection (invariant 16).

// Bounds on one write (invariant 13): a run of deliveries goes out in one
// system call, as a channel pump's do.
const (
	fanoutWriteBatch = 64
	fanoutWriteBytes = 64 << 10
)

// fanoutRetryEvery is how often a sender short of room looks again though
// nothing woke it: room another route gave back without an acknowledgement
// (a delivery released unsent) pokes nobody.
const fanoutRetryEvery = time.Second

// start runs the sender for connection cl, which now owns the session. It
// runs after the CONNACK and after the session's deliveries sent again what
// was unacknowledged (deliveries.resume), so nothing reaches a connection
// before its CONNACK and a resumed session's unacknowledged messages go
// first.
func (o *outbox) start(b *Broker, cl *mqtt.Client) {
	o.stopSender()
	o.mu.Lock()
	o.live = true
	o.b, o.cl = b, cl
	busy := o.head < len(o.q) || len(o.onWire) > 0
	o.mu.Unlock()
	// The sender is started when there is something to send: now, for a
	// session resuming with broadcast owed, on the wire or subscribed to
	// (a shared group's backlog is pulled by its sender); otherwise at the
	// first message offered. A connection that never receives broadcast
	// costs no goroutine and no stack (Step 6: memory per connection).
	if busy || cl.State.Subscriptions.Len() > 0 {
		o.ensureSender()
	}
}

// ensureSender starts the connection's sender if a connection is served and
// none runs. Never during the broker's own stop, whose wait for its
// goroutines must not see new ones.
func (o *outbox) ensureSender() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.live || o.sender.running() || o.b == nil || o.b.closing.Load() {
		return
	}
	b, cl := o.b, o.cl
	o.sender.goLocked(b, func(ctx context.Context) { o.run(ctx, b, cl) })
}

// stop ends the sender and waits for it: the connection is gone, taken
// over, or the session is ending. What is on the wire stays with the
// session (its deliveries send those packets, or the PUBRELs owed, again to
// a resuming connection); QoS 0 still waiting is not owed to a session
// away, and goes.
func (o *outbox) stop() {
	// Not live first, so no offer starts a sender for the connection
	// being let go while the running one stops.
	o.mu.Lock()
	o.live = false
	o.cl = nil
	o.mu.Unlock()
	o.stopSender()
	o.mu.Lock()
	kept := o.q[:0]
	for _, e := range o.q[o.head:] {
		if e.qos > 0 {
			kept = append(kept, e)
		} else {
			o.queued -= e.charge
			o.countLocked(e.m, -1)
		}
	}
	clear(o.q[len(kept):])
	o.q, o.head = kept, 0
	// A resume sends every PUBREL owed again.
	for _, seq := range o.pubrels {
		if w, ok := o.onWire[seq]; ok {
			w.relQueued = false
			o.onWire[seq] = w
		}
	}
	o.pubrels = o.pubrels[:0]
	o.mu.Unlock()
}

func (o *outbox) stopSender() {
	o.sender.stopUnder(&o.mu)
}

// run is the sender's loop: write what is waiting, as the client's window
// and the bound allow; wait for a publish or an acknowledgement.
func (o *outbox) run(ctx context.Context, b *Broker, cl *mqtt.Client) {
	var buf bytes.Buffer
	for ctx.Err() == nil {
		// The first member back is served its groups' backlogs.
		b.pullShares(o, cl)
		o.appendPubrels(cl, &buf)
		qos0, stalled := o.fill(b, cl, &buf)
		if buf.Len() > 0 && o.s.isDurable() {
			// The window is stored before what joins it is written
			// (rfcs/broadcast-log.md: Drain sends nothing past window until
			// acks written), so a restart resends under the same packet
			// ids, and a PUBREL is written only once the window says one
			// is owed: a crash then resends the PUBREL, never the message.
			// A store that fails ends the connection; one that is full
			// (and the broadcast log could give up nothing more) does not
			// hold the subscriber back: what it is written then would be
			// resent under new ids after a crash (at-least-once).
			if err := b.storeWindow(o, false); err != nil && errors.Is(err, storage.ErrFull) {
				b.log.Debug("broadcast window not stored: provider full", "client", cl.ID)
			} else if err != nil {
				b.log.Warn("storing a broadcast window failed: disconnecting the subscriber", "client", cl.ID, "error", err)
				o.written(qos0)
				cl.Stop(err)
				return
			}
		}
		if buf.Len() == 0 && !stalled {
			select {
			case <-ctx.Done():
			case <-o.wake:
			}
			continue
		}
		if buf.Len() == 0 {
			// Short of room: an acknowledgement wakes the sender.
			wait := time.NewTimer(fanoutRetryEvery)
			select {
			case <-ctx.Done():
			case <-o.wake:
			case <-wait.C:
			}
			wait.Stop()
			continue
		}
		err := o.write(cl, buf.Bytes())
		o.written(qos0)
		if buf.Cap() > 2*fanoutWriteBytes {
			buf = bytes.Buffer{} // one large message does not keep its buffer
		}
		buf.Reset()
		if err != nil {
			// invariant 16: a write that missed limits.write_timeout (or
			// failed) ends the connection; it is never retried, and a
			// partial packet cannot be followed by another. What is on the
			// wire stays owed to a session that outlives the connection.
			if ctx.Err() == nil && !cl.Closed() {
				b.log.Warn("broadcast write failed: disconnecting the subscriber", "client", cl.ID, "error", err)
			}
			cl.Stop(err)
			return
		}
	}
}

// write writes one run of deliveries through the session's deliveries,
// bounded by the connection's write deadline (invariant 16).
func (o *outbox) write(cl *mqtt.Client, p []byte) error {
	return o.s.deliv.write(cl, p)
}

// fill encodes up to fanoutWriteBatch waiting deliveries into buf, taking
// each one's packet identifier and in-flight entry as it goes. It returns
// the charge of the QoS 0 ones (released once written), and whether it
// stopped for want of room for a QoS 1/2 delivery: the client's Receive
// Maximum, half the session's bound on the wire, or packet identifiers.
func (o *outbox) fill(b *Broker, cl *mqtt.Client, buf *bytes.Buffer) (qos0 int64, stalled bool) {
	var subs map[string]packets.Subscription
	var declared map[string]partition.Matcher
	now := b.clock.Now()
	v := cl.Properties.ProtocolVersion
	maxSize := cl.Properties.Props.MaximumPacketSize
	for n := 0; n < fanoutWriteBatch && buf.Len() < fanoutWriteBytes; {
		e, ok := o.peek()
		if !ok {
			return qos0, false
		}
		if subs == nil {
			// The session's subscriptions as they are now, read once a
			// run: an UNSUBSCRIBE stops what is still waiting.
			subs = cl.State.Subscriptions.GetAll()
			declared = b.declaredOf(cl.ID)
		}
		pk, _, outcome := shapeBroadcast(e, subs, declared, cl.ID, v, now)
		refused := false
		if outcome == shapeDeliver && !b.permit(cl, routeOf(e), e.m.topic) {
			refused = true
			// invariant 16: asked per delivery, not only at SUBSCRIBE. Not
			// sent where the grant is refused now; let go like an
			// acknowledged one (docs/channels.md "Broadcast").
			outcome = shapeUnmatched
		}
		if outcome != shapeDeliver {
			switch taken := o.take(e.seq, 0, true); {
			case taken && outcome == shapeExpired:
				b.fan.expired.Add(1)
			case taken && refused && e.group != "":
				b.fan.shareNotAuthorized.Add(1)
			}
			continue
		}
		r := routeOf(e)
		if pk.FixedHeader.Qos > 0 {
			if !o.wireRoom(b, e.charge) {
				return qos0, true
			}
			// The acknowledgement routes back through the session's
			// deliveries (OnPacketRead), which keep the packet for a
			// resuming connection, sent again in the order first sent
			// (MQTT-4.4.0-1, -4.6.0-1). Its exchange carries the entry
			// the delivery goes on the wire as (take: its seq) back to
			// the outbox.
			if !o.s.deliv.reserve(cl, outboxAck{o, e.seq}, r, &pk, now) {
				return qos0, true // the client's Receive Maximum is full
			}
		}
		start := buf.Len()
		// Copied from the message's encoding for another subscriber of the
		// same shape where there is one (fanout_encode.go).
		if err := b.encodeBroadcast(buf, e.m, &pk, v, maxSize); err != nil {
			o.s.deliv.release(pk.PacketID, outboxAck{o, e.seq})
			if o.take(e.seq, 0, true) {
				// docs/channels.md "What a delivery carries": a broadcast message too large for the
				// subscriber is dropped for it; it stays connected.
				b.fan.tooLarge.Add(1)
				b.log.Debug("broadcast delivery not written", "client", cl.ID, "topic", e.m.topic, "error", err)
			}
			continue
		}
		if !o.take(e.seq, pk.PacketID, false) {
			buf.Truncate(start) // given up by a publisher meanwhile
			o.s.deliv.release(pk.PacketID, outboxAck{o, e.seq})
			continue
		}
		n++
		if pk.PacketID == 0 {
			qos0 += e.charge
		}
	}
	return qos0, false
}

// appendPubrels encodes the PUBRELs owed for QoS 2 deliveries the client
// PUBREC'd (outbox.pubrecd), in the order the PUBRECs came (MQTT-4.6.0-3),
// to be written after the window that records them is stored.
func (o *outbox) appendPubrels(cl *mqtt.Client, buf *bytes.Buffer) {
	type rel struct {
		seq uint64
		pid uint16
	}
	o.mu.Lock()
	due := make([]rel, 0, len(o.pubrels))
	for _, seq := range o.pubrels {
		if w, ok := o.onWire[seq]; ok {
			w.relQueued = false
			o.onWire[seq] = w
			due = append(due, rel{seq, w.pid})
		}
	}
	o.pubrels = o.pubrels[:0]
	o.mu.Unlock()
	for _, r := range due {
		// Asked of the exchange this entry's cookie made: the PUBREL goes
		// out under the id the delivery did.
		if o.s.deliv.pubrelDue(r.pid, outboxAck{o, r.seq}) {
			appendAck(buf, packets.Pubrel, r.pid, 0, cl.Properties.ProtocolVersion)
		}
	}
}

// shapeOutcome is what shapeBroadcast made of one owed message.
type shapeOutcome int

const (
	shapeDeliver shapeOutcome = iota
	shapeUnmatched
	shapeExpired
)

// shapeBroadcast builds the PUBLISH one session is sent for e, by the rules
// the substrate's publishToClient applied and the ones it missed:
//
//   - matched against the session's subscriptions as they are now; a
//     message nothing matches any more is not sent (docs/channels.md "Broadcast");
//   - No Local per subscription: a subscription with it set does not
//     deliver its own client's message, another without it still does
//     (MQTT-3.8.3-3; the substrate OR-ed the flag over all of them);
//   - QoS the lower of the published one and the highest granted among the
//     matching subscriptions (MQTT-3.3.4-2);
//   - every matching Subscription Identifier (MQTT-3.3.4-3, -4);
//   - RETAIN only where the publish set it and a matching subscription asked
//     Retain As Published, never to MQTT 3.1.1 (MQTT-3.3.1-12, -13);
//   - the Message Expiry Interval counted down by the wait, and an expired
//     message not sent (MQTT-3.3.2-5, -6);
//   - no Topic Alias (the broker sends none);
//   - a subscription that declared a saguin-filter slice delivers only the
//     topics in it.
//
// A message a shared group handed the session is served by that one
// subscription only. It also returns the remaining expiry in seconds.
func shapeBroadcast(e owed, subs map[string]packets.Subscription, declared map[string]partition.Matcher, id string, v byte, now time.Time) (packets.Packet, uint32, shapeOutcome) {
	m := e.m
	var qos byte
	var ids []int
	rap, found := false, false
	take := func(sub packets.Subscription) {
		found = true
		qos = max(qos, sub.Qos)
		if sub.Identifier > 0 {
			ids = append(ids, sub.Identifier)
		}
		rap = rap || sub.RetainAsPublished
	}
	if e.group != "" {
		if sub, ok := subs[e.group]; ok {
			take(sub)
		}
	} else {
		for filter, sub := range subs {
			if strings.HasPrefix(filter, "$share/") || strings.HasPrefix(filter, "$saguin/") {
				continue
			}
			if !topic.Match(filter, m.topic) || (sub.NoLocal && m.origin == id) {
				continue
			}
			// A declared slice narrows live broadcast too (rfcs/partition.md).
			if d, ok := declared[filter]; ok && !d.Match(m.topic) {
				continue
			}
			take(sub)
		}
	}
	if !found {
		return packets.Packet{}, 0, shapeUnmatched
	}
	var left uint32
	if m.expiry > 0 {
		rem := m.created.Add(time.Duration(m.expiry) * time.Second).Sub(now)
		if rem <= 0 {
			return packets.Packet{}, 0, shapeExpired
		}
		left = uint32((rem + time.Second - 1) / time.Second)
	}
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: min(qos, m.qos), Retain: m.retain && rap && v == 5},
		TopicName:       m.topic,
		Payload:         m.payload,
		Properties:      m.props,
		ProtocolVersion: v,
		Created:         now.Unix(),
		Origin:          m.origin,
	}
	pk.Properties.MessageExpiryInterval = left
	if len(ids) > 0 {
		slices.Sort(ids)
		pk.Properties.SubscriptionIdentifier = ids
	}
	return pk, left, shapeDeliver
}

// declaredOf copies the saguin-filter declarations of a session's filters
// (nil for none).
func (b *Broker) declaredOf(id string) map[string]partition.Matcher {
	s := b.sessionOf(id)
	if s == nil {
		return nil
	}
	return s.declarations()
}
