package broker_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

const retainedConfig = `
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
      small:
        type: memory
        snapshot_dir: none
        max_bytes: 14KiB
  retained:
    storage: {{.Store}}
channels:
  events:
    type: append
    filter: "events/#"
`

func retainedRig(t *testing.T, store string) (*brokertest.Broker, *clock.Fake) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	cfg := brokertest.Config(t, t.TempDir(), replaceStore(retainedConfig, store))
	return brokertest.Start(t, cfg, brokertest.WithClock(clk)), clk
}

func replaceStore(tmpl, store string) string {
	return string(bytes.ReplaceAll([]byte(tmpl), []byte("{{.Store}}"), []byte(store)))
}

func retainPublish(t *testing.T, c *brokertest.Client, topic string, payload []byte, expiry uint32) byte {
	t.Helper()
	p := &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: payload, Properties: &paho.PublishProperties{}}
	if expiry > 0 {
		p.Properties.MessageExpiry = &expiry
	}
	resp, err := c.Publish(p)
	if err != nil && resp == nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
	return resp.ReasonCode
}

// The retained store lives on a provider: a retained value survives a
// restart as that provider promises (sqlite here), is served with RETAIN set
// to a new subscriber, and an empty retained publish removes it.
func TestRetainedValuesSurviveRestartOnTheirProvider(t *testing.T) {
	b, _ := retainedRig(t, "main")
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "status/pump-1", []byte("on"), 0); code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	if code := retainPublish(t, pub, "status/pump-2", []byte("off"), 0); code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	if code := retainPublish(t, pub, "status/pump-2", nil, 0); code != 0 {
		t.Fatalf("retained delete: 0x%02x", code)
	}
	b.Restart()

	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("status/#", 1)
	p := sub.Next(wait)
	if p.Topic != "status/pump-1" || string(p.Payload) != "on" || !p.Retain {
		t.Fatalf("retained pass: %s %q retain=%v", p.Topic, p.Payload, p.Retain)
	}
	sub.Quiet(200 * time.Millisecond) // pump-2 was removed
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})

	// Live traffic to an existing subscriber is not flagged (no Retain As
	// Published asked).
	if code := retainPublish(t, pub, "status/pump-1", []byte("off"), 0); code != 0 {
		t.Fatal(code)
	}
	if p := sub.Next(wait); p.Retain || string(p.Payload) != "off" {
		t.Fatalf("live delivery: retain=%v %q", p.Retain, p.Payload)
	}

	// Retain Handling 2 sends no retained values; $share never gets them.
	rh := brokertest.Connect(t, b.Address(), "rh", brokertest.ClientOptions{CleanStart: true})
	if sa, _ := rh.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "status/#", QoS: 1, RetainHandling: 2}, {Topic: "$share/g/status/#", QoS: 1}}}); sa.Reasons[0] != 1 || sa.Reasons[1] != 1 {
		t.Fatalf("suback %v", sa.Reasons)
	}
	rh.Quiet(200 * time.Millisecond)
}

// invariant 13: the retained store is bounded by its provider's max_bytes;
// past it a retained publish is refused 0x97, never stored and dropped, and
// replacing a value with a smaller one or removing it is still allowed.
func TestInvariant13_RetainedStoreBoundedByItsProvider(t *testing.T) {
	b, _ := retainedRig(t, "small")
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	value := bytes.Repeat([]byte("x"), 1000)
	stored := 0
	var code byte
	for i := 0; i < 50; i++ {
		if code = retainPublish(t, pub, "big/"+string(rune('a'+i%26))+string(rune('a'+i/26)), value, 0); code != 0 {
			break
		}
		stored++
	}
	if code != 0x97 {
		t.Fatalf("retained store never refused: stored %d values of 1000 bytes on a 14KiB provider", stored)
	}
	if stored == 0 || stored > 14 {
		t.Fatalf("stored %d values of 1000 bytes before the bound", stored)
	}
	if code := retainPublish(t, pub, "big/aa", []byte("small"), 0); code != 0 {
		t.Fatalf("replacing a value with a smaller one was refused: 0x%02x", code)
	}
	if code := retainPublish(t, pub, "big/ba", nil, 0); code != 0 {
		t.Fatalf("removing a value was refused: 0x%02x", code)
	}
}

// A retained value's own Message Expiry discards it (MQTT-3.3.2-5); a late
// subscriber is served the remaining countdown.
func TestRetainedValueExpiryCountsDown(t *testing.T) {
	b, clk := retainedRig(t, "main")
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "status/door", []byte("open"), 10); code != 0 {
		t.Fatal(code)
	}
	clk.Advance(4 * time.Second)
	s1 := brokertest.Connect(t, b.Address(), "s1", brokertest.ClientOptions{CleanStart: true})
	s1.Subscribe("status/#", 1)
	p := s1.Next(wait)
	if p.Properties.MessageExpiry == nil || *p.Properties.MessageExpiry > 6 || *p.Properties.MessageExpiry == 0 {
		t.Fatalf("late subscriber's expiry: %v, want the remaining 6s", p.Properties.MessageExpiry)
	}
	clk.Advance(7 * time.Second)
	s2 := brokertest.Connect(t, b.Address(), "s2", brokertest.ClientOptions{CleanStart: true})
	s2.Subscribe("status/#", 1)
	s2.Quiet(200 * time.Millisecond)
}
