package broker_test

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// v311Connect is a 3.1.1 CONNECT (protocol level 4) for id.
func v311Connect(id string, clean bool) packets.Packet {
	return packets.Packet{ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: clean, Keepalive: 60}}
}

// v5Connect is an MQTT 5 CONNECT for id.
func v5Connect(id string, clean bool, expiry uint32) packets.Packet {
	return packets.Packet{
		Connect:    packets.ConnectParams{ClientIdentifier: id, Clean: clean, Keepalive: 60},
		Properties: packets.Properties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: expiry > 0},
	}
}

// readUntilEnd reads c until the broker closes it and returns the
// DISCONNECT it sent first, if any.
func readUntilEnd(t *testing.T, c *brokertest.RawClient) (packets.Packet, bool) {
	t.Helper()
	for {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				var ne interface{ Timeout() bool }
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("the broker did not close the replaced connection")
				}
			}
			return packets.Packet{}, false
		}
		if pk.FixedHeader.Type == packets.Disconnect {
			return pk, true
		}
	}
}

// nextPublish reads c until a PUBLISH arrives (fails after wait).
func nextPublish(t *testing.T, c *brokertest.RawClient) packets.Packet {
	t.Helper()
	for {
		pk := c.Read()
		if pk.FixedHeader.Type == packets.Publish {
			return pk
		}
	}
}

// A session that ends with its connection (no Session Expiry Interval; 3.1.1
// Clean Session 1) ends at takeover: the CONNECT that replaces its
// connection is answered Session Present 0 whatever its Clean Start
// (rfcs/sessions-ownership.md), inherits none of its subscriptions, and the replaced
// connection is told 0x8E (Session taken over).
func TestTakeoverEndsASessionThatEndsWithItsConnection(t *testing.T) {
	b := brokertest.Start(t, configWith(t, sqliteProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})

	old, _ := brokertest.DialRaw(t, b.Address(), "dev", true, 0)
	if sa := old.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	// Clean Start 0 with an expiry: asks to resume, but there is nothing
	// to resume.
	next, ack := brokertest.DialConnect(t, b.Address(), v5Connect("dev", false, 600))
	if ack.ReasonCode != 0 || ack.SessionPresent {
		t.Fatalf("takeover of a session ending with its connection: CONNACK 0x%02x Session Present %v, want 0x00 and 0",
			ack.ReasonCode, ack.SessionPresent)
	}
	if d, ok := readUntilEnd(t, old); !ok || d.ReasonCode != 0x8E {
		t.Fatalf("replaced connection: DISCONNECT %v 0x%02x, want 0x8E", ok, d.ReasonCode)
	}
	// The old subscription ended with the old session: the new connection
	// is sent nothing until it subscribes itself.
	publishN(t, pub, "events/a", 1, 1)
	if pk, err := next.ReadWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("the new session inherited a subscription: sent %v %q", pk.FixedHeader.Type, pk.Payload)
	}
	if sa := next.Subscribe(2, "events/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	// A new subscription to an append channel is served from the channel's
	// start: the record published before it, then the next.
	publishN(t, pub, "events/a", 2, 1)
	for _, want := range []string{"record 1", "record 2"} {
		if p := nextPublish(t, next); string(p.Payload) != want {
			t.Fatalf("new session served %q, want %s", p.Payload, want)
		}
	}

	// The same for 3.1.1 Clean Session 1 replaced by a Clean Session 0.
	if _, ack := brokertest.DialConnect(t, b.Address(), v311Connect("old-dev", true)); ack.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK 0x%02x", ack.ReasonCode)
	}
	if _, ack := brokertest.DialConnect(t, b.Address(), v311Connect("old-dev", false)); ack.ReasonCode != 0 || ack.SessionPresent {
		t.Fatalf("3.1.1 takeover of a clean session: CONNACK 0x%02x Session Present %v, want 0", ack.ReasonCode, ack.SessionPresent)
	}

	// And a session that outlives its connection is resumed by a takeover:
	// Session Present 1, subscription intact.
	kept, _ := brokertest.DialRaw(t, b.Address(), "kept", true, 600)
	if sa := kept.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
		t.Fatalf("suback %v", sa.ReasonCodes)
	}
	again, ack := brokertest.DialConnect(t, b.Address(), v5Connect("kept", false, 600))
	if !ack.SessionPresent {
		t.Fatal("takeover of a kept session: Session Present 0")
	}
	if d, ok := readUntilEnd(t, kept); !ok || d.ReasonCode != 0x8E {
		t.Fatalf("replaced connection: DISCONNECT %v 0x%02x, want 0x8E", ok, d.ReasonCode)
	}
	// Served from its position: what the replaced connection never
	// acknowledged, then the new record.
	publishN(t, pub, "events/a", 3, 1)
	for i := 1; ; i++ {
		p := nextPublish(t, again)
		if string(p.Payload) == "record 3" {
			break
		}
		if i == 10 {
			t.Fatal("the resumed session was not served the new record")
		}
	}
}

// Invariant 17: CONNECTs for one client id take turns. Many at once, each
// subscribing as soon as it is answered: every one is answered, all but one
// are taken over (0x8E), and the one left owns the session, is served once
// per record, and no connection taken over — nor a teardown running late —
// removed its registration or its subscription. Run for sessions that
// resume (Clean Start 0, an expiry) and sessions that end with their
// connection (Clean Start 1, no expiry: the teardown path).
func TestInvariant17_ConcurrentConnectsLeaveOneOwner(t *testing.T) {
	for _, tc := range []struct {
		name   string
		clean  bool
		expiry uint32
	}{{"resume", false, 600}, {"ends-with-connection", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			b := brokertest.Start(t, configWith(t, sqliteProvider))
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			first, _ := brokertest.DialRaw(t, b.Address(), "dev", true, tc.expiry)
			if sa := first.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
				t.Fatalf("suback %v", sa.ReasonCodes)
			}
			const n = 8
			conns := make([]*brokertest.RawClient, n)
			acks := make([]packets.Packet, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					conns[i], acks[i] = brokertest.DialConnect(t, b.Address(), v5Connect("dev", tc.clean, tc.expiry))
					if acks[i].ReasonCode == 0 {
						conns[i].SendSubscribe(1, packets.Subscription{Filter: "events/#", Qos: 1})
					}
				}()
			}
			wg.Wait()
			for i, a := range acks {
				if a.FixedHeader.Type != packets.Connack || a.ReasonCode != 0 {
					t.Fatalf("CONNECT %d answered %v 0x%02x", i, a.FixedHeader.Type, a.ReasonCode)
				}
			}
			if d, ok := readUntilEnd(t, first); !ok || d.ReasonCode != 0x8E {
				t.Fatalf("first connection: DISCONNECT %v 0x%02x, want 0x8E", ok, d.ReasonCode)
			}
			// Each connection is answered its SUBACK, or is taken over first.
			ended := make([]bool, n)
			for i, c := range conns {
				for !ended[i] {
					pk, err := c.ReadWithin(wait)
					if err != nil {
						t.Fatalf("CONNECT %d: closed without a DISCONNECT: %v", i, err)
					}
					if pk.FixedHeader.Type == packets.Suback {
						break
					}
					if pk.FixedHeader.Type == packets.Disconnect {
						if pk.ReasonCode != 0x8E {
							t.Fatalf("CONNECT %d: DISCONNECT 0x%02x, want 0x8E", i, pk.ReasonCode)
						}
						ended[i] = true
					}
				}
			}
			publishN(t, pub, "events/a", 1, 1)
			owner := -1
			for i, c := range conns {
				if ended[i] {
					continue
				}
				pk, err := c.ReadWithin(wait)
				switch {
				case err != nil:
					t.Fatalf("CONNECT %d: closed without a DISCONNECT: %v", i, err)
				case pk.FixedHeader.Type == packets.Disconnect:
					if pk.ReasonCode != 0x8E {
						t.Fatalf("CONNECT %d: DISCONNECT 0x%02x, want 0x8E", i, pk.ReasonCode)
					}
				case pk.FixedHeader.Type == packets.Publish:
					if owner >= 0 {
						t.Fatalf("CONNECTs %d and %d both own the session", owner, i)
					}
					owner = i
					if string(pk.Payload) != "record 1" {
						t.Fatalf("owner served %q", pk.Payload)
					}
				default:
					t.Fatalf("CONNECT %d: sent %v", i, pk.FixedHeader.Type)
				}
			}
			if owner < 0 {
				t.Fatal("no connection owns the session: its registration or subscription was lost")
			}
			// Served once: no subscription of a replaced connection lingers.
			if pk, err := conns[owner].ReadWithin(300 * time.Millisecond); err == nil {
				t.Fatalf("owner sent a second %v after one record", pk.FixedHeader.Type)
			}
			// And served again: still registered after every teardown ran.
			publishN(t, pub, "events/a", 2, 1)
			if p := nextPublish(t, conns[owner]); string(p.Payload) != "record 2" {
				t.Fatalf("owner served %q, want record 2", p.Payload)
			}
		})
	}
}

// Expiry and reconnect never interleave (rfcs/sessions-ownership.md): a session away
// past its expiry is ended before a CONNECT for its id is answered, whether
// or not any sweep has run — Session Present 0, its subscription gone.
func TestExpiredSessionEndsBeforeTheConnectIsAnswered(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	for _, tc := range []struct {
		id      string
		away    time.Duration
		present bool
	}{{"short", 6 * time.Second, false}, {"long", 4 * time.Second, true}} {
		c, _ := brokertest.DialRaw(t, b.Address(), tc.id, true, 5)
		if sa := c.Subscribe(1, "events/#", 1); sa.ReasonCodes[0] != 1 {
			t.Fatalf("suback %v", sa.ReasonCodes)
		}
		c.Disconnect()
		clk.Advance(tc.away)
		_, ack := brokertest.DialConnect(t, b.Address(), v5Connect(tc.id, false, 5))
		if ack.ReasonCode != 0 || ack.SessionPresent != tc.present {
			t.Fatalf("%s: away %s of a 5 s session: CONNACK 0x%02x Session Present %v, want %v",
				tc.id, tc.away, ack.ReasonCode, ack.SessionPresent, tc.present)
		}
	}
}

// A session that ended with its connection is never resumed, however soon
// the next CONNECT comes: the substrate may still hold the old connection
// (its teardown waits for the new CONNECT's turn), and nothing of it is
// carried over — Session Present 0, no subscription. Repeated, since the
// window is a race.
func TestSessionEndedWithItsConnectionIsNeverResumed(t *testing.T) {
	b := brokertest.Start(t, configWith(t, sqliteProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := range 20 {
		c, _ := brokertest.DialRaw(t, b.Address(), "brief", true, 0)
		if sa := c.Subscribe(1, "bc/#", 1); sa.ReasonCodes[0] != 1 {
			t.Fatalf("suback %v", sa.ReasonCodes)
		}
		if i%2 == 0 {
			c.Drop()
		} else {
			c.Disconnect()
		}
		next, ack := brokertest.DialConnect(t, b.Address(), v5Connect("brief", false, 600))
		if ack.ReasonCode != 0 || ack.SessionPresent {
			t.Fatalf("round %d: CONNACK 0x%02x Session Present %v, want 0", i, ack.ReasonCode, ack.SessionPresent)
		}
		if _, err := pub.Publish(&paho.Publish{Topic: "bc/x", QoS: 1, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if pk, err := next.ReadWithin(100 * time.Millisecond); err == nil {
			t.Fatalf("round %d: the new session inherited a subscription: sent %v", i, pk.FixedHeader.Type)
		}
		next.Disconnect() // its own session (600 s) is ended by the next Clean Start 1 CONNECT
	}
}
