package broker_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// waitLogged polls a log until it holds s (real time: the broker's own
// goroutines write it), failing after wait.
func waitLogged(t *testing.T, contains func(string) bool, s string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !contains(s) {
		if time.Now().After(deadline) {
			t.Fatalf("never logged %q", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A CONNECT refused for its Will changes nothing of the session its client
// id holds (rfcs/sessions-ownership.md;
// docs/channels.md: a waiting Will is cancelled by a resume, "never a CONNECT that
// was refused"). Each cause is answered on the wire with 0x90 and a reason;
// afterwards the session away is resumed whole — Session Present 1, its
// subscription and position — and its waiting Will was not cancelled.
func TestWillRefusedAtConnectChangesNothingOfTheSession(t *testing.T) {
	b, clk := willRig(t)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})

	dev, _ := brokertest.DialConnect(t, b.Address(), willConnect("dev", "status/dev", 30, 3600))
	if sa := dev.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	publishN(t, pub, "events/a", 1, 2)
	for i := 0; i < 2; i++ {
		dev.Puback(nextPublish(t, dev).PacketID)
	}
	dev.Drop() // away; its Will waits 30 s
	waitLogged(t, b.Log.Contains, "error=EOF client=dev")

	for _, topic := range []string{"status/+", "$SYS/dev", "$saguin/sessions/disconnect", "$share/g/status", "jobs/__dlq/x", longTopic(), deepTopic()} {
		bad := willConnect("dev", topic, 0, 600)
		bad.Connect.Clean = false
		if _, ack := brokertest.DialConnect(t, b.Address(), bad); ack.ReasonCode != 0x90 || ack.SessionPresent {
			t.Fatalf("Will on %.40q: CONNACK 0x%02x (Session Present %v), want 0x90", topic, ack.ReasonCode, ack.SessionPresent)
		}
	}
	// The waiting Will was not cancelled by any of them: it falls due.
	tickUntil(t, clk, watch)
	if p := watch.Next(wait); p.Topic != "status/dev" {
		t.Fatalf("published %s", p.Topic)
	}
	// And the session is whole: resumed, subscribed, at its position.
	back, ack := brokertest.DialConnect(t, b.Address(), v5Connect("dev", false, 3600))
	if !ack.SessionPresent {
		t.Fatal("the session did not survive the refused CONNECTs")
	}
	publishN(t, pub, "events/a", 3, 1)
	if p := nextPublish(t, back); string(p.Payload) != "record 3" {
		t.Fatalf("resumed session served %q, want record 3", p.Payload)
	}
}

// willFullConfig is an append channel with room for one large record.
var willFullConfig = appendConfigWith(sqliteProvider, "    max_bytes: 2KiB\n")

// A Will is published through the ordinary publish path when it fires, and
// what refuses it then — here its channel filled since the CONNECT — is
// logged, naming the client, and no more: nobody is left to answer, and the
// broker goes on (rfcs/wills.md).
func TestWillIntoAFullChannelIsLoggedAndNotStored(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), willFullConfig))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})

	w := willConnect("dev", "events/dead", 0, 0)
	w.Connect.WillPayload = bytes.Repeat([]byte("w"), 1200)
	dev, ack := brokertest.DialConnect(t, b.Address(), w)
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	resp, err := pub.Publish(&paho.Publish{Topic: "events/fill", QoS: 1, Payload: bytes.Repeat([]byte("f"), 1200)})
	if err != nil || resp.ReasonCode != 0 {
		t.Fatalf("filler: %v %+v", err, resp)
	}
	dev.Drop()
	waitLogged(t, b.Log.Contains, `msg="Will not published" broker=test client=dev topic=events/dead`)

	reader := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	if p := reader.Next(wait); p.Topic != "events/fill" {
		t.Fatalf("first record %s", p.Topic)
	}
	reader.Quiet(200 * time.Millisecond) // the Will was not stored
}

// willDLQConfig is written over the first configuration before a restart:
// queue "work" now exists, so work/__dlq/... is its dead-letter channel.
var willDLQConfig = willNoQueueConfig + `  work:
    type: queue
    filter: "work/#"
    visibility_timeout: 30s
`

var willNoQueueConfig = appendConfigWith(sqliteProvider, "")

// A Will is judged again against the rules as they stand when it fires. Its
// topic was an ordinary broadcast topic at CONNECT; by the time its wait
// ends, a restart on a new configuration made it a dead-letter channel,
// which takes records from its queue and nothing else. The Will is not
// published, the log says so naming the client, and nothing crashes.
func TestWillJudgedAgainWhenItFires(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, brokertest.Config(t, dir, willNoQueueConfig), brokertest.WithClock(clk))
	dev, ack := brokertest.DialConnect(t, b.Address(), willConnect("dev", "work/__dlq/x", 30, 3600))
	if ack.ReasonCode != 0 {
		t.Fatalf("Will on a broadcast topic: CONNACK 0x%02x", ack.ReasonCode)
	}
	dev.Drop()
	waitLogged(t, b.Log.Contains, "error=EOF client=dev")

	brokertest.Config(t, dir, willDLQConfig) // the same path, rewritten
	b.Restart()
	dl := brokertest.Connect(t, b.Address(), "dl", brokertest.ClientOptions{CleanStart: true})
	dl.Subscribe("work/__dlq/#", 1)
	deadline := time.Now().Add(wait)
	for !b.Log.Contains(`msg="Will not published" broker=test client=dev topic=work/__dlq/x`) {
		if time.Now().After(deadline) {
			t.Fatalf("the Will was not refused when it fired:\n%s", b.Log.Tail(20))
		}
		clk.Advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	dl.Quiet(200 * time.Millisecond)
	if strings.Contains(b.Log.String(), `msg="Will published" broker=test client=dev`) {
		t.Fatal("the Will was published into a dead-letter channel")
	}
	// The broker goes on.
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishN(t, pub, "events/a", 1, 1)
}

// A Will whose wait had begun is published at least once across a crash:
// its due moment is on the stored session, so a broker killed (SIGKILL)
// while it waits publishes it after the restart.
func TestWillPublishedAcrossAKill(t *testing.T) {
	proc := brokertest.StartProcess(t, configWith(t, sqliteProvider))
	dev, ack := brokertest.DialConnect(t, proc.Address(), willConnect("dev", "events/dead", 5, 3600))
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	dev.Drop()
	waitLogged(t, func(s string) bool { return strings.Contains(proc.Output(), s) }, "error=EOF client=dev")
	proc.Kill()
	if strings.Contains(proc.Output(), "Will published") {
		t.Fatal("the Will fired before the kill: nothing is left to prove (its delay is 5 s)")
	}
	proc.Restart()
	reader := brokertest.Connect(t, proc.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	if p := reader.Next(wait); p.Topic != "events/dead" || string(p.Payload) != "dev is gone" {
		t.Fatalf("after the kill: %s %q", p.Topic, p.Payload)
	}
}

// rfcs/wills.md and invariant 18: a DISCONNECT 0x04 keeps the
// Will, and its wait begins then. The moment it falls due is stored before
// the close that answers the DISCONNECT, so a broker killed the instant the
// client sees its connection close still publishes the Will after restart.
func TestInvariant18_WillKeptByDisconnect04IsDueAcrossAKillAtTheClose(t *testing.T) {
	proc := brokertest.StartProcess(t, configWith(t, sqliteProvider))
	dev, ack := brokertest.DialConnect(t, proc.Address(), willConnect("dev", "events/dead", 3, 3600))
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	dev.DisconnectWith(0x04)
	if pk, err := dev.ReadWithin(wait); err == nil {
		t.Fatalf("after DISCONNECT 0x04 the broker sent %v instead of closing", pk.FixedHeader.Type)
	}
	proc.Kill() // the client has seen the close: what answered it must be stored
	if strings.Contains(proc.Output(), "Will published") {
		t.Fatal("the Will fired before the kill: nothing is left to prove (its delay is 3 s)")
	}
	proc.Restart()
	reader := brokertest.Connect(t, proc.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	if p := reader.Next(wait); p.Topic != "events/dead" || string(p.Payload) != "dev is gone" {
		t.Fatalf("after the kill: %s %q", p.Topic, p.Payload)
	}
}

// rfcs/wills.md: a client connected when the broker stopped
// keeps its Will — a broker stopping is not a device dying, so nothing is
// published at the start — and the Will waits on the restored session: the
// session expiring at the running broker publishes it; the client coming
// back replaces it, and then it is never published.
func TestWillOfAClientConnectedAtTheStopWaitsOnTheRestoredSession(t *testing.T) {
	proc := brokertest.StartProcess(t, configWith(t, sqliteProvider))
	if _, ack := brokertest.DialConnect(t, proc.Address(), willConnect("gone", "events/gone", 0, 4)); ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	if _, ack := brokertest.DialConnect(t, proc.Address(), willConnect("back", "events/back", 0, 3600)); ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	proc.Term() // both connected: the stop cuts them
	if strings.Contains(proc.Output(), "Will published") {
		t.Fatal("a Will was published by the broker's own stop")
	}
	proc.Restart()
	reader := brokertest.Connect(t, proc.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	reader.Subscribe("events/#", 1)
	back, ack := brokertest.DialConnect(t, proc.Address(), packets.Packet{
		Connect:    packets.ConnectParams{ClientIdentifier: "back", Keepalive: 60},
		Properties: packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true},
	})
	if ack.ReasonCode != 0 || !ack.SessionPresent {
		t.Fatalf("resuming client: CONNACK 0x%02x, Session Present %v", ack.ReasonCode, ack.SessionPresent)
	}
	back.Disconnect() // 0x00: it had no Will of its own; the restored one was replaced
	// The session of "gone" (4 s) expires at the running broker: its Will.
	if p := reader.Next(wait); p.Topic != "events/gone" || string(p.Payload) != "gone is gone" {
		t.Fatalf("the restored session's expiry published %s %q, want gone's Will", p.Topic, p.Payload)
	}
	reader.Quiet(time.Second) // and never the replaced one
}
