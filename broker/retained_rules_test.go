package broker_test

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// The retained store follows MQTT's rules in each place docs/channels.md "Retained
// messages" lists (step 4 item 3). Each test publishes status/door retained
// on a broadcast topic unless it says otherwise.

func retainedRulesRig(t *testing.T) (*brokertest.Broker, *brokertest.Client) {
	t.Helper()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), queueConfig))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "status/door", []byte("open"), 0); code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	return b, pub
}

// The SUBACK goes first, then the stored pass with RETAIN set
// (MQTT-3.3.1-9), read packet by packet.
func TestRetainedPassFollowsTheSuback(t *testing.T) {
	b, _ := retainedRulesRig(t)
	c, _ := brokertest.DialRaw(t, b.Address(), "raw", true, 0)
	c.SendSubscribe(7, packets.Subscription{Filter: "status/#", Qos: 1})
	first := c.Read()
	if first.FixedHeader.Type != packets.Suback || first.PacketID != 7 {
		t.Fatalf("first packet after SUBSCRIBE is type %d, want the SUBACK", first.FixedHeader.Type)
	}
	second := c.Read()
	if second.FixedHeader.Type != packets.Publish || string(second.Payload) != "open" || !second.FixedHeader.Retain {
		t.Fatalf("stored pass: type %d payload %q retain %v", second.FixedHeader.Type, second.Payload, second.FixedHeader.Retain)
	}
}

// Retained values are sent at SUBSCRIBE, never at connect: a durable
// session resuming without subscribing again is sent no stored pass.
func TestRetainedNotSentAtResume(t *testing.T) {
	b, _ := retainedRulesRig(t)
	c := brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	// QoS 0: at QoS 1 the client's PUBACK of the retained delivery could
	// still be in flight behind its DISCONNECT, and the resumed session
	// would rightly resend the unacknowledged delivery (DUP) — which is
	// not what this test is about.
	c.Subscribe("status/#", 0)
	if p := c.Next(wait); !p.Retain {
		t.Fatal("stored pass without RETAIN")
	}
	c.Close()
	c = brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{SessionExpiry: 600})
	if !c.Connack.SessionPresent {
		t.Fatal("session not resumed")
	}
	c.Quiet(300 * time.Millisecond)
}

// Retain Handling (MQTT 5 §3.8.3.1): 0 sends the stored pass at every
// SUBSCRIBE, 1 only when the subscription is new, 2 never.
func TestRetainHandlingOnTheRetainedStore(t *testing.T) {
	b, _ := retainedRulesRig(t)
	c := brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{CleanStart: true})
	sub := func(rh byte, filter string) {
		t.Helper()
		if _, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1, RetainHandling: rh}}}); err != nil {
			t.Fatal(err)
		}
	}
	sub(0, "status/#")
	if p := c.Next(wait); string(p.Payload) != "open" {
		t.Fatalf("RH 0, new: %q", p.Payload)
	}
	sub(0, "status/#")
	if p := c.Next(wait); string(p.Payload) != "open" {
		t.Fatalf("RH 0, existing: %q", p.Payload)
	}
	sub(1, "status/#")
	c.Quiet(200 * time.Millisecond) // RH 1 on an existing subscription
	sub(1, "status/+")
	if p := c.Next(wait); string(p.Payload) != "open" {
		t.Fatalf("RH 1, new: %q", p.Payload)
	}
	sub(2, "+/door")
	c.Quiet(200 * time.Millisecond)
}

// Nothing of the retained store goes to a shared subscription
// (MQTT-3.8.4-4 leaves it to the server; docs/channels.md says none).
func TestSharedSubscriptionIsSentNoRetainedValue(t *testing.T) {
	b, pub := retainedRulesRig(t)
	c := brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("$share/g/status/#", 1)
	c.Quiet(200 * time.Millisecond)
	// It is a live subscription all the same.
	if _, err := pub.Publish(&paho.Publish{Topic: "status/door", QoS: 1, Payload: []byte("shut")}); err != nil {
		t.Fatal(err)
	}
	if p := c.Next(wait); string(p.Payload) != "shut" {
		t.Fatalf("live delivery to the group: %q", p.Payload)
	}
}

// RETAIN is set on the stored pass only; a live delivery of a retained
// publish carries it only to a subscription with Retain As Published
// (MQTT-3.3.1-12, -13).
func TestRetainFlagOnlyOnTheStoredPassUnlessRetainAsPublished(t *testing.T) {
	b, pub := retainedRulesRig(t)
	plain := brokertest.Connect(t, b.Address(), "plain", brokertest.ClientOptions{CleanStart: true})
	plain.Subscribe("status/#", 1)
	if p := plain.Next(wait); !p.Retain {
		t.Fatal("stored pass without RETAIN")
	}
	rap := brokertest.Connect(t, b.Address(), "rap", brokertest.ClientOptions{CleanStart: true})
	if _, err := rap.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "status/#", QoS: 1, RetainAsPublished: true}}}); err != nil {
		t.Fatal(err)
	}
	if p := rap.Next(wait); !p.Retain {
		t.Fatal("stored pass without RETAIN (Retain As Published)")
	}
	retainPublish(t, pub, "status/door", []byte("ajar"), 0)
	if p := plain.Next(wait); p.Retain || string(p.Payload) != "ajar" {
		t.Fatalf("live delivery to a plain subscription: retain %v payload %q", p.Retain, p.Payload)
	}
	if p := rap.Next(wait); !p.Retain || string(p.Payload) != "ajar" {
		t.Fatalf("live delivery with Retain As Published: retain %v payload %q", p.Retain, p.Payload)
	}
}

// A retained publish to a queue topic is accepted as a job with the flag
// dropped: the worker gets it without RETAIN, and the retained store holds
// nothing for a later subscriber (docs/channels.md "Broadcast").
func TestRetainedPublishToAQueueDropsTheFlag(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "jobs/x", []byte("work"), 0); code != 0 {
		t.Fatalf("retained publish to a queue: 0x%02x, want 0x00", code)
	}
	late := brokertest.Connect(t, r.b.Address(), "late", brokertest.ClientOptions{CleanStart: true})
	late.Subscribe("#", 1)
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	p := r.next(w)
	if string(p.Payload) != "work" || p.Retain {
		t.Fatalf("job: payload %q retain %v", p.Payload, p.Retain)
	}
	late.Quiet(200 * time.Millisecond)
}

// A retained publish to an append channel is stored as any other record and
// replayed to whoever reads the channel; the broadcast retained store does
// not hold it.
func TestRetainedPublishToAnAppendChannelIsARecord(t *testing.T) {
	b, pub := retainedRulesRig(t)
	if code := retainPublish(t, pub, "events/a", []byte("kept"), 0); code != 0 {
		t.Fatalf("retained publish to an append channel: 0x%02x", code)
	}
	if code := retainPublish(t, pub, "events/a", []byte{}, 0); code != 0 {
		t.Fatalf("empty retained publish to an append channel: 0x%02x", code)
	}
	c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("events/#", 1)
	first, second := c.Next(wait), c.Next(wait)
	if string(first.Payload) != "kept" || first.Properties.User.Get("saguin-offset") != "1" {
		t.Fatalf("first record: %q offset %s", first.Payload, first.Properties.User.Get("saguin-offset"))
	}
	// The zero-length retained publish is a record too, not a deletion.
	if len(second.Payload) != 0 || second.Properties.User.Get("saguin-offset") != "2" {
		t.Fatalf("second record: %q offset %s", second.Payload, second.Properties.User.Get("saguin-offset"))
	}
}
