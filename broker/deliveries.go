package broker

import (
	"bytes"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The delivery seam (rfcs/delivery-seam.md). Every delivery Sagüin makes to
// a session's connection — an append or latest pump's record, a queue job,
// a broadcast or shared-group message, a retained value — is handed over
// through the session's deliveries: asked permission for, given its packet
// identifier and its entry in the session's ack table, written, and
// acknowledged, released or taken back there. No other file touches the
// packet identifiers of server→client exchanges or writes a delivery to the
// connection.

// route is the path a delivery takes to the connection: what the
// permission hook is told, and what a stop or takeover does with the
// delivery if it is still unacknowledged.
type route uint8

const (
	routeAppend    route = iota + 1 // an append channel's consumer (consumer.go)
	routeLatest                     // a latest channel's consumer (latest_consumer.go)
	routeQueue                      // a queue job offered to a worker (queue_offer.go)
	routeBroadcast                  // broadcast owed to the session's own subscriptions (fanout_send.go)
	routeShared                     // broadcast a shared group handed the session (share.go)
	routeRetained                   // a retained value sent to a new subscription (retained.go)
)

func (r route) String() string {
	switch r {
	case routeAppend:
		return "append"
	case routeLatest:
		return "latest"
	case routeQueue:
		return "queue"
	case routeBroadcast:
		return "broadcast"
	case routeShared:
		return "shared"
	case routeRetained:
		return "retained"
	}
	return "unknown"
}

// kept reports whether an unacknowledged delivery on this route stays with
// the session when its connection goes, to be sent again to the next one
// (invariant 15: a session's own messages come back with it; a channel's
// records and a queue's jobs do not — the consumer resumes from its
// position and the queue offers its work again).
func (r route) kept() bool {
	return r == routeBroadcast || r == routeShared || r == routeRetained
}

// ackTarget is what the acknowledgement of one of Sagüin's deliveries
// reaches: the consumer, queue delivery or outbox that made it.
type ackTarget interface {
	acked(pid uint16)
}

// retainedAck is the target of a retained value's delivery: nothing waits
// on its acknowledgement beyond the packet identifier it frees.
type retainedAck struct{}

func (retainedAck) acked(uint16) {}

// exchange is one server→client QoS 1/2 exchange in the session's ack
// table.
type exchange struct {
	target ackTarget
	route  route
}

// deliveries is a session's deliveries to whichever connection owns it. Its
// lock is a leaf: nothing else is locked while it is held, and nothing is
// called out (no target, no permission hook, no socket).
type deliveries struct {
	mu sync.Mutex
	// table holds every unacknowledged QoS 1/2 exchange the broker started
	// with the session, by packet identifier, so an acknowledgement finds
	// its delivery in O(1).
	table map[uint16]exchange
}

func newDeliveries() *deliveries {
	return &deliveries{table: make(map[uint16]exchange)}
}

// reserve takes a packet identifier for a QoS 1/2 delivery on route r to
// cl, if the client's Receive Maximum leaves room, and records what its
// acknowledgement reaches. pk gets the identifier. It reports false when
// there is no room (the caller waits for an acknowledgement) or no
// identifier.
func (d *deliveries) reserve(cl *mqtt.Client, t ackTarget, r route, pk *packets.Packet) bool {
	if !windowFree(cl) {
		return false
	}
	pid, err := cl.NextPacketID()
	if err != nil {
		return false
	}
	pk.PacketID = uint16(pid)
	d.mu.Lock()
	d.table[pk.PacketID] = exchange{target: t, route: r}
	d.mu.Unlock()
	// The substrate's table reserves the identifier: no other delivery to
	// this client takes it until the acknowledgement frees it.
	cl.State.Inflight.Set(*pk)
	return true
}

// release takes back a reservation whose delivery never reached the wire
// (or never will): its identifier is free again. Only the target that
// reserved it releases it; one another delivery holds now is left alone.
func (d *deliveries) release(cl *mqtt.Client, pid uint16, t ackTarget) {
	d.mu.Lock()
	ex, ok := d.table[pid]
	mine := !ok || ex.target == t
	if ok && mine {
		delete(d.table, pid)
	}
	d.mu.Unlock()
	if mine && cl != nil {
		// Also when a stop already took it out of the table (takeBack):
		// the substrate's copy would be resent to a resuming connection.
		cl.State.Inflight.Delete(pid)
	}
}

// room reports whether the client's Receive Maximum leaves room for one
// more QoS 1/2 delivery.
func (d *deliveries) room(cl *mqtt.Client) bool {
	return windowFree(cl)
}

// inFlight is how many QoS 1/2 exchanges with the client are unfinished.
func (d *deliveries) inFlight(cl *mqtt.Client) int {
	return cl.State.Inflight.Len()
}

// receiveMaximum is how many QoS 1/2 deliveries the client takes
// unacknowledged (MQTT 5 §3.1.2.11.3: absent means 65,535).
func receiveMaximum(cl *mqtt.Client) int {
	if rm := int(cl.Properties.Props.ReceiveMaximum); rm > 0 {
		return rm
	}
	return 65535
}

// track records a delivery whose identifier was taken elsewhere (a route
// not yet handed over to reserve).
func (d *deliveries) track(pid uint16, t ackTarget, r route) {
	d.mu.Lock()
	d.table[pid] = exchange{target: t, route: r}
	d.mu.Unlock()
}

// forget drops an identifier a route tracked.
func (d *deliveries) forget(pid uint16) {
	d.mu.Lock()
	delete(d.table, pid)
	d.mu.Unlock()
}

// take removes the exchange under pid and returns what it acknowledges.
func (d *deliveries) take(pid uint16) (ackTarget, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ex, ok := d.table[pid]
	if ok {
		delete(d.table, pid)
	}
	return ex.target, ok
}

// owns reports whether pid is held by target t.
func (d *deliveries) owns(pid uint16, t ackTarget) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ex, ok := d.table[pid]
	return ok && ex.target == t
}

// takeBack is the stop of the session's pumps (a connection gone, taken
// over, or the session ending): the deliveries of routes that are not kept
// leave the table, and the channel ones leave cl's in-flight table too, so
// nothing resends them (invariant 15; a queue's are returned by its engine,
// removeWorker). Kept ones stay with the session.
func (d *deliveries) takeBack(cl *mqtt.Client) {
	d.mu.Lock()
	var dropped []uint16
	for pid, ex := range d.table {
		if ex.route.kept() {
			continue
		}
		delete(d.table, pid)
		if ex.route == routeAppend || ex.route == routeLatest {
			dropped = append(dropped, pid)
		}
	}
	d.mu.Unlock()
	if cl != nil {
		for _, pid := range dropped {
			cl.State.Inflight.Delete(pid)
		}
	}
}

// write writes bytes already encoded to cl in one write: the connection's
// writer (clientConn.Write) serialises it with every other write to the
// socket and bounds it by limits.write_timeout (invariant 16). It does not
// take the substrate's client lock, which the substrate holds across its
// own blocking writes.
func (d *deliveries) write(cl *mqtt.Client, p []byte) error {
	if cl.Closed() || cl.Net.Conn == nil {
		return mqtt.ErrConnectionClosed
	}
	_, err := cl.Net.Conn.Write(p)
	return err
}

// writePacket encodes one PUBLISH for cl (encodeDelivery) and writes it.
func (d *deliveries) writePacket(cl *mqtt.Client, pk packets.Packet) error {
	var buf bytes.Buffer
	if err := encodeDelivery(&buf, &pk, cl.Properties.ProtocolVersion, cl.Properties.Props.MaximumPacketSize); err != nil {
		return err
	}
	return d.write(cl, buf.Bytes())
}

// permit is the one permission function every delivery passes, on every
// route, before anything is reserved for it (invariant 16: per delivery,
// not only at SUBSCRIBE). It asks the acl hook, which allows everything in
// this build; a test may stand in for it (SetDeliveryPermit).
func (b *Broker) permit(cl *mqtt.Client, r route, topic string) bool {
	if f := b.permitTest.Load(); f != nil {
		return (*f)(cl.ID, r.String(), topic)
	}
	h := hook{b: b}
	return h.OnACLCheck(cl, topic, false)
}
