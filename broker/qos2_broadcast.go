package broker

import (
	"errors"
	"fmt"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// QoS 2 inbound on broadcast topics (rfcs/qos2-holds.md "Broadcast QoS 2").
//
// A client's QoS 2 PUBLISH to a topic no channel claims is held in the
// broadcast log's store (the provider broker.session.storage names) from
// its PUBREC to its PUBREL, whether or not any session keeps it: the
// exchange itself must survive a restart, so a PUBLISH re-sent after one is
// the repeat it is and is delivered once. The PUBREL releases it — one
// atomic write that appends it to the broadcast log at the next offset and
// deletes the hold — and only then is it delivered, retained first when the
// publisher set RETAIN. So a QoS 2 broadcast reaches subscribers one round
// trip later than a QoS 1 one, and is never delivered for an exchange the
// publisher did not finish. Holds share the per-client allowance
// (broker.qos2.max_inflight_per_client), the expiry and the session-end
// rules of channel holds (qos2.go), under the log's name.

// holdBroadcast keeps a client's QoS 2 broadcast publish as a hold and lets
// the substrate answer PUBREC 0x00 (nothing is fanned out now). The log has
// no max_bytes of its own: only its provider, less the reserve, refuses a
// hold (PUBREC 0x97, before ownership passes).
func (b *Broker) holdBroadcast(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if s := b.sessionOf(cl.ID); s != nil && s.owner() != cl {
		return b.refuse(cl, pk, codeTakenOver)
	}
	q := &b.qos2
	q.mu.Lock()
	held := q.byClient[cl.ID]
	if _, repeat := held[pk.PacketID]; repeat {
		q.mu.Unlock()
		return pk, packets.CodeSuccessIgnore // re-sent PUBLISH: held once (MQTT 5 §4.3.3)
	}
	if max := b.cfg.Broker.QoS2.MaxInflightPerClient; len(held) >= max {
		q.mu.Unlock()
		return b.refuse(cl, pk, withReason(codeQuotaExceeded,
			fmt.Sprintf("%s: %d QoS 2 publishes held; broker.qos2.max_inflight_per_client is %d", inflightReason, len(held), max)))
	}
	q.mu.Unlock()

	now := b.clock.Now()
	rec := recordOfMsg(newBroadcastMsg(cl.ID, pk, now), now, b.ids.New(now))
	err := b.bcastHolds.Hold(storage.Held{Channel: broadcastLogName, ClientID: cl.ID, PacketID: pk.PacketID, HeldAt: now, Record: rec})
	switch {
	case err == nil, errors.Is(err, storage.ErrExists):
	case errors.Is(err, storage.ErrFull):
		return b.refuse(cl, pk, withReason(codeQuotaExceeded,
			fmt.Sprintf("provider %s has no room to hold the publish", b.sessionProvider)))
	default:
		b.log.Error("holding a QoS 2 broadcast publish", "client", cl.ID, "error", err)
		return b.refuse(cl, pk, withReason(codeImplementation, "the broadcast log could not hold the publish"))
	}
	q.mu.Lock()
	q.indexLocked(cl.ID, pk.PacketID, qos2Exchange{channel: broadcastLogName, heldAt: now})
	q.mu.Unlock()
	return pk, packets.CodeSuccessIgnore
}

// releaseBroadcast answers the PUBREL of a held broadcast exchange (taken
// out of the index by pubrel): retained first if it asked to be, released
// into the log stamped in the log's order, delivered from there, then
// PUBCOMP. A release the store refuses keeps the hold and closes the
// connection without PUBCOMP, as for a channel.
func (b *Broker) releaseBroadcast(cl *mqtt.Client, pid uint16, ex qos2Exchange) (packets.Packet, error) {
	l := b.fan.log
	if l == nil || b.bcastHolds == nil {
		return b.pubcomp(cl, pid, codePacketIDNotFound)
	}
	t, ts := l.begin(b.clock.Now())
	rec, err := b.bcastHolds.ReleaseAt(broadcastLogName, cl.ID, pid, ts)
	if err != nil {
		l.end(t)
		if errors.Is(err, storage.ErrNotFound) {
			return b.pubcomp(cl, pid, codePacketIDNotFound)
		}
		b.qos2.mu.Lock()
		b.qos2.indexLocked(cl.ID, pid, ex)
		b.qos2.mu.Unlock()
		b.log.Error("releasing a QoS 2 broadcast publish", "client", cl.ID, "error", err)
		code := withReason(codeImplementation, "the broadcast log could not store the released publish")
		return noopPacket, b.refuseRelease(cl, pid, broadcastLogName, code)
	}
	l.set(t, rec.Offset)
	l.writes.Add(1)
	unlock := func() {}
	if rec.Retain {
		// Retained and delivered as one step among new subscriptions
		// (retained_order.go).
		b.retainedOrder.RLock()
		unlock = b.retainedOrder.RUnlock
		// The topic's current value (MQTT 5 §3.3.1.3) from the release on.
		// A retained store without room loses only the retained copy: the
		// message is in the log and is delivered (logged, never silent).
		if err := b.retain(cl, packetOfRecord(rec)); err != nil {
			b.log.Warn("released QoS 2 broadcast not retained", "client", cl.ID, "topic", rec.Topic, "error", err)
		}
	}
	b.deliverLogged(cl, rec)
	unlock()
	l.end(t)
	return b.pubcomp(cl, pid, packets.CodeSuccess)
}

// packetOfRecord is a logged broadcast message as the PUBLISH it was: what
// the retained store keeps of it.
func packetOfRecord(rec storage.Record) packets.Packet {
	m := msgFromRecord(rec)
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: rec.QoS, Retain: rec.Retain},
		TopicName:   rec.Topic,
		Payload:     rec.Payload,
		Properties:  m.props,
	}
	if m.expiry > 0 {
		pk.Properties.MessageExpiryInterval = m.expiry
	}
	return pk
}
