package broker_test

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Invariant 16 at every QoS a broadcast is delivered at: a grant withdrawn
// after SUBSCRIBE stops a QoS 0 and a QoS 2 delivery as it stops a QoS 1
// one (TestInvariant16_RefusedDeliveryStopsEveryRoute). The permission is
// asked of each delivery before it is written, not only of those that take
// a packet identifier: a QoS 0 message reserves nothing, so a check placed
// with the reservation would let it through. The refused message is let
// go, never sent later; the next one, published once the grant is back, is
// the first the subscriber receives. A shared group's QoS 0 message goes to
// the member that may take it.
func TestInvariant16_RefusedBroadcastAtEveryQoS(t *testing.T) {
	for _, qos := range []byte{0, 1, 2} {
		t.Run(fmt.Sprintf("broadcast QoS %d", qos), func(t *testing.T) {
			b, g := startPermitBroker(t)
			sub, _ := dialMx(t, b.Address(), "listener", mxConnect{clean: true})
			sub.subscribe(1, "news/#", qos)
			g.set(b, map[string]string{"listener": ""})
			pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
			publishAt(pub, 1, qos, "n1")
			g.waitRefused(t, "broadcast", "listener", 1)
			nothingSent(t, sub, "the broadcast was refused")
			g.set(b, nil)
			publishAt(pub, 2, qos, "n2")
			pk := sub.nextPublish("the broadcast published once the grant is back")
			if string(pk.Payload) != "n2" || pk.FixedHeader.Qos != qos {
				t.Fatalf("delivered %q at QoS %d first, want n2 at QoS %d: n1 was refused, and a refused broadcast is not sent",
					pk.Payload, pk.FixedHeader.Qos, qos)
			}
		})
	}

	t.Run("shared QoS 0", func(t *testing.T) {
		b, g := startPermitBroker(t)
		g.set(b, map[string]string{"m-a": ""})
		ma, _ := dialMx(t, b.Address(), "m-a", mxConnect{clean: true})
		ma.subscribe(1, "$share/g/news/#", 0)
		mb, _ := dialMx(t, b.Address(), "m-b", mxConnect{clean: true})
		mb.subscribe(1, "$share/g/news/#", 0)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		for i := 1; i <= 4; i++ {
			publishAt(pub, uint16(i), 0, fmt.Sprintf("s%d", i))
		}
		for i := 1; i <= 4; i++ {
			pk := mb.nextPublish("the group's message, passed over the refused member")
			if want := fmt.Sprintf("s%d", i); string(pk.Payload) != want {
				t.Fatalf("m-b was handed %q, want %q: every message goes to the member that may take it", pk.Payload, want)
			}
		}
		g.waitRefused(t, "shared", "m-a", 1)
		nothingSent(t, ma, "the refused member")
	})
}

// publishAt publishes payload on news/a at qos and completes its exchange,
// so the broker has the message before the test goes on.
func publishAt(c *mxConn, id uint16, qos byte, payload string) {
	c.t.Helper()
	switch qos {
	case 0:
		c.publish(id, 0, "news/a", []byte(payload), packets.Properties{})
		// The PINGRESP, read in order after the PUBLISH: the broker has it.
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}, ProtocolVersion: 5},
			(*packets.Packet).PingreqEncode)
		c.expect(packets.Pingresp, "PINGRESP after the QoS 0 publish of "+payload)
	case 1:
		c.publish1(id, "news/a", payload, packets.Properties{})
	case 2:
		c.publish(id, 2, "news/a", []byte(payload), packets.Properties{})
		c.expect(packets.Pubrec, "PUBREC for "+payload)
		c.pubrel(id)
		c.expect(packets.Pubcomp, "PUBCOMP for "+payload)
	}
}
