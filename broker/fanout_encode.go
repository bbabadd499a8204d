package broker

import (
	"bytes"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Encoding a broadcast message once for the sessions it is fanned out to
// (rfcs/fanout.md "Encoded once"). A PUBLISH to one subscriber differs from
// the same message to another of the same shape only in bytes whose place
// does not move:
//
//   - the first byte: DUP, QoS and RETAIN (MQTT 5 §3.3.1) — QoS 1 and 2
//     encode alike but for these bits;
//   - the Packet Identifier, two bytes right after the Topic Name, before
//     the properties (MQTT 5 §3.3.2.2) — present only at QoS 1/2.
//
// What does move them is the shape: the protocol level (a 3.1.1 PUBLISH has
// no properties, MQTT 5 §3.3.2.3 does), whether there is a Packet
// Identifier at all (QoS 0 has none, MQTT-2.2.1-2), and the Message Expiry
// Interval as sent (§3.3.2.3.3: the seconds left, which differ from one
// second to the next). A delivery carrying Subscription Identifiers
// (§3.3.2.3.8: the subscriber's own numbers, in the properties) is encoded
// on its own. The broker sends no Topic Alias (§3.3.2.3.4), so nothing else
// in the properties is per subscriber. The client's Maximum Packet Size
// (§3.1.2.11.4) only compares the length, which the shape fixes.

// encodedShapes is how many shapes one message keeps encoded (invariant 13:
// a fixed number per message). 3.1.1 and 5, each with and without a Packet
// Identifier, take four; a message with an expiry may need one more per
// second that passes while it is fanned out. Past it a delivery is encoded
// on its own.
const encodedShapes = 4

// shapeKey is what makes two deliveries of one message differ beyond the
// bytes patched.
type shapeKey struct {
	v5     bool
	pid    bool   // QoS 1/2: a Packet Identifier follows the topic
	expiry uint32 // the Message Expiry Interval sent (MQTT 5 only)
}

// encodedShape is one shape's encoding, made once by the first sender that
// needs it (once) while the others of that shape wait for it: b holds it
// with the Packet Identifier bytes (at pidAt, when the shape has one) as
// encoded for that first delivery — every copy overwrites them and the first
// byte. b stays nil when the encoding was too large to keep (keepable).
type encodedShape struct {
	key   shapeKey
	once  sync.Once
	b     []byte
	pidAt int
}

// encodings are a broadcast message's shapes. Made when a first shape is
// wanted; its lock is a leaf, taken under an outbox's lock (heldLocked
// trims it there) and held for no encoding; nothing is taken under it.
type encodings struct {
	mu     sync.Mutex
	n      int
	shapes [encodedShapes]*encodedShape
}

// What a message's encodings hold besides the encoded bytes, as allocated.
var (
	encodingsCost = allocated(int(unsafe.Sizeof(encodings{})))
	shapeCost     = allocated(int(unsafe.Sizeof(encodedShape{})))
)

// encodeCounts are the broker's counts of broadcast encodings
// (BroadcastEncodes).
type encodeCounts struct {
	encoded atomic.Int64 // PUBLISH packets encoded by the substrate's encoder
	copied  atomic.Int64 // deliveries written as a copy of a shape already encoded
}

// BroadcastEncodeStats is how the broadcast senders encoded what they wrote
// since the broker started: Encoded packets went through the encoder, Copied
// ones were a message's encoding for another subscriber of the same shape
// with its Packet Identifier and first byte patched.
type BroadcastEncodeStats struct {
	Encoded int64
	Copied  int64
}

// BroadcastEncodes reports the broadcast senders' encoding counts.
func (b *Broker) BroadcastEncodes() BroadcastEncodeStats {
	return BroadcastEncodeStats{Encoded: b.fan.encodes.encoded.Load(), Copied: b.fan.encodes.copied.Load()}
}

// heldLocked notes that one more (d 1) or one fewer (d -1) outbox entry
// holds m — waiting in a queue, or on the wire at QoS 1/2 — and lets go of
// the shapes no entry pays for any more. Caller holds that outbox's lock.
//
// invariant 13: every such entry is charged at least m.charge() against
// its session's limits.session_queue_bytes, and one of them pays for the
// message itself. A shape is kept only while another entry pays for it: at
// most held-1 shapes, each (with the encodings' own header) no larger than
// one entry's charge (keepable). So what the bounds count still covers what
// is held, and the encodings go when the last entry but one lets the
// message go.
func (m *broadcastMsg) heldLocked(d int32) {
	q := m.held.Add(d)
	e := m.enc.Load()
	if e == nil {
		return
	}
	e.mu.Lock()
	for e.n > 0 && int32(e.n) > q-1 {
		e.n--
		e.shapes[e.n] = nil // a sender still copying it keeps its own pointer
	}
	e.mu.Unlock()
	if q <= 1 {
		// Nothing pays for the struct either; a shape call racing this
		// finds held too low under its lock and adds nothing.
		m.enc.CompareAndSwap(e, nil)
	}
}

// keepable reports whether an encoding of n bytes may be kept: one
// entry's charge covers it with its shape and the encodings' header.
func (m *broadcastMsg) keepable(n int) bool {
	return allocated(n)+shapeCost+encodingsCost <= m.content+msgHeaderCost
}

// shape returns m's shape for key, adding it if there is room (a fixed
// number, and no more than entries other than the message's own pay for);
// nil when there is none.
func (m *broadcastMsg) shape(key shapeKey) *encodedShape {
	if m.held.Load() < 2 {
		return nil
	}
	e := m.enc.Load()
	if e == nil {
		m.enc.CompareAndSwap(nil, &encodings{})
		if e = m.enc.Load(); e == nil {
			return nil // let go meanwhile: the message is leaving the queues
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.shapes[:e.n] {
		if s.key == key {
			return s
		}
	}
	if e.n >= encodedShapes || int32(e.n) >= m.held.Load()-1 {
		return nil
	}
	s := &encodedShape{key: key}
	e.shapes[e.n] = s
	e.n++
	return s
}

// encodeBroadcast appends pk, the delivery of m shaped for one subscriber
// (shapeBroadcast, its Packet Identifier reserved), to buf exactly as
// encodeDelivery would: copied from m's encoding of the same shape, made by
// whichever sender needed it first, or encoded on its own where the shape
// is per subscriber or there is no room to keep it. Past maxSize it returns
// ErrPacketTooLarge, buf as it was.
func (b *Broker) encodeBroadcast(buf *bytes.Buffer, m *broadcastMsg, pk *packets.Packet, v byte, maxSize uint32) error {
	var s *encodedShape
	if len(pk.Properties.SubscriptionIdentifier) == 0 {
		// With one, MQTT 5 §3.3.2.3.8: the subscriber's own numbers.
		key := shapeKey{v5: v == 5, pid: pk.FixedHeader.Qos > 0}
		if key.v5 {
			key.expiry = pk.Properties.MessageExpiryInterval
		}
		s = m.shape(key)
	}
	if s == nil {
		b.fan.encodes.encoded.Add(1)
		return encodeDelivery(buf, pk, v, maxSize)
	}
	mine := false
	var err error
	start := buf.Len()
	s.once.Do(func() {
		mine = true
		b.fan.encodes.encoded.Add(1)
		if err = encodeDelivery(buf, pk, v, 0); err != nil {
			return
		}
		if enc := buf.Bytes()[start:]; m.keepable(len(enc)) {
			s.b, s.pidAt = bytes.Clone(enc), pidOffset(enc, len(pk.TopicName))
		}
	})
	switch {
	case mine && err != nil:
		return err
	case mine:
		if maxSize > 0 && uint32(buf.Len()-start) > maxSize {
			buf.Truncate(start)
			return packets.ErrPacketTooLarge
		}
		return nil
	case s.b == nil:
		// Its first sender could not keep it.
		b.fan.encodes.encoded.Add(1)
		return encodeDelivery(buf, pk, v, maxSize)
	}
	if err := patchShape(buf, s, pk, maxSize); err != nil {
		return err
	}
	b.fan.encodes.copied.Add(1)
	return nil
}

// pidOffset is where the Packet Identifier sits in an encoded PUBLISH: after
// the first byte, the Remaining Length (a variable byte integer of one to
// four bytes, its last byte below 0x80, MQTT 5 §1.5.5) and the Topic Name
// (a two-byte length and the topic, §1.5.4).
func pidOffset(enc []byte, topicLen int) int {
	i := 1
	for enc[i]&0x80 != 0 {
		i++
	}
	return i + 1 + 2 + topicLen
}

// patchShape appends s's encoding to buf with pk's first byte and Packet
// Identifier.
func patchShape(buf *bytes.Buffer, s *encodedShape, pk *packets.Packet, maxSize uint32) error {
	if maxSize > 0 && uint32(len(s.b)) > maxSize {
		return packets.ErrPacketTooLarge // MQTT-3.1.2-24: not sent to this client
	}
	start := buf.Len()
	buf.Write(s.b)
	out := buf.Bytes()[start:]
	// MQTT 5 §3.3.1: type 3, then DUP, QoS (two bits) and RETAIN.
	out[0] = packets.Publish<<4 | bit(pk.FixedHeader.Dup)<<3 | pk.FixedHeader.Qos<<1 | bit(pk.FixedHeader.Retain)
	if s.key.pid {
		if pk.PacketID == 0 {
			buf.Truncate(start)
			return packets.ErrProtocolViolationNoPacketID // MQTT-2.2.1-2, as the encoder refuses it
		}
		out[s.pidAt], out[s.pidAt+1] = byte(pk.PacketID>>8), byte(pk.PacketID)
	}
	return nil
}

func bit(v bool) byte {
	if v {
		return 1
	}
	return 0
}
