package broker_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// A latest channel holds one current value per topic. A subscriber gets,
// after its SUBACK, every topic's value with RETAIN set and the saguin-*
// labels (offset, Unix-millisecond timestamp, id; no saguin-channel for a
// filter reaching one channel); then changes without RETAIN, a deletion
// live as an empty payload. A later subscriber is told nothing of the
// deleted topic, as if it had never been set.
func TestLatestStateThenChanges(t *testing.T) {
	b, clk := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/pump/1", "on")
	set(t, pub, "state/pump/2", "off")
	set(t, pub, "state/pump/3", "idle")
	set(t, pub, "state/pump/2", "on") // replaces
	set(t, pub, "state/pump/3", "")   // deletes
	set(t, pub, "state/pump/9", "")   // deletes nothing: stores nothing

	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("state/#", 1)
	got := expectSet(t, sub, true, map[string]string{"state/pump/1": "on", "state/pump/2": "on"})
	sub.Quiet(200 * time.Millisecond)
	u := got["state/pump/2"].Properties.User
	if u.Get("saguin-offset") != "4" || u.Get("saguin-id") == "" || u.Get("saguin-channel") != "" {
		t.Fatalf("state labels: %v; want saguin-offset 4 (the replacing value), an id and no saguin-channel", u)
	}
	if u.Get("saguin-timestamp") != strconv.FormatInt(latestStart.UnixMilli(), 10) {
		t.Fatalf("saguin-timestamp %q, want broker receipt time in Unix ms %d", u.Get("saguin-timestamp"), latestStart.UnixMilli())
	}

	clk.Advance(time.Second)
	set(t, pub, "state/pump/1", "off")
	p := expect(t, sub, "state/pump/1", "off", false)
	if offsetOf(t, p) != 6 {
		t.Fatalf("change offset %d, want 6 (the empty delete of a topic with no value took none)", offsetOf(t, p))
	}
	set(t, pub, "state/pump/2", "")
	if p := expect(t, sub, "state/pump/2", "", false); offsetOf(t, p) != 7 {
		t.Fatalf("live deletion offset %d, want 7 (a tombstone has its own offset)", offsetOf(t, p))
	}

	late := brokertest.Connect(t, b.Address(), "late", brokertest.ClientOptions{CleanStart: true})
	late.Subscribe("state/#", 1)
	expect(t, late, "state/pump/1", "off", true)
	late.Quiet(200 * time.Millisecond)
}

// The SUBACK is written before the state it earns (docs/channels.md "Retained
// messages": the one order every client library is written against), with
// saguin-deletions on the SUBSCRIBE naming a property Sagüin reads rather
// than refusing it.
func TestLatestSubackBeforeState(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := range 50 {
		set(t, pub, fmt.Sprintf("state/s/%d", i), "v")
	}
	raw := dialRawMQTT(t, b.Address(), "raw")
	raw.subscribe(7, []packets.UserProperty{{Key: "saguin-deletions", Val: ""}}, packets.Subscription{Filter: "state/#", Qos: 1})
	first := raw.read()
	if first.FixedHeader.Type != packets.Suback || first.PacketID != 7 || len(first.ReasonCodes) != 1 || first.ReasonCodes[0] != 1 {
		t.Fatalf("first packet after SUBSCRIBE: type %d id %d codes %v; want the SUBACK granting QoS 1",
			first.FixedHeader.Type, first.PacketID, first.ReasonCodes)
	}
	for i := range 50 {
		pk := raw.read()
		if pk.FixedHeader.Type != packets.Publish || !pk.FixedHeader.Retain {
			t.Fatalf("state value %d: type %d retain %v", i, pk.FixedHeader.Type, pk.FixedHeader.Retain)
		}
	}
	// An unknown saguin- property is still refused on every filter.
	raw.subscribe(8, []packets.UserProperty{{Key: "saguin-bogus", Val: "1"}}, packets.Subscription{Filter: "state/#", Qos: 1})
	if pk := raw.read(); pk.FixedHeader.Type != packets.Suback || pk.ReasonCodes[0] != 0x83 {
		t.Fatalf("SUBSCRIBE with saguin-bogus: type %d codes %v; want SUBACK 0x83", pk.FixedHeader.Type, pk.ReasonCodes)
	}
}

// Retain Handling on a latest channel acts on that one pass: 0 sends the
// state on every SUBSCRIBE, 1 only when the subscription is new, 2 never;
// changes flow whatever it was.
func TestLatestRetainHandling(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/a", "1")

	rh2 := brokertest.Connect(t, b.Address(), "rh2", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, rh2, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1, RetainHandling: 2})
	rh2.Quiet(200 * time.Millisecond)

	rh1 := brokertest.Connect(t, b.Address(), "rh1", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, rh1, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1, RetainHandling: 1})
	expect(t, rh1, "state/a", "1", true)
	subscribeOpts(t, rh1, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1, RetainHandling: 1})
	rh1.Quiet(200 * time.Millisecond)

	rh0 := brokertest.Connect(t, b.Address(), "rh0", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, rh0, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1})
	expect(t, rh0, "state/a", "1", true)
	subscribeOpts(t, rh0, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1})
	expect(t, rh0, "state/a", "1", true)

	set(t, pub, "state/a", "2")
	for _, c := range []*brokertest.Client{rh2, rh1, rh0} {
		expect(t, c, "state/a", "2", false)
		c.Quiet(100 * time.Millisecond)
	}
}

// saguin-deletions on a SUBSCRIBE puts tombstones in that packet's state
// pass (empty payload, with their offset), for every filter in it; without
// it the state is only what is set. Live deletions reach everyone.
func TestLatestDeletionsOnRequest(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/x/1", "a")
	set(t, pub, "state/y/1", "b")
	set(t, pub, "state/x/1", "")
	set(t, pub, "state/y/1", "")
	set(t, pub, "state/y/2", "c")

	with := brokertest.Connect(t, b.Address(), "with", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, with, paho.UserProperties{{Key: "saguin-deletions", Value: "on"}},
		paho.SubscribeOptions{Topic: "state/x/#", QoS: 1}, paho.SubscribeOptions{Topic: "state/y/#", QoS: 1})
	got := expectSet(t, with, true, map[string]string{"state/x/1": "", "state/y/1": "", "state/y/2": "c"})
	if offsetOf(t, got["state/x/1"]) != 3 || offsetOf(t, got["state/y/1"]) != 4 {
		t.Fatalf("tombstone offsets %d, %d; want 3, 4", offsetOf(t, got["state/x/1"]), offsetOf(t, got["state/y/1"]))
	}
	with.Quiet(200 * time.Millisecond)

	without := brokertest.Connect(t, b.Address(), "without", brokertest.ClientOptions{CleanStart: true})
	without.Subscribe("state/#", 1)
	expect(t, without, "state/y/2", "c", true)
	without.Quiet(200 * time.Millisecond)

	set(t, pub, "state/y/2", "")
	expect(t, with, "state/y/2", "", false)
	expect(t, without, "state/y/2", "", false)
}

// Retain As Published: a change carries the publisher's flag; without it
// changes never carry RETAIN. The state pass always carries RETAIN, even
// for a value whose publisher never set it.
func TestLatestRetainAsPublished(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/plain", "p")
	rap := brokertest.Connect(t, b.Address(), "rap", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, rap, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1, RetainAsPublished: true})
	expect(t, rap, "state/plain", "p", true)
	plain := brokertest.Connect(t, b.Address(), "plain", brokertest.ClientOptions{CleanStart: true})
	plain.Subscribe("state/#", 1)
	expect(t, plain, "state/plain", "p", true)

	setWith(t, pub, &paho.Publish{Topic: "state/flagged", QoS: 1, Retain: true, Payload: []byte("f")})
	set(t, pub, "state/plain", "q")
	expect(t, rap, "state/flagged", "f", true)
	expect(t, rap, "state/plain", "q", false)
	expect(t, plain, "state/flagged", "f", false)
	expect(t, plain, "state/plain", "q", false)
}

// A resumed session without a new SUBSCRIBE gets only the topics that
// changed while it was away (from its mark), as changes (no RETAIN), and
// not the deletions made meanwhile; a new SUBSCRIBE clears the mark and
// brings the full state.
func TestLatestResumeGetsOnlyChanges(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/a", "1")
	set(t, pub, "state/b", "1")
	set(t, pub, "state/c", "1")
	durable := brokertest.ClientOptions{SessionExpiry: 3600}
	c := brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	c.Subscribe("state/#", 1)
	expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": "1", "state/c": "1"})
	set(t, pub, "state/a", "2")
	expect(t, c, "state/a", "2", false)
	time.Sleep(50 * time.Millisecond) // the PUBACK reaches the broker
	c.Close()

	set(t, pub, "state/b", "2")
	set(t, pub, "state/c", "") // deleted while away: not reported
	set(t, pub, "state/d", "1")
	c = brokertest.Connect(t, b.Address(), "dev", durable)
	if !c.Connack.SessionPresent {
		t.Fatal("the session did not resume")
	}
	expectSet(t, c, false, map[string]string{"state/b": "2", "state/d": "1"})
	c.Quiet(200 * time.Millisecond)

	c.Subscribe("state/#", 1)
	expectSet(t, c, true, map[string]string{"state/a": "2", "state/b": "2", "state/d": "1"})
	c.Quiet(200 * time.Millisecond)
}

// A QoS 0 subscriber is served the full state at every resume: its
// deliveries say nothing of what arrived.
func TestLatestQoS0ResumeGetsFullState(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/a", "1")
	set(t, pub, "state/b", "1")
	c := brokertest.Connect(t, b.Address(), "q0", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	c.Subscribe("state/#", 0)
	expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": "1"})
	c.Close()
	set(t, pub, "state/b", "2")
	c = brokertest.Connect(t, b.Address(), "q0", brokertest.ClientOptions{SessionExpiry: 3600})
	expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": "2"})
	c.Quiet(200 * time.Millisecond)
}

// A value left unacknowledged by a connection that went is resent on
// resume while it is still its topic's value, and dropped before anything
// is sent once the store has superseded it — its newer value comes instead,
// never the older after it.
func TestLatestResumeResendsOnlyCurrentUnacknowledged(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/kept", "k1")
	set(t, pub, "state/moved", "m1")
	opts := brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600, ManualAck: true}
	c := brokertest.Connect(t, b.Address(), "dev", opts)
	c.Subscribe("state/#", 1)
	expectSet(t, c, true, map[string]string{"state/kept": "k1", "state/moved": "m1"}) // never acknowledged
	c.Close()
	set(t, pub, "state/moved", "m2")

	opts.CleanStart = false
	c = brokertest.Connect(t, b.Address(), "dev", opts)
	got := map[string]string{}
	for range 2 {
		p := c.Next(wait)
		if _, dup := got[p.Topic]; dup {
			t.Fatalf("%s sent twice on resume", p.Topic)
		}
		got[p.Topic] = string(p.Payload)
		if err := c.Ack(p); err != nil {
			t.Fatal(err)
		}
	}
	if got["state/kept"] != "k1" || got["state/moved"] != "m2" {
		t.Fatalf("resume sent %v; want kept=k1 (unacknowledged, current) and moved=m2 (m1 superseded)", got)
	}
	c.Quiet(200 * time.Millisecond)
}

// Invariant 13 / docs/channels.md "`latest`" "Window": while a subscriber's window is full,
// a topic's updates do not queue up for it — at most one value per topic
// waits, and it is the newest: 50 updates behind a full window arrive as
// one delivery, the last.
func TestInvariant13_LatestWaitingValueIsReplacedNotQueued(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/t", "v0")
	c := brokertest.Connect(t, b.Address(), "slow", brokertest.ClientOptions{CleanStart: true, ManualAck: true, ReceiveMaximum: 1})
	c.Subscribe("state/#", 1)
	first := expect(t, c, "state/t", "v0", true)
	var last string
	for i := 1; i <= 50; i++ {
		last = fmt.Sprintf("v%d", i)
		set(t, pub, "state/t", last) // every publisher is answered: nothing waits on the subscriber
	}
	if err := c.Ack(first); err != nil {
		t.Fatal(err)
	}
	p := expect(t, c, "state/t", last, false)
	if offsetOf(t, p) != 51 {
		t.Fatalf("waiting value has offset %d, want 51 (the newest)", offsetOf(t, p))
	}
	if err := c.Ack(p); err != nil {
		t.Fatal(err)
	}
	c.Quiet(300 * time.Millisecond)
}

// Never an older value after a newer one, per topic per consumer: under
// concurrent publishers, subscribes and resumes, every subscriber sees each
// topic's offsets only rise (a repeat of the same value is allowed; an
// older one never).
func TestLatestNeverOlderAfterNewer(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	const topics, rounds = 5, 60
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			pub := brokertest.Connect(t, b.Address(), fmt.Sprint("pub", w), brokertest.ClientOptions{CleanStart: true})
			for i := range rounds {
				set(t, pub, fmt.Sprintf("state/t/%d", (i+w)%topics), fmt.Sprint(w, "-", i))
			}
		})
	}
	check := func(c *brokertest.Client, seen map[string]uint64, until time.Duration) {
		deadline := time.After(until)
		for {
			select {
			case p := <-c.Msgs:
				off := offsetOf(t, p)
				if off < seen[p.Topic] {
					t.Errorf("%s: offset %d after %d", p.Topic, off, seen[p.Topic])
				}
				seen[p.Topic] = off
			case <-deadline:
				return
			}
		}
	}
	var subs sync.WaitGroup
	for s := range 3 {
		subs.Go(func() {
			id := fmt.Sprint("sub", s)
			seen := map[string]uint64{}
			c := brokertest.Connect(t, b.Address(), id, brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600, ReceiveMaximum: 2})
			c.Subscribe("state/#", 1)
			check(c, seen, 150*time.Millisecond)
			c.Subscribe("state/t/+", 1) // a second filter, its own pass
			check(c, seen, 150*time.Millisecond)
			c.Close()
			c = brokertest.Connect(t, b.Address(), id, brokertest.ClientOptions{SessionExpiry: 600, ReceiveMaximum: 2})
			check(c, seen, 300*time.Millisecond)
		})
	}
	wg.Wait()
	subs.Wait()
}

// Invariant 11: one filter reaching broadcast, an append channel and a
// latest channel is served each under its own semantics, one copy per
// record: the latest value as state with RETAIN, the append record as a
// replay without it, both labelled saguin-channel (the filter reaches more
// than one channel), the broadcast live and unlabelled; the queue's job
// never.
func TestInvariant11_OneFilterServedEachChannelUnderItsSemantics(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/door", "open")
	set(t, pub, "events/door", "opened")
	set(t, pub, "jobs/door", "fix it")

	c := brokertest.Connect(t, b.Address(), "all", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("#", 1)
	got := map[string]*paho.Publish{}
	for range 2 {
		p := c.Next(wait)
		if got[p.Topic] != nil {
			t.Fatalf("%s delivered twice", p.Topic)
		}
		got[p.Topic] = p
	}
	st, ev := got["state/door"], got["events/door"]
	if st == nil || !st.Retain || st.Properties.User.Get("saguin-channel") != "state" {
		t.Fatalf("latest value: %+v; want RETAIN and saguin-channel state", st)
	}
	if ev == nil || ev.Retain || ev.Properties.User.Get("saguin-channel") != "events" {
		t.Fatalf("append record: %+v; want no RETAIN and saguin-channel events", ev)
	}
	set(t, pub, "news/today", "hello")
	set(t, pub, "state/door", "shut")
	got = map[string]*paho.Publish{}
	for range 2 {
		p := c.Next(wait)
		got[p.Topic] = p
	}
	if bc := got["news/today"]; bc == nil || bc.Properties.User.Get("saguin-offset") != "" {
		t.Fatalf("broadcast: %+v; want it live and unlabelled", bc)
	}
	if ch := got["state/door"]; ch == nil || ch.Retain || string(ch.Payload) != "shut" {
		t.Fatalf("latest change: %+v; want shut without RETAIN", ch)
	}
	c.Quiet(300 * time.Millisecond)
}

// Invariant 16: a subscriber that stops reading its socket holds up no
// publisher. It has a latest subscription, is sent the state and then
// never reads again; publishers to the channel keep being answered.
func TestInvariant16_DeafLatestSubscriberHoldsNoPublisher(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	deaf := dialRawMQTT(t, b.Address(), "deaf")
	deaf.subscribe(1, nil, packets.Subscription{Filter: "state/#", Qos: 1})
	payload := make([]byte, 8<<10)
	start := time.Now()
	for i := range 400 { // 3.2 MiB: far past any socket buffer
		setWith(t, pub, &paho.Publish{Topic: fmt.Sprintf("state/big/%d", i), QoS: 1, Payload: payload})
	}
	t.Logf("400 publishes with a deaf subscriber: %s", time.Since(start))
}

// MQTT 3.1.1 on a latest channel: every SUBSCRIBE gets the state with
// RETAIN and no properties; a durable session (cleanSession 0) resumes,
// with no SUBSCRIBE, to the changes only — deletions made while away not
// among them.
func TestLatestMQTT311SubscribeAndResume(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/a", "1")
	set(t, pub, "state/b", "1")
	v3 := packets.Packet{ProtocolVersion: 4, Connect: packets.ConnectParams{ClientIdentifier: "legacy", Clean: false}}
	c, ack := dialRawMQTTWith(t, b.Address(), v3)
	if ack.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK %d", ack.ReasonCode)
	}
	readValues := func(n int, retain bool) map[string]string {
		t.Helper()
		got := map[string]string{}
		for len(got) < n {
			pk := c.read()
			if pk.FixedHeader.Type != packets.Publish {
				continue // the SUBACK
			}
			if pk.FixedHeader.Retain != retain || len(pk.Properties.User) != 0 {
				t.Fatalf("3.1.1 delivery %s retain=%v properties %v; want retain=%v and none", pk.TopicName, pk.FixedHeader.Retain, pk.Properties.User, retain)
			}
			got[pk.TopicName] = string(pk.Payload)
			c.puback(pk.PacketID)
		}
		return got
	}
	c.subscribe(1, nil, packets.Subscription{Filter: "state/#", Qos: 1})
	if got := readValues(2, true); got["state/a"] != "1" || got["state/b"] != "1" {
		t.Fatalf("3.1.1 state: %v", got)
	}
	time.Sleep(50 * time.Millisecond) // the PUBACKs reach the broker
	c.disconnect()

	set(t, pub, "state/b", "2")
	set(t, pub, "state/c", "1")
	set(t, pub, "state/a", "")
	c, ack = dialRawMQTTWith(t, b.Address(), v3)
	if !ack.SessionPresent {
		t.Fatal("the 3.1.1 durable session did not resume")
	}
	if got := readValues(2, false); got["state/b"] != "2" || got["state/c"] != "1" {
		t.Fatalf("3.1.1 resume: %v; want b=2 and c=1 only", got)
	}
	if pk, err := c.readWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("3.1.1 resume sent more: %s %q", pk.TopicName, pk.Payload)
	}
}

// No Local on a latest channel is judged by the client id stored with the
// value, on the state pass and on changes alike.
func TestLatestNoLocal(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	me := brokertest.Connect(t, b.Address(), "me", brokertest.ClientOptions{CleanStart: true})
	other := brokertest.Connect(t, b.Address(), "other", brokertest.ClientOptions{CleanStart: true})
	set(t, me, "state/mine", "1")
	set(t, other, "state/theirs", "1")
	subscribeOpts(t, me, nil, paho.SubscribeOptions{Topic: "state/#", QoS: 1, NoLocal: true})
	expect(t, me, "state/theirs", "1", true)
	set(t, me, "state/mine", "2")
	set(t, other, "state/theirs", "2")
	expect(t, me, "state/theirs", "2", false)
	me.Quiet(200 * time.Millisecond)
}

// A value larger than the subscriber's Maximum Packet Size disconnects it
// with 0x95 and is never skipped (docs/channels.md "What a delivery carries"); a point read of it is
// refused 0x83 on the PUBACK rather than answered.
func TestLatestValueTooLargeForTheClient(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	setWith(t, pub, &paho.Publish{Topic: "state/big", QoS: 1, Payload: make([]byte, 2000)})
	set(t, pub, "state/small", "x")
	small := packets.Packet{ProtocolVersion: 5, Connect: packets.ConnectParams{ClientIdentifier: "small", Clean: true},
		Properties: packets.Properties{MaximumPacketSize: 1024}}
	c, _ := dialRawMQTTWith(t, b.Address(), small)
	if ack := c.publish(1, "$saguin/kv/get", []byte("state/big"), packets.Properties{ResponseTopic: "answers/small"}); ack.ReasonCode != 0x83 {
		t.Fatalf("point read of a value over the client's Maximum Packet Size: PUBACK 0x%02x, want 0x83", ack.ReasonCode)
	}
	c.subscribe(2, nil, packets.Subscription{Filter: "state/#", Qos: 1})
	for {
		pk := c.read()
		if pk.FixedHeader.Type == packets.Publish && pk.TopicName == "state/big" {
			t.Fatal("a value over the client's Maximum Packet Size was sent")
		}
		if pk.FixedHeader.Type == packets.Disconnect {
			if pk.ReasonCode != 0x95 {
				t.Fatalf("DISCONNECT 0x%02x, want 0x95", pk.ReasonCode)
			}
			break
		}
	}
}
