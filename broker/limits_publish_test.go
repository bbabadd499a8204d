package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// publishCode publishes QoS 1 and returns the PUBACK's reason code.
func publishCode(t *testing.T, c *brokertest.Client, p *paho.Publish) byte {
	t.Helper()
	p.QoS = 1
	r, err := c.Publish(p)
	if r == nil {
		t.Fatalf("publish %s: %v", p.Topic, err)
	}
	return r.ReasonCode
}

func userProps(n, size int) paho.UserProperties {
	var u paho.UserProperties
	for i := range n {
		u = append(u, paho.UserProperty{Key: "k", Value: strings.Repeat(string(rune('a'+i%26)), size)})
	}
	return u
}

// invariant 13, the publish-time limits: a topic past max_topic_length or
// max_topic_levels is refused 0x90; User Properties past max_header_count
// or max_header_bytes 0x97. The limit itself is admitted; the connection
// stays (a later publish on it is served) and nothing refused reaches a
// subscriber; a QoS 0 past a limit is dropped.
func TestInvariant13_PublishTopicAndHeaderLimits(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_topic_length: 32", "max_topic_levels: 4",
		"max_header_count: 3", "max_header_bytes: 64"))
	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true, ProblemInfo: true})

	atLength := "plain/" + strings.Repeat("x", 32-len("plain/"))
	cases := []struct {
		name string
		p    paho.Publish
		want byte
	}{
		{"topic at max_topic_length", paho.Publish{Topic: atLength}, 0},
		{"topic over max_topic_length", paho.Publish{Topic: atLength + "y"}, 0x90},
		{"topic at max_topic_levels", paho.Publish{Topic: "plain/a/b/c"}, 0},
		{"topic over max_topic_levels", paho.Publish{Topic: "plain/a/b/c/d"}, 0x90},
		{"headers at max_header_count", paho.Publish{Topic: "plain/h3", Properties: &paho.PublishProperties{User: userProps(3, 1)}}, 0},
		{"headers over max_header_count", paho.Publish{Topic: "plain/h4", Properties: &paho.PublishProperties{User: userProps(4, 1)}}, 0x97},
		// Two properties of key "k" (1 byte) and 31 bytes: 64 bytes.
		{"headers at max_header_bytes", paho.Publish{Topic: "plain/b64", Properties: &paho.PublishProperties{User: userProps(2, 31)}}, 0},
		{"headers over max_header_bytes", paho.Publish{Topic: "plain/b65", Properties: &paho.PublishProperties{User: userProps(2, 32)}}, 0x97},
	}
	var delivered []string
	for _, tc := range cases {
		p := tc.p
		p.Payload = []byte("x")
		if got := publishCode(t, pub, &p); got != tc.want {
			t.Errorf("%s: PUBACK 0x%02x, want 0x%02x", tc.name, got, tc.want)
		}
		if tc.want == 0 {
			delivered = append(delivered, tc.p.Topic)
		}
	}
	// QoS 0 past a limit: dropped, no answer, connection kept.
	if _, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "plain/a/b/c/d/e", QoS: 0, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if got := publishCode(t, pub, &paho.Publish{Topic: "plain/after", Payload: []byte("x")}); got != 0 {
		t.Fatalf("the connection was not kept: 0x%02x", got)
	}
	delivered = append(delivered, "plain/after")
	for _, want := range delivered {
		if got := sub.Next(wait); got.Topic != want {
			t.Fatalf("subscriber got %s, want %s (refusals never delivered)", got.Topic, want)
		}
	}
	othersUnaffected(t, b, "other")
}

// invariant 13, limits.max_client_id_length: one byte over is CONNACK 0x85
// (3.1.1: 0x02) before any session is made; at the limit it connects.
func TestInvariant13_MaxClientIDLength(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_client_id_length: 40"))
	connect := func(v byte, id string) byte {
		t.Helper()
		_, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{ProtocolVersion: v,
			Connect: packets.ConnectParams{ClientIdentifier: id, Clean: true}})
		return ack.ReasonCode
	}
	if got := connect(5, strings.Repeat("i", 41)); got != 0x85 {
		t.Fatalf("41 bytes: CONNACK 0x%02x, want 0x85", got)
	}
	if got := connect(4, strings.Repeat("i", 41)); got != 0x02 {
		t.Fatalf("3.1.1, 41 bytes: CONNACK 0x%02x, want 0x02", got)
	}
	if got := connect(5, strings.Repeat("i", 40)); got != 0 {
		t.Fatalf("40 bytes: CONNACK 0x%02x, want 0", got)
	}
	othersUnaffected(t, b, "other")
}

// invariant 13, limits.max_session_expiry: a client asking for longer is
// granted the cap, and the CONNACK says so.
func TestInvariant13_MaxSessionExpiryCapsTheGrant(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_session_expiry: 1h"))
	_, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{Connect: packets.ConnectParams{ClientIdentifier: "long", Clean: true},
		Properties: packets.Properties{SessionExpiryInterval: 86400, SessionExpiryIntervalFlag: true}})
	if ack.ReasonCode != 0 || !ack.Properties.SessionExpiryIntervalFlag || ack.Properties.SessionExpiryInterval != 3600 {
		t.Fatalf("asked a day: CONNACK 0x%02x Session Expiry %v %d, want 3600",
			ack.ReasonCode, ack.Properties.SessionExpiryIntervalFlag, ack.Properties.SessionExpiryInterval)
	}
}

// A Will is the broker's publish for a client that is gone: it is not
// charged to that client's publish budget (rfcs/limits.md), so a client
// that spent its budget still has its Will delivered.
func TestInvariant13_PublishRateDoesNotChargeWills(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, limitsWith(t, "publish_rate: 1"), brokertest.WithClock(clk))
	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("plain/#", 1)
	c, ack := brokertest.DialConnect(t, b.Address(), packets.Packet{Connect: packets.ConnectParams{
		ClientIdentifier: "testament", Clean: true, Keepalive: 60,
		WillFlag: true, WillTopic: "plain/will", WillPayload: []byte("gone"), WillQos: 1}})
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	for i, want := range []byte{0, 0x97} {
		c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: uint16(i + 1),
			TopicName: "plain/spent", Payload: []byte("x")})
		if pk := c.Read(); pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != want {
			t.Fatalf("publish %d: %+v, want PUBACK 0x%02x", i+1, pk, want)
		}
	}
	c.Drop()
	for _, want := range []string{"plain/spent", "plain/will"} {
		if got := sub.Next(wait); got.Topic != want {
			t.Fatalf("subscriber got %s, want %s", got.Topic, want)
		}
	}
}
