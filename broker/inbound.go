package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// The pipelined publisher (rfcs/pipelined-publish.md). A connection's QoS
// 0/1 PUBLISH to a channel is judged on its read loop, given its place in
// its provider's order (storage.Submitter) and left there: the read loop
// goes on to the next packet while the commit runs, so one connection with
// many publishes in flight fills a group commit rather than one record per
// commit. Each publish is answered by the connection's answering goroutine
// once its record is stored — its PUBACK never before (invariants 16, 18)
// — in the order the PUBLISHes arrived (MQTT 5 §4.6), and the work after
// a store (consumers woken, $share/ groups served) is done there too,
// never on the storage writer, which only marks the answer and wakes.
//
// Everything else a connection sends that answers or acts in order with
// its publishes waits until every earlier publish is answered (settle):
// QoS 2 publishes (held at PUBREC, qos2.go), PUBREL, retained broadcast,
// latest deletions, $saguin/ requests, SUBSCRIBE, UNSUBSCRIBE and
// DISCONNECT. PINGREQ and the acknowledgements of the broker's own
// deliveries are never held behind a commit.

// receiveMaximum is the Receive Maximum every MQTT 5 CONNACK advertises:
// the QoS 1 and QoS 2 publishes a client may have unanswered. 256 is one
// full group commit (storage.md: publish_commit_max_records): a single
// connection can fill a transaction while the one before it commits, and
// the 8-connection × 64-in-flight load of a gateway or bridge fits whole.
// Past it, MQTT 5 DISCONNECT 0x93 (MQTT 5 §3.3.4); a 3.1.1 client, which
// is told no Receive Maximum, is read no further until an answer leaves.
const receiveMaximum = 256

// inboundEntryCost is what one publish waiting for its store holds besides
// its record: its entry here, the provider's request and the copy it makes
// of the record as stored. The record's own bytes are counted twice (the
// packet as decoded, and the stored copy).
const inboundEntryCost = 1024

// idleEntries is the most entry slots a connection with nothing owed keeps
// for its next publishes; a larger queue a burst grew is let go.
const idleEntries = 16

// answerLinger is how long the answering goroutine waits, with nothing
// owed, for the connection's next publish before it ends. A publisher with
// one publish in flight sends its next as soon as it reads the PUBACK: a
// goroutine started per publish cost more than its commit's hand-off (its
// start and the stack it grows on the way to the consumers it wakes were a
// tenth of the broker's CPU on the 64 × 1 append bench), so the goroutine
// stays for the next one. A connection idle longer holds none.
const answerLinger = 20 * time.Millisecond

// inbound is one connection's publishes taken in and not yet answered, in
// arrival order. The read loop adds to it; the answering goroutine, which
// runs while anything is owed and is gone when nothing is, takes from it.
type inbound struct {
	b  *Broker
	cl *mqtt.Client
	// maxBytes bounds what the entries hold (limits.session_queue_bytes,
	// at least one max_message_size): past it the read loop waits for the
	// oldest to be answered, never grows it (invariant 13). An empty
	// pipeline always takes one.
	maxBytes int64

	mu      sync.Mutex
	left    *sync.Cond // signalled as entries are answered, to waiters only
	waiters int
	q       []inEntry // owed answers, oldest at q[head]
	head    int
	acks    int   // QoS 1 entries whose PUBACK is not yet being sent: what Receive Maximum counts
	bytes   int64 // what the entries hold
	running bool  // the answering goroutine runs (answering, or lingering)
	idle    bool  // it lingers with nothing owed, waiting on wake
	ended   bool  // the read loop is over: a lingering goroutine ends at once
	// wake (capacity 1) tells a lingering answering goroutine that an entry
	// was pushed or the connection ended.
	wake chan struct{}
}

// inEntry is one publish owed an answer.
type inEntry struct {
	qos    byte
	pid    uint16
	charge int64
	// One of: a record being stored (pend, write); a broadcast publish to
	// fan out in its turn (fan); an answer decided on the read loop (code).
	pend    storage.Pending
	write   *channelWrite
	fan     *packets.Packet
	code    packets.Code
	refused bool
}

// inboundOf is cl's pipeline, made on first use; nil for a client with no
// connection of its own (a Will's stand-in, an in-process client), whose
// publishes are answered where they are made.
func (b *Broker) inboundOf(cl *mqtt.Client) *inbound {
	if cl.Net.Conn == nil || cl.Net.Inline {
		return nil
	}
	if in, ok := b.inbound.Load(cl); ok {
		return in.(*inbound)
	}
	in := &inbound{b: b, cl: cl, maxBytes: b.cfg.Broker.Limits.SessionQueueBytes, wake: make(chan struct{}, 1)}
	in.left = sync.NewCond(&in.mu)
	v, _ := b.inbound.LoadOrStore(cl, in)
	return v.(*inbound)
}

// busyInbound reports whether cl owes answers to earlier publishes: an
// answer decided now must then wait its turn.
func (b *Broker) busyInbound(cl *mqtt.Client) (*inbound, bool) {
	v, ok := b.inbound.Load(cl)
	if !ok {
		return nil, false
	}
	in := v.(*inbound)
	return in, in.busy()
}

// inboundEnded: the connection's read loop is over. Its owed answers are
// still waited for — every record it handed over is stored or refused
// before the connection's end is acted on (its Will, a takeover's
// resume), and nothing it submitted is left running — but nothing more is
// written to it once it is closed: a PUBACK it never got is a publish the
// client sends again, as when a connection drops between a commit and its
// PUBACK (at least once, invariant 18).
func (b *Broker) inboundEnded(cl *mqtt.Client) {
	v, ok := b.inbound.Load(cl)
	if !ok {
		return
	}
	in := v.(*inbound)
	in.settle()
	in.mu.Lock()
	in.ended = true
	in.wakeLocked()
	in.mu.Unlock()
	b.inbound.Delete(cl)
}

// wakeLocked ends a lingering answering goroutine's wait. Caller holds in.mu.
func (in *inbound) wakeLocked() {
	if !in.idle {
		return
	}
	in.idle = false
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

func (in *inbound) busy() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.head < len(in.q)
}

// settle waits until every publish taken in has been answered: what the
// caller does next is then answered after them. Bounded by the provider's
// commits and one write_timeout per answer (a connection whose write timed
// out is closed, and later writes fail at once).
func (in *inbound) settle() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for in.head < len(in.q) {
		in.wait()
	}
}

// wait sleeps until an entry is answered. Caller holds in.mu.
func (in *inbound) wait() {
	in.waiters++
	in.left.Wait()
	in.waiters--
}

// pipelinable reports whether a PUBLISH can be taken in without waiting
// for what its connection sent before: QoS 0 or 1, and neither a $saguin/
// request, a retained broadcast (stored and fanned out as one step among
// new subscriptions, retained_order.go) nor a latest deletion (whose look
// at the current value must see the connection's earlier values stored).
func (b *Broker) pipelinable(pk packets.Packet) bool {
	if pk.FixedHeader.Qos > 1 || strings.HasPrefix(pk.TopicName, "$saguin/") {
		return false
	}
	name, ok := b.resolver.Resolve(pk.TopicName)
	if !ok {
		return !pk.FixedHeader.Retain
	}
	ch := b.channels[name]
	return ch.values == nil || len(pk.Payload) > 0
}

// publish takes a PUBLISH from the connection's read loop. It reports
// false for a publish that is not pipelinable: the caller settles and
// answers it as before. Otherwise the answer is what the substrate is to
// do: ErrRejectPacket (neither acknowledge nor fan out — the answer is
// this pipeline's), or, for a broadcast publish or a refusal with nothing
// owed before it, what it has always been.
func (in *inbound) publish(pk packets.Packet) (packets.Packet, error, bool) {
	b, cl := in.b, in.cl
	if !b.pipelinable(pk) {
		return pk, nil, false
	}
	qos := pk.FixedHeader.Qos
	// invariant 13: unanswered publishes per connection bounded by the
	// Receive Maximum advertised.
	if qos > 0 && !in.ackRoom() {
		// MQTT 5 §3.3.4: more unanswered QoS 1/2 publishes than the
		// Receive Maximum the CONNACK gave (invariant 13).
		b.refusedClosing(slog.LevelWarn, cl, refusePublish, packets.ErrReceiveMaximum.Code,
			"DISCONNECT: more publishes unanswered than the Receive Maximum", "receive_maximum", receiveMaximum)
		_ = b.mqtt.DisconnectClient(cl, packets.ErrReceiveMaximum)
		cl.Stop(packets.ErrReceiveMaximum)
		return pk, packets.ErrRejectPacket, true
	}
	w, out, err := b.admitPublish(cl, pk)
	switch {
	case w != nil:
		e := inEntry{qos: qos, pid: pk.PacketID, write: w, charge: inboundEntryCost + 2*w.rec.Size()}
		in.room(e.charge)
		// invariant 16: the read loop hands the record over and goes on;
		// its place in the provider's order is taken here, so one
		// publisher's records are stored in the order it sent them.
		e.pend = w.submit()
		in.push(e)
		return pk, packets.ErrRejectPacket, true
	case err != nil:
		// Refused (refuse: in its turn when answers are owed before it).
		return out, err, true
	}
	// Broadcast. Nothing owed before it: fanned out and acknowledged now,
	// as always (receivePublish, publish.go).
	if !in.busy() {
		b.fanOut(cl, out)
		return out, packets.CodeSuccessIgnore, true
	}
	// Answers are owed before it: fanned out in its turn, so a topic's
	// messages from this publisher still reach subscribers in order.
	// A copy of its own: taking out's address would move it to the heap
	// on every publish, not only on one that waits its turn.
	fan := new(packets.Packet)
	*fan = out
	e := inEntry{qos: qos, pid: pk.PacketID, fan: fan, charge: inboundEntryCost + 2*int64(len(out.Payload)+len(out.TopicName))}
	in.room(e.charge)
	in.push(e)
	return out, packets.ErrRejectPacket, true
}

// answerInTurn queues a refusal decided on the read loop behind the
// answers owed before it. It reports false when nothing is owed: the
// caller answers at once, as it always did.
func (b *Broker) answerInTurn(cl *mqtt.Client, pk packets.Packet, code packets.Code) bool {
	in, busy := b.busyInbound(cl)
	if !busy {
		return false
	}
	in.push(inEntry{qos: pk.FixedHeader.Qos, pid: pk.PacketID, code: code, refused: true, charge: inboundEntryCost})
	return true
}

// ackRoom reports whether one more QoS 1 publish may be taken in: fewer
// than receiveMaximum unanswered. A 3.1.1 client, which was told no
// Receive Maximum, waits for room instead of being disconnected.
func (in *inbound) ackRoom() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.acks < receiveMaximum {
		return true
	}
	if in.cl.Properties.ProtocolVersion >= 5 {
		return false
	}
	for in.acks >= receiveMaximum {
		in.wait()
	}
	return true
}

// room waits until an entry charged n fits under maxBytes, or nothing is
// owed: backpressure on the socket, which the read loop stops reading
// (invariant 13: the pipeline never grows past its bound).
func (in *inbound) room(n int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	// invariant 13: bounded before the record is handed over.
	for in.head < len(in.q) && in.bytes+n > in.maxBytes {
		in.wait()
	}
}

// push adds an entry and starts the answering goroutine if none runs.
func (in *inbound) push(e inEntry) {
	in.mu.Lock()
	if in.head > 0 && in.head >= len(in.q)/2 {
		// Reclaim the answered front, so the slice stays within what the
		// bounds admit.
		n := copy(in.q, in.q[in.head:])
		clear(in.q[n:])
		in.q = in.q[:n]
		in.head = 0
	}
	in.q = append(in.q, e)
	if e.qos > 0 {
		in.acks++
	}
	in.bytes += e.charge
	start := !in.running
	in.running = true
	in.wakeLocked()
	in.mu.Unlock()
	if start {
		in.b.wg.Add(1)
		go in.run()
	}
}

// run answers the entries in order until none is owed. It is the only
// goroutine that takes from the queue. With the queue empty it lingers
// (answerLinger) for the next publish and ends when none comes, or at
// once when the connection has ended (a later publish starts another).
//
// Answers whose outcome is already known leave together (issue 13 item
// 2): the PUBACKs of consecutive entries that are ready — a group commit
// returns many at once — are gathered and written in one Write, before
// run waits on an entry that is not ready and before it ends. At most
// answerBatchBytes are gathered (invariant 13).
func (in *inbound) run() {
	defer in.b.wg.Done()
	var acks bytes.Buffer
	var linger *time.Timer
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		in.mu.Lock()
		if in.head == len(in.q) {
			if acks.Len() > 0 {
				// Written before running is given up, so a run started
				// for a later publish writes after these.
				in.mu.Unlock()
				in.writeAnswers(&acks)
				continue
			}
			clear(in.q)
			in.q, in.head = in.q[:0], 0
			if cap(in.q) > idleEntries {
				in.q = nil // an idle connection keeps no burst's worth of slots
			}
			if !in.ended && !in.idle {
				// Linger for the next publish (answerLinger). A wake left
				// by an earlier push this loop already saw is dropped
				// first, so the wait below is for a new one.
				select {
				case <-in.wake:
				default:
				}
				in.idle = true
				in.mu.Unlock()
				d := answerLinger
				if t := in.b.answerLinger.Load(); t > 0 {
					d = time.Duration(t)
				}
				if linger == nil {
					linger = time.NewTimer(d)
				} else {
					linger.Reset(d)
				}
				select {
				case <-in.wake:
				case <-linger.C:
				}
				in.mu.Lock()
				if !in.idle || in.head < len(in.q) {
					// Woken by a push (or the end, seen above next round).
					in.idle = false
					in.mu.Unlock()
					continue
				}
			}
			in.idle = false
			in.running = false
			in.mu.Unlock()
			return
		}
		e := in.q[in.head]
		in.mu.Unlock()
		if acks.Len() > 0 && !e.ready() {
			in.writeAnswers(&acks)
		}
		code, refused := in.outcome(&e)
		in.mu.Lock()
		if e.qos > 0 {
			// Counted as answered before the PUBACK is written: a client
			// that sends its next publish the moment it reads one is
			// never over the Receive Maximum it was given.
			in.acks--
		}
		in.mu.Unlock()
		in.answer(&acks, &e, code, refused)
		if acks.Len() >= answerBatchBytes {
			in.writeAnswers(&acks)
		}
		in.mu.Lock()
		in.q[in.head] = inEntry{}
		in.head++
		in.bytes -= e.charge
		if in.waiters > 0 {
			in.left.Broadcast()
		}
		in.mu.Unlock()
	}
}

// answerBatchBytes bounds the PUBACKs gathered for one write: about a
// thousand, well inside the connection writer's 64 KiB pending bound
// (rfcs/connection-writer.md).
const answerBatchBytes = 4 << 10

// ready reports whether the entry's outcome is known without waiting.
func (e *inEntry) ready() bool {
	if e.pend == nil {
		return true
	}
	select {
	case <-e.pend.Done():
		return true
	default:
		return false
	}
}

// outcome waits for the entry's store and does the work after it: the
// record's consumers woken and its $share/ groups served, or a broadcast
// fanned out, in the order the connection sent them.
func (in *inbound) outcome(e *inEntry) (packets.Code, bool) {
	b := in.b
	switch {
	case e.pend != nil:
		// invariant 18: the answer waits for the store's; a PUBACK is
		// written only after this, never for a record not stored.
		<-e.pend.Done()
		rec, err := e.pend.Result()
		if err != nil {
			code := storeRefusal(e.write.ch.name, err)
			b.logPublishRefusal(in.cl, packets.Packet{FixedHeader: packets.FixedHeader{Qos: e.qos},
				TopicName: e.write.rec.Topic, Payload: e.write.rec.Payload}, code)
			return code, true
		}
		e.write.stored(b, rec)
		return packets.CodeSuccess, false
	case e.fan != nil:
		b.fanOut(in.cl, *e.fan)
		return packets.CodeSuccess, false
	}
	return e.code, e.refused
}

// answer adds the entry's answer to acks: a PUBACK (its code a
// refusal's when refused), nothing at QoS 0. A 3.1.1 client, which has no
// reason codes, is closed instead of sent a refusing PUBACK (docs/channels.md "What a publish is answered", as refuse), after the answers before it are written.
func (in *inbound) answer(acks *bytes.Buffer, e *inEntry, code packets.Code, refused bool) {
	if e.qos == 0 {
		return
	}
	cl := in.cl
	if refused && cl.Properties.ProtocolVersion < 5 {
		in.writeAnswers(acks)
		cl.Stop(code)
		return
	}
	ack := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Puback},
		ProtocolVersion: cl.Properties.ProtocolVersion,
		PacketID:        e.pid,
		ReasonCode:      code.Code,
	}
	if code.Code >= packets.ErrUnspecifiedError.Code {
		ack.Properties.ReasonString = code.Reason
	}
	// What the substrate's WritePacket did for each answer: the reason
	// string left out past the client's Maximum Packet Size, and when it
	// asked for no problem information (MQTT 5 §3.1.2.11.7, §3.4.2.2.2).
	ack.Mods.MaxSize = cl.Properties.Props.MaximumPacketSize
	ack.Mods.DisallowProblemInfo = cl.Properties.Props.RequestProblemInfoFlag && cl.Properties.Props.RequestProblemInfo == 0
	start := acks.Len()
	if err := ack.PubackEncode(acks); err != nil {
		acks.Truncate(start)
	}
}

// writeAnswers writes the gathered PUBACKs in one Write and empties acks.
// A write that fails (the connection closed) loses nothing stored: the
// client sends the publishes again on its next connection.
func (in *inbound) writeAnswers(acks *bytes.Buffer) {
	if acks.Len() == 0 {
		return
	}
	_ = writeAnswers(in.cl, acks.Bytes())
	acks.Reset()
}

// answering reports whether the answering goroutine runs (tests).
func (in *inbound) answering() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.running
}

// usage reports what the pipeline holds (tests).
func (in *inbound) usage() (entries, acks int, bytes int64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.q) - in.head, in.acks, in.bytes
}
