package broker

import (
	"bytes"
	"errors"
	"fmt"
	"saguin.dev/broker/partition"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// retainedStoreName is the value store broadcast retained values live in,
// on the provider broker.retained.storage names.
const retainedStoreName = "$saguin/retained"

// retainedSweepLimit bounds one age sweep of the retained store: the rest
// waits for the next tick (invariant 13).
const retainedSweepLimit = 100000

// openRetained opens the broadcast retained store (docs/channels.md "Retained
// messages"): MQTT's own store, kept on a provider so it survives a restart
// as that provider promises, and bounded by that provider's max_bytes.
func (b *Broker) openRetained() error {
	name := b.cfg.Broker.Retained.Storage
	if name == "" {
		name = b.cfg.Broker.DefaultProvider
	}
	p, err := b.provider(name)
	if err != nil {
		return err
	}
	if b.retained, err = p.Values(retainedStoreName); err != nil {
		return fmt.Errorf("retained store on provider %s: %w", name, err)
	}
	return nil
}

// retain stores (or, for an empty payload, removes) the retained value of a
// broadcast topic before the publish is acknowledged (invariant 18). The
// substrate's own in-memory copy is discarded in OnRetainMessage: the
// provider's store is the only one, so its bound is the only bound.
func (b *Broker) retain(cl *mqtt.Client, pk packets.Packet) error {
	if len(pk.Payload) == 0 {
		_, err := b.retained.Remove(pk.TopicName)
		return err
	}
	rec := b.recordOf(cl, pk)
	// MQTT's store keeps the packet as published (less saguin-* but
	// saguin-id, as the fan-out forwards it), not a channel record's headers.
	rec.Headers = rec.Headers[:0]
	for _, u := range pk.Properties.User {
		rec.Headers = append(rec.Headers, storage.Header{Name: u.Key, Value: u.Val})
	}
	_, err := b.retained.Put(rec)
	return err
}

// retainedRefusal maps a retained-store failure to its reason code.
func retainedRefusal(err error) packets.Code {
	if errors.Is(err, storage.ErrFull) {
		return withReason(codeQuotaExceeded, "the retained store is full")
	}
	return withReason(codeImplementation, "the retained value could not be stored")
}

// retainedExpired: a retained value's own Message Expiry discards it, as
// MQTT says (MQTT-3.3.2-5); this is MQTT's store, not a channel, so the
// publisher's clock applies here and nowhere else (invariant 2).
func retainedExpired(rec *storage.Record, now time.Time) bool {
	// invariant 2: Message Expiry removes MQTT's retained value, never a channel record.
	if rec.MessageExpiry == nil || rec.Timestamp.IsZero() {
		return false
	}
	return !now.Before(rec.Timestamp.Add(time.Duration(*rec.MessageExpiry) * time.Second))
}

// retainedFor reads the retained values a new subscription is sent (MQTT 5
// §3.3.1.3): none to $share or per Retain Handling, none past their own
// expiry. The caller holds retainedOrder, so the read is the retained
// store as it was when the subscription was made (retained_order.go).
func (b *Broker) retainedFor(sub packets.Subscription, existed bool, declared partition.Matcher) []storage.Record {
	if sub.RetainHandling == 2 || (sub.RetainHandling == 1 && existed) || len(sub.ShareName) > 0 {
		return nil
	}
	now := b.clock.Now()
	var matched []storage.Record
	err := b.retained.Scan(func(rec storage.Record) bool {
		// A declared slice takes the retained pass too: it is a
		// current-state pass (rfcs/partition.md).
		if topic.Match(sub.Filter, rec.Topic) && declared.Match(rec.Topic) && !retainedExpired(&rec, now) {
			if _, claimed := b.resolver.Resolve(rec.Topic); !claimed {
				matched = append(matched, rec)
			}
		}
		return true
	})
	if err != nil {
		b.log.Error("reading the retained store", "error", err)
		return nil
	}
	return matched
}

// sendRetained writes a new subscription's retained values, read by
// retainedFor: after the SUBACK, with RETAIN set and the remaining expiry
// countdown, through the session's deliveries (deliveries.go), each asked
// permission for. Written outside retainedOrder: a slow subscriber's socket
// holds up no publisher (invariant 16). Values past what the client's
// Receive Maximum has room for now are handed to a goroutine of the
// session's that sends them as acknowledgements free room
// (retained_rest.go): this runs on the read loop, which must go back to
// reading those acknowledgements. A value over the client's Maximum Packet
// Size is not sent (MQTT-3.1.2-25); the subscriber stays connected.
func (b *Broker) sendRetained(s *session, cl *mqtt.Client, sub packets.Subscription, matched []storage.Record) {
	if s == nil || len(matched) == 0 {
		return
	}
	if n, full := b.writeRetained(s, cl, sub, matched); full {
		b.holdRetained(s, cl, sub, matched[n:])
	}
}

// writeRetained writes recs in order until the client's Receive Maximum has
// no room for the next QoS 1/2 value. It reports how many it took (written,
// or let go: refused by the permission hook, too large, expired) and
// whether it stopped for room; it also stops, reporting not full, once the
// connection is no longer the one served or a write fails.
func (b *Broker) writeRetained(s *session, cl *mqtt.Client, sub packets.Subscription, recs []storage.Record) (taken int, full bool) {
	d := s.deliv
	now := b.clock.Now()
	v, maxSize := cl.Properties.ProtocolVersion, cl.Properties.Props.MaximumPacketSize
	var buf bytes.Buffer
	flush := func() bool {
		if buf.Len() == 0 {
			return true
		}
		err := d.write(cl, buf.Bytes())
		buf.Reset()
		if err != nil {
			b.log.Debug("retained values not written", "client", cl.ID, "error", err)
			return false
		}
		return true
	}
	for i := range recs {
		rec := &recs[i]
		if retainedExpired(rec, now) {
			continue // expired while it waited for room: no longer served
		}
		if !b.permit(cl, routeRetained, rec.Topic) {
			continue // a refusal on the way out is not a delivery: nothing sent
		}
		m := matched1(sub, rec)
		pk := b.deliveryPacket(rec, nil, m, now)
		pk.FixedHeader.Retain = true // the stored pass always carries RETAIN
		// The retained store is broadcast: the packet as it was published,
		// without a channel's saguin-* labels.
		pk.Properties.User = nil
		for _, h := range rec.Headers {
			pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: h.Name, Val: h.Value})
		}
		if rec.MessageExpiry != nil {
			left := rec.Timestamp.Add(time.Duration(*rec.MessageExpiry) * time.Second).Sub(now)
			pk.Properties.MessageExpiryInterval = uint32((left + time.Second - 1) / time.Second)
		}
		// invariant 13: no more QoS 1/2 values unacknowledged than the
		// client's Receive Maximum; the rest wait for room, not dropped.
		if pk.FixedHeader.Qos > 0 && !d.reserve(cl, retainedAck{}, routeRetained, &pk, now) {
			if !flush() || !d.serves(cl) {
				return i, false
			}
			return i, true
		}
		if err := encodeDelivery(&buf, &pk, v, maxSize); err != nil {
			d.release(pk.PacketID, retainedAck{})
			b.log.Debug("retained value not written", "client", cl.ID, "topic", rec.Topic, "error", err)
			continue
		}
		if buf.Len() >= fanoutWriteBytes && !flush() {
			return i + 1, false
		}
	}
	flush()
	return len(recs), false
}

func matched1(sub packets.Subscription, rec *storage.Record) matched {
	m := matched{qos: min(sub.Qos, rec.QoS)}
	if sub.Identifier > 0 {
		m.ids = []int{sub.Identifier}
	}
	return m
}

// sweepRetained removes retained values past their own expiry or past
// broker.retained.retention_period.
func (b *Broker) sweepRetained() {
	if b.retained == nil {
		return
	}
	now := b.clock.Now()
	period := b.cfg.Broker.Retained.RetentionPeriod
	var gone []string
	_ = b.retained.Scan(func(rec storage.Record) bool {
		old := period > 0 && !rec.Timestamp.IsZero() && now.Sub(rec.Timestamp) > period
		if old || retainedExpired(&rec, now) {
			gone = append(gone, rec.Topic)
		}
		return len(gone) < retainedSweepLimit
	})
	for _, t := range gone {
		if _, err := b.retained.Remove(t); err != nil {
			b.log.Warn("removing an expired retained value", "topic", t, "error", err)
		}
	}
}
