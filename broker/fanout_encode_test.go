package broker_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

// A broadcast message to 50 subscribers of one shape (MQTT 5, QoS 1, no
// Subscription Identifier) is encoded once and copied 49 times with each
// subscriber's Packet Identifier patched in; a 3.1.1 subscriber and one
// whose subscription carries an identifier are a shape of their own /
// encoded on their own (rfcs/fanout.md "Encoded once"). Every subscriber
// still gets the message as published.
func TestBroadcastFanOutEncodedOncePerShape(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig))
	const n = 50
	subs := make([]*brokertest.Client, n)
	for i := range subs {
		// Acknowledged only once the counts are read: a message's
		// encodings live while entries holding it do, so a subscriber
		// written after every other had acknowledged would encode again
		// (rightly; flaky under load before this).
		subs[i] = brokertest.Connect(t, b.Address(), fmt.Sprintf("s%02d", i), brokertest.ClientOptions{CleanStart: true, ManualAck: true})
		subs[i].Subscribe("status/enc/#", 1)
	}
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	payload := bytes.Repeat([]byte("p"), 300) // a two-byte Remaining Length
	before := b.BroadcastEncodes()
	if _, err := pub.Publish(&paho.Publish{Topic: "status/enc/1", QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ContentType: "text/plain", User: paho.UserProperties{{Key: "k", Value: "v"}}}}); err != nil {
		t.Fatal(err)
	}
	firsts := make([]*paho.Publish, n)
	for i, s := range subs {
		m := s.Next(10 * time.Second)
		if m == nil {
			t.Fatalf("subscriber %d got nothing", i)
		}
		firsts[i] = m
		if m.Topic != "status/enc/1" || m.QoS != 1 || !bytes.Equal(m.Payload, payload) || m.PacketID == 0 ||
			m.Properties.ContentType != "text/plain" || len(m.Properties.User) != 1 || m.Properties.User[0].Value != "v" {
			t.Fatalf("subscriber %d got %q qos %d id %d props %+v", i, m.Topic, m.QoS, m.PacketID, m.Properties)
		}
	}
	got := b.BroadcastEncodes()
	if enc, cp := got.Encoded-before.Encoded, got.Copied-before.Copied; enc != 1 || cp != n-1 {
		t.Fatalf("a message to %d subscribers of one shape: encoded %d times, copied %d; want 1 and %d", n, enc, cp, n-1)
	}
	for i, s := range subs {
		if err := s.Ack(firsts[i]); err != nil {
			t.Fatal(err)
		}
	}

	// A subscription with a Subscription Identifier is encoded on its own
	// (MQTT 5 §3.3.2.3.8); the other 50 still share one encoding.
	ided := brokertest.Connect(t, b.Address(), "ided", brokertest.ClientOptions{CleanStart: true, ManualAck: true})
	id := 7
	if _, err := ided.SubscribeWith(&paho.Subscribe{Properties: &paho.SubscribeProperties{SubscriptionIdentifier: &id},
		Subscriptions: []paho.SubscribeOptions{{Topic: "status/enc/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	before = b.BroadcastEncodes()
	if _, err := pub.Publish(&paho.Publish{Topic: "status/enc/2", QoS: 1, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	seconds := make([]*paho.Publish, n)
	for i, s := range subs {
		if seconds[i] = s.Next(10 * time.Second); seconds[i] == nil || seconds[i].Topic != "status/enc/2" {
			t.Fatalf("subscriber %d: %+v", i, seconds[i])
		}
	}
	m := ided.Next(10 * time.Second)
	if m == nil || m.Properties.SubscriptionIdentifier == nil || *m.Properties.SubscriptionIdentifier != id {
		t.Fatalf("the subscriber with identifier %d got %+v", id, m)
	}
	got = b.BroadcastEncodes()
	if enc, cp := got.Encoded-before.Encoded, got.Copied-before.Copied; enc != 2 || cp != n-1 {
		t.Fatalf("50 of one shape and one with a Subscription Identifier: encoded %d, copied %d; want 2 and %d", enc, cp, n-1)
	}
}
