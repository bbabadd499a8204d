package broker_test

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// latestConfig: a latest channel "state" (retention_period 1h, tombstones
// kept the default day), an append channel "events", a queue "jobs", and
// everything else broadcast. Topics are bounded at 64 bytes and 4 levels.
const latestConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_topic_length: 64
    max_topic_levels: 4
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
{{.Provider}}
channels:
  state:
    type: latest
    filter: "state/#"
    retention_period: 1h
  events:
    type: append
    filter: "events/#"
  jobs:
    type: queue
    filter: "jobs/#"
`

var latestStart = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// latestRig starts a broker on latestConfig with the provider given
// (sqliteProvider or memoryProvider) and a fake clock.
func latestRig(t *testing.T, provider string) (*brokertest.Broker, *clock.Fake) {
	t.Helper()
	dir := t.TempDir()
	if strings.Contains(provider, "snapshots") {
		if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	clk := clock.NewFake(latestStart)
	cfg := brokertest.Config(t, dir, strings.Replace(latestConfig, "{{.Provider}}", provider, 1))
	return brokertest.Start(t, cfg, brokertest.WithClock(clk)), clk
}

// set publishes one value (an empty payload deletes) at QoS 1 and fails
// unless it is stored.
func set(t *testing.T, c *brokertest.Client, topic, payload string) {
	t.Helper()
	setWith(t, c, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
}

func setWith(t *testing.T, c *brokertest.Client, p *paho.Publish) {
	t.Helper()
	r, err := c.Publish(p)
	if err != nil && r == nil {
		t.Fatalf("publish %s: %v", p.Topic, err)
	}
	if r.ReasonCode != 0 {
		t.Fatalf("publish %s: PUBACK 0x%02x %s", p.Topic, r.ReasonCode, reasonOf(r))
	}
}

func reasonOf(r *paho.PublishResponse) string {
	if r.Properties != nil {
		return r.Properties.ReasonString
	}
	return ""
}

// expect reads the next message and checks topic, payload and RETAIN.
func expect(t *testing.T, c *brokertest.Client, topic, payload string, retain bool) *paho.Publish {
	t.Helper()
	p := c.Next(wait)
	if p.Topic != topic || string(p.Payload) != payload || p.Retain != retain {
		t.Fatalf("got %s %q retain=%v (offset %s); want %s %q retain=%v",
			p.Topic, p.Payload, p.Retain, p.Properties.User.Get("saguin-offset"), topic, payload, retain)
	}
	return p
}

// expectSet reads n messages, in any order, and checks they are exactly
// want (topic -> payload), each with RETAIN as given.
func expectSet(t *testing.T, c *brokertest.Client, retain bool, want map[string]string) map[string]*paho.Publish {
	t.Helper()
	got := map[string]*paho.Publish{}
	for range want {
		p := c.Next(wait)
		if _, dup := got[p.Topic]; dup {
			t.Fatalf("%s delivered twice (offsets %s, %s)", p.Topic,
				got[p.Topic].Properties.User.Get("saguin-offset"), p.Properties.User.Get("saguin-offset"))
		}
		w, ok := want[p.Topic]
		if !ok || string(p.Payload) != w || p.Retain != retain {
			t.Fatalf("got %s %q retain=%v; want one of %v with retain=%v", p.Topic, p.Payload, p.Retain, want, retain)
		}
		got[p.Topic] = p
	}
	return got
}

func offsetOf(t *testing.T, p *paho.Publish) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(p.Properties.User.Get("saguin-offset"), 10, 64)
	if err != nil {
		t.Fatalf("%s: saguin-offset %q", p.Topic, p.Properties.User.Get("saguin-offset"))
	}
	return n
}

// subscribeOpts subscribes with the options and SUBSCRIBE user properties
// given and fails unless every filter is granted.
func subscribeOpts(t *testing.T, c *brokertest.Client, user paho.UserProperties, opts ...paho.SubscribeOptions) {
	t.Helper()
	s := &paho.Subscribe{Subscriptions: opts}
	if len(user) > 0 {
		s.Properties = &paho.SubscribeProperties{User: user}
	}
	sa, err := c.SubscribeWith(s)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	for i, r := range sa.Reasons {
		if r >= 0x80 {
			t.Fatalf("subscribe %s refused 0x%02x", opts[i].Topic, r)
		}
	}
}

// rawMQTT is a packet-level MQTT client (5, or 3.1.1 with version 4): the
// test sees every packet in the order the broker wrote it (a SUBACK before
// or after the state it earns).
type rawMQTT struct {
	t       *testing.T
	conn    net.Conn
	r       *bufio.Reader
	version byte
}

func dialRawMQTT(t *testing.T, addr, id string) *rawMQTT {
	t.Helper()
	c, ack := dialRawMQTTWith(t, addr, packets.Packet{ProtocolVersion: 5,
		Connect: packets.ConnectParams{ClientIdentifier: id, Clean: true}})
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", ack)
	}
	return c
}

// dialRawMQTTWith sends the CONNECT given (its version, session, and
// properties such as Maximum Packet Size) and returns the CONNACK.
func dialRawMQTTWith(t *testing.T, addr string, connect packets.Packet) (*rawMQTT, packets.Packet) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := &rawMQTT{t: t, conn: conn, r: bufio.NewReader(conn), version: connect.ProtocolVersion}
	connect.FixedHeader.Type = packets.Connect
	connect.Connect.ProtocolName = []byte("MQTT")
	connect.Connect.Keepalive = 60
	c.send(connect, (*packets.Packet).ConnectEncode)
	ack := c.read()
	if ack.FixedHeader.Type != packets.Connack {
		t.Fatalf("answer to CONNECT: packet type %d", ack.FixedHeader.Type)
	}
	return c, ack
}

func (c *rawMQTT) send(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
	c.t.Helper()
	var buf bytes.Buffer
	if err := enc(&pk, &buf); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawMQTT) subscribe(id uint16, user []packets.UserProperty, filters ...packets.Subscription) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: c.version,
		PacketID: id, Filters: filters, Properties: packets.Properties{User: user}}, (*packets.Packet).SubscribeEncode)
}

// publish sends a QoS 1 PUBLISH and returns its PUBACK, failing the test
// if anything else arrives first.
func (c *rawMQTT) publish(id uint16, topic string, payload []byte, props packets.Properties) packets.Packet {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: c.version,
		PacketID: id, TopicName: topic, Payload: payload, Properties: props,
		Mods: packets.Mods{AllowResponseInfo: true}}, (*packets.Packet).PublishEncode) // else no Response Topic is encoded
	pk := c.read()
	if pk.FixedHeader.Type != packets.Puback || pk.PacketID != id {
		c.t.Fatalf("after PUBLISH %d: packet type %d id %d, want its PUBACK", id, pk.FixedHeader.Type, pk.PacketID)
	}
	return pk
}

// puback acknowledges a delivery.
func (c *rawMQTT) puback(id uint16) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: c.version, PacketID: id},
		(*packets.Packet).PubackEncode)
}

// disconnect sends DISCONNECT and waits for the broker to close.
func (c *rawMQTT) disconnect() {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: c.version},
		(*packets.Packet).DisconnectEncode)
	for {
		if _, err := c.readWithin(wait); err != nil {
			return
		}
	}
}

func (c *rawMQTT) read() packets.Packet {
	c.t.Helper()
	pk, err := c.readWithin(wait)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return pk
}

func (c *rawMQTT) readWithin(d time.Duration) (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	return brokertest.ReadPacket(c.r, c.version)
}
