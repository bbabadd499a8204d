package broker_test

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// hexBytes decodes "10 10 00 04 ..." (spaces ignored).
func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// issueConnect is the ordinary MQTT 5 CONNECT of issue 12 item 0: Clean
// Start, keep-alive 60, no properties, client id "zzz".
const issueConnect = "10 10 00 04 4d 51 54 54 05 02 00 3c 00 00 03 7a 7a 7a"

// connected5 dials, sends an MQTT 5 CONNECT for id and reads its CONNACK.
func connected5(t *testing.T, addr, id string) *rawConn {
	t.Helper()
	r := dialBytes(t, addr)
	r.write(connectBytes(t, 5, id))
	if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", pk, err)
	}
	return r
}

// connected311 is connected5 at MQTT 3.1.1.
func connected311(t *testing.T, addr, id string) *rawConn {
	t.Helper()
	r := dialBytes(t, addr)
	r.write(connectBytes(t, 4, id))
	if pk, err := r.read(4); err != nil || pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK %+v %v", pk, err)
	}
	return r
}

// disconnectedWith asserts the broker's next packet is DISCONNECT code and
// that the socket is closed after it.
func (c *rawConn) disconnectedWith(code byte) {
	c.t.Helper()
	pk, err := c.read(5)
	if err != nil || pk.FixedHeader.Type != packets.Disconnect || pk.ReasonCode != code {
		c.t.Fatalf("got %s, want DISCONNECT %#x", answered(pk, err), code)
	}
	c.closedSilently()
}

// answered names what the broker sent: a packet type and reason code, or
// the read's error.
func answered(pk packets.Packet, err error) string {
	if err != nil {
		return "no packet (" + err.Error() + ")"
	}
	return fmt.Sprintf("%s reason %#x", strings.ToUpper(packets.PacketNames[pk.FixedHeader.Type]), pk.ReasonCode)
}

// connackedWith asserts the broker answers an MQTT 5 CONNACK code and
// closes the socket.
func (c *rawConn) connackedWith(code byte) {
	c.t.Helper()
	pk, err := c.read(5)
	if err != nil || pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != code {
		c.t.Fatalf("got %s, want CONNACK %#x", answered(pk, err), code)
	}
	c.closedSilently()
}

// Issue 12 item 0: a SUBSCRIBE whose last filter has no options byte made
// the substrate's decoder index past the packet (a panic nothing recovered:
// the broker process exited 2). It is a Malformed Packet, refused before the
// substrate sees it, and every other client stays served.
func TestWire_SubscribeMissingOptionsByteIsMalformed(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	other := brokertest.Connect(t, b.Address(), "bystander", brokertest.ClientOptions{CleanStart: true})
	defer other.Close()
	for _, sub := range []string{
		"82 06 00 01 00 00 01 61",             // one filter "a", its options byte missing
		"82 0a 00 01 00 00 01 61 01 00 01 62", // the second filter's options byte missing
	} {
		r := dialBytes(t, b.Address())
		r.write(hexBytes(t, issueConnect))
		if pk, err := r.read(5); err != nil || pk.ReasonCode != 0 {
			t.Fatalf("CONNACK %+v %v", pk, err)
		}
		r.write(hexBytes(t, sub))
		r.disconnectedWith(0x81)
	}
	othersUnaffected(t, b, "after")
	if r, err := other.Publish(&paho.Publish{Topic: "events/still", QoS: 1, Payload: []byte("z")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("the bystander connected before the malformed packets: %v %+v", err, r)
	}
}

// The substrate's listener logged every connection's end as a WARN with an
// empty message (its error as the only key). A connection's end is one
// debug line that says what it is.
func TestWire_ConnectionEndIsOneDebugLine(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	r := connected5(t, b.Address(), "leaver")
	_ = r.conn.Close()
	deadline := time.Now().Add(wait)
	for !b.Log.Contains(`msg="connection ended"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var ended int
	for _, l := range strings.Split(b.Log.String(), "\n") {
		if strings.Contains(l, `msg=""`) {
			t.Fatalf("a log line with an empty message: %s", l)
		}
		if strings.Contains(l, `msg="connection ended"`) {
			ended++
			if !strings.Contains(l, "level=DEBUG") || !strings.Contains(l, "client=leaver") {
				t.Fatalf("the connection's end: %s", l)
			}
		}
	}
	if ended != 1 {
		t.Fatalf("%d connection-ended lines, want 1", ended)
	}
}
