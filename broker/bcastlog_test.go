package broker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// The broadcast log (rfcs/broadcast-log.md): QoS 1/2 broadcast owed to a
// session that outlives its connection is written once, served from the
// session's cursor after a restart, resent under its packet ids, bounded by
// limits.session_queue_bytes, and trimmed once every cursor is past it.

const bcastConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 4KiB
    session_queue_bytes: {{.Queue}}
    write_timeout: 60s
  share:
    expires_after: {{.Expires}}
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
{{.Provider}}
channels:
  events:
    type: append
    filter: "events/#"
`

type bcastOpts struct {
	provider string
	queue    string // limits.session_queue_bytes
	expires  string // broker.share.expires_after
}

func bcastBroker(t *testing.T, o bcastOpts, opts ...brokertest.Option) *brokertest.Broker {
	t.Helper()
	if o.queue == "" {
		o.queue = "1MiB"
	}
	if o.expires == "" {
		o.expires = "none"
	}
	dir := t.TempDir()
	if strings.Contains(o.provider, "snapshots") {
		if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r := strings.NewReplacer("{{.Provider}}", o.provider, "{{.Queue}}", o.queue, "{{.Expires}}", o.expires)
	return brokertest.Start(t, brokertest.Config(t, dir, r.Replace(bcastConfig)), opts...)
}

var bcastProviders = []struct{ name, cfg string }{{"sqlite", sqliteProvider}, {"memory", memoryProvider}}

// publishBroadcast publishes n QoS 1 messages "<prefix> i" on topic.
func publishBroadcast(t *testing.T, addr, topic, prefix string, from, n int, qos byte) {
	t.Helper()
	pub := brokertest.Connect(t, addr, "pub", brokertest.ClientOptions{CleanStart: true})
	defer pub.Close()
	for i := from; i < from+n; i++ {
		resp, err := pub.Publish(&paho.Publish{Topic: topic, QoS: qos, Payload: []byte(fmt.Sprintf("%s %d", prefix, i))})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if resp != nil && resp.ReasonCode >= 0x80 {
			t.Fatalf("publish %d refused: 0x%02x", i, resp.ReasonCode)
		}
	}
}

// readPublishes reads n PUBLISH packets off a raw connection, acknowledging
// none.
func readPublishes(t *testing.T, c *brokertest.RawClient, n int) []packets.Packet {
	t.Helper()
	var out []packets.Packet
	for len(out) < n {
		pk := c.Read()
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		out = append(out, pk)
	}
	return out
}

func payloads(pks []packets.Packet) []string {
	out := make([]string, len(pks))
	for i, pk := range pks {
		out[i] = string(pk.Payload)
	}
	return out
}

func want(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s %d", prefix, i))
	}
	return out
}

func sameStrings(a, b []string) bool {
	return strings.Join(a, "|") == strings.Join(b, "|")
}

// A durable QoS 1 subscriber away receives everything published while it
// was away — before and after a restart — in order (sqlite across any stop;
// memory through its snapshot at a graceful stop: invariant 14).
func TestBroadcastLogAwaySubscriberServedAcrossRestart(t *testing.T) {
	for _, prov := range bcastProviders {
		t.Run(prov.name, func(t *testing.T) {
			b := bcastBroker(t, bcastOpts{provider: prov.cfg})
			sub, _ := brokertest.DialRaw(t, b.Address(), "away", true, 3600)
			sub.Subscribe(1, "news/#", 1)
			sub.Disconnect()
			publishBroadcast(t, b.Address(), "news/a", "n", 1, 10, 1)
			b.Restart()
			publishBroadcast(t, b.Address(), "news/a", "n", 11, 5, 1)
			sub, ack := brokertest.DialRaw(t, b.Address(), "away", false, 3600)
			if !ack.SessionPresent {
				t.Fatal("Session Present 0 for a durable session after a restart")
			}
			got := readPublishes(t, sub, 15)
			for _, pk := range got {
				if pk.FixedHeader.Qos != 1 {
					t.Fatalf("delivered at QoS %d, want 1", pk.FixedHeader.Qos)
				}
				sub.Puback(pk.PacketID)
			}
			if w := want("n", 1, 15); !sameStrings(payloads(got), w) {
				t.Fatalf("got %v\nwant %v", payloads(got), w)
			}
			if _, err := sub.ReadWithin(300 * time.Millisecond); err == nil {
				t.Fatal("a message more than was published")
			}
		})
	}
}

// Exactly the unacknowledged ones come back after a restart, under the
// packet ids they were first sent with, marked DUP (MQTT-4.4.0-1); the
// acknowledged ones do not.
func TestBroadcastLogResendsUnackedUnderTheirIDs(t *testing.T) {
	for _, prov := range bcastProviders {
		t.Run(prov.name, func(t *testing.T) {
			b := bcastBroker(t, bcastOpts{provider: prov.cfg})
			sub, _ := brokertest.DialRaw(t, b.Address(), "win", true, 3600)
			sub.Subscribe(1, "news/#", 1)
			publishBroadcast(t, b.Address(), "news/a", "w", 1, 5, 1)
			first := readPublishes(t, sub, 5)
			sub.Puback(first[0].PacketID)
			sub.Puback(first[1].PacketID)
			sub.Disconnect()
			b.Restart()
			sub, ack := brokertest.DialRaw(t, b.Address(), "win", false, 3600)
			if !ack.SessionPresent {
				t.Fatal("Session Present 0 after a restart")
			}
			again := readPublishes(t, sub, 3)
			for i, pk := range again {
				orig := first[i+2]
				if string(pk.Payload) != string(orig.Payload) || pk.PacketID != orig.PacketID || !pk.FixedHeader.Dup {
					t.Fatalf("resent %q id %d dup %v; want %q id %d dup true",
						pk.Payload, pk.PacketID, pk.FixedHeader.Dup, orig.Payload, orig.PacketID)
				}
				sub.Puback(pk.PacketID)
			}
			if pk, err := sub.ReadWithin(300 * time.Millisecond); err == nil {
				t.Fatalf("more than the unacknowledged: %+v", pk)
			}
			sub.Disconnect()
			b.Restart()
			sub, _ = brokertest.DialRaw(t, b.Address(), "win", false, 3600)
			if pk, err := sub.ReadWithin(300 * time.Millisecond); err == nil {
				t.Fatalf("acknowledged message sent again after a second restart: %q", pk.Payload)
			}
		})
	}
}

// Invariant 18: the cursor a clean DISCONNECT leaves is stored before the
// close that answers it. The clock is injected and never advanced, so the
// periodic flush never runs: only the DISCONNECT path can have stored it.
func TestInvariant18_BroadcastCursorStoredBeforeClose(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider}, brokertest.WithClock(clk))
	sub, _ := brokertest.DialRaw(t, b.Address(), "c18", true, 3600)
	sub.Subscribe(1, "news/#", 1)
	publishBroadcast(t, b.Address(), "news/a", "c", 1, 4, 1)
	got := readPublishes(t, sub, 4)
	sub.Puback(got[0].PacketID)
	sub.Puback(got[1].PacketID)
	sub.Puback(got[2].PacketID)
	sub.Disconnect()
	cur, ok := b.BroadcastCursor("c18")
	next, _, _ := b.BroadcastLog()
	if !ok || cur != next-1 {
		t.Fatalf("stored cursor %d (held %v), want %d: the one unacknowledged message", cur, ok, next-1)
	}
}

// However many sessions are owed it, a message is written to the log once.
func TestBroadcastLogOneWritePerMessage(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	for i := range 50 {
		c, _ := brokertest.DialRaw(t, b.Address(), fmt.Sprintf("s%02d", i), true, 3600)
		c.Subscribe(1, "fan/#", 1)
		if i%2 == 0 {
			c.Disconnect() // half away, half connected: all owed
		}
	}
	next0, _, _ := b.BroadcastLog()
	publishBroadcast(t, b.Address(), "fan/x", "f", 1, 20, 1)
	next, _, written := b.BroadcastLog()
	if next-next0 != 20 || written != 20 {
		t.Fatalf("log advanced %d, %d written, for 20 messages owed to 50 sessions", next-next0, written)
	}
	// QoS 0, and QoS 1 owed to no session that outlives its connection,
	// are not written.
	publishBroadcast(t, b.Address(), "fan/x", "z", 1, 3, 0)
	publishBroadcast(t, b.Address(), "other/x", "o", 1, 3, 1)
	if n, _, _ := b.BroadcastLog(); n != next {
		t.Fatalf("log advanced to %d for messages no durable session is owed at QoS 1/2", n)
	}
}

// Invariant 13: a session away falls behind by at most
// limits.session_queue_bytes; past it the oldest owed are given up and
// counted, the newest kept in order — and a restart serves it the same
// bounded tail from the log.
func TestInvariant13_BroadcastLogSessionLagBounded(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: memoryProvider, queue: "64KiB"})
	sub, _ := brokertest.DialRaw(t, b.Address(), "lag", true, 3600)
	sub.Subscribe(1, "big/#", 1)
	sub.Disconnect()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 100
	for i := 1; i <= n; i++ {
		payload := fmt.Sprintf("b %d %s", i, strings.Repeat("x", 2000))
		if _, err := pub.Publish(&paho.Publish{Topic: "big/a", QoS: 1, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	pub.Close()
	skipped := b.BroadcastStats().QueueFull
	if skipped == 0 {
		t.Fatal("nothing given up past limits.session_queue_bytes")
	}
	b.Restart()
	sub, _ = brokertest.DialRaw(t, b.Address(), "lag", false, 3600)
	var got []int
	for {
		pk, err := sub.ReadWithin(500 * time.Millisecond)
		if err != nil {
			break
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		var i int
		fmt.Sscanf(string(pk.Payload), "b %d", &i)
		got = append(got, i)
		sub.Puback(pk.PacketID)
	}
	if len(got) == 0 || got[len(got)-1] != n || int64(len(got)) > n-skipped {
		t.Fatalf("after restart got %d messages ending %v; %d were given up before", len(got), got[max(0, len(got)-1):], skipped)
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+1 {
			t.Fatalf("out of order or gapped: %v", got)
		}
	}
}

// Messages leave the log once every cursor is past them.
func TestBroadcastLogTrimmedOnceCursorsPass(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	fast, _ := brokertest.DialRaw(t, b.Address(), "fast", true, 3600)
	fast.Subscribe(1, "t/#", 1)
	slow, _ := brokertest.DialRaw(t, b.Address(), "slow", true, 3600)
	slow.Subscribe(1, "t/#", 1)
	publishBroadcast(t, b.Address(), "t/a", "t", 1, 10, 1)
	for _, pk := range readPublishes(t, fast, 10) {
		fast.Puback(pk.PacketID)
	}
	slowGot := readPublishes(t, slow, 10)
	for _, pk := range slowGot[:4] {
		slow.Puback(pk.PacketID)
	}
	next, _, _ := b.BroadcastLog()
	waitFor(t, func() bool { _, floor, _ := b.BroadcastLog(); return floor == next-6 })
	for _, pk := range slowGot[4:] {
		slow.Puback(pk.PacketID)
	}
	waitFor(t, func() bool { _, floor, _ := b.BroadcastLog(); return floor == next })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Invariant 18 across a kill: the window is stored before what joins it is
// written, so after a SIGKILL every unacknowledged message comes back under
// the packet id it was first sent with, marked DUP — and at most the
// acknowledged ones whose acks had not reached the store yet come back too,
// also under their ids (rfcs/broadcast-log.md: unclean stop re-sends ≤ Receive
// Maximum).
func TestInvariant18_BroadcastWindowSurvivesKill(t *testing.T) {
	dir := t.TempDir()
	r := strings.NewReplacer("{{.Provider}}", sqliteProvider, "{{.Queue}}", "1MiB", "{{.Expires}}", "none")
	p := brokertest.StartProcess(t, brokertest.Config(t, dir, r.Replace(bcastConfig)))
	sub, _ := brokertest.DialRaw(t, p.Address(), "kw", true, 3600)
	sub.Subscribe(1, "news/#", 1)
	publishBroadcast(t, p.Address(), "news/a", "k", 1, 5, 1)
	first := readPublishes(t, sub, 5)
	ids := make(map[string]uint16, len(first))
	for _, pk := range first {
		ids[string(pk.Payload)] = pk.PacketID
	}
	sub.Puback(first[0].PacketID)
	sub.Puback(first[1].PacketID)
	p.Kill()
	p.Restart()
	sub, ack := brokertest.DialRaw(t, p.Address(), "kw", false, 3600)
	if !ack.SessionPresent {
		t.Fatal("Session Present 0 after a kill")
	}
	var again []string
	for {
		pk, err := sub.ReadWithin(time.Second)
		if err != nil {
			break
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if id, ok := ids[string(pk.Payload)]; !ok || pk.PacketID != id || !pk.FixedHeader.Dup {
			t.Fatalf("resent %q under id %d dup %v; first sent under %d", pk.Payload, pk.PacketID, pk.FixedHeader.Dup, id)
		}
		again = append(again, string(pk.Payload))
		sub.Puback(pk.PacketID)
	}
	tail := strings.Join(again, "|")
	if !strings.HasSuffix(tail, "k 3|k 4|k 5") || len(again) > 5 {
		t.Fatalf("after a kill resent %v; want k 3..k 5 (and at most k 1, k 2 before them), in order", again)
	}
}

// A takeover resends what was on the wire in the order first sent, under
// the same packet ids, marked DUP (MQTT-4.6.0-1, MQTT-4.4.0-1).
func TestBroadcastTakeoverResendsInOrder(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: memoryProvider})
	sub, _ := brokertest.DialRaw(t, b.Address(), "to", true, 3600)
	sub.Subscribe(1, "news/#", 1)
	publishBroadcast(t, b.Address(), "news/a", "o", 1, 8, 1)
	first := readPublishes(t, sub, 8)
	next, _ := brokertest.DialRaw(t, b.Address(), "to", false, 3600)
	again := readPublishes(t, next, 8)
	for i, pk := range again {
		if string(pk.Payload) != string(first[i].Payload) || pk.PacketID != first[i].PacketID || !pk.FixedHeader.Dup {
			t.Fatalf("resend %d: %q id %d dup %v; want %q id %d dup", i, pk.Payload, pk.PacketID, pk.FixedHeader.Dup,
				first[i].Payload, first[i].PacketID)
		}
	}
}

// Invariant 13 at a full provider: the broadcast log has no bound of its
// own and never refuses a publisher; when the provider is full it gives up
// its oldest messages (none on the wire), counted, and the session owed them
// is still served them from memory.
func TestInvariant13_BroadcastLogYieldsToAFullProvider(t *testing.T) {
	full := `        type: memory
        snapshot_dir: none
        max_bytes: 256KiB`
	b := bcastBroker(t, bcastOpts{provider: full})
	sub, _ := brokertest.DialRaw(t, b.Address(), "owed", true, 3600)
	sub.Subscribe(1, "big/#", 1)
	sub.Disconnect()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 150 // 300 KiB owed: past the provider, within the session's bound
	for i := 1; i <= n; i++ {
		resp, err := pub.Publish(&paho.Publish{Topic: "big/a", QoS: 1, Payload: []byte(fmt.Sprintf("b %d %0*d", i, 2000, 0))})
		if err != nil || resp.ReasonCode != 0 {
			t.Fatalf("publish %d: %v %+v", i, err, resp)
		}
	}
	pub.Close()
	st := b.BroadcastStats()
	if st.LogStorageFull == 0 || st.LogFailed != 0 {
		t.Fatalf("log at a full provider: %d given up, %d refused; want some given up, none refused", st.LogStorageFull, st.LogFailed)
	}
	sub, _ = brokertest.DialRaw(t, b.Address(), "owed", false, 3600)
	for i := 1; i <= n; i++ {
		pk := readPublishes(t, sub, 1)[0]
		var k int
		fmt.Sscanf(string(pk.Payload), "b %d", &k)
		if k != i {
			t.Fatalf("delivery %d is message %d", i, k)
		}
		sub.Puback(pk.PacketID) // the sender holds half the bound unacknowledged at most
	}
}
