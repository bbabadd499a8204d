package broker_test

import (
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
)

// Invariant 3 when the stale answer comes from the worker that holds the
// job now. The job went back to the same worker — after its visibility
// timeout, or after it reconnected under the same client id — and that
// worker's late answer to the earlier attempt names the earlier Delivery
// ID. Holder and session match, so only the ID tells the two attempts
// apart: the stale ack is logged and ignored (the current lease runs out
// and the job comes back), and the current attempt's own ack resolves it.
// TestInvariant03_LateAckWithSupersededDeliveryIDChangesNothing has the
// late answer come from another worker, which the holder check alone
// refuses whatever the ID.
func TestInvariant03_StaleAnswerFromTheCurrentHolderChangesNothing(t *testing.T) {
	for _, how := range []string{"visibility timeout", "reconnect"} {
		t.Run(how, func(t *testing.T) {
			r := newQueueRig(t, queueConfig)
			pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
			w := worker(t, r, "worker", brokertest.ClientOptions{CleanStart: true})
			r.publish(pub, "jobs/x", "the job")
			first := r.next(w)

			switch how {
			case "visibility timeout":
				r.clk.Advance(31 * time.Second)
			case "reconnect":
				w.Close()
				w = worker(t, r, "worker", brokertest.ClientOptions{CleanStart: true})
			}
			second := r.next(w)
			if second.Properties.User.Get("saguin-attempt") != "2" || string(second.Payload) != "the job" {
				t.Fatalf("redelivery: attempt %s payload %q", second.Properties.User.Get("saguin-attempt"), second.Payload)
			}

			// The answer to the first attempt, late, from the holder of the
			// second: ignored and logged.
			answer(t, w, first, "ack")
			if !r.b.Log.Contains("queue answer ignored") {
				t.Fatalf("the holder's answer to its superseded delivery was not ignored:\n%s", r.b.Log.Tail(20))
			}
			// The second lease is intact: it runs out and the job comes back.
			r.clk.Advance(31 * time.Second)
			third := r.next(w)
			if third.Properties.User.Get("saguin-attempt") != "3" || string(third.Payload) != "the job" {
				t.Fatalf("after the second lease ran out: attempt %s payload %q", third.Properties.User.Get("saguin-attempt"), third.Payload)
			}

			// The current attempt's own ack resolves the job: nothing comes
			// back, however long the clock runs.
			answer(t, w, third, "ack")
			r.clk.Advance(time.Minute)
			r.quiet(w, 5)
			w.Close()
			checkJobResolved(t, r, pub)
		})
	}
}

// checkJobResolved publishes a second job and asserts it is the next thing a
// fresh worker, the queue's only one, is handed, at attempt 1: the first
// one is gone.
func checkJobResolved(t *testing.T, r *queueRig, pub *brokertest.Client) {
	t.Helper()
	r.publish(pub, "jobs/x", "the next job")
	fresh := worker(t, r, "fresh", brokertest.ClientOptions{CleanStart: true})
	p := r.next(fresh)
	if string(p.Payload) != "the next job" || p.Properties.User.Get("saguin-attempt") != "1" {
		t.Fatalf("a fresh worker was handed %q attempt %s, want the next job: the acknowledged one is still queued",
			p.Payload, p.Properties.User.Get("saguin-attempt"))
	}
}
