package broker_test

import (
	"path/filepath"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
)

// Invariant 10: the broker is the only enforcement point. A stock client —
// no SDK, no convention — that forges Sagüin's own metadata gets nothing
// past the broker: every saguin-* property but saguin-id is dropped before
// the record is stored, and the reserved topics refuse it.
func TestInvariant10_ForgedReservedPropertiesNeverReachAConsumer(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	forger := brokertest.Connect(t, r.b.Address(), "forger", brokertest.ClientOptions{CleanStart: true})
	forged := paho.UserProperties{
		{Key: "saguin-offset", Value: "999"},
		{Key: "saguin-dlq-reason", Value: "attempts_exhausted"},
		{Key: "saguin-dlq-channel", Value: "jobs"},
		{Key: "saguin-attempt", Value: "7"},
		{Key: "saguin-channel", Value: "elsewhere"},
		{Key: "saguin-timestamp", Value: "1"},
		{Key: "app", Value: "kept"},
	}
	for _, topic := range []string{"events/x", "jobs/x", "plain/x"} {
		resp, err := forger.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte("p"),
			Properties: &paho.PublishProperties{User: forged}})
		if err != nil || resp.ReasonCode != 0 {
			t.Fatalf("publish %s: %v %+v", topic, err, resp)
		}
	}
	check := func(where string, u paho.UserProperties) {
		t.Helper()
		if u.Get("app") != "kept" {
			t.Errorf("%s: the publisher's own property was not kept: %v", where, u)
		}
		for _, k := range []string{"saguin-dlq-reason", "saguin-dlq-channel", "saguin-channel"} {
			if u.Get(k) != "" {
				t.Errorf("%s: forged %s reached the consumer: %v", where, k, u)
			}
		}
		for k, v := range map[string]string{"saguin-offset": "999", "saguin-attempt": "7", "saguin-timestamp": "1"} {
			for _, got := range u.GetAll(k) {
				if got == v {
					t.Errorf("%s: forged %s=%s reached the consumer: %v", where, k, v, u)
				}
			}
		}
	}
	reader := brokertest.Connect(t, r.b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	check("append replay", r.next(reader).Properties.User)
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	check("queue delivery", r.next(w).Properties.User)

	// Publishing into the dead-letter channel, or to a subscribe-only
	// reserved topic, is refused: the only writer of a dead letter is the
	// broker's own move.
	for topic, code := range map[string]byte{"jobs/__dlq/x": 0x87, "$saguin/queue/jobs": 0x90, "$saguin/anything": 0x90} {
		resp, _ := forger.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
		if resp == nil || resp.ReasonCode != code {
			t.Errorf("publish %s: %+v, want reason 0x%02x", topic, resp, code)
		}
	}
}

// The configuration `make run` ships loads and serves (on a port and in a
// folder of the test's own).
func TestExampleConfigurationStarts(t *testing.T) {
	// Its doors and its data move to the test's own port and folder: the
	// shipped file names the data make run keeps, which a test must never
	// write (ShippedExample fails when it cannot move them).
	path := brokertest.ShippedExample(t, filepath.Join("..", "examples", "saguin.yaml"), t.TempDir())
	if _, err := config.Load(path); err != nil {
		t.Fatalf("examples/saguin.yaml: %v", err)
	}
	b := brokertest.Start(t, path)
	c := brokertest.Connect(t, b.Address(), "smoke", brokertest.ClientOptions{CleanStart: true})
	resp, err := c.Publish(&paho.Publish{Topic: "events/smoke", QoS: 1, Payload: []byte("ok")})
	if err != nil || resp.ReasonCode != 0 {
		t.Fatalf("publish on the example configuration: %v %+v", err, resp)
	}
}
