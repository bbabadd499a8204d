package broker_test

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// A retained publish and a SUBSCRIBE matching it reach the subscriber as
// one message, never two: MQTT 5 §3.3.1.3 sends the retained values "when
// the subscription is made", and §3.8.4 delivers what is published after
// it live. A publish stored before the subscription is made is in the
// retained pass only (RETAIN 1); one published after it is delivered live
// only (RETAIN 0 without Retain As Published).

// retainedCopies reads the subscriber's packets until it has seen both the
// SUBACK of the barrier SUBSCRIBE (id 2, sent after the first one's, so the
// first one's retained pass — written on the same connection's goroutine
// before the next packet is read — is all before it) and the live marker,
// which atBarrier publishes once that SUBACK is read: only then is the
// first subscription certainly made, so the marker is certainly delivered
// to it, and any live copy of the message, queued to the same outbox
// first, is before it. It returns how many copies of payload came with
// RETAIN set and how many without.
func retainedCopies(t *testing.T, sub *brokertest.RawClient, payload string, atBarrier func()) (retained, live int) {
	t.Helper()
	barrier, marker := false, false
	for !barrier || !marker {
		pk := sub.Read()
		switch pk.FixedHeader.Type {
		case packets.Suback:
			if pk.PacketID == 2 && !barrier {
				barrier = true
				atBarrier()
			}
		case packets.Publish:
			if pk.FixedHeader.Qos > 0 {
				sub.Puback(pk.PacketID)
			}
			switch string(pk.Payload) {
			case "marker":
				marker = true
			case payload:
				if pk.FixedHeader.Retain {
					retained++
				} else {
					live++
				}
			}
		}
	}
	return retained, live
}

// publishMarker publishes the non-retained marker retainedCopies waits for.
func publishMarker(t *testing.T, pub *brokertest.Client) {
	t.Helper()
	if _, err := pub.Publish(&paho.Publish{Topic: "status/pump-1", QoS: 1, Payload: []byte("marker")}); err != nil {
		t.Fatal(err)
	}
}

// TestRetainedPublishAfterTheSubscriptionArrivesOnceLive: a retained
// publish made while a SUBSCRIBE is between its SUBACK and its retained
// pass — the subscription made, so the publish is delivered live — is not
// sent again in the pass.
func TestRetainedPublishAfterTheSubscriptionArrivesOnceLive(t *testing.T) {
	b, _ := retainedRig(t, "main")
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	sub, _ := brokertest.DialRaw(t, b.Address(), "sub", true, 0)
	reached, release := b.PauseBeforeRetainedPass()
	sub.SendSubscribe(1, packets.Subscription{Filter: "status/#", Qos: 1})
	<-reached
	if code := retainPublish(t, pub, "status/pump-1", []byte("on"), 0); code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	release()
	sub.SendSubscribe(2, packets.Subscription{Filter: "barrier/#", Qos: 1})
	if retained, live := retainedCopies(t, sub, "on", func() { publishMarker(t, pub) }); retained != 0 || live != 1 {
		t.Fatalf("the publish made after the subscription arrived %d times with RETAIN and %d times live, want once live",
			retained, live)
	}
}

// TestRetainedPublishStoredBeforeTheSubscriptionArrivesOnceRetained: a
// retained publish whose value is stored but not yet fanned out when a
// SUBSCRIBE arrives is the subscription's retained value, sent once in the
// pass, and not delivered live as well.
func TestRetainedPublishStoredBeforeTheSubscriptionArrivesOnceRetained(t *testing.T) {
	b, _ := retainedRig(t, "main")
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	sub, _ := brokertest.DialRaw(t, b.Address(), "sub", true, 0)
	reached, release := b.PauseAfterRetainStored()
	published := make(chan byte, 1)
	go func() {
		resp, err := pub.Publish(&paho.Publish{Topic: "status/pump-1", QoS: 1, Retain: true, Payload: []byte("on")})
		if err != nil {
			published <- 0xff
			return
		}
		published <- resp.ReasonCode
	}()
	<-reached
	arrived := b.NotifySubscribeAtOrder()
	sub.SendSubscribe(1, packets.Subscription{Filter: "status/#", Qos: 1})
	// Released only once the SUBSCRIBE has reached the broker: it arrives
	// while the value is stored and not yet fanned out, which is the case
	// under test (released earlier, the publish may be fanned out first).
	<-arrived
	release()
	if code := <-published; code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	sub.SendSubscribe(2, packets.Subscription{Filter: "barrier/#", Qos: 1})
	if retained, live := retainedCopies(t, sub, "on", func() { publishMarker(t, pub) }); retained != 1 || live != 0 {
		t.Fatalf("the publish stored before the subscription arrived %d times with RETAIN and %d times live, want once retained",
			retained, live)
	}
}
