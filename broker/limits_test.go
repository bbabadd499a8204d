package broker_test

import (
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// limitsConfig is appendConfig with small client limits.
func limitsConfig(t *testing.T) string {
	t.Helper()
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", memoryProvider, 1)
	tmpl = strings.Replace(tmpl, "  storage:\n",
		"  limits:\n    max_subscriptions: 3\n    max_client_id_length: 23\n  storage:\n", 1)
	dir := t.TempDir()
	return brokertest.Config(t, dir, tmpl)
}

// Invariant 13: a client's subscriptions are bounded by
// limits.max_subscriptions, counted after the SUBSCRIBE. A filter past it is
// refused 0x97 and the rest of the packet is served; a filter the client
// already holds is a replacement and counts nothing; the connection stays.
func TestInvariant13_SubscriptionsPastTheLimitAreRefused(t *testing.T) {
	b := brokertest.Start(t, limitsConfig(t))
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	sub := func(filters ...string) []byte {
		t.Helper()
		var opts []paho.SubscribeOptions
		for _, f := range filters {
			opts = append(opts, paho.SubscribeOptions{Topic: f, QoS: 1})
		}
		sa, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: opts})
		if sa == nil {
			t.Fatalf("subscribe %v: %v", filters, err)
		}
		return sa.Reasons
	}
	if got := sub("plain/1", "plain/2"); got[0] != 1 || got[1] != 1 {
		t.Fatalf("first two: %v", got)
	}
	got := sub("plain/3", "plain/4", "plain/1")
	if got[0] != 1 || got[1] != 0x97 || got[2] != 1 {
		t.Fatalf("past the limit of 3: %v, want [1 0x97 1] (plain/1 replaces)", got)
	}
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if _, err := pub.Publish(&paho.Publish{Topic: "plain/3", QoS: 1, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if p := c.Next(wait); p.Topic != "plain/3" {
		t.Fatalf("the connection was not served after the refusal: %s", p.Topic)
	}
	if !b.Log.Contains("limits.max_subscriptions") {
		t.Fatal("no warning naming the limit")
	}
}

// A client identifier is refused at CONNECT with 0x85 and the reason when it
// is past limits.max_client_id_length, holds a control character, or is
// empty while asking to resume; a 3.1.1 client gets 0x02.
func TestClientIdentifierRefusals(t *testing.T) {
	b := brokertest.Start(t, limitsConfig(t))
	for name, pk := range map[string]packets.Packet{
		"too long":        {Connect: packets.ConnectParams{ClientIdentifier: strings.Repeat("d", 24), Clean: true}},
		"control char":    {Connect: packets.ConnectParams{ClientIdentifier: "dev\x07", Clean: true}},
		"empty resuming":  {Connect: packets.ConnectParams{ClientIdentifier: "", Clean: false}},
		"C1 control char": {Connect: packets.ConnectParams{ClientIdentifier: "dev\u0085", Clean: true}},
	} {
		pk.Mods.AllowResponseInfo = true
		_, ack := brokertest.DialConnect(t, b.Address(), pk)
		if ack.ReasonCode != 0x85 {
			t.Errorf("%s: CONNACK 0x%02x, want 0x85", name, ack.ReasonCode)
		}
	}
	v3 := packets.Packet{ProtocolVersion: 4, Connect: packets.ConnectParams{ClientIdentifier: strings.Repeat("d", 24), Clean: true}}
	if _, ack := brokertest.DialConnect(t, b.Address(), v3); ack.ReasonCode != 0x02 {
		t.Errorf("3.1.1 too long: CONNACK 0x%02x, want 0x02", ack.ReasonCode)
	}
	// At the limit it connects.
	if _, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{Connect: packets.ConnectParams{
		ClientIdentifier: strings.Repeat("d", 23), Clean: true}}); ack.ReasonCode != 0 {
		t.Errorf("23 bytes: CONNACK 0x%02x", ack.ReasonCode)
	}
}
