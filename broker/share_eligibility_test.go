package broker_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// memberConnect is a raw MQTT 5 member with its own Receive Maximum and
// Maximum Packet Size, subscribed to filter at QoS 1.
func memberConnect(t *testing.T, addr, id, filter string, receiveMax uint16, maxPacket uint32) *brokertest.RawClient {
	t.Helper()
	c, ack := brokertest.DialConnect(t, addr, packets.Packet{
		Connect:    packets.ConnectParams{ClientIdentifier: id, Clean: true, Keepalive: 60},
		Properties: packets.Properties{ReceiveMaximum: receiveMax, MaximumPacketSize: maxPacket},
	})
	if ack.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK 0x%02x", id, ack.ReasonCode)
	}
	if sa := c.Subscribe(1, filter, 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("%s: SUBACK %v", id, sa.ReasonCodes)
	}
	return c
}

// countPublishes reads what c is sent within d (acknowledging nothing).
func countPublishes(c *brokertest.RawClient, d time.Duration) int {
	n := 0
	for {
		pk, err := c.ReadWithin(d)
		if err != nil {
			return n
		}
		if pk.FixedHeader.Type == packets.Publish {
			n++
		}
	}
}

// docs/channels.md "Shared subscriptions": a shared group
// hands a message only to a member it fits — one whose Maximum Packet Size
// it is over is passed over, not disconnected, and nothing is dropped or
// counted; the member it fits takes every one.
func TestSharedGroupPassesOverAMemberAMessageDoesNotFit(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	small := memberConnect(t, b.Address(), "small", "$share/g/big/#", 0, 256)
	large := brokertest.Connect(t, b.Address(), "large", brokertest.ClientOptions{CleanStart: true})
	large.Subscribe("$share/g/big/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	payload := bytes.Repeat([]byte("x"), 1000)
	for i := range 6 {
		if _, err := pub.Publish(&paho.Publish{Topic: fmt.Sprintf("big/%d", i), QoS: 1, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if p := large.Next(wait); len(p.Payload) != 1000 {
			t.Fatalf("message %d to the member it fits: %d bytes", i, len(p.Payload))
		}
	}
	if n := countPublishes(small, 300*time.Millisecond); n != 0 {
		t.Fatalf("the member with Maximum Packet Size 256 was sent %d messages of 1,000 bytes", n)
	}
	if st := b.BroadcastStats(); st.TooLarge != 0 || st.NoSharedMember != 0 {
		t.Fatalf("passing a member over was counted: %+v", st)
	}
	// Still connected, and served what fits it.
	for i := range 4 {
		if _, err := pub.Publish(&paho.Publish{Topic: fmt.Sprintf("big/s%d", i), QoS: 1, Payload: []byte("s")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := countPublishes(small, 500*time.Millisecond); n == 0 {
		t.Fatal("the small member was not served the small messages its turn gave it")
	}
}

// docs/channels.md "Shared subscriptions" "Delivery": at QoS 1/2 a member is eligible only
// with Receive Maximum room. One that holds its only slot unacknowledged is
// passed over, so the group's other member takes the rest at once instead
// of them waiting behind the slow one.
func TestSharedGroupPassesOverAMemberWithoutReceiveMaximumRoom(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	slow := memberConnect(t, b.Address(), "a-slow", "$share/g/work/#", 1, 0)
	fast := brokertest.Connect(t, b.Address(), "b-fast", brokertest.ClientOptions{CleanStart: true})
	fast.Subscribe("$share/g/work/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := range 6 {
		if _, err := pub.Publish(&paho.Publish{Topic: fmt.Sprintf("work/%d", i), QoS: 1, Payload: []byte("w")}); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for got < 5 {
		fast.Next(wait)
		got++
	}
	if n := countPublishes(slow, 300*time.Millisecond); n != 1 {
		t.Fatalf("the member with Receive Maximum 1, acknowledging nothing, was sent %d messages, want 1", n)
	}
	fast.Quiet(200 * time.Millisecond)
}

// MQTT 5 §4.8.2 and rfcs/broadcast-log.md, across a crash: a group's message
// on the wire to a member that had not acknowledged it comes back to that
// member (resent, DUP, from its window) and to no other — the group's
// stored cursor stays at it until it is acknowledged, and a restart does
// not put what a member's window carries back in the group's backlog.
func TestInvariant15_SharedDeliveryOnTheWireReturnsToItsMemberOnlyAfterAKill(t *testing.T) {
	proc := brokertest.StartProcess(t, configWith(t, sqliteProvider))
	durable := func(id string, clean bool) (*brokertest.RawClient, packets.Packet) {
		return brokertest.DialConnect(t, proc.Address(), packets.Packet{
			Connect:    packets.ConnectParams{ClientIdentifier: id, Clean: clean, Keepalive: 60},
			Properties: packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true},
		})
	}
	a, _ := durable("a-holder", true)
	if sa := a.Subscribe(1, "$share/g/job/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("a: SUBACK %v", sa.ReasonCodes)
	}
	bm, _ := durable("b-other", true)
	if sa := bm.Subscribe(1, "$share/g/job/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("b: SUBACK %v", sa.ReasonCodes)
	}
	bm.Disconnect() // away: a is the only member connected
	pub := brokertest.Connect(t, proc.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if _, err := pub.Publish(&paho.Publish{Topic: "job/1", QoS: 1, Payload: []byte("one")}); err != nil {
		t.Fatal(err)
	}
	pk, err := a.ReadWithin(wait)
	if err != nil || pk.FixedHeader.Type != packets.Publish || string(pk.Payload) != "one" {
		t.Fatalf("a was not handed job/1: %v %v", pk.FixedHeader.Type, err)
	}
	time.Sleep(time.Second) // past ack_commit_interval: the cursor and a's window are stored
	proc.Kill()
	proc.Restart()

	bm, ack := durable("b-other", false)
	if !ack.SessionPresent {
		t.Fatal("b's session did not come back")
	}
	if n := countPublishes(bm, 700*time.Millisecond); n != 0 {
		t.Fatalf("the other member was handed %d message(s) the first one's window carries", n)
	}
	a, ack = durable("a-holder", false)
	if !ack.SessionPresent {
		t.Fatal("a's session did not come back")
	}
	pk, err = a.ReadWithin(wait)
	if err != nil || pk.FixedHeader.Type != packets.Publish || string(pk.Payload) != "one" || !pk.FixedHeader.Dup {
		t.Fatalf("a after the restart: type %v payload %q dup %v, %v; want job/1 resent with DUP",
			pk.FixedHeader.Type, pk.Payload, pk.FixedHeader.Dup, err)
	}
}
