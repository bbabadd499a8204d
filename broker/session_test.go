package broker_test

import (
	"strconv"
	"testing"
	"time"

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

	// The session survived the kill (Session Present 1) with its
	// subscription: the consumer resumes without subscribing again.
	c, connack := brokertest.DialRaw(t, proc.Address(), "reader", false, 3600)
	if !connack.SessionPresent {
		t.Fatal("the durable session did not survive the kill")
	}
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

// A consumer that leaves with a clean DISCONNECT while deliveries are still
// unacknowledged resumes from its position, and gets each of those records
// once: the substrate must not also resend its own copies (with DUP) of the
// deliveries the pump makes again. Found by the chaos harness
// (append-duplicate).
func TestResumedConsumerGetsEachUnackedRecordOnce(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishN(t, pub, "events/x", 1, 10)

	c, _ := brokertest.DialRaw(t, b.Address(), "reader", true, 3600)
	c.Subscribe(1, "events/#", 1)
	seen := 0
	for seen < 10 {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		seen++
		if seen <= 3 {
			c.Puback(pk.PacketID) // 1–3 acknowledged, 4–10 left in flight
		}
	}
	c.Disconnect()

	c, connack := brokertest.DialRaw(t, b.Address(), "reader", false, 3600)
	if !connack.SessionPresent {
		t.Fatal("the session did not carry over")
	}
	count := map[string]int{}
	for {
		pk, err := c.ReadWithin(time.Second)
		if err != nil {
			break // quiet: everything the resume sends has come
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		count[userProp(pk, "saguin-offset")]++
		c.Puback(pk.PacketID)
	}
	for off := 4; off <= 10; off++ {
		if n := count[strconv.Itoa(off)]; n != 1 {
			t.Errorf("offset %d delivered %d times after the resume, want once (all: %v)", off, n, count)
		}
	}
	for off := 1; off <= 3; off++ {
		if n := count[strconv.Itoa(off)]; n != 0 {
			t.Errorf("acknowledged offset %d delivered again after the resume", off)
		}
	}
}
