package broker_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// limitsWith is appendConfig (memory storage) with the broker.limits lines
// given, each "key: value".
func limitsWith(t *testing.T, lines ...string) string {
	t.Helper()
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", memoryProvider, 1)
	block := "  limits:\n"
	for _, l := range lines {
		block += "    " + l + "\n"
	}
	tmpl = strings.Replace(tmpl, "  storage:\n", block+"  storage:\n", 1)
	return brokertest.Config(t, t.TempDir(), tmpl)
}

// rawConn is a socket the test writes bytes to as it likes, reading back
// what the broker answers.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialBytes(t *testing.T, addr string) *rawConn {
	t.Helper()
	return dialNetBytes(t, "tcp", addr)
}

// dialNetBytes is dialBytes on network ("tcp", "unix").
func dialNetBytes(t *testing.T, network, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, conn: c, r: bufio.NewReader(c)}
}

func (c *rawConn) write(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the broker's next packet at protocol level v.
func (c *rawConn) read(v byte) (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	return brokertest.ReadPacket(c.r, v)
}

// closedSilently asserts the broker closes the socket without a byte.
func (c *rawConn) closedSilently() {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	n, err := c.r.Read(make([]byte, 64))
	if n != 0 {
		c.t.Fatalf("the broker answered %d bytes; want the socket closed with nothing", n)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatal("the socket was not closed")
	}
	if err == nil {
		c.t.Fatal("read returned nothing and no error")
	}
}

// fixedHeader encodes a packet's first byte and a declared body length.
func fixedHeader(first byte, n int) []byte {
	b := []byte{first}
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 128
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

func connectBytes(t *testing.T, version byte, id string) []byte {
	t.Helper()
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: version,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60}}
	var buf bytes.Buffer
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// othersUnaffected: a fresh client connects and publishes QoS 1 with
// success (the broker stayed up for everyone else).
func othersUnaffected(t *testing.T, b *brokertest.Broker, id string) {
	t.Helper()
	c := brokertest.Connect(t, b.Address(), id, brokertest.ClientOptions{CleanStart: true})
	defer c.Close()
	r, err := c.Publish(&paho.Publish{Topic: "events/ok", QoS: 1, Payload: []byte("y")})
	if err != nil || r.ReasonCode != 0 {
		t.Fatalf("another client's publish after the refusal: %v %+v", err, r)
	}
}

// invariant 13, limits.max_message_size: advertised as the CONNACK's
// Maximum Packet Size; a packet declaring more is answered DISCONNECT 0x95
// before its body is read — the test never sends the 100MiB it declares,
// so the answer can only come from the declared length — and a packet of
// exactly the limit is served.
func TestInvariant13_MaxMessageSizeRefusedOnDeclaredLength(t *testing.T) {
	const limit = 4096
	b := brokertest.Start(t, limitsWith(t, "max_message_size: 4KiB"))
	c, ack := brokertest.DialRaw(t, b.Address(), "big", true, 0)
	if ack.Properties.MaximumPacketSize != limit {
		t.Fatalf("CONNACK Maximum Packet Size %d, want %d", ack.Properties.MaximumPacketSize, limit)
	}
	if ack.Properties.TopicAliasMaximum != 16 {
		t.Fatalf("CONNACK Topic Alias Maximum %d, want 16", ack.Properties.TopicAliasMaximum)
	}
	// A QoS 1 PUBLISH of exactly 4096 bytes: 1 + 2 length bytes + body.
	topic := "events/x"
	body := limit - 3
	payload := body - (2 + len(topic) + 2 + 1) // topic, packet id, property length
	c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: 1, TopicName: topic,
		Payload: make([]byte, payload)})
	if pk := c.Read(); pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != 0 {
		t.Fatalf("PUBLISH of exactly max_message_size: %+v", pk)
	}

	for name, declared := range map[string]int{"one byte over": limit - 2, "100MiB": 100 << 20} {
		r := dialBytes(t, b.Address())
		r.write(connectBytes(t, 5, "big-"+strings.ReplaceAll(name, " ", "")))
		if pk, err := r.read(5); err != nil || pk.ReasonCode != 0 {
			t.Fatalf("%s: CONNACK %+v %v", name, pk, err)
		}
		// The header and the topic only: the rest never comes.
		r.write(append(fixedHeader(0x30, declared), 0, 8, 'e', 'v', 'e', 'n', 't', 's', '/', 'y'))
		pk, err := r.read(5)
		if err != nil || pk.FixedHeader.Type != packets.Disconnect || pk.ReasonCode != 0x95 {
			t.Fatalf("%s: got %+v %v, want DISCONNECT 0x95", name, pk, err)
		}
	}
	// Any packet, not only a PUBLISH: the bound is the advertised Maximum
	// Packet Size (rfcs/limits.md).
	r := dialBytes(t, b.Address())
	r.write(connectBytes(t, 5, "bigsub"))
	if pk, err := r.read(5); err != nil || pk.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", pk, err)
	}
	r.write(append(fixedHeader(0x82, 1<<20), 0, 1))
	if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != packets.Disconnect || pk.ReasonCode != 0x95 {
		t.Fatalf("oversized SUBSCRIBE: got %+v %v, want DISCONNECT 0x95", pk, err)
	}
	// 3.1.1 has no server DISCONNECT: closed.
	r4 := dialBytes(t, b.Address())
	r4.write(connectBytes(t, 4, "big311"))
	if pk, err := r4.read(4); err != nil || pk.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK %+v %v", pk, err)
	}
	r4.write(append(fixedHeader(0x30, 1<<20), 0, 1))
	r4.closedSilently()
	othersUnaffected(t, b, "other")
	if !b.Log.Contains("limits.max_message_size") {
		t.Fatal("no log line naming the limit")
	}
}

// invariant 13, limits.max_connect_size: a CONNECT declaring more is
// answered CONNACK 0x95 from its opening bytes alone (the rest is never
// sent); a 3.1.1 one is closed with nothing.
func TestInvariant13_MaxConnectSizeRefusedUnread(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_connect_size: 1KiB"))
	r := dialBytes(t, b.Address())
	r.write(append(fixedHeader(0x10, 5000), 0, 4, 'M', 'Q', 'T', 'T', 5))
	pk, err := r.read(5)
	if err != nil || pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0x95 {
		t.Fatalf("MQTT 5 CONNECT over max_connect_size: %+v %v, want CONNACK 0x95", pk, err)
	}
	r4 := dialBytes(t, b.Address())
	r4.write(append(fixedHeader(0x10, 5000), 0, 4, 'M', 'Q', 'T', 'T', 4))
	r4.closedSilently()
	othersUnaffected(t, b, "other")
}

// invariant 13, limits.connect_timeout: a socket that sends no CONNECT, or
// only part of one, is closed with no reply once it runs out, and its
// slot comes back (max_connections 1: another client then connects).
func TestInvariant13_ConnectTimeoutClosesWithoutReply(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "connect_timeout: 1s", "max_connections: 1"))
	silent := dialBytes(t, b.Address())
	silent.closedSilently()
	half := dialBytes(t, b.Address())
	half.write(connectBytes(t, 5, "half")[:6])
	half.closedSilently()
	connectEventually(t, b, "after")
	slotsEventually(t, b, 0)
}

// slotsEventually waits for the broker to hold want connection slots and
// no overflow place: every end lets its slot go.
func slotsEventually(t *testing.T, b *brokertest.Broker, want int) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		st := b.AdmissionStats()
		if st.Slots == want && st.OverflowPlaces == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("admission holds %+v, want %d slots and no overflow place", st, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connectEventually connects id, retrying while the broker answers busy:
// a slot freed by another connection's end is given back as that end is
// processed, which the test cannot observe directly.
func connectEventually(t *testing.T, b *brokertest.Broker, id string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		c, err := brokertest.Dial(t, b.Address(), id, brokertest.ClientOptions{CleanStart: true})
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never connected: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// invariant 13, limits.max_connections: past it, a socket waits its turn
// and is then answered CONNACK 0x89 (3.1.1: 0x03) with credentials
// unchecked; the connected clients are served meanwhile; when one leaves,
// its slot is free for the next.
func TestInvariant13_MaxConnectionsAnswersServerBusy(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_connections: 2"))
	one := brokertest.Connect(t, b.Address(), "one", brokertest.ClientOptions{CleanStart: true})
	two := brokertest.Connect(t, b.Address(), "two", brokertest.ClientOptions{CleanStart: true})

	busy := func(v, want byte) {
		t.Helper()
		// An unadmitted socket whose CONNECT is not read within 100 ms is
		// closed with nothing, which is also right: a machine stalled that
		// long gets another try.
		var last error
		for range 5 {
			r := dialBytes(t, b.Address())
			r.write(connectBytes(t, v, "three"))
			pk, err := r.read(v)
			if err == nil {
				if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != want {
					t.Fatalf("third client at level %d: %+v, want CONNACK 0x%02x", v, pk, want)
				}
				return
			}
			last = err
		}
		t.Fatalf("third client at level %d never answered: %v", v, last)
	}
	busy(5, 0x89)
	busy(4, 0x03)
	if r, err := one.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("x")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("a connected client was disturbed: %v %+v", err, r)
	}
	slotsEventually(t, b, 2) // the refused sockets let theirs go
	two.Close()
	connectEventually(t, b, "three")
	one.Close()
	slotsEventually(t, b, 0)
	if !b.Log.Contains("limits.max_connections") {
		t.Fatal("no log line naming the limit")
	}
}

// invariant 13, limits.max_connect_rate: accepts past the rate wait (in
// the kernel's queue) instead of being refused. With 1 per second and a
// burst of 2, four connections cannot all be accepted within a second.
func TestInvariant13_MaxConnectRatePacesAccepts(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "max_connect_rate: 1"))
	start := time.Now()
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		c := brokertest.Connect(t, b.Address(), id, brokertest.ClientOptions{CleanStart: true})
		defer c.Close()
	}
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("four connections accepted in %v at 1 per second with a burst of 2", el)
	}
}

// invariant 13, limits.publish_rate: a client past its rate gets PUBACK
// 0x97 and keeps its connection; its QoS 0 past the rate is dropped; the
// budget follows its client id across a reconnect; another client is not
// charged. Time is the broker's injected clock.
func TestInvariant13_PublishRateRefusedQuotaExceeded(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, limitsWith(t, "publish_rate: 2"), brokertest.WithClock(clk))
	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("plain/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true, ProblemInfo: true})
	publish := func(c *brokertest.Client, topic string) byte {
		t.Helper()
		r, err := c.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte("x")})
		if r == nil {
			t.Fatalf("publish %s: %v", topic, err)
		}
		return r.ReasonCode
	}
	for _, topic := range []string{"plain/1", "plain/2"} {
		if code := publish(pub, topic); code != 0 {
			t.Fatalf("%s within the rate: 0x%02x", topic, code)
		}
	}
	if code := publish(pub, "plain/3"); code != 0x97 {
		t.Fatalf("past the rate: 0x%02x, want 0x97", code)
	}
	if _, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "plain/qos0", QoS: 0, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// Reconnecting under the same id does not refill the budget.
	pub.Close()
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := publish(pub, "plain/4"); code != 0x97 {
		t.Fatalf("after reconnecting: 0x%02x, want 0x97 (budget follows the client id)", code)
	}
	other := brokertest.Connect(t, b.Address(), "other", brokertest.ClientOptions{CleanStart: true})
	if code := publish(other, "plain/other"); code != 0 {
		t.Fatalf("another client was charged: 0x%02x", code)
	}
	clk.Advance(time.Second)
	if code := publish(pub, "plain/5"); code != 0 {
		t.Fatalf("a second later (connection left alone): 0x%02x", code)
	}
	if n := b.AdmissionStats().PublishRateRefused; n != 3 {
		t.Fatalf("%d refusals counted, want 3 (plain/3, the QoS 0, plain/4)", n)
	}
	for _, want := range []string{"plain/1", "plain/2", "plain/other", "plain/5"} {
		if got := sub.Next(wait); got.Topic != want {
			t.Fatalf("subscriber got %s, want %s (refused and dropped messages never delivered)", got.Topic, want)
		}
	}
}

// invariant 13, limits.publish_bytes: past the byte budget ⇒ 0x97; a
// message larger than the whole budget is admitted on a full budget and
// the client then waits out the deficit.
func TestInvariant13_PublishBytesRefusedQuotaExceeded(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, limitsWith(t, "publish_bytes: 1KiB"), brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publish := func(size int) byte {
		t.Helper()
		r, err := pub.Publish(&paho.Publish{Topic: "events/b", QoS: 1, Payload: make([]byte, size)})
		if r == nil {
			t.Fatalf("publish %d bytes: %v", size, err)
		}
		return r.ReasonCode
	}
	if code := publish(500); code != 0 {
		t.Fatalf("500 of 1KiB: 0x%02x", code)
	}
	if code := publish(600); code != 0x97 {
		t.Fatalf("600 more: 0x%02x, want 0x97", code)
	}
	clk.Advance(time.Second)
	if code := publish(5000); code != 0 {
		t.Fatalf("a message over the whole budget, budget full: 0x%02x, want admitted", code)
	}
	clk.Advance(2 * time.Second)
	if code := publish(10); code != 0x97 {
		t.Fatalf("still in deficit: 0x%02x, want 0x97", code)
	}
	clk.Advance(3 * time.Second)
	if code := publish(10); code != 0 {
		t.Fatalf("deficit paid back: 0x%02x", code)
	}
}

// invariant 13/16, limits.write_timeout none: no ceiling of its own, but a
// write is still bounded — by the client's keep-alive span (rfcs/limits.md).
// A subscriber that keeps sending PINGREQs (so its reads never time out)
// but never reads is cut once a write to it has waited that long; without
// a bound its writer would wait for ever. Other clients are served.
func TestInvariant13_WriteTimeoutNoneBoundedByKeepAlive(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "write_timeout: none"))
	conn := deafConn(t, b.Address())
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "deaf", Clean: true, Keepalive: 2}}
	_ = pk.ConnectEncode(&buf)
	sub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "plain/#", Qos: 0}}}
	_ = sub.SubscribeEncode(&buf)
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	for _, want := range []byte{packets.Connack, packets.Suback} {
		if got, err := brokertest.ReadPacket(r, 5); err != nil || got.FixedHeader.Type != want {
			t.Fatalf("deaf client handshake: %+v %v", got, err)
		}
	}
	// From here the client reads nothing.
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	payload := make([]byte, 32<<10)
	for i := range 40 {
		if _, err := pub.Publish(&paho.Publish{Topic: "plain/flood", QoS: 1, Payload: payload}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	ping := []byte{0xC0, 0}
	deadline := time.Now().Add(wait)
	for {
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(ping); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				break // the broker closed the connection
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("a client not taking writes was never disconnected under write_timeout none")
		}
		time.Sleep(250 * time.Millisecond)
	}
	othersUnaffected(t, b, "other")
}

// Shutdown closes a socket still short of its CONNECT at once, rather than
// waiting out its connect_timeout (docs/configuration.md "`broker.limits`").
func TestInvariant13_ShutdownClosesPreConnectSockets(t *testing.T) {
	b := brokertest.Start(t, limitsWith(t, "connect_timeout: 1h"))
	r := dialBytes(t, b.Address())
	r.write(connectBytes(t, 5, "never")[:4])
	// Make sure the broker has accepted it before shutting down.
	c := brokertest.Connect(t, b.Address(), "probe", brokertest.ClientOptions{CleanStart: true})
	c.Close()
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	_ = r.conn.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadAll(r.r); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("a pre-CONNECT socket outlived the shutdown")
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("shutdown held by a pre-CONNECT socket")
	}
}
