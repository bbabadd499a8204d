package broker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// permitConfig: every route a delivery takes — an append channel, a latest
// channel, a queue, broadcast (and shared groups, and retained values)
// everywhere else.
const permitConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
channels:
  events:
    type: append
    filter: "events/#"
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    retry:
      max_attempts: 3
`

// permitGate is a permission function a test steers: it refuses the
// clients named, on the routes named ("" any), and counts each refusal.
type permitGate struct {
	mu      sync.Mutex
	refuse  map[string]string // client id → route refused ("": every route)
	refused map[string]int    // "route client" → refusals
	asked   chan struct{}
}

func newPermitGate() *permitGate {
	return &permitGate{refuse: map[string]string{}, refused: map[string]int{}, asked: make(chan struct{}, 1)}
}

func (g *permitGate) permit(client, route, topic string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, named := g.refuse[client]
	if !named || (r != "" && r != route) {
		return true
	}
	g.refused[route+" "+client]++
	select {
	case g.asked <- struct{}{}:
	default:
	}
	return false
}

// set replaces what is refused and hands the gate to the broker again,
// which wakes every delivery a refusal stalled.
func (g *permitGate) set(b *brokertest.Broker, refuse map[string]string) {
	g.mu.Lock()
	g.refuse = refuse
	g.mu.Unlock()
	b.SetDeliveryPermit(g.permit)
}

// waitRefused waits until route has been refused to client at least n
// times: the delivery reached the permission and was stopped there.
func (g *permitGate) waitRefused(t *testing.T, route, client string, n int) {
	t.Helper()
	deadline := time.NewTimer(mxWait)
	defer deadline.Stop()
	for {
		g.mu.Lock()
		got := g.refused[route+" "+client]
		g.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-g.asked:
		case <-deadline.C:
			t.Fatalf("%s was never refused to %s (%d of %d refusals)", route, client, got, n)
		}
	}
}

// nothingSent asserts that the broker wrote c nothing before answering a
// PINGREQ: a delivery refused before it was written is not on the wire.
func nothingSent(t *testing.T, c *mxConn, what string) {
	t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}, ProtocolVersion: 5},
		(*packets.Packet).PingreqEncode)
	pk := c.read(mxWait)
	if pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("%s: %s: the broker sent packet type %d (topic %q payload %q) before the PINGRESP",
			c.id, what, pk.FixedHeader.Type, pk.TopicName, pk.Payload)
	}
}

func startPermitBroker(t *testing.T) (*brokertest.Broker, *permitGate) {
	t.Helper()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), permitConfig))
	g := newPermitGate()
	b.SetDeliveryPermit(g.permit)
	return b, g
}

// Invariant 16: a refusal on the way out is not a delivery, on any route.
// With a permission function refusing every delivery to a client, each of
// the five routes stops before anything is reserved or written, and each
// does what the rule says of a refusal: a channel consumer stalls where it
// stands (no record sent, its stored position unmoved) and resumes when
// the grant comes back — woken by that, with nothing published meanwhile;
// a queue job stays available with its attempt unspent and goes to a
// worker that may take it; a broadcast delivery, a shared group's or one
// sent again at a resume is let go, unsent; a retained value is not sent.
func TestInvariant16_RefusedDeliveryStopsEveryRoute(t *testing.T) {
	t.Run("append", func(t *testing.T) {
		b, g := startPermitBroker(t)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.publish1(1, "events/a", "r1", packets.Properties{})
		pub.publish1(2, "events/a", "r2", packets.Properties{})
		g.set(b, map[string]string{"reader": ""})
		sub, _ := dialMx(t, b.Address(), "reader", mxConnect{clean: true, expiry: 3600})
		sub.subscribe(1, "events/#", 1)
		g.waitRefused(t, "append", "reader", 1)
		nothingSent(t, sub, "the record was refused")
		stalled, ok := b.StoredPosition("events", "reader")
		if !ok {
			t.Fatal("no position stored for the durable reader")
		}
		g.set(b, nil) // the grant comes back; nothing is published
		for _, want := range []string{"r1", "r2"} {
			pk := sub.nextPublish("record " + want + " once the grant is back")
			if string(pk.Payload) != want {
				t.Fatalf("delivered %q, want %q: a refused record is never stepped over", pk.Payload, want)
			}
			if want == "r1" && prop(pk, "saguin-offset") != fmt.Sprint(stalled) {
				t.Fatalf("r1 is offset %s; the position stored while refused was %d, want it at r1 (unmoved)",
					prop(pk, "saguin-offset"), stalled)
			}
			sub.puback(pk.PacketID)
		}
	})

	t.Run("latest", func(t *testing.T) {
		b, g := startPermitBroker(t)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.publish1(1, "state/door", "open", packets.Properties{})
		g.set(b, map[string]string{"watcher": ""})
		sub, _ := dialMx(t, b.Address(), "watcher", mxConnect{clean: true})
		sub.subscribe(1, "state/#", 1)
		g.waitRefused(t, "latest", "watcher", 1)
		nothingSent(t, sub, "the current value was refused")
		g.set(b, nil)
		pk := sub.nextPublish("the current value once the grant is back")
		if string(pk.Payload) != "open" || !pk.FixedHeader.Retain {
			t.Fatalf("delivered %q RETAIN %v, want the state pass's \"open\" with RETAIN", pk.Payload, pk.FixedHeader.Retain)
		}
	})

	t.Run("queue", func(t *testing.T) {
		b, g := startPermitBroker(t)
		g.set(b, map[string]string{"w-a": "", "w-b": ""})
		wa, _ := dialMx(t, b.Address(), "w-a", mxConnect{clean: true})
		wa.subscribe(1, "$saguin/queue/jobs", 1)
		wb, _ := dialMx(t, b.Address(), "w-b", mxConnect{clean: true})
		wb.subscribe(1, "$saguin/queue/jobs", 1)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.publish1(1, "jobs/x", "j1", packets.Properties{})
		g.waitRefused(t, "queue", "w-a", 1)
		g.waitRefused(t, "queue", "w-b", 1)
		nothingSent(t, wa, "the job was refused to every worker")
		nothingSent(t, wb, "the job was refused to every worker")
		// One worker may take it now: the job goes to it, its attempt
		// unspent by the refusals.
		g.set(b, map[string]string{"w-a": ""})
		pk := wb.nextPublish("the job, once w-b may take it")
		if string(pk.Payload) != "j1" || prop(pk, "saguin-attempt") != "1" {
			t.Fatalf("w-b was handed %q attempt %s; want j1 at attempt 1", pk.Payload, prop(pk, "saguin-attempt"))
		}
		wb.puback(pk.PacketID)
		nothingSent(t, wa, "the refused worker")
	})

	t.Run("broadcast", func(t *testing.T) {
		b, g := startPermitBroker(t)
		sub, _ := dialMx(t, b.Address(), "listener", mxConnect{clean: true})
		sub.subscribe(1, "news/#", 1)
		g.set(b, map[string]string{"listener": ""})
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.publish1(1, "news/a", "n1", packets.Properties{})
		g.waitRefused(t, "broadcast", "listener", 1)
		g.set(b, nil)
		pub.publish1(2, "news/a", "n2", packets.Properties{})
		if pk := sub.nextPublish("the broadcast published once the grant is back"); string(pk.Payload) != "n2" {
			t.Fatalf("delivered %q first, want n2: n1 was refused, and a refused broadcast is not sent", pk.Payload)
		}
	})

	t.Run("shared", func(t *testing.T) {
		b, g := startPermitBroker(t)
		g.set(b, map[string]string{"m-a": ""})
		ma, _ := dialMx(t, b.Address(), "m-a", mxConnect{clean: true})
		ma.subscribe(1, "$share/g/news/#", 1)
		mb, _ := dialMx(t, b.Address(), "m-b", mxConnect{clean: true})
		mb.subscribe(1, "$share/g/news/#", 1)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		for i := 1; i <= 4; i++ {
			pub.publish1(uint16(i), "news/a", fmt.Sprintf("s%d", i), packets.Properties{})
		}
		for i := 1; i <= 4; i++ {
			pk := mb.nextPublish("the group's message, passed over the refused member")
			if want := fmt.Sprintf("s%d", i); string(pk.Payload) != want {
				t.Fatalf("m-b was handed %q, want %q: every message goes to the member that may take it", pk.Payload, want)
			}
			mb.puback(pk.PacketID)
		}
		g.waitRefused(t, "shared", "m-a", 1)
		nothingSent(t, ma, "the refused member")
	})

	t.Run("retained", func(t *testing.T) {
		b, g := startPermitBroker(t)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, ProtocolVersion: 5,
			PacketID: 1, TopicName: "lamp/kitchen", Payload: []byte("on")}, (*packets.Packet).PublishEncode)
		pub.expect(packets.Puback, "PUBACK for the retained publish")
		g.set(b, map[string]string{"late": ""})
		sub, _ := dialMx(t, b.Address(), "late", mxConnect{clean: true})
		sub.subscribe(1, "lamp/#", 1)
		g.waitRefused(t, "retained", "late", 1)
		nothingSent(t, sub, "the retained value was refused")
		// The grant back: the next SUBSCRIBE's pass sends it (nothing
		// else was held for the refused one).
		g.set(b, nil)
		nothingSent(t, sub, "a refused retained value is not sent later")
		sub.subscribe(2, "lamp/#", 1)
		if pk := sub.nextPublish("the retained value to the new SUBSCRIBE"); string(pk.Payload) != "on" || !pk.FixedHeader.Retain {
			t.Fatalf("delivered %q RETAIN %v, want the retained \"on\"", pk.Payload, pk.FixedHeader.Retain)
		}
	})

	t.Run("resend at resume", func(t *testing.T) {
		b, g := startPermitBroker(t)
		sub, _ := dialMx(t, b.Address(), "resumer", mxConnect{clean: true, expiry: 3600})
		sub.subscribe(1, "news/#", 1)
		pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
		pub.publish1(1, "news/a", "unacked", packets.Properties{})
		sub.nextPublish("the delivery left unacknowledged")
		sub.drop()
		g.set(b, map[string]string{"resumer": ""})
		again, ack := dialMx(t, b.Address(), "resumer", mxConnect{expiry: 3600})
		if !ack.SessionPresent {
			t.Fatal("the session did not carry over")
		}
		g.waitRefused(t, "broadcast", "resumer", 1)
		nothingSent(t, again, "the resend was refused")
		g.set(b, nil)
		pub.publish1(2, "news/a", "next", packets.Properties{})
		if pk := again.nextPublish("the next broadcast"); string(pk.Payload) != "next" {
			t.Fatalf("delivered %q, want next: a resend refused at the resume is let go", pk.Payload)
		}
	})
}
