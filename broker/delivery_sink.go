package broker

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// deliverySink is where a channel pump hands its deliveries
// (rfcs/delivery-seam.md "The delivery sink"): the append pump (consumer.go),
// the latest pump (latest_consumer.go) and the queue engine's offers to its
// workers (queue.go, queue_offer.go) reach the session's deliveries only
// through it. It is defined here by what those pumps do with a
// receiver, and no more: ask whether it is still there and may be sent a
// topic, ask for room, reserve a delivery (a packet identifier and a place
// under the receiver's Receive Maximum, the exchange carrying the pump's
// cookie back at the acknowledgement), write a run, give back a
// reservation never written, and end a receiver a record is too large for.
//
// A sink is bound to the one receiver it serves. The first one (connSink)
// is the session's deliveries bound to the mochi connection it serves; the
// bridge's outbound reader (the next step) will be a second one that is no
// *mqtt.Client at all, so no pump names *mqtt.Client — the connection
// stays inside connSink. session_seam_test.go holds the pumps to that.
type deliverySink interface {
	// closed reports whether the receiver is gone: the pump stops.
	closed() bool
	// permit asks the one permission function (Broker.permit) whether the
	// receiver may be sent topic on route r (invariant 16: a refusal
	// stalls the pump where it stands).
	permit(r route, topic string) bool
	// room reports whether the receiver is still the one served and has
	// room for one more QoS 1/2 delivery under its Receive Maximum.
	room() bool
	// reserve gives pk a packet identifier and records the exchange, with
	// t, the cookie its acknowledgement brings back; false when the
	// receiver is no longer served or has no room (deliveries.reserve).
	reserve(t ackTarget, r route, pk *packets.Packet, now time.Time) bool
	// writeRun encodes n packets (pk(i) is the i-th) and writes them in one
	// write: where an encode stopped the run, its error, and the write's
	// (deliveries.writeRun).
	writeRun(n int, pk func(i int) *packets.Packet) (stop int, encErr, written error)
	// release gives back a reservation made by t that was never written.
	release(pid uint16, t ackTarget)
	// refuseTooLarge ends the receiver a delivery is over the Maximum
	// Packet Size of (0x95; docs/channels.md "What a delivery carries": a
	// record is never skipped).
	refuseTooLarge()
}

// connSink is the session's deliveries bound to the connection cl they
// serve: the *mqtt.Client a pump used to carry is held here, and every
// method asks about, or writes to, that connection only (invariant 17:
// reserve and write refuse once cl is no longer the connection served).
type connSink struct {
	b  *Broker
	d  *deliveries
	cl *mqtt.Client
}

// sink is the session's delivery sink for the connection cl: what its
// pumps are started with (sessionEstablished; subscribe's startDeliveries).
func (s *session) sink(b *Broker, cl *mqtt.Client) deliverySink {
	return connSink{b: b, d: s.deliv, cl: cl}
}

// closed: a connection the substrate closed, or one without a socket,
// takes no more writes.
func (k connSink) closed() bool { return k.cl.Closed() || k.cl.Net.Conn == nil }

func (k connSink) permit(r route, topic string) bool { return k.b.permit(k.cl, r, topic) }

func (k connSink) room() bool { return k.d.room(k.cl) }

func (k connSink) reserve(t ackTarget, r route, pk *packets.Packet, now time.Time) bool {
	return k.d.reserve(k.cl, t, r, pk, now)
}

func (k connSink) writeRun(n int, pk func(i int) *packets.Packet) (stop int, encErr, written error) {
	return k.d.writeRun(k.cl, n, pk)
}

func (k connSink) release(pid uint16, t ackTarget) { k.d.release(pid, t) }

func (k connSink) refuseTooLarge() { _ = k.b.mqtt.DisconnectClient(k.cl, packets.ErrPacketTooLarge) }

// writeOne writes the one packet pk through k: the queue's handover, one
// job per worker at a time. Its error is the encode's where pk could not be
// encoded for the receiver (packets.ErrPacketTooLarge: over its Maximum
// Packet Size, nothing written), else the write's.
func writeOne(k deliverySink, pk *packets.Packet) error {
	_, encErr, written := k.writeRun(1, func(int) *packets.Packet { return pk })
	if encErr != nil {
		return encErr
	}
	return written
}
