package broker

import (
	"bytes"
	"errors"
	"slices"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/wire"
)

// The delivery seam (rfcs/delivery-seam.md). Every delivery Sagüin makes to
// a session's connection — an append or latest pump's record, a queue job,
// a broadcast or shared-group message, a retained value, and what a resumed
// session is sent again — is handed over through the session's deliveries:
// asked permission for, given its packet identifier and its entry in the
// session's ack table, written, and acknowledged, released or taken back
// there. No other file touches the packet identifiers of server→client
// exchanges or writes a delivery to the connection.
//
// The identifiers are the session's own, not the substrate's. The
// substrate kept one in-flight table for both directions, keyed by packet
// identifier, though the client and the server number their exchanges
// independently (MQTT 5 §2.2.1): a client PUBLISH under the number of one
// of our deliveries deleted that delivery's entry, a SUBSCRIBE or
// UNSUBSCRIBE under it was answered 0x91, and the client's PUBRECs for our
// QoS 2 deliveries spent its own Receive Maximum. The substrate's table now
// holds only the client's QoS 2 exchanges with the broker, and never sees a
// PUBACK, PUBREC or PUBCOMP: those always answer an exchange the broker
// started (MQTT 5 §4.3), so they come here (OnPacketRead).

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
// reaches: the consumer, queue delivery or outbox that made it. acked is
// called once per exchange that ends (PUBACK, PUBCOMP, a PUBREC refusing
// it, or a resend let go), never with a lock of the deliveries held.
type ackTarget interface {
	acked(pid uint16)
}

// pubrecTarget is a target that learns of the PUBREC of its QoS 2
// delivery. It reports whether it writes the PUBREL itself: the outbox does
// for a logged message of a durable session, once the window saying
// "PUBREL owed" is stored (rfcs/broadcast-log.md), so a crash after the PUBREL
// resends the PUBREL, never the message.
type pubrecTarget interface {
	pubrecd(pid uint16) (writesPubrel bool)
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
	qos    byte
	// seq orders the exchanges as first sent: a resume sends them again in
	// that order (MQTT-4.6.0-1).
	seq uint64
	// pubrel: the client PUBREC'd the QoS 2 delivery; a PUBREL is owed
	// until its PUBCOMP, and the message is never sent again.
	pubrel bool
	// resend is the PUBLISH as first written, for a kept route: what a
	// resumed session is sent again (with DUP). expires is when its
	// Message Expiry Interval runs out (zero: none).
	resend  *packets.Packet
	expires time.Time
}

// deliveries is a session's deliveries to whichever connection owns it,
// and the session's server→client packet identifiers. Its lock is a leaf:
// nothing else is locked while it is held, and nothing is called out (no
// target, no permission hook, no socket) — so any lock may be held by a
// caller (c.mu, q.mu), and none may be taken inside.
type deliveries struct {
	mu sync.Mutex
	// cl is the connection served (resume), nil while the session is away
	// or its pumps are stopped (takeBack): nothing is reserved for, or
	// written to, any other connection (invariant 17).
	cl *mqtt.Client
	// table holds every unfinished QoS 1/2 exchange the broker started with
	// the session, by packet identifier. Bounded (invariant 13): nothing is
	// reserved past the client's Receive Maximum, at most 65,535.
	table map[uint16]*exchange
	next  uint16 // the identifier last given: the next search starts after it
	seq   uint64
	// writing counts the writes in progress to cl; idle, made only when a
	// stop waits for them (stopWriting), is closed when the count falls
	// back to zero — no channel is made per write.
	writing int
	idle    chan struct{}
}

// cutGrace is how long a stop waits for a write in progress to the
// connection it stops serving before closing that connection. A client
// that keeps reading takes a write at once; one that stopped holds it for
// write_timeout — with write_timeout none and no keep-alive, for good —
// and the stop (a takeover, on the new connection's own goroutine; the
// broker's Close) would wait as long (invariant 16).
const cutGrace = time.Second

// errStopCut is the end of a connection whose write a stop cut.
var errStopCut = errors.New("a write to this connection was cut: its session's deliveries were stopped while the client was not reading")

// closedChan is an idle that is already over.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newDeliveries() *deliveries {
	return &deliveries{table: make(map[uint16]*exchange)}
}

// clientReceiveMaximum is how many QoS 1/2 deliveries the client takes
// unacknowledged (MQTT 5 §3.1.2.11.3: absent means 65,535).
func clientReceiveMaximum(cl *mqtt.Client) int {
	if rm := int(cl.Properties.Props.ReceiveMaximum); rm > 0 {
		return rm
	}
	return 65535
}

// room reports whether cl is the connection served and its Receive
// Maximum leaves room for one more QoS 1/2 delivery: counted against the
// session's own exchanges, not the client's exchanges with the broker.
func (d *deliveries) room(cl *mqtt.Client) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cl == cl && len(d.table) < clientReceiveMaximum(cl)
}

// serves reports whether cl is the connection served.
func (d *deliveries) serves(cl *mqtt.Client) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cl == cl
}

// inFlight is how many QoS 1/2 deliveries are unfinished.
func (d *deliveries) inFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.table)
}

// reserve takes a packet identifier for a QoS 1/2 delivery on route r to
// cl and records the exchange: what its acknowledgement reaches and, on a
// kept route, the packet to send again (pk as it is now, with its
// identifier; its expiry counted from now). pk gets the identifier. It
// reports false when cl is not the connection served or its Receive
// Maximum is full: the caller waits for an acknowledgement (or stops).
func (d *deliveries) reserve(cl *mqtt.Client, t ackTarget, r route, pk *packets.Packet, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	// invariant 13: the table is bounded before anything is added to it,
	// by the client's Receive Maximum (at most 65,535); invariant 17:
	// only the connection that owns the session is served.
	if d.cl != cl || len(d.table) >= clientReceiveMaximum(cl) {
		return false
	}
	// Fewer than 65,535 are taken (the Receive Maximum is at most that), so
	// a free identifier is found.
	for {
		d.next++
		if d.next == 0 {
			d.next = 1
		}
		if _, taken := d.table[d.next]; !taken {
			break
		}
	}
	pk.PacketID = d.next
	d.seq++
	ex := &exchange{target: t, route: r, qos: pk.FixedHeader.Qos, seq: d.seq}
	if r.kept() {
		keep := *pk
		ex.resend = &keep
		if e := pk.Properties.MessageExpiryInterval; e > 0 {
			ex.expires = now.Add(time.Duration(e) * time.Second)
		}
	}
	d.table[pk.PacketID] = ex
	return true
}

// restore puts back an exchange a restart found in the session's stored
// window (bcastlog_restore.go), under its packet identifier: the message
// to send again, or a PUBREL owed. Called in the order first sent.
func (d *deliveries) restore(pid uint16, t ackTarget, r route, pk *packets.Packet, pubrel bool, expires time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	ex := &exchange{target: t, route: r, qos: 2, seq: d.seq, pubrel: pubrel, expires: expires}
	if !pubrel {
		keep := *pk
		keep.PacketID = pid
		ex.resend, ex.qos = &keep, pk.FixedHeader.Qos
	}
	d.table[pid] = ex
}

// release takes back a reservation whose delivery never reached the wire
// (or never will): its identifier is free again. Only the target that
// reserved it releases it; one another delivery holds now is left alone.
func (d *deliveries) release(pid uint16, t ackTarget) {
	d.mu.Lock()
	if ex, ok := d.table[pid]; ok && ex.target == t {
		delete(d.table, pid)
	}
	d.mu.Unlock()
}

// pubrelDue reports whether the exchange under pid, made by t, is waiting
// for a PUBREL the target undertook to write (pubrecTarget).
func (d *deliveries) pubrelDue(pid uint16, t ackTarget) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ex, ok := d.table[pid]
	return ok && ex.target == t && ex.pubrel
}

// takeBack is the stop of the session's pumps (a connection gone, taken
// over, or the session ending): nothing is written to the connection from
// here on, and the exchanges of routes that are not kept leave the table —
// a channel consumer resumes from its position and a queue's engine takes
// its jobs back (removeWorker), so a late acknowledgement on the old
// connection reaches none of them (invariant 15). Kept ones stay with the
// session for the next connection (resume).
func (d *deliveries) takeBack() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cl = nil
	for pid, ex := range d.table {
		// invariant 15: no channel record or queue job stays in flight
		// past its connection; the session's own messages do.
		if !ex.route.kept() {
			delete(d.table, pid)
		}
	}
}

// ack applies the client's PUBACK, PUBREC or PUBCOMP (OnPacketRead): each
// answers an exchange the broker started.
func (d *deliveries) ack(b *Broker, s *session, cl *mqtt.Client, pk packets.Packet) {
	pid := pk.PacketID
	d.mu.Lock()
	ex, ok := d.table[pid]
	switch {
	case !ok:
		d.mu.Unlock()
		if pk.FixedHeader.Type == packets.Pubrec {
			// MQTT 5 §4.3.3: a PUBREC for no exchange of ours is answered
			// PUBREL 0x92 Packet Identifier not found.
			_ = d.writeAck(cl, packets.Pubrel, pid, packets.ErrPacketIdentifierNotFound.Code)
		} else {
			b.log.Debug("acknowledgement for no delivery ignored", "client", cl.ID, "packet", wire.PacketName(pk.FixedHeader.Type), "packet_id", pid)
		}
		return
	case pk.FixedHeader.Type == packets.Pubrec && ex.qos == 2 && pk.ReasonCode < 0x80:
		// Received: a PUBREL is owed until the PUBCOMP, and the message is
		// never sent again (MQTT-4.3.3-4, -5).
		ex.pubrel, ex.resend = true, nil
		d.mu.Unlock()
		if pt, ok := ex.target.(pubrecTarget); ok && pt.pubrecd(pid) {
			return
		}
		_ = d.writeAck(cl, packets.Pubrel, pid, 0)
		return
	case pk.FixedHeader.Type == packets.Puback && ex.qos != 1,
		pk.FixedHeader.Type == packets.Pubrec && ex.qos != 2,
		pk.FixedHeader.Type == packets.Pubcomp && ex.qos != 2:
		d.mu.Unlock()
		b.log.Debug("acknowledgement of the wrong kind ignored", "client", cl.ID, "packet", wire.PacketName(pk.FixedHeader.Type),
			"packet_id", pid, "qos", ex.qos)
		return
	}
	// PUBACK, PUBCOMP, or a PUBREC refusing the message (MQTT 5 §4.13.2):
	// the exchange is over and its identifier free. invariant 7: a queue
	// job's lease starts here, at its PUBACK (queueAck.acked), never at the
	// send.
	delete(d.table, pid)
	d.mu.Unlock()
	ex.target.acked(pid)
	s.roomFreed(b)
}

// resume serves a connection that now owns the session (OnSessionEstablished,
// after the CONNACK, before any pump starts): what stayed unacknowledged is
// sent again, in the order first sent, under its packet identifier — a
// PUBLISH with DUP (MQTT-3.3.1-1), or the PUBREL owed (MQTT-4.4.0-1). A
// PUBLISH the permission hook now refuses, or that no longer fits the
// client's Maximum Packet Size, is let go like an acknowledged one.
func (d *deliveries) resume(b *Broker, cl *mqtt.Client) {
	d.mu.Lock()
	// invariant 15: what is sent again is the session's own messages only
	// (takeBack dropped the rest), under the identifiers first sent.
	d.cl = cl
	list := make([]uint16, 0, len(d.table))
	for pid := range d.table {
		list = append(list, pid)
	}
	slices.SortFunc(list, func(a, c uint16) int { return cmpU64(d.table[a].seq, d.table[c].seq) })
	exs := make([]exchange, len(list))
	for i, pid := range list {
		exs[i] = *d.table[pid]
	}
	d.mu.Unlock()
	if len(list) == 0 {
		return
	}
	now := b.clock.Now()
	v, maxSize := cl.Properties.ProtocolVersion, cl.Properties.Props.MaximumPacketSize
	var buf bytes.Buffer
	var gone []int
	for i, pid := range list {
		ex := &exs[i]
		if ex.pubrel {
			appendAck(&buf, packets.Pubrel, pid, 0, v)
			continue
		}
		if ex.resend == nil || !b.permit(cl, ex.route, ex.resend.TopicName) {
			gone = append(gone, i)
			continue
		}
		pk := *ex.resend
		pk.FixedHeader.Dup = true
		if !ex.expires.IsZero() {
			// Counted down by the wait; a message already on its way is
			// completed, so it is sent with at least one second left.
			left := (ex.expires.Sub(now) + time.Second - 1) / time.Second
			pk.Properties.MessageExpiryInterval = uint32(max(left, 1))
		}
		if err := encodeDelivery(&buf, &pk, v, maxSize); err != nil {
			b.log.Debug("delivery not sent again", "client", cl.ID, "topic", pk.TopicName, "error", err)
			gone = append(gone, i)
		}
	}
	for _, i := range gone {
		d.release(list[i], exs[i].target)
		exs[i].target.acked(list[i])
	}
	if buf.Len() > 0 {
		if err := d.write(cl, buf.Bytes()); err != nil {
			b.log.Debug("resending unacknowledged deliveries failed", "client", cl.ID, "error", err)
		}
	}
}

// writeAnswers writes a connection's answers to its own publishes (PUBACKs
// already encoded, rfcs/pipelined-publish.md) to cl in one write. They are
// no delivery — no packet identifier of the session's — so they go to the
// connection whatever session it serves, through the same connection writer
// (clientConn.Write: serialised with every other write, bounded by
// limits.write_timeout, invariant 16), with no lock held.
func writeAnswers(cl *mqtt.Client, p []byte) error {
	if cl.Closed() || cl.Net.Conn == nil {
		return mqtt.ErrConnectionClosed
	}
	_, err := cl.Net.Conn.Write(p)
	return err
}

// write writes bytes already encoded to cl in one write, if cl is the
// connection served: the connection's writer (clientConn.Write) serialises
// it with every other write to the socket and bounds it by
// limits.write_timeout (invariant 16). It never takes the substrate's
// client lock, which the substrate holds across its own blocking writes.
func (d *deliveries) write(cl *mqtt.Client, p []byte) error {
	d.mu.Lock()
	if d.cl != cl || cl.Closed() || cl.Net.Conn == nil {
		d.mu.Unlock()
		return mqtt.ErrConnectionClosed
	}
	d.writing++
	d.mu.Unlock()
	// invariant 16: bounded by write_timeout in clientConn.Write, on the
	// delivering route's own goroutine, with no lock of ours held.
	_, err := cl.Net.Conn.Write(p)
	if cc, ok := cl.Net.Conn.(*clientConn); ok && err == nil {
		// Every delivery, resends and queue jobs included, is written
		// here: counted by its PUBLISH packets (saguin_deliveries_sent_total).
		cc.shard().deliveriesOut.Add(publishesIn(p))
	}
	d.mu.Lock()
	if d.writing--; d.writing == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
	d.mu.Unlock()
	return err
}

// publishesIn counts the PUBLISH packets in p, whole packets one after
// another as a write holds them (PUBRELs ride along with deliveries).
func publishesIn(p []byte) uint64 {
	var n uint64
	wire.AnyPacket(p, func(typ byte, _ int) bool {
		if typ == packets.Publish {
			n++
		}
		return false
	})
	return n
}

// stopWriting waits for stopped (the pumps' stop) and then for every write
// in progress, and leaves no connection served. Past cutGrace it closes the
// connection that was served: whatever it was writing is cut, and the
// stop goes on (invariant 16). Nothing written to that connection now is
// owed to it — it is ending or being taken over — and what it held of the
// session's own messages goes to the next connection (resume).
func (d *deliveries) stopWriting(stopped <-chan struct{}) {
	d.mu.Lock()
	cl := d.cl
	d.mu.Unlock()
	grace := time.NewTimer(cutGrace)
	defer grace.Stop()
	cut := false
	wait := func(done <-chan struct{}) {
		select {
		case <-done:
			return
		case <-grace.C:
		}
		if !cut && cl != nil {
			// invariant 16: a stop waiting on a write a client is holding
			// cuts it, so neither a takeover nor a shutdown waits for good.
			cut = true
			cutConnection(cl, errStopCut)
		}
		<-done
	}
	wait(stopped)
	d.mu.Lock()
	d.cl = nil // from here no write starts
	idle := closedChan
	if d.writing > 0 {
		if d.idle == nil {
			d.idle = make(chan struct{})
		}
		idle = d.idle
	}
	d.mu.Unlock()
	wait(idle)
}

// writeRun encodes n PUBLISH packets for cl in order (pk(i) is the i-th)
// and writes them in one write: a pump's batch. An encode that fails — a
// packet over the client's Maximum Packet Size — ends the run there: what
// was encoded before it is written, and its index and error are returned
// (n and nil when every packet was encoded). written is the write's error.
func (d *deliveries) writeRun(cl *mqtt.Client, n int, pk func(i int) *packets.Packet) (stop int, encErr, written error) {
	var buf bytes.Buffer
	v, maxSize := cl.Properties.ProtocolVersion, cl.Properties.Props.MaximumPacketSize
	stop = n
	for i := 0; i < n; i++ {
		if encErr = encodeDelivery(&buf, pk(i), v, maxSize); encErr != nil {
			stop = i
			break
		}
	}
	if buf.Len() > 0 {
		written = d.write(cl, buf.Bytes())
	}
	return stop, encErr, written
}

// writePacket encodes one PUBLISH for cl (encodeDelivery) and writes it.
func (d *deliveries) writePacket(cl *mqtt.Client, pk packets.Packet) error {
	var buf bytes.Buffer
	if err := encodeDelivery(&buf, &pk, cl.Properties.ProtocolVersion, cl.Properties.Props.MaximumPacketSize); err != nil {
		return err
	}
	return d.write(cl, buf.Bytes())
}

// writeAck writes one PUBREL (or another acknowledgement) of an exchange of
// ours.
func (d *deliveries) writeAck(cl *mqtt.Client, typ byte, pid uint16, code byte) error {
	var buf bytes.Buffer
	appendAck(&buf, typ, pid, code, cl.Properties.ProtocolVersion)
	return d.write(cl, buf.Bytes())
}

// appendAck encodes an acknowledgement packet: PUBREL carries the flags
// 0010 (MQTT-3.6.1-1); a reason code only on MQTT 5, where 0x00 with no
// properties is left out (MQTT 5 §3.6.2.1).
func appendAck(buf *bytes.Buffer, typ byte, pid uint16, code byte, version byte) {
	first := typ << 4
	if typ == packets.Pubrel {
		first |= 0x02
	}
	if version == 5 && code != 0 {
		buf.Write([]byte{first, 3, byte(pid >> 8), byte(pid), code})
		return
	}
	buf.Write([]byte{first, 2, byte(pid >> 8), byte(pid)})
}

// permissionsChanged wakes every delivery a refusal may have stalled — the
// consumers, the queues and the broadcast senders — so a grant that comes
// back is what resumes them, not the next publish (invariant 16).
func (b *Broker) permissionsChanged() {
	for _, s := range b.heldSessions() {
		s.roomFreed(b)
	}
	for _, q := range b.engines {
		q.poke()
	}
}
