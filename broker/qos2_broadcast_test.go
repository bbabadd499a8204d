package broker_test

import (
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// rfcs/qos2-holds.md "Broadcast QoS 2": a client's QoS 2 publish to a broadcast
// topic is held from PUBREC to PUBREL and delivered at its release, not its
// arrival — once, however often PUBREL is re-sent — and retained from the
// release on. Holds count against broker.qos2.max_inflight_per_client like
// channel holds (the config sets 2).
func TestQoS2BroadcastDeliveredAtReleaseNotArrival(t *testing.T) {
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			b := brokertest.Start(t, qos2ConfigWith(t, pv.provider, ""))
			sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
			sub.Subscribe("plain/#", 2)
			pub, _ := q2Dial(t, b.Address(), "pub", true, 0)
			pub.hold(1, "plain/a", "first", 0x00)
			pub.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2, Retain: true},
				PacketID: 2, TopicName: "plain/r", Payload: []byte("kept")})
			pub.expect("PUBREC for the retained one", packets.Pubrec, 2, 0x00)
			pub.hold(3, "plain/b", "over", 0x97) // the allowance of 2 is taken
			if s := b.QoS2Stats(); s.Held != 2 {
				t.Fatalf("QoS2Stats = %+v, want the two broadcast exchanges held", s)
			}
			sub.Quiet(300 * time.Millisecond) // nothing is delivered at arrival
			late := brokertest.Connect(t, b.Address(), "late", brokertest.ClientOptions{CleanStart: true})
			late.Subscribe("plain/r", 1)
			late.Quiet(200 * time.Millisecond) // nor retained before its release

			pub.release(1, 0x00)
			if p := sub.Next(wait); p.Topic != "plain/a" || string(p.Payload) != "first" || p.QoS != 2 {
				t.Fatalf("after PUBREL: %s %q at QoS %d, want plain/a first at 2", p.Topic, p.Payload, p.QoS)
			}
			pub.release(1, 0x92) // a re-sent PUBREL finds nothing: delivered once
			pub.release(2, 0x00)
			if p := sub.Next(wait); p.Topic != "plain/r" || string(p.Payload) != "kept" {
				t.Fatalf("second release: %s %q", p.Topic, p.Payload)
			}
			if p := late.Next(wait); p.Topic != "plain/r" || string(p.Payload) != "kept" {
				t.Fatalf("live to the late subscriber: %s %q", p.Topic, p.Payload)
			}
			sub.Quiet(300 * time.Millisecond)
			again := brokertest.Connect(t, b.Address(), "again", brokertest.ClientOptions{CleanStart: true})
			again.Subscribe("plain/r", 1)
			if p := again.Next(wait); p.Topic != "plain/r" || string(p.Payload) != "kept" || !p.Retain {
				t.Fatalf("retained after the release: %s %q retain %v", p.Topic, p.Payload, p.Retain)
			}
			if s := b.QoS2Stats(); s.Held != 0 || s.Abandoned != 0 {
				t.Fatalf("QoS2Stats = %+v, want nothing held or abandoned", s)
			}
		})
	}
}

// invariant 15/18 and rfcs/qos2-holds.md "Restart cost": a broadcast exchange
// PUBREC'd before a SIGKILL comes back with its durable session; the
// re-sent PUBREL delivers it exactly once to a subscriber, and one more
// PUBREL is 0x92. An exchange whose session did not come back is dropped
// and counted, never delivered.
func TestInvariant15_BroadcastQoS2HoldSurvivesAKill(t *testing.T) {
	proc := brokertest.StartProcess(t, qos2ConfigWith(t, sqliteProvider, ""))
	pub, _ := q2Dial(t, proc.Address(), "pub", false, 3600)
	pub.hold(7, "plain/x", "once", 0x00)
	gone, _ := q2Dial(t, proc.Address(), "gone", true, 0) // ends with its connection
	gone.hold(8, "plain/x", "never", 0x00)
	proc.Kill()
	proc.Restart()
	sub := brokertest.Connect(t, proc.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("plain/#", 1)
	pub, present := q2Dial(t, proc.Address(), "pub", false, 3600)
	if !present {
		t.Fatal("the publisher's durable session did not come back (Session Present 0)")
	}
	pub.release(7, 0x00)
	if p := sub.Next(wait); p.Topic != "plain/x" || string(p.Payload) != "once" {
		t.Fatalf("after the re-sent PUBREL: %s %q", p.Topic, p.Payload)
	}
	pub.release(7, 0x92)
	gone, present = q2Dial(t, proc.Address(), "gone", true, 0)
	if present {
		t.Fatal("a session that ended with its connection came back")
	}
	gone.release(8, 0x92)
	sub.Quiet(500 * time.Millisecond)
}
