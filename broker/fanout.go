package broker

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Broadcast fan-out (rfcs/fanout.md). A publish to a topic no channel claims
// is handed to a Sagüin-owned outbox per subscribing session, and each
// connection's own sender goroutine (fanout_send.go) writes it. The
// publisher's goroutine only takes the outboxes' own short locks: it never
// takes a packet identifier, never touches a subscriber's client lock and
// never waits on a socket (invariant 16). The substrate's publishToClient
// takes the subscriber's client lock for NextPacketID, which its WritePacket
// holds across a blocking write, so one subscriber that stopped reading held
// every publisher of a topic it matched for a whole write deadline, again
// and again.

// broadcastMsg is one broadcast publish, shared read-only by every outbox it
// is queued on.
type broadcastMsg struct {
	topic   string
	payload []byte
	// props are the publisher's properties as forwarded (saguin-* but
	// saguin-id stripped by publish), with no Topic Alias, no Subscription
	// Identifier and no Message Expiry Interval: those are per delivery.
	props   packets.Properties
	qos     byte
	retain  bool
	origin  string    // the publishing client id (No Local)
	created time.Time // receipt, on the broker's clock (the expiry countdown)
	expiry  uint32    // Message Expiry Interval as published; 0: none
	content int64     // what topic, payload and properties hold, as allocated
	// off is the message's offset in the broadcast log (bcastlog.go); 0
	// when it was not written there (QoS 0, or owed to no session that
	// outlives its connection): served from memory only.
	off uint64
	// held and enc: how many outbox entries hold the message — waiting, or
	// written at QoS 1/2 and unacknowledged, each charged at least
	// charge() — and its encodings for them (fanout_encode.go).
	held atomic.Int32
	enc  atomic.Pointer[encodings]
}

// owed is one broadcast message a session is owed.
type owed struct {
	m      *broadcastMsg
	seq    uint64 // position in the outbox, so the sender can tell its head was dropped
	charge int64  // what limits.session_queue_bytes counts for it
	qos    byte   // the delivery's QoS when it was published: the lower of the message's and the highest granted
	group  string // "": the session's own subscriptions; else the $share/ filter whose group handed it
}

// Costs counted against limits.session_queue_bytes besides a message's own
// bytes (invariant 13: "each delivery its message and the measured cost of
// its entry"). Every session holding a message is charged its shared header
// whole, so the sum of the charges never falls below what is held.
// TestInvariant13_BroadcastOutboxChargesWhatItHolds measures them.
const (
	// msgHeaderCost is the message header's allocation: its size rounded
	// up to the allocator's size class (360 bytes take 384).
	msgHeaderCost = (int64(unsafe.Sizeof(broadcastMsg{})) + 63) &^ 63
	// queuedEntryCost adds its slot in the outbox's queue, twice over for
	// the slack of the slice's growth.
	queuedEntryCost = msgHeaderCost + 2*int64(unsafe.Sizeof(owed{}))
	// inflightEntryCost is what one delivery on the wire holds besides the
	// message: its exchange in the session's deliveries with the packet
	// kept to send again (an 800-byte packets.Packet, stored out of line in
	// an 896-byte size class), the table's slot with its cookie
	// (outboxAck), and its entry in outbox.onWire.
	inflightEntryCost = 1152
	// userPropertyCost is the header of one User Property (two strings).
	userPropertyCost = int64(unsafe.Sizeof(packets.UserProperty{}))
)

// charge is what one session's bound counts for m while it waits. Written
// at QoS 1/2 and unacknowledged, it is charged inflightEntryCost more.
func (m *broadcastMsg) charge() int64 {
	return m.content + queuedEntryCost
}

// newBroadcastMsg copies what a delivery needs out of the publish. The
// payload and Correlation Data are copied: as decoded they are slices of the
// whole packet's buffer, which would otherwise stay held, uncounted.
func newBroadcastMsg(origin string, pk packets.Packet, now time.Time) *broadcastMsg {
	m := &broadcastMsg{
		topic:   pk.TopicName,
		payload: append([]byte(nil), pk.Payload...),
		qos:     pk.FixedHeader.Qos,
		retain:  pk.FixedHeader.Retain,
		origin:  origin,
		created: now,
		expiry:  pk.Properties.MessageExpiryInterval,
	}
	p := pk.Properties
	m.props = packets.Properties{
		PayloadFormat:     p.PayloadFormat,
		PayloadFormatFlag: p.PayloadFormatFlag,
		ContentType:       p.ContentType,
		ResponseTopic:     p.ResponseTopic,
		User:              p.User,
	}
	if len(p.CorrelationData) > 0 {
		m.props.CorrelationData = append([]byte(nil), p.CorrelationData...)
	}
	m.measure()
	return m
}

// measure sets what m's topic, payload and properties hold. Strings and
// buffers are counted as allocated, not as long.
func (m *broadcastMsg) measure() {
	p := m.props
	m.content = allocated(len(m.payload)) + allocated(len(p.CorrelationData)) +
		allocated(len(m.topic)) + allocated(len(p.ContentType)) + allocated(len(p.ResponseTopic)) +
		allocated(len(p.User)*int(userPropertyCost))
	for _, u := range p.User {
		m.content += allocated(len(u.Key)) + allocated(len(u.Val))
	}
}

// allocated is what the allocator holds for n bytes, rounded up: to its size
// classes up to 32 KiB (at most an eighth over, 16 bytes at least), to 8 KiB
// pages above.
func allocated(n int) int64 {
	switch {
	case n == 0:
		return 0
	case n > 32<<10:
		return int64((n + 8<<10 - 1) &^ (8<<10 - 1))
	default:
		return int64(n + n/8 + 16)
	}
}

// fanout is the broker's broadcast state: the shared groups' turns and what
// was not delivered, by cause.
type fanout struct {
	mu sync.Mutex
	// turn maps a $share/ filter to the member its group last handed a
	// message, for round-robin in client-id order. Bounded by fanoutTurns:
	// past it the turns start over, which only moves where each group
	// resumes (invariant 13: group names are client input).
	turn map[string]string

	// log is the broadcast log (bcastlog.go) and shares the shared groups'
	// backlogs (share.go); set when the sessions' provider opens.
	log    *bcastLog
	shares *shares

	droppedQoS0 atomic.Int64
	queueFull   atomic.Int64
	noMember    atomic.Int64 // a publish no member could take, none durable
	expired     atomic.Int64
	tooLarge    atomic.Int64
	memberEnded atomic.Int64
	shareFull   atomic.Int64
	shareExpire atomic.Int64
	logFailed   atomic.Int64
	// logStorageFull: logged messages the log gave up to a full provider.
	logStorageFull atomic.Int64
	// noneLeft: backlog a group lost with its last member session.
	noneLeft atomic.Int64
	// shareNotAuthorized: messages a group handed a member that its
	// sender could not write, the grant withdrawn meanwhile.
	shareNotAuthorized atomic.Int64
	// shareStorageFull: backlog messages whose logged copy the log gave up
	// to a full provider (bcastlog_full.go).
	shareStorageFull atomic.Int64

	encodes encodeCounts
}

const fanoutTurns = 4096

// BroadcastStats counts broadcast deliveries that were not made, by cause
// (docs/channels.md "Broadcast": broadcast is the one place Sagüin drops, and every
// drop is counted).
type BroadcastStats struct {
	// DroppedQoS0: QoS 0 deliveries past a subscriber's outbound buffer (half
	// of limits.session_queue_bytes).
	DroppedQoS0 int64
	// QueueFull: QoS 1/2 deliveries given up at limits.session_queue_bytes,
	// the oldest waiting one first.
	QueueFull int64
	// NoSharedMember: deliveries a shared group had no member to take.
	NoSharedMember int64
	// Expired: deliveries whose Message Expiry Interval ran out before
	// they could be written.
	Expired int64
	// TooLarge: deliveries over the subscriber's Maximum Packet Size
	// (dropped for that subscriber, which stays connected).
	TooLarge int64
	// MemberEnded: QoS 2 deliveries a shared group had handed a member
	// whose session ended before its PUBREC (MQTT-4.8.2-5: never to another
	// member).
	MemberEnded int64
	// ShareBacklogFull: a shared group's backlog past
	// limits.session_queue_bytes, oldest first.
	ShareBacklogFull int64
	// ShareExpired: backlog dropped after broker.share.expires_after with
	// no member connected.
	ShareExpired int64
	// LogFailed: QoS 1/2 messages owed to a durable session that the
	// broadcast log refused; served from memory only (lost at a restart).
	LogFailed int64
	// LogStorageFull: logged messages removed from the broadcast log to
	// make room at a full provider, oldest first and never one on the wire
	// (storage_full): still delivered from memory, but not after a restart.
	LogStorageFull int64
}

// BroadcastStats reports what broadcast fan-out did not deliver since start.
func (b *Broker) BroadcastStats() BroadcastStats {
	f := &b.fan
	return BroadcastStats{
		DroppedQoS0:      f.droppedQoS0.Load(),
		QueueFull:        f.queueFull.Load(),
		NoSharedMember:   f.noMember.Load() + f.noneLeft.Load(),
		Expired:          f.expired.Load(),
		TooLarge:         f.tooLarge.Load(),
		MemberEnded:      f.memberEnded.Load(),
		ShareBacklogFull: f.shareFull.Load(),
		ShareExpired:     f.shareExpire.Load(),
		LogFailed:        f.logFailed.Load(),
		LogStorageFull:   f.logStorageFull.Load(),
	}
}

// fanOut hands a broadcast publish to every session it is owed to, on the
// publisher's goroutine, without waiting for anything a subscriber does
// (invariant 16). The substrate's topic index says who subscribes; how each
// is served (QoS, Subscription Identifiers, No Local, Retain As Published) is
// decided by that session's sender from its subscriptions as it writes.
func (b *Broker) fanOut(cl *mqtt.Client, pk packets.Packet) {
	subs := b.subscribers(pk.TopicName)
	matched := len(subs.Subscriptions) > 0 || len(subs.Shared) > 0
	b.countBroadcast(cl, matched)
	if !matched {
		return
	}
	b.fanOutMsg(newBroadcastMsg(cl.ID, pk, b.clock.Now()), subs, true)
}

// countBroadcast counts one broadcast publish landed
// (saguin_published_total{channel="broadcast"}), and one nobody
// subscribed to (saguin_broadcast_unmatched_total), on the publisher's
// shard.
func (b *Broker) countBroadcast(cl *mqtt.Client, matched bool) {
	sh := b.shardOf(cl)
	if sh == nil {
		return
	}
	sh.broadcast.Add(1)
	if !matched {
		sh.unmatched.Add(1)
	}
}

// subscribers is who subscribes to topic, from the substrate's index, less
// the shared groups MQTT keeps away from it: a filter beginning with a
// wildcard never matches a topic beginning with '$' (MQTT-4.7.2-1). The
// substrate applies that to sessions' own subscriptions but not to a
// $share/<group>/# or $share/<group>/+/..., which got $sys/x, $SHARE/x and
// every other ordinary '$' topic.
func (b *Broker) subscribers(topic string) *mqtt.Subscribers {
	subs := b.mqtt.Topics.Subscribers(topic)
	if !strings.HasPrefix(topic, "$") {
		return subs
	}
	for filter := range subs.Shared {
		if _, inner, ok := strings.Cut(strings.TrimPrefix(filter, "$share/"), "/"); ok &&
			(strings.HasPrefix(inner, "#") || strings.HasPrefix(inner, "+")) {
			delete(subs.Shared, filter)
		}
	}
	return subs
}

// fanOutMsg offers m to the sessions and shared groups subs names. With
// mayLog, a QoS 1/2 message owed to a session that outlives its connection
// (or to a shared group one of whose members' does) is first written once
// to the broadcast log (rfcs/broadcast-log.md): this runs on the publisher's
// goroutine, ahead of its PUBACK/PUBREC, and is the one store write a
// publisher waits for (invariant 16 allows it; nothing a subscriber does is
// waited for).
func (b *Broker) fanOutMsg(m *broadcastMsg, subs *mqtt.Subscribers, mayLog bool) {
	b.mu.Lock()
	own := make([]*session, 0, len(subs.Subscriptions))
	for id := range subs.Subscriptions {
		if s := b.sessions[id]; s != nil {
			own = append(own, s)
		}
	}
	var members map[string]*session
	if len(subs.Shared) > 0 {
		members = make(map[string]*session)
		for _, group := range subs.Shared {
			for id := range group {
				if s := b.sessions[id]; s != nil {
					members[id] = s
				}
			}
		}
	}
	b.mu.Unlock()
	if mayLog && m.qos > 0 && m.off == 0 && owedDurably(m, subs, own, members) {
		done := b.logBroadcast(m)
		// Until every outbox has it, the message holds the log's low-water
		// mark, so no cursor skips it unseen.
		defer done()
	} else if m.off != 0 && b.fan.log != nil {
		defer b.fan.log.hold(m.off)()
	}
	woken := make([]*outbox, 0, len(own))
	for _, s := range own {
		// The substrate's index merges a session's matching subscriptions
		// with the highest granted QoS: what the delivery is bounded as.
		qos := min(m.qos, subs.Subscriptions[s.id].Qos)
		if o := b.outboxOf(s); o.enqueue(b, m, qos, "", false) {
			woken = append(woken, o)
		}
	}
	// Woken once all hold it (enqueue): the message is encoded once per
	// shape, not once per subscriber.
	for _, o := range woken {
		o.poke()
	}
	for filter, group := range subs.Shared {
		b.shareOut(m, filter, group, members)
	}
}

// outbox is one session's broadcast deliveries waiting to be written or
// acknowledged. It belongs to the session, so QoS 1/2 messages owed while
// the session is away wait here for its next connection, within the same
// bound. Its lock is never held across a write or while taking any other
// lock, so a publisher enqueueing here cannot be held by the connection.
type outbox struct {
	s *session

	mu   sync.Mutex
	q    []owed // waiting, oldest first, from q[head]
	head int
	seq  uint64 // seq of the next message queued
	// What limits.session_queue_bytes counts, in three parts: waiting in q;
	// taken by the sender and being written at QoS 0; written at QoS 1/2
	// and not yet acknowledged.
	queued, writing, wire int64
	// onWire holds what is written at QoS 1/2 and not yet acknowledged, by
	// entry: the seq it had waiting in q (a restored one is given the next
	// seq), so it is keyed by the outbox's own numbers, never by packet id.
	// The packet id is the session's deliveries' (rfcs/delivery-seam.md):
	// each exchange carries its entry back (outboxAck), and the entry keeps
	// the id it went out under only for what names it on the wire: the
	// stored window, which a restart resends under the same ids (invariant
	// 18, bcastlog.go windowLocked), and its PUBREL (appendPubrels).
	// Bounded (invariant 13): an entry joins only with its exchange in the
	// session's deliveries (within the client's Receive Maximum, or a
	// stored window of at most 65,535 at a restart), and its charge counts
	// against the half of limits.session_queue_bytes wireRoom keeps.
	onWire map[uint64]wireEntry
	live   bool // a connection is being served
	// pubrels lists, by entry, the QoS 2 deliveries PUBREC'd whose PUBREL
	// the sender writes once the window recording it is stored (pubrecd),
	// in PUBREC order. Bounded by onWire: an entry is listed once
	// (relQueued).
	pubrels []uint64
	// The broadcast-log side (bcastlog.go): from maps each filter to the
	// log offset at which it was subscribed (a later subscription does not
	// reach back); stored is the cursor last written, storedWindow
	// whether the window last written was non-empty, windowDirty whether
	// the window changed since.
	from         map[string]uint64
	stored       uint64
	storedWindow bool
	windowDirty  bool
	// touched: the logged messages the session holds changed since its
	// cursor was last stored. A session never owed a logged message stores
	// no cursor at all (a restart reads it from its filters' log_from).
	touched bool
	// ended: the session ended (memberEnded); its queue no longer counts in
	// its messages' held counts (countLocked).
	ended    bool
	lastWarn time.Time // last drop warning (one per fanoutWarnEvery)
	unwarned int64     // drops since that warning

	// b and cl are the broker and the connection being served (nil while
	// away), for starting the sender when the first message comes.
	b  *Broker
	cl *mqtt.Client

	wake   chan struct{}
	sender pumpRun
}

const fanoutWarnEvery = 10 * time.Second

// outboxOf returns the session's outbox, making it on first use. It takes
// no lock: a publisher reaches it without touching anything the session's
// other goroutines hold.
func (b *Broker) outboxOf(s *session) *outbox {
	if o := s.bcast.Load(); o != nil {
		return o
	}
	o := &outbox{s: s, onWire: make(map[uint64]wireEntry), from: make(map[string]uint64), wake: make(chan struct{}, 1)}
	if s.bcast.CompareAndSwap(nil, o) {
		return o
	}
	return s.bcast.Load()
}

func (o *outbox) poke() {
	o.ensureSender()
	signal(o.wake)
}

// offer queues m for the session, within limits.session_queue_bytes
// (invariant 13, docs/configuration.md "`broker.limits`"; rfcs/fanout.md).
// The bound is split in two halves, each charged what it holds, so the
// whole never passes the bound and moving a message from one to the other
// never needs room the other gave away:
//
//   - waiting to be written: at most half the bound (the outbound buffer).
//     Past it a QoS 0 delivery is dropped and counted; a QoS 1/2 delivery
//     gives up the oldest waiting ones (counted) until it fits.
//   - written at QoS 1/2 and not yet acknowledged: at most the other half,
//     each charged its in-flight entry too (outbox.wireRoom); the sender
//     waits for acknowledgements past it. Nothing there is given up.
//   - An outbox holding nothing takes one message whatever its size, so a
//     message as large as max_message_size (which the bound is never below)
//     is delivered.
//
// With share (a shared group choosing a member) nothing is given up and
// only a connected session takes it: the group tries the next member. It
// reports whether m was queued; the session's sender is then woken.
func (o *outbox) offer(b *Broker, m *broadcastMsg, qos byte, group string, share bool) bool {
	if !o.enqueue(b, m, qos, group, share) {
		return false
	}
	o.poke()
	return true
}

// enqueue is offer without waking the sender: fanOutMsg queues a message on
// every outbox first and wakes their senders after, so each sender finds the
// message queued everywhere and copies its encoding for another subscriber
// rather than encoding it again (fanout_encode.go: an encoding is kept only
// while another queue holds the message).
func (o *outbox) enqueue(b *Broker, m *broadcastMsg, qos byte, group string, share bool) bool {
	charge := m.charge()
	half := b.cfg.Broker.Limits.SessionQueueBytes / 2
	if share && !o.eligible(b, m, qos) {
		return false // the group tries its next member (share.go)
	}
	o.mu.Lock()
	if !o.live && (qos == 0 || share) {
		// QoS 0 is not owed to a session away (MQTT 5 §4.1); a group
		// first looks for a connected member.
		o.mu.Unlock()
		return false
	}
	fits := func() bool {
		waiting := o.queued + o.writing
		return waiting+charge <= half || waiting == 0 && o.wire == 0
	}
	if fits() {
		o.pushLocked(m, qos, charge, group)
		o.mu.Unlock()
		return true
	}
	if share {
		o.mu.Unlock()
		return false
	}
	var gaveUp []owed
	if qos > 0 {
		for !fits() && o.head < len(o.q) {
			e := o.popLocked()
			o.queued -= e.charge
			gaveUp = append(gaveUp, e)
		}
	}
	queued := fits()
	if queued {
		o.pushLocked(m, qos, charge, group)
	}
	warn := o.dropped(b)
	o.mu.Unlock()
	o.countGivenUp(b, gaveUp)
	switch {
	case queued:
		// The caller wakes the sender.
	case qos == 0:
		b.fan.droppedQoS0.Add(1)
	default:
		b.fan.queueFull.Add(1)
	}
	o.warn(b, warn)
	return queued
}

func (o *outbox) countGivenUp(b *Broker, gaveUp []owed) {
	for _, e := range gaveUp {
		if e.qos == 0 {
			b.fan.droppedQoS0.Add(1)
		} else {
			b.fan.queueFull.Add(1)
		}
	}
}

// dropped notes a drop and reports whether it is time to warn. Caller holds
// o.mu.
func (o *outbox) dropped(b *Broker) bool {
	o.unwarned++
	now := b.clock.Now()
	if !o.lastWarn.IsZero() && now.Sub(o.lastWarn) < fanoutWarnEvery {
		return false
	}
	o.lastWarn = now
	return true
}

func (o *outbox) warn(b *Broker, due bool) {
	if !due {
		return
	}
	o.mu.Lock()
	n := o.unwarned
	o.unwarned = 0
	o.mu.Unlock()
	b.log.Warn("broadcast deliveries dropped: the subscriber is behind by limits.session_queue_bytes",
		"client", o.s.id, "dropped", n, "session_queue_bytes", b.cfg.Broker.Limits.SessionQueueBytes)
}

// pushLocked appends to the queue. Caller holds o.mu.
func (o *outbox) pushLocked(m *broadcastMsg, qos byte, charge int64, group string) {
	if o.head > 0 && o.head >= len(o.q)/2 {
		// Reclaim the consumed front, so the slice stays within what the
		// bound admits.
		n := copy(o.q, o.q[o.head:])
		clear(o.q[n:])
		o.q = o.q[:n]
		o.head = 0
	}
	o.q = append(o.q, owed{m: m, seq: o.seq, charge: charge, qos: qos, group: group})
	o.countLocked(m, 1)
	o.touched = o.touched || m.off != 0
	o.seq++
	o.queued += charge
}

// countLocked counts one more (d 1) or one fewer (d -1) entry of m in this
// queue towards m's encodings (fanout_encode.go), unless the session ended.
// Caller holds o.mu.
func (o *outbox) countLocked(m *broadcastMsg, d int32) {
	if !o.ended {
		m.heldLocked(d)
	}
}

// popLocked removes the oldest waiting message. Caller holds o.mu and has
// checked there is one; the caller moves its charge.
func (o *outbox) popLocked() owed {
	e := o.q[o.head]
	o.q[o.head] = owed{}
	o.head++
	o.countLocked(e.m, -1)
	o.touched = o.touched || e.m.off != 0
	if o.head == len(o.q) {
		o.q, o.head = o.q[:0], 0
	}
	return e
}

// peek returns the oldest waiting message.
func (o *outbox) peek() (owed, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.head == len(o.q) {
		return owed{}, false
	}
	return o.q[o.head], true
}

// take removes the oldest waiting message if it is still the one with seq
// (a publisher may have given it up meanwhile) and moves its charge: onto
// the wire for a QoS 1/2 delivery written under pid — its entry in onWire
// keyed by the same seq, which its exchange's cookie carries (outboxAck) —,
// to writing for QoS 0, or away for one not delivered (pid 0, skip).
func (o *outbox) take(seq uint64, pid uint16, skip bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.head == len(o.q) || o.q[o.head].seq != seq {
		return false
	}
	if !skip && pid != 0 {
		// Counted on the wire before it leaves the queue, so the move
		// costs the message none of its encodings (fanout_encode.go).
		o.countLocked(o.q[o.head].m, 1)
	}
	e := o.popLocked()
	o.queued -= e.charge
	switch {
	case skip:
	case pid != 0:
		o.wire += e.charge + inflightEntryCost
		o.onWire[seq] = wireEntry{pid: pid, charge: e.charge + inflightEntryCost, m: e.m, qos: e.qos, group: e.group}
		o.windowDirty = o.windowDirty || e.m.off != 0
	default:
		o.writing += e.charge
	}
	return true
}

// written releases the charge of QoS 0 deliveries once written (or failed).
func (o *outbox) written(n int64) {
	if n == 0 {
		return
	}
	o.mu.Lock()
	o.writing -= n
	o.mu.Unlock()
}

// outboxAck is the cookie a broadcast or shared delivery's exchange carries
// (deliveries.go), as consumerAck and latestAck do for the channel routes:
// the outbox and the entry the delivery is on the wire as (its seq),
// brought back with the client's PUBACK, PUBREC or PUBCOMP. The packet id
// the deliveries hand it is not needed: the entry is found by its own
// number (rfcs/delivery-seam.md "The session behind methods").
type outboxAck struct {
	o   *outbox
	seq uint64
}

func (a outboxAck) acked(uint16) { a.o.acked(a.seq) }

func (a outboxAck) pubrecd(uint16) bool { return a.o.pubrecd(a.seq) }

// acked releases a QoS 1/2 delivery's charge at the end of its exchange
// (PUBACK, PUBCOMP, a refusing PUBREC, a resend let go): routed here by the
// session's deliveries through the exchange's cookie (outboxAck). An entry
// no longer on the wire (a shared group took it back when the session
// ended, memberEnded) is left alone.
func (o *outbox) acked(seq uint64) {
	o.mu.Lock()
	w, ok := o.onWire[seq]
	if ok {
		delete(o.onWire, seq)
		o.wire -= w.charge
		o.countLocked(w.m, -1)
		o.windowDirty = o.windowDirty || w.m.off != 0
		o.touched = o.touched || w.m.off != 0
	}
	o.mu.Unlock()
	if ok {
		o.poke()
	}
}

// pubrecd records that the client PUBREC'd the QoS 2 delivery on the wire
// as entry seq (pubrecTarget, through outboxAck): from now on a PUBREL is
// owed, never the message. For a logged message of a session that outlives
// its connection, the sender writes that PUBREL once the window saying so
// is stored (rfcs/broadcast-log.md), and it reports true; otherwise the
// session's deliveries write it at once.
func (o *outbox) pubrecd(seq uint64) bool {
	durable := o.s.isDurable()
	o.mu.Lock()
	w, ok := o.onWire[seq]
	if !ok {
		o.mu.Unlock()
		return false
	}
	w.pubrel = true
	// invariant 18: the PUBREL tells the client its copy is the one; the
	// window that says a PUBREL is owed is stored before it is written.
	deferred := durable && w.m.off != 0
	if deferred {
		o.windowDirty = true
		if !w.relQueued {
			w.relQueued = true
			o.pubrels = append(o.pubrels, seq)
		}
	}
	o.onWire[seq] = w
	o.mu.Unlock()
	if deferred {
		// Not live (the connection going): the resume sends it.
		o.poke()
	}
	return deferred
}

// wireRoom reports whether one more QoS 1/2 delivery of a message charged
// c while waiting may be written: at most half the bound is written and
// unacknowledged (docs/configuration.md "`broker.limits`"), though one always
// may be.
func (o *outbox) wireRoom(b *Broker, c int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.wire == 0 || o.wire+c+inflightEntryCost <= b.cfg.Broker.Limits.SessionQueueBytes/2
}

// usage reports what the bound counts now (tests).
func (o *outbox) usage() (queued, writing, wire int64, waiting int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queued, o.writing, o.wire, len(o.q) - o.head
}

// routeOf is the delivery route an owed message takes: a shared group's,
// or the session's own subscriptions'.
func routeOf(e owed) route {
	if e.group != "" {
		return routeShared
	}
	return routeBroadcast
}

// queueFigures is the outbox's read-only view for the metric catalogue:
// what limits.session_queue_bytes counts (offer), messages and bytes,
// under o.mu.
func (o *outbox) queueFigures() (queued, bytes int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int64(len(o.q)-o.head) + int64(len(o.onWire)), o.queued + o.writing + o.wire
}
