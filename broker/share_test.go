package broker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// Shared groups on broadcast with every member away (rfcs/broadcast-log.md,
// rfcs/broadcast-log.md): QoS 1/2 waits in the group's backlog behind its
// cursor, survives a restart on the session provider, and is served to the
// first member back in publish order.
func TestSharedGroupBacklogServedToFirstMemberBackAcrossRestart(t *testing.T) {
	for _, prov := range bcastProviders {
		t.Run(prov.name, func(t *testing.T) {
			b := bcastBroker(t, bcastOpts{provider: prov.cfg})
			for _, id := range []string{"m1", "m2"} {
				c, _ := brokertest.DialRaw(t, b.Address(), id, true, 3600)
				c.Subscribe(1, "$share/g/jobs/#", 1)
				c.Disconnect()
			}
			publishBroadcast(t, b.Address(), "jobs/a", "j", 1, 10, 1)
			if n := b.BroadcastStats().NoSharedMember; n != 0 {
				t.Fatalf("%d counted no_shared_member with members whose sessions are kept", n)
			}
			b.Restart()
			m2, ack := brokertest.DialRaw(t, b.Address(), "m2", false, 3600)
			if !ack.SessionPresent {
				t.Fatal("member session not kept across the restart")
			}
			got := readPublishes(t, m2, 10)
			for _, pk := range got {
				m2.Puback(pk.PacketID)
			}
			if w := want("j", 1, 10); !sameStrings(payloads(got), w) {
				t.Fatalf("first member back got %v\nwant %v", payloads(got), w)
			}
			m1, _ := brokertest.DialRaw(t, b.Address(), "m1", false, 3600)
			if pk, err := m1.ReadWithin(300 * time.Millisecond); err == nil {
				t.Fatalf("the second member back got %q too", pk.Payload)
			}
			// A new message while members are connected goes to one of them.
			publishBroadcast(t, b.Address(), "jobs/a", "k", 1, 1, 1)
			pk, err := m2.ReadWithin(300 * time.Millisecond)
			if err != nil {
				pk, err = m1.ReadWithin(2 * time.Second)
			}
			if err != nil || string(pk.Payload) != "k 1" {
				t.Fatalf("live message after the backlog: %v %v", pk.Payload, err)
			}
		})
	}
}

// A group none of whose members' sessions outlives its connection holds
// nothing: with its one member connected but without room (it acknowledges
// nothing, so half of limits.session_queue_bytes on the wire and half
// waiting fill up), QoS 1 is dropped and counted no_shared_member, and
// nothing is written to the broadcast log.
func TestSharedGroupWithoutDurableMemberDrops(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider, queue: "64KiB"})
	eph, _ := brokertest.DialRaw(t, b.Address(), "eph", true, 0)
	eph.Subscribe(1, "$share/g/jobs/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := 1; i <= 60; i++ {
		payload := fmt.Sprintf("d %d %0*d", i, 2000, 0)
		if _, err := pub.Publish(&paho.Publish{Topic: "jobs/a", QoS: 1, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.BroadcastStats().NoSharedMember; n == 0 {
		t.Fatal("nothing counted no_shared_member with the only member full")
	}
	if next, _, _ := b.BroadcastLog(); next != 1 {
		t.Fatalf("log written (next %d) for a group with no durable member", next)
	}
}

// broker.share.expires_after: a backlog no member came back for within it is
// dropped, counted; the member returning later is served nothing.
func TestSharedGroupBacklogExpires(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := bcastBroker(t, bcastOpts{provider: memoryProvider, expires: "60s"}, brokertest.WithClock(clk))
	m, _ := brokertest.DialRaw(t, b.Address(), "m", true, 3600)
	m.Subscribe(1, "$share/g/jobs/#", 1)
	m.Disconnect()
	publishBroadcast(t, b.Address(), "jobs/a", "e", 1, 5, 1)
	clk.Advance(30 * time.Second)
	if n := b.BroadcastStats().ShareExpired; n != 0 {
		t.Fatalf("backlog expired after 30s of 60s: %d", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.BroadcastStats().ShareExpired != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("ShareExpired %d, want 5", b.BroadcastStats().ShareExpired)
		}
		clk.Advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
	m, _ = brokertest.DialRaw(t, b.Address(), "m", false, 3600)
	if pk, err := m.ReadWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("expired backlog served: %q", pk.Payload)
	}
	// The log lets go of what only the expired backlog needed.
	next, _, _ := b.BroadcastLog()
	for {
		clk.Advance(time.Second)
		if _, floor, _ := b.BroadcastLog(); floor == next {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("log not trimmed after the backlog expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A member session ending with unacknowledged QoS 1 the group handed it:
// those go back to the group, ahead of anything newer, and reach another
// member (MQTT 5 §4.8.2).
func TestSharedGroupMemberEndingHandsQoS1Back(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	keeper, _ := brokertest.DialRaw(t, b.Address(), "keeper", true, 3600)
	keeper.Subscribe(1, "$share/g/jobs/#", 1)
	keeper.Disconnect()
	// A member whose session ends with its connection, connected: it is
	// handed everything and acknowledges nothing.
	eph, _ := brokertest.DialRaw(t, b.Address(), "eph", true, 0)
	eph.Subscribe(1, "$share/g/jobs/#", 1)
	publishBroadcast(t, b.Address(), "jobs/a", "h", 1, 4, 1)
	if got := readPublishes(t, eph, 4); !sameStrings(payloads(got), want("h", 1, 4)) {
		t.Fatalf("connected member got %v", payloads(got))
	}
	eph.Drop() // its session ends
	publishBroadcast(t, b.Address(), "jobs/a", "h", 5, 1, 1)
	keeper, _ = brokertest.DialRaw(t, b.Address(), "keeper", false, 3600)
	got := readPublishes(t, keeper, 5)
	for _, pk := range got {
		keeper.Puback(pk.PacketID)
	}
	if w := want("h", 1, 5); !sameStrings(payloads(got), w) {
		t.Fatalf("the remaining member got %v\nwant %v", payloads(got), w)
	}
}

// QoS 2 a member had not PUBREC'd when its session ended is never given to
// another member (MQTT-4.8.2-5): dropped, counted member_ended.
func TestSharedGroupMemberEndingDropsQoS2(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	keeper, _ := brokertest.DialRaw(t, b.Address(), "keeper", true, 3600)
	keeper.Subscribe(1, "$share/g/jobs/#", 2)
	keeper.Disconnect()
	eph, _ := brokertest.DialRaw(t, b.Address(), "eph", true, 0)
	eph.Subscribe(1, "$share/g/jobs/#", 2)
	publishBroadcast(t, b.Address(), "jobs/a", "q", 1, 2, 2)
	readPublishes(t, eph, 2)
	eph.Drop()
	deadline := time.Now().Add(10 * time.Second)
	for b.BroadcastStats().MemberEnded != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("MemberEnded %d, want 2", b.BroadcastStats().MemberEnded)
		}
		time.Sleep(10 * time.Millisecond)
	}
	keeper, _ = brokertest.DialRaw(t, b.Address(), "keeper", false, 3600)
	if pk, err := keeper.ReadWithin(300 * time.Millisecond); err == nil && pk.FixedHeader.Type == packets.Publish {
		t.Fatalf("QoS 2 handed to a second member: %q", pk.Payload)
	}
}

// Invariant 13: a group's backlog is bounded by limits.session_queue_bytes,
// the oldest given up and counted.
func TestInvariant13_SharedBacklogBounded(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: memoryProvider, queue: "64KiB"})
	m, _ := brokertest.DialRaw(t, b.Address(), "m", true, 3600)
	m.Subscribe(1, "$share/g/big/#", 1)
	m.Disconnect()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 100
	for i := 1; i <= n; i++ {
		payload := fmt.Sprintf("b %d %0*d", i, 2000, 0)
		if _, err := pub.Publish(&paho.Publish{Topic: "big/a", QoS: 1, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	dropped := b.BroadcastStats().ShareBacklogFull
	if dropped == 0 {
		t.Fatal("backlog not bounded")
	}
	m, _ = brokertest.DialRaw(t, b.Address(), "m", false, 3600)
	var got []int
	for {
		pk, err := m.ReadWithin(500 * time.Millisecond)
		if err != nil {
			break
		}
		var i int
		fmt.Sscanf(string(pk.Payload), "b %d", &i)
		got = append(got, i)
		m.Puback(pk.PacketID)
	}
	if int64(len(got))+dropped != n || got[len(got)-1] != n {
		t.Fatalf("served %d (last %v) + dropped %d != %d", len(got), got[len(got)-1:], dropped, n)
	}
}
