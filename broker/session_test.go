package broker_test

import (
	"strconv"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// Invariant 18: the close that answers a DISCONNECT tells the client that
// what it acknowledged is stored. A consumer acknowledges ten records, sends
// DISCONNECT, sees the broker close — and the broker is killed at once. On
// restart the consumer resumes at the eleventh, not earlier.
func TestInvariant18_CleanDisconnectStoresPositionBeforeTheClose(t *testing.T) {
	proc := brokertest.StartProcess(t, configWith(t, sqliteProvider))
	pub := brokertest.Connect(t, proc.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishN(t, pub, "events/x", 1, 20)

	c, _ := brokertest.DialRaw(t, proc.Address(), "reader", true, 3600)
	if sa := c.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	acked := 0
	for acked < 10 {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		off := userProp(pk, "saguin-offset")
		if off != strconv.Itoa(acked+1) {
			t.Fatalf("delivery %d has offset %s", acked+1, off)
		}
		c.Puback(pk.PacketID)
		acked++
	}
	c.Disconnect()
	proc.Kill()
	proc.Restart()

	c, _ = brokertest.DialRaw(t, proc.Address(), "reader", false, 3600)
	c.Subscribe(1, "events/#", 1)
	for {
		pk := c.Read()
		if pk.FixedHeader.Type == packets.Publish {
			if off := userProp(pk, "saguin-offset"); off != "11" {
				t.Fatalf("after a clean DISCONNECT and a kill the consumer resumed at %s, want 11", off)
			}
			return
		}
	}
}

func userProp(pk packets.Packet, key string) string {
	for _, u := range pk.Properties.User {
		if u.Key == key {
			return u.Val
		}
	}
	return ""
}
