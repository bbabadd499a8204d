package broker

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/clock"
)

// The outbox's bound, tested on the outbox itself: every admission decision
// is a function of the charges queued, so the counts below are exact.

func outboxRig(t *testing.T, bound int64) (*Broker, *outbox) {
	t.Helper()
	cfg := &config.Config{}
	cfg.Broker.Limits.SessionQueueBytes = bound
	b := &Broker{cfg: cfg, clock: clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := newSession("sub")
	o := b.outboxOf(s)
	// As while a connection is served (no sender is started: the rig's
	// outbox has no broker to start one with).
	o.live = true
	o.cl = mqtt.New(nil).NewClient(nil, "test", "sub", false)
	return b, o
}

func testMsg(b *Broker, qos byte, payload int) *broadcastMsg {
	return newBroadcastMsg("pub", packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   "status/x",
		Payload:     bytes.Repeat([]byte("p"), payload),
	}, b.clock.Now())
}

// waitingSeqs lists what the outbox holds, oldest first.
func (o *outbox) waitingSeqs() []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []uint64
	for _, e := range o.q[o.head:] {
		out = append(out, e.seq)
	}
	return out
}

// Invariant 13: QoS 0 past the outbound buffer (half the bound) is dropped
// and counted; what was queued stays, in order.
func TestInvariant13_BroadcastQoS0DroppedAtHalfTheBound(t *testing.T) {
	b, o := outboxRig(t, 64<<10)
	m := testMsg(b, 0, 100)
	c := m.charge()
	fit := int((64 << 10) / 2 / c)
	for i := 0; i < fit+50; i++ {
		o.offer(b, m, 0, "", false)
	}
	queued, _, _, n := o.usage()
	if n != fit || queued != int64(fit)*c {
		t.Fatalf("%d waiting (%d bytes); want %d (%d bytes)", n, queued, fit, int64(fit)*c)
	}
	if got := b.BroadcastStats().DroppedQoS0; got != 50 {
		t.Fatalf("%d QoS 0 drops counted, want 50", got)
	}
	if seqs := o.waitingSeqs(); seqs[0] != 0 || seqs[len(seqs)-1] != uint64(fit-1) {
		t.Fatalf("kept %d..%d, want the first %d", seqs[0], seqs[len(seqs)-1], fit)
	}
}

// QoS 1 waits within half the bound, and as much again may be written and
// unacknowledged; past it the oldest waiting message is given up (counted),
// never what is on the wire and never the publisher.
func TestInvariant13_BroadcastQoS1GivesUpTheOldestWaiting(t *testing.T) {
	bound := int64(64 << 10)
	b, o := outboxRig(t, bound)
	m := testMsg(b, 1, 100)
	c := m.charge()
	fit := int(bound / 2 / c)
	// Two on the wire, as the sender would put them: each entry is found
	// by its seq (what its exchange's cookie carries), not its packet id.
	var onWireSeqs []uint64
	for pid := uint16(1); pid <= 2; pid++ {
		o.offer(b, m, 1, "", false)
		e, _ := o.peek()
		if !o.take(e.seq, pid, false) {
			t.Fatal("take failed")
		}
		onWireSeqs = append(onWireSeqs, e.seq)
	}
	for i := 0; i < fit+10; i++ {
		if !o.offer(b, m, 1, "", false) {
			t.Fatalf("offer %d refused: a QoS 1 delivery gives up the oldest waiting instead", i)
		}
	}
	queued, _, wire, n := o.usage()
	onWire := c + inflightEntryCost
	if wire != 2*onWire || queued > bound/2 || n != fit {
		t.Fatalf("wire %d, waiting %d (%d bytes), bound %d; want wire %d and %d waiting", wire, n, queued, bound, 2*onWire, fit)
	}
	if got := b.BroadcastStats().QueueFull; got != 10 {
		t.Fatalf("%d given up, want 10", got)
	}
	if !o.wireRoom(b, c) {
		t.Fatal("no room on the wire with two messages written")
	}
	// The newest are kept: the waiting ones end at the last offered.
	seqs := o.waitingSeqs()
	if last := seqs[len(seqs)-1]; last != uint64(2+fit+10-1) {
		t.Fatalf("newest kept is %d, want %d", last, 2+fit+10-1)
	}
	// An acknowledgement releases its charge and nothing else.
	o.acked(onWireSeqs[0])
	o.acked(onWireSeqs[0]) // twice changes nothing more
	if _, _, wire, _ := o.usage(); wire != onWire {
		t.Fatalf("after one PUBACK the wire holds %d, want %d", wire, onWire)
	}
}

// A shared group asks without giving anything up, and only a connected
// member; QoS 0 goes to no session away, QoS 1 waits for it; an outbox that
// stops serving a connection lets its waiting QoS 0 go.
func TestBroadcastOutboxAwayAndSharedAdmission(t *testing.T) {
	bound := int64(16 << 10)
	b, o := outboxRig(t, bound)
	m1 := testMsg(b, 1, 100)
	for o.offer(b, m1, 1, "$share/g/status/#", true) {
	}
	if st := b.BroadcastStats(); st.QueueFull != 0 || st.DroppedQoS0 != 0 {
		t.Fatalf("a group's refused offers were counted as drops: %+v", st)
	}
	queued, _, _, n := o.usage()
	if queued > bound/2 || n != int(bound/2/m1.charge()) {
		t.Fatalf("%d waiting (%d bytes) under a %d bound", n, queued, bound)
	}
	m0 := testMsg(b, 0, 10)
	o.offer(b, m0, 0, "", false)
	o.stop() // the connection ended: QoS 0 waiting goes, QoS 1 stays
	if _, _, _, left := o.usage(); left != n {
		t.Fatalf("%d waiting after the connection ended, want the %d QoS 1", left, n)
	}
	if o.offer(b, m0, 0, "", false) {
		t.Fatal("QoS 0 queued for a session away")
	}
	if o.offer(b, m1, 1, "$share/g/status/#", true) {
		t.Fatal("a group handed a message to a member away while asking for a connected one")
	}
	o.offer(b, m1, 1, "", false)
	if got := b.BroadcastStats().QueueFull; got != 1 {
		t.Fatalf("QoS 1 for a full session away: %d given up, want 1", got)
	}
}

// An empty outbox takes one message whatever its size, so a message as large
// as max_message_size (which the bound is never below) is delivered.
func TestBroadcastOutboxTakesOneLargeMessage(t *testing.T) {
	b, o := outboxRig(t, 8<<10)
	big := testMsg(b, 1, 8<<10)
	if !o.offer(b, big, 1, "", false) {
		t.Fatal("an empty outbox refused a message of the bound's size")
	}
	if o.offer(b, testMsg(b, 0, 10), 0, "", false) {
		t.Fatal("a QoS 0 message queued past the bound")
	}
}

// Shaping per subscription: No Local per subscription, every matching
// Subscription Identifier (sorted), QoS the lower of published and highest
// granted, RETAIN only with Retain As Published on MQTT 5, the expiry counted
// down, nothing for a message no subscription matches now.
func TestBroadcastShapePerSubscription(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	m := newBroadcastMsg("me", packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Retain: true},
		TopicName:   "status/door",
		Payload:     []byte("open"),
		Properties:  packets.Properties{MessageExpiryInterval: 10, TopicAlias: 3, TopicAliasFlag: true, SubscriptionIdentifier: []int{99}},
	}, now)
	subs := map[string]packets.Subscription{
		"status/#":        {Filter: "status/#", Qos: 0, Identifier: 9, NoLocal: true},
		"status/+":        {Filter: "status/+", Qos: 1, Identifier: 7, RetainAsPublished: true},
		"+/door":          {Filter: "+/door", Qos: 1},
		"other/#":         {Filter: "other/#", Qos: 2, Identifier: 1},
		"$share/g/status": {Filter: "$share/g/status/#", Qos: 2, Identifier: 5},
	}
	e := owed{m: m}
	pk, left, out := shapeBroadcast(e, subs, nil, "someone", 5, now.Add(3500*time.Millisecond))
	if out != shapeDeliver || pk.FixedHeader.Qos != 1 || !pk.FixedHeader.Retain || fmt.Sprint(pk.Properties.SubscriptionIdentifier) != "[7 9]" {
		t.Fatalf("to another client: outcome %d qos %d retain %v ids %v", out, pk.FixedHeader.Qos, pk.FixedHeader.Retain, pk.Properties.SubscriptionIdentifier)
	}
	if left != 7 || pk.Properties.MessageExpiryInterval != 7 || pk.Properties.TopicAlias != 0 || pk.Properties.TopicAliasFlag {
		t.Fatalf("expiry %d/%d alias %d %v", left, pk.Properties.MessageExpiryInterval, pk.Properties.TopicAlias, pk.Properties.TopicAliasFlag)
	}
	// Its own message: the No Local subscription drops out, the others stay.
	pk, _, _ = shapeBroadcast(e, subs, nil, "me", 5, now)
	if fmt.Sprint(pk.Properties.SubscriptionIdentifier) != "[7]" {
		t.Fatalf("own message: ids %v, want [7]", pk.Properties.SubscriptionIdentifier)
	}
	onlyNoLocal := map[string]packets.Subscription{"status/#": subs["status/#"]}
	if _, _, out := shapeBroadcast(e, onlyNoLocal, nil, "me", 5, now); out != shapeUnmatched {
		t.Fatal("own message delivered through a No Local subscription")
	}
	// MQTT 3.1.1: never RETAIN on a live delivery.
	if pk, _, _ := shapeBroadcast(e, subs, nil, "someone", 4, now); pk.FixedHeader.Retain {
		t.Fatal("RETAIN on a live 3.1.1 delivery")
	}
	if _, _, out := shapeBroadcast(e, subs, nil, "someone", 5, now.Add(10*time.Second)); out != shapeExpired {
		t.Fatal("an expired message shaped for delivery")
	}
	if _, _, out := shapeBroadcast(e, map[string]packets.Subscription{"other/#": subs["other/#"]}, nil, "x", 5, now); out != shapeUnmatched {
		t.Fatal("delivered with no matching subscription")
	}
	// A group's delivery is served by the group's subscription alone.
	pk, _, _ = shapeBroadcast(owed{m: m, group: "$share/g/status"}, subs, nil, "me", 5, now)
	if pk.FixedHeader.Qos != 2 || fmt.Sprint(pk.Properties.SubscriptionIdentifier) != "[5]" || pk.FixedHeader.Retain {
		t.Fatalf("group delivery: qos %d ids %v retain %v", pk.FixedHeader.Qos, pk.Properties.SubscriptionIdentifier, pk.FixedHeader.Retain)
	}
}

// Invariant 13: what limits.session_queue_bytes counts for a broadcast
// delivery covers what it holds, measured: waiting in the outbox, and
// written at QoS 1 (the session's deliveries with the packet kept to send
// again, outbox.onWire), with every message held by this one session alone, the
// case where nothing is shared.
func TestInvariant13_BroadcastOutboxChargesWhatItHolds(t *testing.T) {
	for _, size := range []int{1, 128, 1000, 18500, 33000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			// Just past a power of two: the queue's slice carries its most
			// slack.
			const n = 1100
			b, o := outboxRig(t, 1<<40)
			b.mqtt = mqtt.New(&mqtt.Options{Logger: b.log})
			cl := b.mqtt.NewClient(nil, "t", "sub", false)
			cl.Properties.ProtocolVersion = 5
			cl.State.Subscriptions.Add("status/#", packets.Subscription{Filter: "status/#", Qos: 1})
			o.s.deliv.mu.Lock()
			o.s.deliv.cl = cl // the connection served, as after its CONNACK
			o.s.deliv.mu.Unlock()
			src := packets.Packet{
				FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
				TopicName:   "status/x",
				Payload:     bytes.Repeat([]byte("p"), size),
				Properties: packets.Properties{ContentType: "text/plain", CorrelationData: []byte("c"),
					User: []packets.UserProperty{{Key: "k", Val: "v"}}},
			}
			heap := func() uint64 {
				runtime.GC()
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			base := heap()
			for i := 0; i < n; i++ {
				if !o.offer(b, newBroadcastMsg("pub", src, b.clock.Now()), 1, "", false) {
					t.Fatal("refused under an unbounded bound")
				}
			}
			queuedHeap := heap()
			queued, _, _, _ := o.usage()
			if held := int64(queuedHeap) - int64(base); held > queued {
				t.Errorf("waiting: %d bytes held, %d charged (%d a message)", held, queued, held/n)
			}
			var buf bytes.Buffer
			for {
				buf.Reset()
				if _, stalled := o.fill(b, cl, &buf); stalled {
					t.Fatal("stalled with an unbounded window")
				}
				if _, _, _, left := o.usage(); left == 0 {
					break
				}
			}
			buf = bytes.Buffer{}
			wireHeap := heap()
			_, _, wire, _ := o.usage()
			if got := o.s.deliv.inFlight(); got != n {
				t.Fatalf("%d in flight, want %d", got, n)
			}
			if held := int64(wireHeap) - int64(base); held > wire {
				t.Errorf("on the wire: %d bytes held, %d charged (%d a message)", held, wire, held/n)
			}
			runtime.KeepAlive(o)
			runtime.KeepAlive(cl)

			// QoS 0 is charged no in-flight entry: its waiting cost alone.
			_, o0 := outboxRig(t, 1<<40)
			base0 := heap()
			for i := 0; i < n; i++ {
				o0.offer(b, newBroadcastMsg("pub", src, b.clock.Now()), 0, "", false)
			}
			held0 := int64(heap()) - int64(base0)
			queued0, _, _, _ := o0.usage()
			if held0 > queued0 {
				t.Errorf("waiting at QoS 0: %d bytes held, %d charged (%d a message)", held0, queued0, held0/n)
			}
			runtime.KeepAlive(o0)
			t.Logf("%d-byte payload, bytes a message held/charged: QoS 0 waiting %d/%d, QoS 1 waiting %d/%d, on the wire %d/%d",
				size, held0/n, queued0/n, (int64(queuedHeap)-int64(base))/n, queued/n, (int64(wireHeap)-int64(base))/n, wire/n)
		})
	}
}
