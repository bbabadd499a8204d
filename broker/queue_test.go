package broker_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

const queueConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
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
    retry:
      max_attempts: 3
  events:
    type: append
    filter: "events/#"
`

// queueRig is a broker on a fake clock with helpers to drive time.
type queueRig struct {
	t   *testing.T
	b   *brokertest.Broker
	clk *clock.Fake
}

func newQueueRig(t *testing.T, cfg string) *queueRig {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	path := brokertest.Config(t, t.TempDir(), cfg)
	return &queueRig{t: t, b: brokertest.Start(t, path, brokertest.WithClock(clk)), clk: clk}
}

// tick moves the clock one offer tick (200ms).
func (r *queueRig) tick() { r.clk.Advance(200 * time.Millisecond) }

// next waits for c's next message, ticking the broker's clock meanwhile so
// the offer loop runs.
func (r *queueRig) next(c *brokertest.Client) *paho.Publish {
	r.t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case p := <-c.Msgs:
			return p
		case <-time.After(20 * time.Millisecond):
			r.tick()
		}
	}
	r.t.Fatalf("no message within %s", wait)
	return nil
}

// nextOf waits for the next message any of cs receives.
func (r *queueRig) nextOf(cs ...*brokertest.Client) *paho.Publish {
	r.t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			select {
			case p := <-c.Msgs:
				return p
			default:
			}
		}
		time.Sleep(20 * time.Millisecond)
		r.tick()
	}
	r.t.Fatalf("no message within %s", wait)
	return nil
}

// quiet ticks the clock n times and asserts c received nothing.
func (r *queueRig) quiet(c *brokertest.Client, ticks int) {
	r.t.Helper()
	for i := 0; i < ticks; i++ {
		r.tick()
		select {
		case p := <-c.Msgs:
			r.t.Fatalf("unexpected message on %s: %q attempt %s", p.Topic, p.Payload, p.Properties.User.Get("saguin-attempt"))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (r *queueRig) publish(c *brokertest.Client, topic, payload string) {
	r.t.Helper()
	resp, err := c.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "origin", Value: "test"}}}})
	if err != nil || resp.ReasonCode != 0 {
		r.t.Fatalf("publish %s: %v %+v", topic, err, resp)
	}
}

// answer publishes ack or return for a delivery, echoing its Correlation
// Data to its Response Topic: the whole protocol, with a stock client.
func answer(t *testing.T, c *brokertest.Client, job *paho.Publish, verdict string) {
	t.Helper()
	resp, err := c.Publish(&paho.Publish{Topic: job.Properties.ResponseTopic, QoS: 1, Payload: []byte(verdict),
		Properties: &paho.PublishProperties{CorrelationData: job.Properties.CorrelationData}})
	if err != nil || resp.ReasonCode != 0 {
		t.Fatalf("answer %s: %v %+v", verdict, err, resp)
	}
}

func worker(t *testing.T, r *queueRig, id string, o brokertest.ClientOptions) *brokertest.Client {
	t.Helper()
	c := brokertest.Connect(t, r.b.Address(), id, o)
	sa := c.Subscribe("$saguin/queue/jobs", 1)
	if sa.Reasons[0] != 1 {
		t.Fatalf("queue subscription granted 0x%02x", sa.Reasons[0])
	}
	return c
}

// The v0.1 acceptance criterion, second half: a stock MQTT 5 client with no
// Sagüin software drives publish, consume, acknowledge, time out, redeliver,
// exhaust attempts, and reads the result out of the dead-letter channel.
func TestQueueFullCycleWithStockClient(t *testing.T) {
	queueFullCycle(t, newQueueRig(t, queueConfig))
}

func queueFullCycle(t *testing.T, r *queueRig) {
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	w := worker(t, r, "worker-1", brokertest.ClientOptions{CleanStart: true})

	// ack resolves.
	r.publish(pub, "jobs/resize/1", "job-1")
	job := r.next(w)
	u := job.Properties.User
	if job.Topic != "jobs/resize/1" || string(job.Payload) != "job-1" || u.Get("origin") != "test" {
		t.Fatalf("delivery is not the publisher's message unchanged: %s %q %v", job.Topic, job.Payload, u)
	}
	if job.Properties.ResponseTopic != "$saguin/queue/jobs/response" || len(job.Properties.CorrelationData) == 0 ||
		len(job.Properties.CorrelationData) > 32 {
		t.Fatalf("response topic %q, correlation data %d bytes", job.Properties.ResponseTopic, len(job.Properties.CorrelationData))
	}
	if u.Get("saguin-attempt") != "1" || u.Get("saguin-offset") != "1" || u.Get("saguin-id") == "" || u.Get("saguin-timestamp") == "" {
		t.Fatalf("delivery headers: %v", u)
	}
	answer(t, w, job, "ack")
	r.clk.Advance(time.Minute) // far past the visibility timeout: nothing comes back
	r.quiet(w, 5)

	// return, timeout, return: three attempts, then dead-lettered.
	r.publish(pub, "jobs/resize/2", "job-2")
	job = r.next(w)
	id := job.Properties.User.Get("saguin-id")
	answer(t, w, job, "return")
	job2 := r.next(w)
	if job2.Properties.User.Get("saguin-attempt") != "2" || string(job2.Payload) != "job-2" {
		t.Fatalf("after return: attempt %s payload %q", job2.Properties.User.Get("saguin-attempt"), job2.Payload)
	}
	if string(job2.Properties.CorrelationData) == string(job.Properties.CorrelationData) {
		t.Fatal("a redelivery reused the Delivery ID")
	}
	// No answer: the visibility timeout (30s from the PUBACK) takes it back.
	r.quiet(w, 3)
	r.clk.Advance(31 * time.Second)
	job3 := r.next(w)
	if job3.Properties.User.Get("saguin-attempt") != "3" {
		t.Fatalf("after timeout: attempt %s", job3.Properties.User.Get("saguin-attempt"))
	}
	answer(t, w, job3, "return")

	// Attempts exhausted: read the dead letter with a stock subscriber.
	dl := brokertest.Connect(t, r.b.Address(), "ops", brokertest.ClientOptions{CleanStart: true})
	dl.Subscribe("jobs/__dlq/#", 1)
	d := r.next(dl)
	du := d.Properties.User
	if d.Topic != "jobs/__dlq/resize/2" || string(d.Payload) != "job-2" {
		t.Fatalf("dead letter %s %q", d.Topic, d.Payload)
	}
	want := map[string]string{"saguin-id": id, "saguin-dlq-channel": "jobs", "saguin-dlq-offset": "2",
		"saguin-dlq-attempts": "3", "saguin-dlq-reason": "attempts_exhausted", "origin": "test"}
	for k, v := range want {
		if du.Get(k) != v {
			t.Errorf("dead letter %s = %q, want %q (all: %v)", k, du.Get(k), v, du)
		}
	}
	for _, k := range []string{"saguin-dlq-first", "saguin-dlq-last", "saguin-dlq-at"} {
		if du.Get(k) == "" {
			t.Errorf("dead letter lacks %s", k)
		}
	}
	r.quiet(w, 3)
}

// mosquitto_pub publishes the job; a paho.golang worker consumes it.
func TestQueueJobFromMosquittoPub(t *testing.T) {
	if _, err := exec.LookPath("mosquitto_pub"); err != nil {
		t.Fatal("mosquitto_pub is not installed (Debian package mosquitto-clients; .ci/run installs it)")
	}
	r := newQueueRig(t, queueConfig)
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	host, port, _ := strings.Cut(r.b.Address(), ":")
	out, err := exec.Command("mosquitto_pub", "-h", host, "-p", port, "-V", "5", "-q", "1",
		"-t", "jobs/email/7", "-m", "send it").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub: %v\n%s", err, out)
	}
	job := r.next(w)
	if job.Topic != "jobs/email/7" || string(job.Payload) != "send it" {
		t.Fatalf("job %s %q", job.Topic, job.Payload)
	}
	answer(t, w, job, "ack")
	r.clk.Advance(time.Minute)
	r.quiet(w, 3)
}

// Invariant 3: a late ack carrying a superseded Delivery ID, after the job
// went to a second worker, changes nothing.
func TestInvariant03_LateAckWithSupersededDeliveryIDChangesNothing(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	a := worker(t, r, "worker-a", brokertest.ClientOptions{CleanStart: true})
	r.publish(pub, "jobs/x", "the job")
	jobA := r.next(a)

	// A stalls past its visibility timeout; the job goes to B.
	b := worker(t, r, "worker-b", brokertest.ClientOptions{CleanStart: true})
	r.clk.Advance(31 * time.Second)
	var jobB *paho.Publish
	select {
	case jobB = <-b.Msgs:
	default:
		jobB = r.next(b)
	}
	if jobB.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("B's attempt %s", jobB.Properties.User.Get("saguin-attempt"))
	}
	// A acknowledges late with its old Delivery ID, twice (a retry).
	answer(t, a, jobA, "ack")
	answer(t, a, jobA, "ack")
	if !r.b.Log.Contains("queue answer ignored") {
		t.Fatal("the superseded answer was not logged")
	}
	// B's lease is intact: if A's ack had resolved the job, B's timeout
	// would bring nothing back. It comes back as attempt 3.
	r.clk.Advance(31 * time.Second)
	var again *paho.Publish
	for again == nil {
		select {
		case again = <-a.Msgs:
		case again = <-b.Msgs:
		case <-time.After(20 * time.Millisecond):
			r.tick()
		}
	}
	if again.Properties.User.Get("saguin-attempt") != "3" || string(again.Payload) != "the job" {
		t.Fatalf("after B's timeout: attempt %s payload %q", again.Properties.User.Get("saguin-attempt"), again.Payload)
	}
}

// Invariant 11: SUBSCRIBE # (and a filter crossing the queue) never
// receives a queue record, while still receiving everything else it matches.
func TestInvariant11_WildcardNeverReachesAQueue(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	spy := brokertest.Connect(t, r.b.Address(), "spy", brokertest.ClientOptions{CleanStart: true})
	for _, f := range []string{"#", "+/x"} {
		sa, _ := spy.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f, QoS: 1}}})
		if sa.Reasons[0] != 1 {
			t.Fatalf("subscribe %s: 0x%02x", f, sa.Reasons[0])
		}
	}
	r.publish(pub, "jobs/x", "a job")
	r.publish(pub, "events/x", "an event")
	r.publish(pub, "plain/x", "a broadcast")
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		p := r.next(spy)
		got[p.Topic] = true
	}
	if !got["events/x"] || !got["plain/x"] {
		t.Fatalf("# was not served the append record and the broadcast: %v", got)
	}
	r.quiet(spy, 5)
	// The job is still there for a worker.
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	if p := r.next(w); string(p.Payload) != "a job" {
		t.Fatalf("worker got %q", p.Payload)
	}
}

// Every refused queue subscription form gets its code (docs/channels.md "The `$saguin/` topics").
func TestQueueSubscriptionForms(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	c := brokertest.Connect(t, r.b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	cases := []struct {
		opt  paho.SubscribeOptions
		want byte
	}{
		{paho.SubscribeOptions{Topic: "$saguin/queue/jobs", QoS: 2}, 1},
		{paho.SubscribeOptions{Topic: "$saguin/queue/jobs", QoS: 0}, 0x83},
		{paho.SubscribeOptions{Topic: "$saguin/queue/jobs", QoS: 1, NoLocal: true}, 0x8F},
		{paho.SubscribeOptions{Topic: "$saguin/queue/jobs/#", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "$saguin/queue/#", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "$saguin/queue/events", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "$saguin/queue/jobs__dlq", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "jobs/#", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "jobs/a/b", QoS: 1}, 0x8F},
		{paho.SubscribeOptions{Topic: "$saguin/kv/get", QoS: 1}, 0x87},
		{paho.SubscribeOptions{Topic: "$share/g/$saguin/queue/jobs", QoS: 1}, 0x87},
	}
	for _, tc := range cases {
		sa, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{tc.opt}})
		if err != nil || sa == nil {
			t.Fatalf("subscribe %s: %v", tc.opt.Topic, err)
		}
		if sa.Reasons[0] != tc.want {
			t.Errorf("subscribe %s (qos %d, no local %v): 0x%02x, want 0x%02x", tc.opt.Topic, tc.opt.QoS, tc.opt.NoLocal, sa.Reasons[0], tc.want)
		}
	}
}

// Invariant 7: the visibility deadline starts at the PUBACK. A worker that
// has not acknowledged the packet keeps the job however long the clock
// runs; when its connection ends without a PUBACK, the job goes back with
// its attempt unspent.
func TestInvariant07_DeadlineStartsAtPubackNotAtSend(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	slow := worker(t, r, "slow", brokertest.ClientOptions{CleanStart: true, ManualAck: true})
	r.publish(pub, "jobs/x", "held")
	job := r.next(slow)
	if job.Properties.User.Get("saguin-attempt") != "1" {
		t.Fatal("first attempt expected")
	}
	other := worker(t, r, "other", brokertest.ClientOptions{CleanStart: true})
	r.clk.Advance(10 * time.Minute) // twenty visibility timeouts, no PUBACK
	r.quiet(other, 5)

	slow.Close() // leaves without ever acknowledging the packet
	again := r.next(other)
	if again.Properties.User.Get("saguin-attempt") != "1" {
		t.Fatalf("a job whose delivery was never acknowledged spent an attempt: %s", again.Properties.User.Get("saguin-attempt"))
	}
}

// Invariant 6: PUBACK is not application acknowledgement. A worker whose
// library acknowledged the packet and which then crashed has not resolved
// the job.
func TestInvariant06_PubackIsNotAcknowledgement(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	crash := worker(t, r, "crash", brokertest.ClientOptions{CleanStart: true})
	r.publish(pub, "jobs/x", "work")
	r.next(crash) // paho acknowledges the packet on receipt
	time.Sleep(50 * time.Millisecond)
	crash.Close()
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	p := r.next(w)
	if string(p.Payload) != "work" || p.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("redelivery %q attempt %s", p.Payload, p.Properties.User.Get("saguin-attempt"))
	}
}

// Invariant 2: a publisher's Message Expiry never removes a job; it arrives
// as saguin-expires and the worker decides.
func TestInvariant02_MessageExpiryNeverRemovesAJob(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	exp := uint32(5)
	resp, err := pub.Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("stale"),
		Properties: &paho.PublishProperties{MessageExpiry: &exp}})
	if err != nil || resp.ReasonCode != 0 {
		t.Fatal(err, resp)
	}
	r.clk.Advance(time.Hour)
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	p := r.next(w)
	if string(p.Payload) != "stale" || p.Properties.User.Get("saguin-expires") == "" {
		t.Fatalf("expired job: %q saguin-expires=%q", p.Payload, p.Properties.User.Get("saguin-expires"))
	}
	if p.Properties.MessageExpiry != nil && *p.Properties.MessageExpiry != 0 {
		t.Fatalf("run-out expiry delivered as %d", *p.Properties.MessageExpiry)
	}
}

// Invariant 15 (queue half): after a restart nothing is in flight; the job
// a worker held is available at once with its attempt count, and the old
// Delivery ID resolves nothing.
func TestInvariant15_RestartResurrectsNoLease(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 3600})
	r.publish(pub, "jobs/x", "survives")
	before := r.next(w)
	time.Sleep(50 * time.Millisecond) // the PUBACK reaches the broker: attempt 1 counted
	r.b.Restart()

	w2 := worker(t, r, "w2", brokertest.ClientOptions{CleanStart: true})
	after := r.next(w2)
	if after.Properties.User.Get("saguin-attempt") != "2" {
		t.Fatalf("after restart: attempt %s, want 2 (attempt counts survive)", after.Properties.User.Get("saguin-attempt"))
	}
	// The pre-restart Delivery ID, answered on a new connection, is dead.
	// The session came back with its queue subscription (Session Present
	// 1), so w is a worker again and the next attempt may go to either.
	w = brokertest.Connect(t, r.b.Address(), "w", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 3600})
	if !w.Connack.SessionPresent {
		t.Fatal("the durable worker session did not survive the restart")
	}
	answer(t, w, before, "ack")
	r.clk.Advance(31 * time.Second)
	again := r.nextOf(w, w2)
	if again.Properties.User.Get("saguin-attempt") != "3" {
		t.Fatalf("the old Delivery ID resolved the job: next attempt %s", again.Properties.User.Get("saguin-attempt"))
	}
	_ = fmt.Sprint()
}
