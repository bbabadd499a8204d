package broker_test

import (
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// willConnect is a CONNECT for id carrying a Will on topic.
func willConnect(id, topic string, delay, sessionExpiry uint32) packets.Packet {
	return packets.Packet{
		Connect: packets.ConnectParams{
			ClientIdentifier: id, Clean: true,
			WillFlag: true, WillTopic: topic, WillPayload: []byte(id + " is gone"), WillQos: 1,
			WillProperties: packets.Properties{
				WillDelayInterval: delay,
				ContentType:       "text/plain",
				CorrelationData:   []byte("corr-" + id),
				ResponseTopic:     "ops/answer",
				User:              []packets.UserProperty{{Key: "site", Val: "north"}, {Key: "saguin-offset", Val: "forged"}},
			},
		},
		Properties: packets.Properties{SessionExpiryInterval: sessionExpiry, SessionExpiryIntervalFlag: sessionExpiry > 0},
	}
}

func willRig(t *testing.T) (*brokertest.Broker, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	return brokertest.Start(t, brokertest.Config(t, t.TempDir(), queueConfig), brokertest.WithClock(clk)), clk
}

// tickUntil advances the fake clock a second at a time until c receives a
// message, or fails after wait.
func tickUntil(t *testing.T, clk *clock.Fake, c *brokertest.Client) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case p := <-c.Msgs:
			c.Msgs <- p
			return
		case <-time.After(20 * time.Millisecond):
			clk.Advance(time.Second)
		}
	}
	t.Fatal("nothing arrived")
}

// A Will goes through the ordinary publish path (rfcs/wills.md): into
// an append channel it is a record with an offset and Message ID, carrying
// the publish properties it was armed with, its forged saguin-* header
// stripped.
func TestWillIsStoredInItsChannelWithItsProperties(t *testing.T) {
	b, _ := willRig(t)
	dev, ack := brokertest.DialConnect(t, b.Address(), willConnect("dev-1", "events/dead", 0, 0))
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	dev.Drop()
	reader := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	p := reader.Next(wait)
	if string(p.Payload) != "dev-1 is gone" || p.Properties.ContentType != "text/plain" ||
		string(p.Properties.CorrelationData) != "corr-dev-1" || p.Properties.ResponseTopic != "ops/answer" {
		t.Fatalf("Will record: %q %+v", p.Payload, p.Properties)
	}
	if p.Properties.User.Get("site") != "north" || p.Properties.User.Get("saguin-offset") != "1" ||
		p.Properties.User.Get("saguin-id") == "" {
		t.Fatalf("Will record headers: %v", p.Properties.User)
	}
}

// A Will into a queue is an ordinary job a worker takes.
func TestWillIntoAQueueIsAJob(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	dev, _ := brokertest.DialConnect(t, r.b.Address(), willConnect("dev-2", "jobs/restart", 0, 0))
	dev.Drop()
	w := worker(t, r, "w", brokertest.ClientOptions{CleanStart: true})
	p := r.next(w)
	if string(p.Payload) != "dev-2 is gone" || p.Properties.User.Get("saguin-attempt") != "1" {
		t.Fatalf("job from a Will: %q attempt %s", p.Payload, p.Properties.User.Get("saguin-attempt"))
	}
}

// DISCONNECT 0x00 discards the Will; 0x04 (Disconnect with Will Message)
// publishes it (MQTT 5 §3.14.2.1). Here on a broadcast topic.
func TestWillDiscardedByNormalDisconnectPublishedByDisconnectWithWill(t *testing.T) {
	b, _ := willRig(t)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)

	quiet, _ := brokertest.DialConnect(t, b.Address(), willConnect("quiet", "status/quiet", 0, 0))
	quiet.Disconnect()
	watch.Quiet(200 * time.Millisecond)

	loud, _ := brokertest.DialConnect(t, b.Address(), willConnect("loud", "status/loud", 0, 0))
	loud.DisconnectWith(0x04)
	p := watch.Next(wait)
	if p.Topic != "status/loud" || string(p.Payload) != "loud is gone" || p.Properties.ContentType != "text/plain" {
		t.Fatalf("Will on broadcast: %s %q %+v", p.Topic, p.Payload, p.Properties)
	}
}

// Will Delay is Sagüin's: the Will waits, is cancelled when the session
// resumes, and is published when the wait ends — capped at the granted
// session expiry.
func TestWillDelayWaitsAndIsCancelledByResume(t *testing.T) {
	b, clk := willRig(t)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)

	dev, _ := brokertest.DialConnect(t, b.Address(), willConnect("flappy", "status/flappy", 10, 600))
	dev.Drop()
	clk.Advance(5 * time.Second)
	watch.Quiet(200 * time.Millisecond)
	back := willConnect("flappy", "status/flappy", 10, 600)
	back.Connect.Clean = false
	dev, ack := brokertest.DialConnect(t, b.Address(), back)
	if !ack.SessionPresent {
		t.Fatal("session not resumed")
	}
	clk.Advance(20 * time.Second)
	watch.Quiet(300 * time.Millisecond) // the waiting Will was cancelled

	// The resumed connection armed its own Will; this time it runs out.
	dev.Drop()
	tickUntil(t, clk, watch)
	if p := watch.Next(wait); p.Topic != "status/flappy" {
		t.Fatalf("published %s", p.Topic)
	}
}

// The wait never outlives the session: a delay longer than the granted
// session expiry is cut to it; a session ending with its connection
// publishes at the disconnect, and says so in the log.
func TestWillDelayCappedBySessionExpiry(t *testing.T) {
	b, clk := willRig(t)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)

	short, _ := brokertest.DialConnect(t, b.Address(), willConnect("short", "status/short", 3600, 0))
	short.Drop()
	if p := watch.Next(wait); p.Topic != "status/short" {
		t.Fatalf("published %s", p.Topic)
	}
	if !b.Log.Contains("a Will Delay needs a session to wait inside") {
		t.Fatal("no log line naming the fix")
	}

	capped, _ := brokertest.DialConnect(t, b.Address(), willConnect("capped", "status/capped", 3600, 5))
	capped.Drop()
	start := clk.Now()
	tickUntil(t, clk, watch)
	if waited := clk.Now().Sub(start); waited > 7*time.Second {
		t.Fatalf("a 3600s delay on a 5s session waited %s", waited)
	}
}

// A Will whose wait began survives a restart with its due moment and is
// published after it; a Will whose connection the broker's own stop cut is
// not published (the device did not die) and is dropped at start.
func TestWillDueMomentSurvivesRestart(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	waiting, _ := brokertest.DialConnect(t, b.Address(), willConnect("waiting", "status/waiting", 30, 3600))
	waiting.Drop()
	connected, _ := brokertest.DialConnect(t, b.Address(), willConnect("connected", "status/connected", 0, 3600))
	time.Sleep(50 * time.Millisecond) // the drop reaches the broker
	b.Restart()
	_ = connected

	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)
	watch.Quiet(200 * time.Millisecond)
	tickUntil(t, clk, watch)
	if p := watch.Next(wait); p.Topic != "status/waiting" {
		t.Fatalf("published %s after the restart", p.Topic)
	}
	clk.Advance(time.Hour)
	watch.Quiet(300 * time.Millisecond)
}

// A Will that could never be delivered is refused at CONNECT with 0x90 and
// the reason (rfcs/wills.md); a 3.1.1 client, which
// has no 0x90, gets 0x05.
func TestWillRefusedAtConnect(t *testing.T) {
	b, _ := willRig(t)
	for _, topic := range []string{"a/+/b", "a/#", "$SYS/x", "$share/g/x", "$saguin/queue/jobs", "jobs/__dlq/x",
		longTopic(), deepTopic()} {
		_, ack := brokertest.DialConnect(t, b.Address(), willConnect("bad", topic, 0, 0))
		if ack.ReasonCode != 0x90 || ack.Properties.ReasonString == "" {
			t.Errorf("Will on %.40q: CONNACK 0x%02x %q, want 0x90 with a reason", topic, ack.ReasonCode, ack.Properties.ReasonString)
		}
	}
	v3 := willConnect("old", "a/+", 0, 0)
	v3.ProtocolVersion = 4
	v3.Properties = packets.Properties{}
	v3.Connect.WillProperties = packets.Properties{}
	if _, ack := brokertest.DialConnect(t, b.Address(), v3); ack.ReasonCode != 0x05 {
		t.Errorf("3.1.1 Will on a/+: CONNACK 0x%02x, want 0x05", ack.ReasonCode)
	}
	// A good Will connects.
	if _, ack := brokertest.DialConnect(t, b.Address(), willConnect("good", "status/good", 0, 0)); ack.ReasonCode != 0 {
		t.Errorf("good Will: CONNACK 0x%02x", ack.ReasonCode)
	}
}

// longTopic is past the default limits.max_topic_length (1,024 bytes).
func longTopic() string {
	b := make([]byte, 0, 2000)
	for len(b) < 1100 {
		b = append(b, "abcdefghijklmnopqrstuvwxyz"...)
	}
	return "status/" + string(b)
}

// deepTopic is past the default limits.max_topic_levels.
func deepTopic() string {
	b := []byte("status")
	for i := 0; i < 300; i++ {
		b = append(b, "/a"...)
	}
	return string(b)
}
