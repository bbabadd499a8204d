package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// A PUBREL the broker refuses — the release refused for room (DISCONNECT
// 0x97), the release the store failed (0x83), a late one (PUBCOMP 0x92) —
// is answered once, by the broker, and the substrate never goes on to act
// on it: its own PUBREL handling would store a PUBCOMP 0x00 for the packet
// id and write it (now, or on the resumed session), telling the client an
// exchange is complete whose message was never released (invariant 18).

// pubrelDial connects a client at the protocol level given with a
// session that outlives the connection (MQTT 5: 300 s; 3.1.1: Clean
// Session 0), and returns it and its CONNACK's Session Present.
func pubrelDial(t *testing.T, addr string, version byte, props packets.Properties) (*wireConn, bool) {
	t.Helper()
	c, ack, err := dialAt(t, addr, wireConnect{version: version, id: "pub", durable: true, props: props})
	if err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v, %v", ack, err)
	}
	return c, ack.SessionPresent
}

// expectNext reads the broker's next packet and checks its type, and for
// an acknowledgement its packet id and reason code.
func (c *wireConn) expectNext(what string, typ byte, pid uint16, code byte) {
	c.t.Helper()
	pk, err := c.next(wait)
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	if pk.FixedHeader.Type != typ || (typ != packets.Disconnect && pk.PacketID != pid) || pk.ReasonCode != code {
		c.t.Fatalf("%s: got packet type %d id %d reason 0x%02x (%s), want type %d id %d reason 0x%02x",
			what, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString, typ, pid, code)
	}
}

// expectClosed asserts that the broker closes the connection with nothing
// more written: no PUBCOMP after the refusal.
func (c *wireConn) expectClosed(what string) {
	c.t.Helper()
	pk, err := c.next(wait)
	if err == nil {
		c.t.Fatalf("%s: a packet followed the refusal: type %d id %d reason 0x%02x", what,
			pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
	}
	if !closedErr(err) {
		c.t.Fatalf("%s: the connection was not closed: %v", what, err)
	}
}

// noPubcompBeforePong sends PINGREQ on a resumed session and reads up to
// its PINGRESP: whatever the broker re-sends first may be the exchange's
// PUBREC again, never a PUBCOMP — the exchange is not complete.
func (c *wireConn) noPubcompBeforePong(what string) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	for {
		pk, err := c.next(wait)
		if err != nil {
			c.t.Fatalf("%s: waiting for PINGRESP: %v", what, err)
		}
		switch pk.FixedHeader.Type {
		case packets.Pingresp:
			return
		case packets.Pubrec:
			continue
		}
		c.t.Fatalf("%s: packet type %d id %d reason 0x%02x written on the resumed session, want none before PINGRESP"+
			" (a PUBCOMP here tells the client a refused release completed)",
			what, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode)
	}
}

func (c *wireConn) publish2(pid uint16, topic, payload string) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, PacketID: pid,
		TopicName: topic, Payload: []byte(payload)})
}

func (c *wireConn) pubrel(pid uint16) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: pid})
}

// fillEvents publishes payload at QoS 1 to events/a until the channel
// refuses one (0x97) and returns how many it took.
func fillEvents(t *testing.T, addr, payload string) int {
	t.Helper()
	for filled := 0; ; filled++ {
		if filled > 10 {
			t.Fatal("the channel never filled")
		}
		p := brokertest.Connect(t, addr, "", brokertest.ClientOptions{CleanStart: true})
		resp, err := p.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte(payload)})
		p.Close()
		if resp != nil && resp.ReasonCode == 0x97 {
			return filled
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// heldOnce reads the events channel from its start up to a marker
// published last, and asserts the held payload is in it exactly once.
func heldOnce(t *testing.T, addr, held string) {
	t.Helper()
	qos1(t, addr, "events/a", "marker", 0x00)
	sub := brokertest.Connect(t, addr, "reader", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("events/#", 1)
	n := 0
	for {
		p, _ := nextRecord(t, sub)
		if p == "marker" {
			break
		}
		if p == held {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the released publish is in the channel %d times, want once", n)
	}
}

// TestInvariant18_PubrelRefusedForRoomIsNeverCompleted: a PUBREL whose
// release the full channel refuses is answered DISCONNECT 0x97 (3.1.1:
// the close), nothing after it; the resumed session is written no PUBCOMP
// for it; once retention made room the PUBREL sent again releases the
// publish exactly once.
func TestInvariant18_PubrelRefusedForRoomIsNeverCompleted(t *testing.T) {
	for _, pv := range qos2Providers {
		for _, version := range []byte{5, 4} {
			t.Run(pv.name+"/"+map[byte]string{5: "mqtt5", 4: "mqtt311"}[version], func(t *testing.T) {
				clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
				cfg := qos2ConfigWith(t, pv.provider, "    max_bytes: 2KiB\n    retention_bytes: 1KiB")
				b := brokertest.Start(t, cfg, brokertest.WithClock(clk))
				pub, _ := pubrelDial(t, b.Address(), version, packets.Properties{})
				held := strings.Repeat("h", 450)
				pub.publish2(1, "events/a", held)
				pub.expectNext("PUBREC", packets.Pubrec, 1, 0x00)
				fillEvents(t, b.Address(), strings.Repeat("x", 400))

				pub.pubrel(1)
				if version == 5 {
					pub.expectNext("release into a full channel", packets.Disconnect, 0, 0x97)
				}
				pub.expectClosed("release into a full channel")
				if s := b.QoS2Stats(); s.Held != 1 || s.Abandoned != 0 {
					t.Fatalf("QoS2Stats = %+v, want the hold kept", s)
				}

				pub, present := pubrelDial(t, b.Address(), version, packets.Properties{})
				if !present {
					t.Fatal("the session with the hold did not come back (Session Present 0)")
				}
				pub.noPubcompBeforePong("after the refused release")
				if s := b.QoS2Stats(); s.Held != 1 {
					t.Fatalf("QoS2Stats after the reconnect = %+v, want the hold kept", s)
				}

				// The size sweep runs on the broker's clock: room is made
				// now, and not before.
				deadline := time.Now().Add(wait)
				for !b.Log.Contains("retention removed records") {
					if time.Now().After(deadline) {
						t.Fatal("the size sweep never trimmed the channel")
					}
					clk.Advance(time.Second)
					time.Sleep(10 * time.Millisecond)
				}
				pub.pubrel(1)
				pub.expectNext("PUBREL re-sent once there is room", packets.Pubcomp, 1, 0x00)
				pub.quietThenPong("after the release")
				if version == 5 {
					pub.pubrel(1)
					pub.expectNext("PUBREL after the completion", packets.Pubcomp, 1, 0x92)
				}
				if s := b.QoS2Stats(); s.Held != 0 || s.Abandoned != 0 {
					t.Fatalf("QoS2Stats = %+v, want nothing held or abandoned", s)
				}
				heldOnce(t, b.Address(), held)
			})
		}
	}
}

// TestInvariant18_PubrelWhoseReleaseFailedIsNeverCompleted: a release the
// store fails is answered DISCONNECT 0x83 and nothing after it; the hold
// stays, the resumed session is written no PUBCOMP for it, and the PUBREL
// sent again once the store works releases it exactly once.
func TestInvariant18_PubrelWhoseReleaseFailedIsNeverCompleted(t *testing.T) {
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			b := brokertest.Start(t, qos2ConfigWith(t, pv.provider, ""))
			pub, _ := pubrelDial(t, b.Address(), 5, packets.Properties{})
			pub.publish2(1, "events/a", "held")
			pub.expectNext("PUBREC", packets.Pubrec, 1, 0x00)
			b.RefuseReleases("main", 1)

			pub.pubrel(1)
			pub.expectNext("a release the store fails", packets.Disconnect, 0, 0x83)
			pub.expectClosed("a release the store fails")
			if s := b.QoS2Stats(); s.Held != 1 || s.Abandoned != 0 {
				t.Fatalf("QoS2Stats = %+v, want the hold kept", s)
			}

			pub, present := pubrelDial(t, b.Address(), 5, packets.Properties{})
			if !present {
				t.Fatal("the session with the hold did not come back (Session Present 0)")
			}
			pub.noPubcompBeforePong("after the failed release")
			pub.pubrel(1)
			pub.expectNext("PUBREL re-sent", packets.Pubcomp, 1, 0x00)
			pub.pubrel(1)
			pub.expectNext("PUBREL after the completion", packets.Pubcomp, 1, 0x92)
			heldOnce(t, b.Address(), "held")
		})
	}
	// A broadcast QoS 2 publish is held in the broadcast log's store until
	// its PUBREL too (rfcs/qos2-holds.md): a failed release delivers nothing, and
	// the one that succeeds later delivers it once.
	t.Run("broadcast", func(t *testing.T) {
		b := brokertest.Start(t, qos2ConfigWith(t, sqliteProvider, ""))
		sub := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
		sub.Subscribe("elsewhere/#", 1)
		pub, _ := pubrelDial(t, b.Address(), 5, packets.Properties{})
		pub.publish2(1, "elsewhere/x", "held")
		pub.expectNext("PUBREC", packets.Pubrec, 1, 0x00)
		b.RefuseReleases("main", 1)
		pub.pubrel(1)
		pub.expectNext("a release the store fails", packets.Disconnect, 0, 0x83)
		pub.expectClosed("a release the store fails")
		pub, present := pubrelDial(t, b.Address(), 5, packets.Properties{})
		if !present {
			t.Fatal("the session with the hold did not come back (Session Present 0)")
		}
		pub.noPubcompBeforePong("after the failed release")
		pub.pubrel(1)
		pub.expectNext("PUBREL re-sent", packets.Pubcomp, 1, 0x00)
		pub.pubrel(1)
		pub.expectNext("PUBREL after the completion", packets.Pubcomp, 1, 0x92)
		qos1(t, b.Address(), "elsewhere/x", "marker", 0x00)
		firstIs(t, sub, "held")
		firstIs(t, sub, "marker")
	})
}

// TestInvariant18_LatePubrelIsAnsweredOnce: a PUBREL past
// broker.qos2.expires_after is answered PUBCOMP 0x92 exactly once — also
// to a client whose Maximum Packet Size leaves no room for the Reason
// String (MQTT 5 §3.7.2.2.2: the broker leaves it out; it does not fail
// the write and let the substrate answer the PUBREL a second time).
// Nothing reaches the channel.
func TestInvariant18_LatePubrelIsAnsweredOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		props packets.Properties
	}{
		{"any packet size", packets.Properties{}},
		{"maximum packet size 16", packets.Properties{MaximumPacketSize: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
			b := brokertest.Start(t, qos2ConfigWith(t, sqliteProvider, ""), brokertest.WithClock(clk))
			pub, _ := pubrelDial(t, b.Address(), 5, tc.props)
			pub.publish2(1, "events/a", "late")
			pub.expectNext("PUBREC", packets.Pubrec, 1, 0x00)
			clk.Advance(time.Minute) // expires_after: judged at the PUBREL, or by a sweep this wakes
			pub.pubrel(1)
			pub.expectNext("a late PUBREL", packets.Pubcomp, 1, 0x92)
			pub.quietThenPong("after the late PUBREL")
			waitQoS2(t, b, broker.QoS2Stats{Held: 0, Abandoned: 1})
			pub.pubrel(1)
			pub.expectNext("the PUBREL again", packets.Pubcomp, 1, 0x92)
			pub.quietThenPong("after the second late PUBREL")
			qos1(t, b.Address(), "events/a", "marker", 0x00)
			sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
			sub.Subscribe("events/#", 1)
			wantRecord(t, sub, "marker", "1")
		})
	}
}
