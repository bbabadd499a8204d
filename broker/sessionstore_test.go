package broker_test

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// sessionRig is a broker on the given provider with an injected clock, a
// publisher, and records 1–5 on events/a.
func sessionRig(t *testing.T, provider string) (*brokertest.Broker, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, provider), brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishN(t, pub, "events/a", 1, 5)
	pub.Close()
	return b, clk
}

// readOffsets reads n deliveries and returns their offsets.
func readOffsets(t *testing.T, c *brokertest.Client, n int) []string {
	t.Helper()
	var out []string
	for len(out) < n {
		out = append(out, c.Next(wait).Properties.User.Get("saguin-offset"))
	}
	return out
}

// A durable session survives a restart whole: Session Present 1, its
// subscription still there (no SUBSCRIBE needed), its consumer resuming
// after what it acknowledged — on both providers (the memory provider
// through its snapshot at a graceful stop: invariant 14).
func TestDurableSessionSurvivesRestart(t *testing.T) {
	for _, prov := range []struct{ name, cfg string }{{"sqlite", sqliteProvider}, {"memory", memoryProvider}} {
		t.Run(prov.name, func(t *testing.T) {
			b, _ := sessionRig(t, prov.cfg)
			c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
			c.Subscribe("events/#", 1)
			if got := readOffsets(t, c, 5); got[4] != "5" {
				t.Fatalf("first read: %v", got)
			}
			c.Close()
			b.Restart()
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			publishN(t, pub, "events/a", 6, 1)

			c = brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{SessionExpiry: 3600})
			if !c.Connack.SessionPresent {
				t.Fatal("Session Present 0 after a restart for a durable session")
			}
			if off := c.Next(wait).Properties.User.Get("saguin-offset"); off != "6" {
				t.Fatalf("resumed at offset %s without subscribing again, want 6", off)
			}
		})
	}
}

// Invariant 18: a device told its session is new is never served the old
// one. A session whose expiry passed while the broker was stopped ends at
// start: its CONNACK says Session Present 0 and its consumer begins where
// a reader with no position begins (the floor), not at the old position.
func TestInvariant18_SessionExpiredWhileStoppedIsNewAndServedFromTheFloor(t *testing.T) {
	b, clk := sessionRig(t, sqliteProvider)
	c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 60})
	c.Subscribe("events/#", 1)
	readOffsets(t, c, 5)
	c.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute) // the broker is down past the expiry
	b.Restart()
	if !b.Log.Contains("session expired while the broker was stopped") {
		t.Fatal("no log line for the session ended at start")
	}
	c = brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{SessionExpiry: 60})
	if c.Connack.SessionPresent {
		t.Fatal("Session Present 1 for a session whose expiry passed while stopped")
	}
	c.Subscribe("events/#", 1)
	if off := c.Next(wait).Properties.User.Get("saguin-offset"); off != "1" {
		t.Fatalf("a session told it is new was served from offset %s, want the floor 1", off)
	}
}

// A Clean Start after a restart ends the stored session: Session Present 0,
// and a second restart does not bring the old one back either.
func TestCleanStartEndsTheStoredSession(t *testing.T) {
	b, _ := sessionRig(t, sqliteProvider)
	c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	c.Subscribe("events/#", 1)
	readOffsets(t, c, 5)
	c.Close()
	b.Restart()
	c = brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	if c.Connack.SessionPresent {
		t.Fatal("Session Present 1 answering a Clean Start")
	}
	c.Close()
	b.Restart()
	c = brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{SessionExpiry: 3600})
	if c.Connack.SessionPresent {
		t.Fatal("the session ended by a Clean Start came back after a restart")
	}
	c.Subscribe("events/#", 1)
	if off := c.Next(wait).Properties.User.Get("saguin-offset"); off != "1" {
		t.Fatalf("served from %s, want the floor 1", off)
	}
}

// An UNSUBSCRIBE is stored too: after a restart the session comes back
// without the filter, and nothing is served on it.
func TestUnsubscribeSurvivesRestart(t *testing.T) {
	b, _ := sessionRig(t, sqliteProvider)
	c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	c.Subscribe("events/#", 1)
	c.Subscribe("other/#", 1)
	readOffsets(t, c, 5)
	if _, err := c.Unsubscribe(t.Context(), &paho.Unsubscribe{Topics: []string{"events/#"}}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	b.Restart()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	c = brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{SessionExpiry: 3600})
	if !c.Connack.SessionPresent {
		t.Fatal("Session Present 0 after a restart")
	}
	publishN(t, pub, "events/a", 6, 1)
	if _, err := pub.Publish(&paho.Publish{Topic: "other/x", QoS: 1, Payload: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	p := c.Next(wait)
	if p.Topic != "other/x" {
		t.Fatalf("after the restart the unsubscribed filter was served: %s offset %s", p.Topic,
			p.Properties.User.Get("saguin-offset"))
	}
	c.Quiet(200 * time.Millisecond)
}
