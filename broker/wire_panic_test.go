//go:build saguinfaults

package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/faults"
)

// Run with: go test -tags saguinfaults -run '^TestFaultBuild' . (make test
// does).

// panicking starts a broker of the fault-injection build switched, through
// SAGUIN_FAULTS as the daemon reads it, to panic-on-packet.
func panicking(t *testing.T) *brokertest.Broker {
	t.Helper()
	set, err := faults.FromEnv(func(k string) string {
		if k == faults.Env {
			return "panic-on-packet"
		}
		return ""
	})
	if err != nil || set.PanicTopic == "" {
		t.Fatalf("SAGUIN_FAULTS=panic-on-packet: %+v %v", set, err)
	}
	return brokertest.Start(t, configWith(t, memoryProvider),
		func(o *broker.Options) { o.PanicTopic = set.PanicTopic })
}

// failureLines counts the log lines reporting a recovered panic.
func failureLines(b *brokertest.Broker) []string {
	var out []string
	for _, l := range strings.Split(b.Log.String(), "\n") {
		if strings.Contains(l, "the broker failed handling its packet") {
			out = append(out, l)
		}
	}
	return out
}

// Issue 12 item 0c: a panic while handling one connection's packet closes
// that connection, logs one line naming the packet type, and leaves every
// other client served; what the broker keeps for the failed client is left
// as a network error's end leaves it (its durable session kept, its Will
// published), and it is served again when it reconnects. Without the
// recovering listener this test's process dies at the first panic.
func TestFaultBuild_PanicOnPacketEndsOnlyItsConnection(t *testing.T) {
	b := panicking(t)
	watcher := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
	watcher.Subscribe("chat/#", 1)
	talker := brokertest.Connect(t, b.Address(), "talker", brokertest.ClientOptions{CleanStart: true})

	// The victim: a durable session with a Will.
	victimConnect := packets.Packet{
		Connect: packets.ConnectParams{ClientIdentifier: "victim", Keepalive: 60, Clean: false,
			WillFlag: true, WillTopic: "chat/will", WillPayload: []byte("victim gone"), WillQos: 1},
		Properties: packets.Properties{SessionExpiryInterval: 300, SessionExpiryIntervalFlag: true},
	}
	v, ack := brokertest.DialConnect(t, b.Address(), victimConnect)
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("victim CONNACK %+v", ack)
	}
	v.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: 7, TopicName: faults.PanicTopic,
		Payload: []byte("boom")})
	if pk, err := v.ReadWithin(wait); err == nil {
		t.Fatalf("the panicking connection was answered %+v; want it closed", pk)
	}

	// Its Will: the connection ended without a DISCONNECT.
	if m := watcher.Next(wait); m == nil || m.Topic != "chat/will" || string(m.Payload) != "victim gone" {
		t.Fatalf("the failed client's Will: %+v", m)
	}
	// Everyone else is still served.
	if r, err := talker.Publish(&paho.Publish{Topic: "chat/x", QoS: 1, Payload: []byte("still here")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("another client's publish after the panic: %v %+v", err, r)
	}
	if m := watcher.Next(wait); m == nil || string(m.Payload) != "still here" {
		t.Fatalf("another client's delivery after the panic: %+v", m)
	}
	lines := failureLines(b)
	if len(lines) != 1 || !strings.Contains(lines[0], "packet=PUBLISH") || !strings.Contains(lines[0], "client=victim") {
		t.Fatalf("want one line naming the PUBLISH and the client, got %d:\n%s", len(lines), strings.Join(lines, "\n"))
	}

	// The victim reconnects: its session was kept and it is served.
	victimConnect.Connect.WillFlag = false
	victimConnect.Connect.WillQos = 0
	v2, ack := brokertest.DialConnect(t, b.Address(), victimConnect)
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 || !ack.SessionPresent {
		t.Fatalf("the failed client's reconnect: %+v (want Session Present 1)", ack)
	}
	v2.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: 8, TopicName: "chat/back",
		Payload: []byte("back")})
	if pk := v2.Read(); pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != 0 {
		t.Fatalf("the reconnected client's publish: %+v", pk)
	}
	if m := watcher.Next(wait); m == nil || string(m.Payload) != "back" {
		t.Fatalf("the reconnected client's publish delivered: %+v", m)
	}

	// Another packet type, on a session that ends with its connection.
	s, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{
		Connect: packets.ConnectParams{ClientIdentifier: "subscriber", Keepalive: 60, Clean: true}})
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v", ack)
	}
	s.SendSubscribe(1, packets.Subscription{Filter: faults.PanicTopic, Qos: 1})
	if pk, err := s.ReadWithin(wait); err == nil {
		t.Fatalf("the panicking SUBSCRIBE was answered %+v; want the connection closed", pk)
	}
	deadline := time.Now().Add(wait)
	for len(failureLines(b)) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if lines := failureLines(b); len(lines) != 2 || !strings.Contains(lines[1], "packet=SUBSCRIBE") {
		t.Fatalf("want a second line naming the SUBSCRIBE, got:\n%s", strings.Join(lines, "\n"))
	}
	if _, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{
		Connect: packets.ConnectParams{ClientIdentifier: "subscriber", Keepalive: 60, Clean: true}}); ack.ReasonCode != 0 || ack.SessionPresent {
		t.Fatalf("the failed subscriber's reconnect: %+v (its session ended with its connection)", ack)
	}
	othersUnaffected(t, b, "after-panics")
}
