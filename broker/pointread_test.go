package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// pointRead asks $saguin/kv/get for key with Correlation Data corr (none
// when empty) and returns the answer and the PUBACK reason code. It fails
// the test if a refused read is answered.
func pointRead(t *testing.T, c *brokertest.Client, key, corr string) (*paho.Publish, byte) {
	t.Helper()
	props := &paho.PublishProperties{ResponseTopic: "answers/" + c.ClientID()}
	if corr != "" {
		props.CorrelationData = []byte(corr)
	}
	r, err := c.Publish(&paho.Publish{Topic: "$saguin/kv/get", QoS: 1, Payload: []byte(key), Properties: props})
	if err != nil && r == nil {
		t.Fatalf("point read %q: %v", key, err)
	}
	if r.ReasonCode != 0 {
		c.Quiet(100 * time.Millisecond) // refusals are never answered on the Response Topic
		return nil, r.ReasonCode
	}
	for {
		p := c.Next(wait)
		if p.Topic == props.ResponseTopic {
			return p, 0
		}
	}
}

// A point read answers the asking session alone, on its Response Topic,
// with the value as payload and the caller's Correlation Data (else the
// key). It is not published: a third party subscribed to that topic sees
// nothing. It never subscribes the caller: a later change is not sent.
func TestPointReadAnswersOnlyTheAsker(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	setWith(t, pub, &paho.Publish{Topic: "state/cfg/unit-1", QoS: 1, Payload: []byte(`{"rate":5}`),
		Properties: &paho.PublishProperties{ContentType: "application/json"}})
	spy := brokertest.Connect(t, b.Address(), "spy", brokertest.ClientOptions{CleanStart: true})
	spy.Subscribe("answers/#", 1)

	asker := brokertest.Connect(t, b.Address(), "asker", brokertest.ClientOptions{CleanStart: true})
	got, code := pointRead(t, asker, "state/cfg/unit-1", "q-1")
	if code != 0 || string(got.Payload) != `{"rate":5}` || string(got.Properties.CorrelationData) != "q-1" {
		t.Fatalf("answer %q corr %q code 0x%02x", got.Payload, got.Properties.CorrelationData, code)
	}
	if got.Properties.ContentType != "application/json" || got.Properties.User.Get("saguin-offset") != "1" || got.Retain {
		t.Fatalf("answer properties: content type %q, labels %v, retain %v", got.Properties.ContentType, got.Properties.User, got.Retain)
	}
	got, _ = pointRead(t, asker, "state/cfg/unit-1", "")
	if string(got.Properties.CorrelationData) != "state/cfg/unit-1" {
		t.Fatalf("without Correlation Data the answer carries %q; want the key", got.Properties.CorrelationData)
	}
	set(t, pub, "state/cfg/unit-1", `{"rate":6}`)
	asker.Quiet(300 * time.Millisecond)
	spy.Quiet(100 * time.Millisecond)
}

// No value and a deletion answer alike: an empty payload, with nothing
// that tells a tombstone from a key never set.
func TestPointReadEmptyForNoValueAndForADeletion(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/was", "here")
	set(t, pub, "state/was", "")
	asker := brokertest.Connect(t, b.Address(), "asker", brokertest.ClientOptions{CleanStart: true})
	never, code := pointRead(t, asker, "state/never", "a")
	if code != 0 || len(never.Payload) != 0 {
		t.Fatalf("never set: %q code 0x%02x", never.Payload, code)
	}
	deleted, code := pointRead(t, asker, "state/was", "b")
	if code != 0 || len(deleted.Payload) != 0 {
		t.Fatalf("deleted: %q code 0x%02x", deleted.Payload, code)
	}
	if len(deleted.Properties.User) != 0 || len(never.Properties.User) != 0 || deleted.Properties.ContentType != "" {
		t.Fatalf("empty answers differ: deleted %v, never %v", deleted.Properties.User, never.Properties.User)
	}
}

// Every refusal of the point-read table, on the PUBACK with its code and
// never on the Response Topic: 0x83 when the read cannot be acted on, 0x90
// when the key is not a topic this broker has a value for. A QoS 0 read is
// dropped: no PUBACK, no answer.
func TestPointReadRefusals(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "events/x", "e")
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	cases := []struct {
		what, key string
		code      byte
		reason    []string // the Reason String names these
	}{
		{"a broadcast topic", "news/x", 0x90, []string{"broadcast"}},
		{"an append channel's topic", "events/x", 0x90, []string{"events", "append"}},
		{"a queue's topic", "jobs/x", 0x90, []string{"jobs", "queue"}},
		{"a dead-letter channel's topic", "jobs/__dlq/x", 0x90, []string{"jobs__dlq", "append"}},
		{"a single-level wildcard", "state/+", 0x90, []string{"wildcard"}},
		{"a multi-level wildcard", "state/#", 0x90, []string{"wildcard"}},
		{"the $SYS space", "$SYS/broker/uptime", 0x90, []string{"reserved"}},
		{"the $saguin space", "$saguin/kv/get", 0x90, []string{"reserved"}},
		{"an empty key", "", 0x83, []string{"empty"}},
		{"a key over max_topic_length", "state/" + strings.Repeat("k", 60), 0x90, []string{"max_topic_length"}},
		{"a key over max_topic_levels", "state/a/b/c/d", 0x90, []string{"max_topic_levels"}},
	}
	for _, tc := range cases {
		_, code := pointRead(t, c, tc.key, "x")
		if code != tc.code {
			t.Errorf("%s (%q): PUBACK 0x%02x, want 0x%02x", tc.what, tc.key, code, tc.code)
		}
	}
	// The Reason String says which rule, to a client that did not turn
	// problem information off (a packet-level client: brokertest's paho
	// client asks for none).
	raw := dialRawMQTT(t, b.Address(), "raw")
	for i, tc := range cases {
		ack := raw.publish(uint16(i+1), "$saguin/kv/get", []byte(tc.key), packets.Properties{ResponseTopic: "answers/raw"})
		if ack.ReasonCode != tc.code {
			t.Errorf("%s: raw PUBACK 0x%02x, want 0x%02x", tc.what, ack.ReasonCode, tc.code)
		}
		for _, w := range tc.reason {
			if !strings.Contains(ack.Properties.ReasonString, w) {
				t.Errorf("%s: reason %q does not name %q", tc.what, ack.Properties.ReasonString, w)
			}
		}
	}

	r, err := c.Publish(&paho.Publish{Topic: "$saguin/kv/get", QoS: 1, Payload: []byte("state/x")})
	if err != nil && r == nil {
		t.Fatal(err)
	}
	if r.ReasonCode != 0x83 {
		t.Fatalf("no Response Topic: PUBACK 0x%02x, want 0x83", r.ReasonCode)
	}
	if _, err := c.Publish(&paho.Publish{Topic: "$saguin/kv/get", QoS: 0, Payload: []byte("state/x"),
		Properties: &paho.PublishProperties{ResponseTopic: "answers/c"}}); err != nil {
		t.Fatal(err)
	}
	c.Quiet(300 * time.Millisecond) // a QoS 0 read is dropped
	// The connection stands after every refusal.
	if got, code := pointRead(t, c, "state/x", "ok"); code != 0 || len(got.Payload) != 0 {
		t.Fatalf("read after the refusals: %q 0x%02x", got.Payload, code)
	}
}
