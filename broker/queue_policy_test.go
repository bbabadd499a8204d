package broker_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

const policyConfig = `
broker:
  id: test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 4KiB
    max_header_bytes: 1KiB
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    job_expires_after: 1h
    max_bytes: 3KiB
    retry:
      max_attempts: 4
      backoff: exponential
      backoff_base: 10s
`

// Backoff: the gap after n attempts is base × 2^(n-1), measured from when
// the worker last had the job; a waiting job is skipped, never waited on.
func TestQueueExponentialBackoffSkipsWaitingJobs(t *testing.T) {
	r := newQueueRig(t, policyConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	r.publish(pub, "jobs/a", "A")
	r.publish(pub, "jobs/b", "B")
	a := r.next(w)
	if string(a.Payload) != "A" {
		t.Fatalf("first job %q", a.Payload)
	}
	answer(t, w, a, "return") // attempt 1 spent: A waits 10s
	b := r.next(w)
	if string(b.Payload) != "B" {
		t.Fatalf("the waiting job was not skipped: got %q", b.Payload)
	}
	answer(t, w, b, "ack")
	r.quiet(w, 40) // 8s of ticks: A is still waiting out its 10s
	r.clk.Advance(2 * time.Second)
	a2 := r.next(w)
	if string(a2.Payload) != "A" || a2.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("after the gap: %q attempt %s", a2.Payload, a2.Properties.User.Get("saguin-attempt"))
	}
	answer(t, w, a2, "return") // attempt 2 spent: A waits 20s
	r.quiet(w, 90)             // 18s
	r.clk.Advance(2 * time.Second)
	if a3 := r.next(w); a3.Properties.User.Get("saguin-attempt") != "3" {
		t.Fatalf("third attempt: %s", a3.Properties.User.Get("saguin-attempt"))
	}
}

// job_expires_after dead-letters a waiting job with reason expired whatever
// its attempt count, by the sweep when no worker exists.
func TestQueueJobExpiresToTheDeadLetterChannel(t *testing.T) {
	r := newQueueRig(t, policyConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	r.publish(pub, "jobs/old", "stale")
	dl := brokertest.Connect(t, r.b.Address(), "ops", brokertest.ClientOptions{CleanStart: true})
	dl.Subscribe("jobs/__dlq/#", 1)
	r.clk.Advance(61 * time.Minute) // past job_expires_after; the age sweep runs on its tick
	d := r.next(dl)
	if d.Topic != "jobs/__dlq/old" || d.Properties.User.Get("saguin-dlq-reason") != "expired" ||
		d.Properties.User.Get("saguin-dlq-attempts") != "0" {
		t.Fatalf("expired job: %s %v", d.Topic, d.Properties.User)
	}
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	r.quiet(w, 5)
}

// A queue's max_bytes is flow control: at the bound a publish gets 0x97,
// and resolution — never refused for capacity — makes room again.
func TestQueueMaxBytesRefusesPublishesAndResolutionMakesRoom(t *testing.T) {
	r := newQueueRig(t, policyConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	payload := bytes.Repeat([]byte("j"), 900)
	accepted := 0
	var refused *paho.PublishResponse
	for i := 0; i < 10; i++ {
		resp, err := pub.Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: payload})
		if err != nil && resp == nil {
			t.Fatal(err)
		}
		if resp.ReasonCode != 0 {
			refused = resp
			break
		}
		accepted++
	}
	if refused == nil || refused.ReasonCode != 0x97 {
		t.Fatalf("a 3KiB queue accepted %d jobs of 900 bytes and never refused with 0x97: %+v", accepted, refused)
	}
	if refused.Properties == nil || !strings.Contains(refused.Properties.ReasonString, "jobs") {
		t.Logf("refusal carries no reason string naming the channel: %+v", refused.Properties)
	}
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	job := r.next(w)
	answer(t, w, job, "ack") // resolution relieves the bound
	deadline := time.Now().Add(wait)
	for {
		resp, err := pub.Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: payload})
		if err == nil && resp.ReasonCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an ack the full queue still refuses: %v %+v", err, resp)
		}
		r.tick()
	}
}
