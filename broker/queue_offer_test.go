package broker_test

import (
	"testing"

	"saguin.dev/broker/brokertest"
)

// Records are offered in offset order (docs/channels.md): a job that
// comes back is offered before the later jobs the offer loop already read
// and kept for its next passes (rfcs/0003-queue-engine.md "Offering").
func TestQueueReturnedJobIsOfferedBeforeLaterOnes(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	for _, p := range []string{"A", "B", "C"} {
		r.publish(pub, "jobs/x", p)
	}
	// The workers send no PUBACK (their answers count the attempts): no
	// PUBACK can start an offer while w1's return is being applied, when
	// w1 is free and A is not yet back (it would rightly get C then).
	manual := brokertest.ClientOptions{CleanStart: true, ManualAck: true}
	w1 := worker(t, r, "w1", manual)
	a := r.next(w1)
	w2 := worker(t, r, "w2", manual)
	b := r.next(w2)
	if string(a.Payload) != "A" || string(b.Payload) != "B" {
		t.Fatalf("first offers %q and %q, want A and B", a.Payload, b.Payload)
	}
	// The answer's PUBACK comes after the return is applied: A is back.
	answer(t, w1, a, "return")
	a2 := r.next(w1)
	if string(a2.Payload) != "A" || a2.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("after A came back w1 was offered %q attempt %s, want A attempt 2 before C",
			a2.Payload, a2.Properties.User.Get("saguin-attempt"))
	}
	answer(t, w2, b, "ack")
	if c := r.next(w2); string(c.Payload) != "C" || c.Properties.User.Get("saguin-attempt") != "1" {
		t.Fatalf("then w2 was offered %q attempt %s, want C attempt 1", c.Payload, c.Properties.User.Get("saguin-attempt"))
	}
	answer(t, w1, a2, "ack")
	r.quiet(w1, 5) // A is resolved: nothing more for anyone
}
