package broker_test

import (
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
)

// TestInvariant04_JobAwaitingItsPubackIsOfferedToNoOtherWorker: one job,
// one holder, including while the holder has not yet sent its PUBACK. The
// property test's workers acknowledge at once, so a job that becomes
// claimable in the window between the PUBLISH and the PUBACK never shows
// there; here the first worker holds its PUBACK back while a second worker
// (subscribed before the clock moves) and a third (subscribed after) ask
// for work, and the engine's clock runs past several visibility timeouts.
// Neither may be offered the job: it has exactly one live delivery until the
// holder answers or leaves. Once the PUBACK is sent the lease starts; only
// when that lease's own deadline passes may another worker have it, as
// attempt 2 — which also shows the other workers were able to receive all
// along, so their silence before was the engine's decision.
func TestInvariant04_JobAwaitingItsPubackIsOfferedToNoOtherWorker(t *testing.T) {
	r := newQueueRig(t, queueConfig) // visibility_timeout: 30s
	const visibility = 30 * time.Second
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	holder := worker(t, r, "holder", brokertest.ClientOptions{CleanStart: true, ManualAck: true})
	r.publish(pub, "jobs/one", "only-one-holder")
	job := r.next(holder)
	if got := job.Properties.User.Get("saguin-attempt"); got != "1" {
		t.Fatalf("first delivery carries attempt %q, want 1", got)
	}

	early := worker(t, r, "early", brokertest.ClientOptions{CleanStart: true})
	r.quiet(early, 5) // the PUBACK is outstanding, no clock has run out
	for range 4 {     // four visibility timeouts with the PUBACK still held
		r.clk.Advance(visibility + time.Second)
		r.quiet(early, 3)
	}
	late := worker(t, r, "late", brokertest.ClientOptions{CleanStart: true})
	r.quiet(early, 3)
	r.quiet(late, 3)

	// The PUBACK starts the one lease; before its deadline nobody else gets
	// the job either.
	if err := holder.Ack(job); err != nil {
		t.Fatalf("PUBACK: %v", err)
	}
	r.quiet(early, 3)
	r.quiet(late, 3)
	r.clk.Advance(visibility / 2)
	r.quiet(early, 3)
	r.quiet(late, 3)

	// The lease runs out unanswered: now, and only now, the job moves.
	r.clk.Advance(visibility)
	again := r.nextOf(early, late)
	if string(again.Payload) != "only-one-holder" || again.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("after the lease expired: %q attempt %q, want the job as attempt 2",
			again.Payload, again.Properties.User.Get("saguin-attempt"))
	}
}
