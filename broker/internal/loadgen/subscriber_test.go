package loadgen

import (
	"bufio"
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// encodeWithPaho renders a PUBLISH with paho's encoder and splits off the
// fixed header, as the read loop does.
func encodeWithPaho(t *testing.T, p *packets.Publish) (byte, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := p.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(&buf)
	first, _ := r.ReadByte()
	n, err := readVBI(r)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, n)
	if _, err := r.Read(body); err != nil {
		t.Fatal(err)
	}
	return first, body
}

// The in-place decoder reads what paho's encoder writes, skipping every
// other PUBLISH property to reach the User Properties and the payload.
func TestDecodePublishMatchesPaho(t *testing.T) {
	expiry := uint32(60)
	format := byte(1)
	subID := 300
	p := &packets.Publish{
		QoS: 1, PacketID: 0xBEEF, Topic: "events/a/b", Payload: []byte("payload bytes"),
		Properties: &packets.Properties{
			PayloadFormat: &format, MessageExpiry: &expiry, ContentType: "text/plain",
			ResponseTopic: "r/t", CorrelationData: []byte{1, 2, 3}, SubscriptionIdentifier: &subID,
			User: []packets.User{{Key: PropOffset, Value: "42"}, {Key: PropID, Value: "id"}, {Key: PropOffset, Value: "shadowed"}},
		},
	}
	first, body := encodeWithPaho(t, p)
	var d delivery
	if err := decodePublish(first, body, &d); err != nil {
		t.Fatal(err)
	}
	if string(d.Topic) != "events/a/b" || d.QoS != 1 || d.PacketID != 0xBEEF || string(d.Payload) != "payload bytes" {
		t.Fatalf("decoded %q qos %d id %x payload %q", d.Topic, d.QoS, d.PacketID, d.Payload)
	}
	if string(d.Prop(PropOffset)) != "42" || string(d.Prop(PropID)) != "id" || d.Prop(PropTimestamp) != nil {
		t.Fatalf("properties %q", d.user)
	}

	// QoS 0 has no packet identifier.
	first, body = encodeWithPaho(t, &packets.Publish{Topic: "x", Payload: []byte("p"), Properties: &packets.Properties{}})
	if err := decodePublish(first, body, &d); err != nil || d.QoS != 0 || string(d.Payload) != "p" || len(d.user) != 0 {
		t.Fatalf("QoS 0: %v %+v", err, d)
	}
}

func TestDecodePublishRefusesMalformed(t *testing.T) {
	alias := uint16(3)
	first, body := encodeWithPaho(t, &packets.Publish{QoS: 1, PacketID: 1, Topic: "x", Properties: &packets.Properties{TopicAlias: &alias}})
	var d delivery
	if err := decodePublish(first, body, &d); err == nil || !strings.Contains(err.Error(), "Topic Alias") {
		t.Fatalf("topic alias accepted: %v", err)
	}
	first, body = encodeWithPaho(t, &packets.Publish{QoS: 1, PacketID: 1, Topic: "topic", Properties: &packets.Properties{
		User: []packets.User{{Key: "k", Value: "v"}}}})
	for cut := 1; cut < len(body)-1; cut++ {
		// Every truncation inside the header and properties is an error,
		// never a panic; cuts into the (empty) payload cannot be told apart.
		_ = decodePublish(first, body[:cut], &d)
	}
	if err := decodePublish(first, body[:3], &d); err == nil {
		t.Fatal("a truncated topic decoded")
	}
	if err := decodePublish(2<<1|packets.PUBLISH<<4, body, &d); err == nil {
		t.Fatal("a QoS 2 PUBLISH accepted on a subscription of at most QoS 1")
	}
	bad := append([]byte(nil), body...)
	// Replace the User Property identifier with one that is no PUBLISH
	// property (0x11, Session Expiry Interval).
	i := bytes.IndexByte(bad, 0x26)
	bad[i] = 0x11
	if err := decodePublish(first, bad, &d); err == nil || !strings.Contains(err.Error(), "not a PUBLISH property") {
		t.Fatalf("foreign property accepted: %v", err)
	}
}

func TestVBI(t *testing.T) {
	for _, n := range []int{0, 127, 128, 16383, 16384, 2097151, 2097152, 268435455} {
		var buf bytes.Buffer
		x := n
		for {
			b := byte(x % 128)
			x /= 128
			if x > 0 {
				b |= 0x80
			}
			buf.WriteByte(b)
			if x == 0 {
				break
			}
		}
		enc := buf.Bytes()
		got, err := readVBI(bufio.NewReader(bytes.NewReader(enc)))
		if err != nil || got != n {
			t.Fatalf("readVBI(%d) = %d, %v", n, got, err)
		}
		got, l, err := vbiFrom(enc)
		if err != nil || got != n || l != len(enc) {
			t.Fatalf("vbiFrom(%d) = %d, %d, %v", n, got, l, err)
		}
	}
	five := []byte{0x80, 0x80, 0x80, 0x80, 0x01}
	if _, err := readVBI(bufio.NewReader(bytes.NewReader(five))); err == nil {
		t.Fatal("a five-byte variable byte integer was read")
	}
	if _, _, err := vbiFrom(five); err == nil {
		t.Fatal("a five-byte variable byte integer was decoded")
	}
}

func TestAckBatch(t *testing.T) {
	for rm, want := range map[uint16]int{1: 1, 3: 1, 8: 2, 16: 4, 64: 8, 1024: 8, 0: 8} {
		if got := ackBatch(rm); got != want {
			t.Errorf("ackBatch(%d) = %d, want %d", rm, got, want)
		}
	}
}

// fakeBroker accepts one connection, answers CONNECT and SUBSCRIBE, then
// writes raw and leaves the connection open until the test ends.
func fakeBroker(t *testing.T, raw []byte) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 1)
	t.Cleanup(func() {
		_ = l.Close()
		select {
		case c := <-conns:
			_ = c.Close()
		default:
		}
	})
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		conns <- c
		r := bufio.NewReader(c)
		if _, err := packets.ReadPacket(r); err != nil {
			return
		}
		ca := packets.NewControlPacket(packets.CONNACK)
		ca.Content.(*packets.Connack).Properties = &packets.Properties{}
		_, _ = ca.WriteTo(c)
		sp, err := packets.ReadPacket(r)
		if err != nil {
			return
		}
		sa := packets.NewControlPacket(packets.SUBACK)
		sa.Content.(*packets.Suback).PacketID = sp.Content.(*packets.Subscribe).PacketID
		sa.Content.(*packets.Suback).Reasons = []byte{1}
		sa.Content.(*packets.Suback).Properties = &packets.Properties{}
		_, _ = sa.WriteTo(c)
		_, _ = c.Write(raw)
	}()
	return l.Addr().String()
}

// A packet declaring more than the Maximum Packet Size the subscriber
// announced ends the connection before any buffer is sized for it.
func TestInvariant13_SubscriberBoundsPacketSize(t *testing.T) {
	// PUBLISH QoS 1 declaring 268,435,455 bytes (the largest MQTT length).
	addr := fakeBroker(t, []byte{packets.PUBLISH<<4 | 2, 0xff, 0xff, 0xff, 0x7f})
	s, _, err := dialSubscriber(testCtx(t), addr, subscriberOptions{ClientID: "big", CleanStart: true, Filter: "x/#", QoS: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the subscriber kept reading a packet over its Maximum Packet Size")
	}
	if s.err == nil || !strings.Contains(s.err.Error(), "over the Maximum Packet Size") {
		t.Fatalf("ended with %v", s.err)
	}
}
