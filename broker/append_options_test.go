package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

const optionsConfig = `
broker:
  id: test
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
  events:
    type: append
    filter: "events/#"
  news:
    type: append
    filter: "news/#"
    start: tail
  logs:
    type: append
    filter: "logs/#"
    retention_bytes: 200
  alerts:
    type: append
    filter: "events/alerts/#"
`

func optionsRig(t *testing.T) (*brokertest.Broker, *clock.Fake, *brokertest.Client) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), optionsConfig), brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	return b, clk, pub
}

func pub1(t *testing.T, c *brokertest.Client, topic, payload string) {
	t.Helper()
	if r, err := c.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("publish %s: %v %+v", topic, err, r)
	}
}

// start: tail — a reader with no position begins at the head; floor (the
// default) replays everything held.
func TestStartTailReadsOnlyNewRecords(t *testing.T) {
	b, _, pub := optionsRig(t)
	pub1(t, pub, "news/a", "old")
	pub1(t, pub, "events/a", "old")
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("news/#", 1)
	c.Subscribe("events/#", 1)
	if p := c.Next(wait); p.Topic != "events/a" {
		t.Fatalf("start: floor did not replay: %s %q", p.Topic, p.Payload)
	}
	c.Quiet(100 * time.Millisecond)
	pub1(t, pub, "news/a", "new")
	if p := c.Next(wait); string(p.Payload) != "new" {
		t.Fatalf("start: tail served %q", p.Payload)
	}
}

// Retain Handling 2 on a durable consumer with a stored position commits
// the position at the head: the backlog is dropped (docs/channels.md "`append`"). The
// consumer here holds a stored position and no running subscription: it
// subscribed to another filter reaching the channel, then unsubscribed.
func TestRetainHandling2CommitsTheHead(t *testing.T) {
	b, _, pub := optionsRig(t)
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	c.Subscribe("events/a", 1)
	pub1(t, pub, "events/a", "1")
	c.Next(wait)
	if _, err := c.Unsubscribe(context.Background(), &paho.Unsubscribe{Topics: []string{"events/a"}}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	pub1(t, pub, "events/a", "2")
	pub1(t, pub, "events/a", "3")
	b.Restart()
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})

	c = brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{SessionExpiry: 600})
	if !c.Connack.SessionPresent {
		t.Fatal("the durable session did not survive the restart")
	}
	if sa, _ := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "events/#", QoS: 1, RetainHandling: 2}}}); sa.Reasons[0] != 1 {
		t.Fatalf("suback %v", sa.Reasons)
	}
	c.Quiet(150 * time.Millisecond)
	pub1(t, pub, "events/a", "4")
	if p := c.Next(wait); string(p.Payload) != "4" {
		t.Fatalf("after RH 2: %q", p.Payload)
	}
	c.Close()
	c = brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{SessionExpiry: 600})
	c.Subscribe("events/#", 1)
	c.Quiet(150 * time.Millisecond) // position was stored at the head, then past 4
}

// retention_bytes is enforced by the size sweep, behind the producer, and
// the floor moves with what it removes (invariant 1).
func TestSizeRetentionRemovesOldestAndMovesTheFloor(t *testing.T) {
	b, clk, pub := optionsRig(t)
	for i := 1; i <= 10; i++ {
		pub1(t, pub, "logs/x", fmt.Sprintf("%020d", i)) // 65 bytes a record (payload, topic, id, publisher): 200 keep 3
	}
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 60})
	deadline := time.Now().Add(wait)
	for {
		clk.Advance(time.Second) // the size sweep's tick
		got, _, _ := seekReply(t, c, "logs", "0")
		if got != "1" {
			if got != "8" {
				t.Fatalf("after the size sweep the floor is %s, want 8", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the size sweep never ran")
		}
	}
	c.Subscribe("logs/#", 1)
	if p := c.Next(wait); p.Properties.User.Get("saguin-offset") != "8" {
		t.Fatalf("first record after the sweep: offset %s", p.Properties.User.Get("saguin-offset"))
	}
}

// One filter reaching two channels gets each record once, labelled with
// saguin-channel; a record matched by two of a session's subscriptions is
// delivered once (docs/channels.md "What a publish is answered", docs/configuration.md "`channels`").
func TestOneCopyPerRecordAndSaguinChannelAcrossChannels(t *testing.T) {
	b, _, pub := optionsRig(t)
	pub1(t, pub, "events/alerts/fire", "a")
	pub1(t, pub, "events/door", "e")
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	sa, err := c.SubscribeWith(&paho.Subscribe{
		Properties:    &paho.SubscribeProperties{SubscriptionIdentifier: intp(7)},
		Subscriptions: []paho.SubscribeOptions{{Topic: "events/#", QoS: 1}, {Topic: "events/+/fire", QoS: 1}}})
	if err != nil || sa.Reasons[0] != 1 || sa.Reasons[1] != 1 {
		t.Fatalf("suback %v %v", sa, err)
	}
	got := map[string]string{}
	for i := 0; i < 2; i++ {
		p := c.Next(wait)
		got[p.Topic] = p.Properties.User.Get("saguin-channel")
		if p.Properties.SubscriptionIdentifier == nil || *p.Properties.SubscriptionIdentifier != 7 {
			t.Errorf("%s: subscription identifier %v", p.Topic, p.Properties.SubscriptionIdentifier)
		}
	}
	c.Quiet(150 * time.Millisecond) // no second copy of events/alerts/fire
	if got["events/alerts/fire"] != "alerts" || got["events/door"] != "events" {
		t.Fatalf("saguin-channel labels: %v", got)
	}
	if !strings.Contains(b.Log.String(), "subscribe") {
		t.Fatal("no subscribe logged")
	}
}

func intp(i int) *int { return &i }
