package broker_test

import (
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// Invariant 17: only the owning connection changes a session. A second
// CONNECT for a live client id that is refused (here: a Will that could
// never be delivered) is turned away before it touches the
// session: the first connection keeps it, is not told it was taken over, and
// goes on being served.
func TestInvariant17_RefusedConnectLeavesTheLiveSessionAlone(t *testing.T) {
	b := brokertest.Start(t, configWith(t, sqliteProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	owner := brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	owner.Subscribe("events/#", 1)
	publishN(t, pub, "events/a", 1, 1)
	owner.Next(wait)

	badWill := willConnect("dev", "events/+", 0, 600)
	badWill.Connect.Clean = false
	if _, ack := brokertest.DialConnect(t, b.Address(), badWill); ack.ReasonCode != 0x90 {
		t.Fatalf("CONNECT with a wildcard Will: 0x%02x, want 0x90", ack.ReasonCode)
	}
	select {
	case d := <-owner.Disconnects:
		t.Fatalf("the owner was disconnected (0x%02x) by a refused CONNECT", d.ReasonCode)
	default:
	}
	publishN(t, pub, "events/a", 2, 1)
	if off := owner.Next(wait).Properties.User.Get("saguin-offset"); off != "2" {
		t.Fatalf("the owner was next served offset %s, want 2", off)
	}
}

// Invariants 4 and 15: a job offered to a worker that drops before its
// PUBACK goes back to the queue and to another worker; when the first
// worker's session resumes, the substrate must not resend it the old
// delivery (DUP) — that would be a second live copy of a job another worker
// holds. Found by the hour-long chaos run (seed 1001).
func TestInvariant04_ResumedWorkerIsNotResentAJobTakenBack(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	first, _ := brokertest.DialRaw(t, r.b.Address(), "first", true, 600)
	if sa := first.Subscribe(1, "$saguin/queue/jobs", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	pub := brokertest.Connect(t, r.b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	r.publish(pub, "jobs/x", "only-once")
	for {
		r.tick()
		pk, err := first.ReadWithin(50 * time.Millisecond)
		if err == nil && pk.FixedHeader.Type == packets.Publish {
			break // received, never acknowledged
		}
	}
	first.Drop()

	second := worker(t, r, "second", brokertest.ClientOptions{CleanStart: true})
	if p := r.next(second); string(p.Payload) != "only-once" {
		t.Fatalf("second worker got %q", p.Payload)
	}
	first, connack := brokertest.DialRaw(t, r.b.Address(), "first", false, 600)
	if !connack.SessionPresent {
		t.Fatal("the first worker's session did not resume")
	}
	for i := 0; i < 10; i++ {
		r.tick()
		if pk, err := first.ReadWithin(50 * time.Millisecond); err == nil && pk.FixedHeader.Type == packets.Publish {
			t.Fatalf("the resumed worker was sent %q (DUP %v) while another worker holds the job",
				pk.Payload, pk.FixedHeader.Dup)
		}
	}
}
