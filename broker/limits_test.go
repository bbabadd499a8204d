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

// readDisconnect reads until the broker's DISCONNECT and returns its reason
// code, failing if the connection ends without one.
func readDisconnect(t *testing.T, c *brokertest.RawClient) byte {
	t.Helper()
	for {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			t.Fatalf("connection ended without a DISCONNECT: %v", err)
		}
		if pk.FixedHeader.Type == packets.Disconnect {
			return pk.ReasonCode
		}
	}
}

// Topic Alias Maximum is 16 inbound (docs/configuration.md "`broker.limits`"): an alias past
// it is a protocol error answered DISCONNECT 0x94, and the broker stays up
// for others.
func TestTopicAliasPastSixteenDisconnects(t *testing.T) {
	b := brokertest.Start(t, limitsConfig(t))
	c, _ := brokertest.DialRaw(t, b.Address(), "alias", true, 0)
	c.SendPublish(packets.Packet{TopicName: "plain/a", Payload: []byte("x"),
		Properties: packets.Properties{TopicAlias: 17, TopicAliasFlag: true}})
	if code := readDisconnect(t, c); code != 0x94 {
		t.Fatalf("alias 17: DISCONNECT 0x%02x, want 0x94", code)
	}
	other := brokertest.Connect(t, b.Address(), "other", brokertest.ClientOptions{CleanStart: true})
	if _, err := other.Publish(&paho.Publish{Topic: "plain/b", QoS: 1, Payload: []byte("y")}); err != nil {
		t.Fatalf("the broker did not stay up for others: %v", err)
	}
}

// A client that sends more QoS 2 publishes than the broker's Receive
// Maximum without completing them is disconnected 0x93 (MQTT-3.3.4-8).
//
// A QoS 2 publish is held until its PUBREL, and broker.qos2's per-client
// allowance (20 by default) answers PUBREC 0x97 past it — a refused PUBREC
// ends its exchange, so the allowance alone never lets a client exceed
// Receive Maximum. Raised here so Receive Maximum is the bound reached.
func TestReceiveMaximumExceededDisconnects(t *testing.T) {
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", memoryProvider, 1)
	tmpl = strings.Replace(tmpl, "  storage:\n", "  qos2:\n    max_inflight_per_client: 65535\n  storage:\n", 1)
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), tmpl))
	c, connack := brokertest.DialRaw(t, b.Address(), "greedy", true, 0)
	max := int(connack.Properties.ReceiveMaximum)
	if max == 0 {
		max = 65535
	}
	for i := 1; i <= max+1; i++ {
		c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 2}, PacketID: uint16(i),
			TopicName: "plain/q2", Payload: []byte("x")})
	}
	if code := readDisconnect(t, c); code != 0x93 {
		t.Fatalf("past Receive Maximum %d: DISCONNECT 0x%02x, want 0x93", max, code)
	}
}

// limits.max_keepalive: an MQTT 5 client asking for more, or for none, is
// given the ceiling as Server Keep Alive; one asking for less keeps its own.
func TestMaxKeepaliveIsServerKeepAlive(t *testing.T) {
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", memoryProvider, 1)
	tmpl = strings.Replace(tmpl, "  storage:\n", "  limits:\n    max_keepalive: 30s\n  storage:\n", 1)
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), tmpl))
	for _, asked := range []uint16{0, 600} {
		_, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{Connect: packets.ConnectParams{
			ClientIdentifier: "k", Clean: true, Keepalive: asked}})
		if !ack.Properties.ServerKeepAliveFlag || ack.Properties.ServerKeepAlive != 30 {
			t.Errorf("asked %ds: Server Keep Alive %v %d, want 30", asked, ack.Properties.ServerKeepAliveFlag, ack.Properties.ServerKeepAlive)
		}
	}
	_, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{Connect: packets.ConnectParams{
		ClientIdentifier: "k", Clean: true, Keepalive: 10}})
	if ack.Properties.ServerKeepAliveFlag {
		t.Errorf("asked 10s: given Server Keep Alive %d", ack.Properties.ServerKeepAlive)
	}
}
