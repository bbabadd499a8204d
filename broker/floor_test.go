package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// floorChannels adds to appendConfig's "events" a one-hour retention, and two
// more channels: "ticks", retained an hour and read from its tail by a
// reader with no position, and "audit", kept forever.
const floorChannels = `    retention_period: 1h
  ticks:
    type: append
    filter: "ticks/#"
    retention_period: 1h
    start: tail
  audit:
    type: append
    filter: "audit/#"
`

var floorProviders = []struct{ name, provider string }{
	{"memory", memoryProvider},
	{"sqlite", sqliteProvider},
}

func floorBroker(t *testing.T, provider, brokerKeys, more string) (*brokertest.Broker, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := brokertest.Config(t, dir, strings.Replace(appendConfigWith(provider, more), "  log_level: debug\n", "  log_level: debug\n"+brokerKeys, 1))
	return brokertest.Start(t, cfg, brokertest.WithClock(clk)), clk
}

// rawOffset is a raw delivery's saguin-offset.
func rawOffset(t *testing.T, pk packets.Packet) uint64 {
	t.Helper()
	for _, u := range pk.Properties.User {
		if u.Key == "saguin-offset" {
			n, err := strconv.ParseUint(u.Val, 10, 64)
			if err != nil {
				t.Fatalf("saguin-offset %q: %v", u.Val, err)
			}
			return n
		}
	}
	t.Fatalf("delivery on %s carries no saguin-offset", pk.TopicName)
	return 0
}

// Invariant 1, the half a consumer can be told: a durable session one of
// whose stored positions retention has passed is answered Session Present 0
// at its CONNECT, before anything resumes; the session is discarded —
// subscriptions, owed broadcast, its held QoS 2 publish — and the discard is
// stored before the CONNACK (invariant 18), so a restart does not bring the
// old session back. The passed channels are served from where a reader with
// no position starts (the floor, or the tail on a start: tail channel); the
// position retention did not pass is kept (rfcs/sessions-ownership.md). The operator
// is told, per passed channel, the position, the floor and how many records
// went, and the count is kept for saguin_channel_position_lost_total. Both
// providers, with and without a restart while the session was away.
func TestInvariant01_ResumeBelowTheFloorIsAnsweredSessionPresent0(t *testing.T) {
	for _, p := range floorProviders {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart=%v", p.name, restart), func(t *testing.T) {
				resumeBelowFloor(t, p.provider, restart)
			})
		}
	}
}

func resumeBelowFloor(t *testing.T, provider string, restart bool) {
	b, clk := floorBroker(t, provider, "", floorChannels)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publish := func(topic, payload string, qos byte) {
		t.Helper()
		if r, err := pub.Publish(&paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)}); err != nil || (r != nil && r.ReasonCode != 0) {
			t.Fatalf("publish %s %s: %v %v", topic, payload, err, r)
		}
	}

	// The device reads two records of each channel and acknowledges them
	// (a raw client, so each PUBACK reaches the broker before the
	// DISCONNECT), holds a QoS 2 publish it never releases, and leaves with
	// every position at 3.
	dev, _ := brokertest.DialRaw(t, b.Address(), "dev", true, 86400)
	dev.SendSubscribe(1,
		packets.Subscription{Filter: "events/#", Qos: 1},
		packets.Subscription{Filter: "ticks/#", Qos: 1},
		packets.Subscription{Filter: "audit/#", Qos: 1},
		packets.Subscription{Filter: "news/#", Qos: 1})
	if ack := dev.Read(); ack.FixedHeader.Type != packets.Suback {
		t.Fatalf("want the SUBACK, got %+v", ack.FixedHeader)
	}
	for i := 1; i <= 2; i++ {
		for _, ch := range []string{"events", "ticks", "audit"} {
			publish(ch+"/a", fmt.Sprintf("%s-%d", ch, i), 1)
		}
	}
	for got := 0; got < 6; got++ {
		pk := dev.Read()
		if pk.FixedHeader.Type != packets.Publish || rawOffset(t, pk) > 2 {
			t.Fatalf("delivery %d: %+v", got, pk)
		}
		dev.Puback(pk.PacketID)
	}
	dev.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 2}, TopicName: "audit/held", PacketID: 7, Payload: []byte("held")})
	if rec := dev.Read(); rec.FixedHeader.Type != packets.Pubrec || rec.PacketID != 7 {
		t.Fatalf("want PUBREC 7, got %+v", rec)
	}
	dev.Disconnect()

	// Away: three more records on each retained channel, one on audit, one
	// QoS 1 broadcast owed to the session. Two hours later retention has
	// removed every record the device did not read: floor 6 on events and
	// ticks.
	for i := 3; i <= 5; i++ {
		publish("events/a", fmt.Sprintf("events-%d", i), 1)
		publish("ticks/a", fmt.Sprintf("ticks-%d", i), 1)
	}
	publish("audit/a", "audit-3", 1)
	publish("news/x", "owed", 1)
	pub.Close()
	clk.Advance(2 * time.Hour)
	if restart {
		b.Restart() // the start-up sweep removes them
	} else {
		waitLog(t, b, `msg="retention removed records" broker=test channel=events records=5`)
		waitLog(t, b, `msg="retention removed records" broker=test channel=ticks records=5`)
	}
	if b.QoS2Stats().Held != 1 && !restart {
		t.Fatalf("held QoS 2 publishes before the resume: %+v, want the device's one", b.QoS2Stats())
	}

	c := brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 86400})
	if c.Connack.SessionPresent {
		t.Fatalf("a session whose positions retention passed was answered Session Present 1")
	}
	for _, ch := range []string{"events", "ticks"} {
		want := fmt.Sprintf(`msg="stored position below the retention floor: session discarded, answered Session Present 0" broker=test client=dev channel=%s position=3 floor=6 lost_records=3`, ch)
		if !b.Log.Contains(want) {
			t.Fatalf("the operator was not told about %s; want %q in the log:\n%s", ch, want, b.Log.Tail(40))
		}
	}
	if b.Log.Contains("channel=audit position=") {
		t.Fatalf("a position retention did not pass was reported lost:\n%s", b.Log.Tail(40))
	}
	lost := b.PositionLost()
	for ch, want := range map[string]broker.PositionLoss{"events": {Passings: 1, Records: 3}, "ticks": {Passings: 1, Records: 3}, "audit": {}} {
		if got, ok := lost[ch]; !ok || got != want {
			t.Fatalf("position loss of %s: %+v (present %v), want %+v", ch, got, ok, want)
		}
	}
	if st := b.QoS2Stats(); st.Held != 0 {
		t.Fatalf("the discarded session's QoS 2 publish is still held: %+v", st)
	}
	// Discarded: no subscription was kept, and the broadcast it was owed
	// went with it.
	c.Quiet(300 * time.Millisecond)

	// The discard was stored before the CONNACK: after a restart the
	// device finds the new, empty session (Session Present 1, its own
	// record) and nothing of the old one.
	c.Close()
	b.Restart()
	c = brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 86400})
	if !c.Connack.SessionPresent {
		t.Fatalf("the new session stored at the Session Present 0 CONNACK did not survive the restart")
	}
	c.Quiet(300 * time.Millisecond)

	// Subscribing again: events from its floor, ticks from its tail, audit
	// from the position retention left alone.
	sa, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "events/#", QoS: 1}, {Topic: "ticks/#", QoS: 1}, {Topic: "audit/#", QoS: 1}}})
	if err != nil || len(sa.Reasons) != 3 || sa.Reasons[0] != 1 || sa.Reasons[1] != 1 || sa.Reasons[2] != 1 {
		t.Fatalf("subscribe: %v %+v", err, sa)
	}
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publish("events/a", "events-6", 1)
	publish("ticks/a", "ticks-6", 1)
	got := map[string]string{}
	for len(got) < 3 {
		p := c.Next(wait)
		ch := p.Topic[:len(p.Topic)-2]
		if _, dup := got[ch]; dup {
			t.Fatalf("second delivery on %s before the others: %q at %s (have %v)", ch, p.Payload, p.Properties.User.Get("saguin-offset"), got)
		}
		got[ch] = string(p.Payload) + "@" + p.Properties.User.Get("saguin-offset")
	}
	want := map[string]string{"events": "events-6@6", "ticks": "ticks-6@6", "audit": "audit-3@3"}
	for ch, w := range want {
		if got[ch] != w {
			t.Fatalf("after the discard %s served %s, want %s (all: %v)", ch, got[ch], w, got)
		}
	}
}

// Invariant 1, the half no consumer can be told: a connected consumer the
// floor overtakes is never written a record below the floor — not even one
// its pump had read into memory before the floor moved. Here the consumer
// allows one unacknowledged delivery (Receive Maximum 1) and holds offset 1
// while its pump has read the rest of the replay; retention then removes
// 1..37. Acknowledging 1 brings offset 38, the floor, next; the operator is
// told in one line how many went, the count is kept for the metric, and
// the late PUBACK of the record below the floor moves the stored position
// neither back nor past what was delivered.
func TestInvariant01_ConnectedConsumerOvertakenIsNeverWrittenBelowTheFloor(t *testing.T) {
	for _, p := range floorProviders {
		t.Run(p.name, func(t *testing.T) {
			b, clk := floorBroker(t, p.provider, "", floorChannels)
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			publishN(t, pub, "events/a", 1, 37)

			c := brokertest.Connect(t, b.Address(), "slow", brokertest.ClientOptions{CleanStart: true,
				SessionExpiry: 86400, ManualAck: true, ReceiveMaximum: 1})
			c.Subscribe("events/#", 1)
			first := c.Next(wait)
			if off := first.Properties.User.Get("saguin-offset"); off != "1" {
				t.Fatalf("first delivery at offset %s, want 1", off)
			}

			clk.Advance(2 * time.Hour)
			publishN(t, pub, "events/a", 38, 3) // 38..40, inside retention
			waitLog(t, b, `msg="retention removed records" broker=test channel=events records=37`)

			if err := c.Ack(first); err != nil {
				t.Fatal(err)
			}
			p := c.Next(wait)
			if off := p.Properties.User.Get("saguin-offset"); off != "38" {
				t.Fatalf("after the floor moved to 38 the consumer was written offset %s (%q): a record below the floor", off, p.Payload)
			}
			waitLog(t, b, `msg="consumer overtaken by retention: restarting at the floor" broker=test client=slow channel=events position=2 floor=38 lost_records=36`)
			if got := b.PositionLost()["events"]; got != (broker.PositionLoss{Passings: 1, Records: 36}) {
				t.Fatalf("position loss of events: %+v, want one passing of 36 records", got)
			}

			// 38 stays unacknowledged: the position is 38, the floor. The
			// PUBACK of 1 did not move it back below the floor (the resume
			// would be Session Present 0) nor past 38.
			c.Close()
			c = brokertest.Connect(t, b.Address(), "slow", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 86400})
			if !c.Connack.SessionPresent {
				t.Fatalf("resume after the overtaking: Session Present 0; the stored position fell below the floor")
			}
			if off := c.Next(wait).Properties.User.Get("saguin-offset"); off != "38" {
				t.Fatalf("resume after the overtaking served offset %s, want 38", off)
			}
		})
	}
}

// rawQoS0Reader connects a consumer that reads nothing until told to, with a
// small socket receive buffer, and subscribes filter at QoS 0.
func rawQoS0Reader(t *testing.T, addr, id, filter string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	send := func(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
		t.Helper()
		var buf bytes.Buffer
		if err := enc(&pk, &buf); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(buf.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	read := func() packets.Packet {
		t.Helper()
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		pk, err := brokertest.ReadPacket(r, 5)
		if err != nil {
			t.Fatal(err)
		}
		return pk
	}
	send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect:    packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 600},
		Properties: packets.Properties{SessionExpiryInterval: 86400, SessionExpiryIntervalFlag: true}},
		(*packets.Packet).ConnectEncode)
	if ack := read(); ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", ack)
	}
	send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5,
		PacketID: 1, Filters: packets.Subscriptions{{Filter: filter, Qos: 0}}}, (*packets.Packet).SubscribeEncode)
	if ack := read(); ack.FixedHeader.Type != packets.Suback {
		t.Fatalf("want the SUBACK first, got %+v", ack.FixedHeader)
	}
	return conn, r
}

// socketSendBufferMax is the most a TCP socket's send buffer grows to:
// tcp_wmem's maximum, or Linux's default where it cannot be read.
func socketSendBufferMax() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 3 {
			if n, err := strconv.Atoi(f[2]); err == nil {
				return n
			}
		}
	}
	return 4 << 20
}

// Invariant 1 for a QoS 0 consumer, whose pump waits on nothing but its
// socket: a consumer that stops reading holds its pump in a write with a
// replay read into memory behind it. Retention then removes every record;
// once the consumer reads again it receives what was handed to its socket
// before the floor moved — at most what the socket buffers and the one
// write in progress hold — and then the floor, never the rest of what the
// pump had read.
func TestInvariant01_QoS0ConsumerIsNeverWrittenWhatItsPumpHeldBelowTheFloor(t *testing.T) {
	const (
		records = 300
		size    = 32 << 10
	)
	// Bytes a consumer that stopped reading can have been handed before the
	// floor moved: the broker's socket send buffer at its largest (Linux
	// tcp_wmem's maximum, 4 MiB by default), this consumer's receive buffer,
	// and the one write in progress (the pump writes at most 64 deliveries
	// at a time) — by default well under the 256 records (8 MiB) a pump
	// reads at once, all of which it wrote before it checked the floor at
	// every write.
	handedAtMost := socketSendBufferMax() + 256<<10 + 64*(size+256)
	for _, p := range floorProviders {
		t.Run(p.name, func(t *testing.T) {
			b, clk := floorBroker(t, p.provider, "  limits:\n    write_timeout: none\n", floorChannels)
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			payload := bytes.Repeat([]byte("x"), size)
			for i := 1; i <= records; i++ {
				if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: payload}); err != nil || r.ReasonCode != 0 {
					t.Fatalf("publish %d: %v %v", i, err, r)
				}
			}
			conn, r := rawQoS0Reader(t, b.Address(), "deaf", "events/#")

			clk.Advance(2 * time.Hour)
			if resp, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("new")}); err != nil || resp.ReasonCode != 0 {
				t.Fatal(err, resp)
			}
			waitLog(t, b, fmt.Sprintf(`msg="retention removed records" broker=test channel=events records=%d`, records))

			// Reading again, at full speed: a tiny window crawls.
			if err := conn.(*net.TCPConn).SetReadBuffer(4 << 20); err != nil {
				t.Fatal(err)
			}
			var below uint64
			var bytesBelow int
			for {
				_ = conn.SetReadDeadline(time.Now().Add(wait))
				pk, err := brokertest.ReadPacket(r, 5)
				if err != nil {
					t.Fatalf("after %d records below the floor: %v", below, err)
				}
				if pk.FixedHeader.Type != packets.Publish {
					continue
				}
				off := rawOffset(t, pk)
				if off == records+1 {
					break
				}
				if off != below+1 {
					t.Fatalf("offset %d after %d: a gap below the floor", off, below)
				}
				below = off
				bytesBelow += len(pk.Payload) + len(pk.TopicName)
			}
			if bytesBelow > handedAtMost {
				t.Fatalf("the consumer was written %d records (%d bytes) below the floor, more than its socket and one write could hold when the floor moved: the pump wrote what it had read after the floor passed it", below, bytesBelow)
			}
			waitLog(t, b, fmt.Sprintf(`msg="consumer overtaken by retention: restarting at the floor" broker=test client=deaf channel=events position=%d floor=%d lost_records=%d`,
				below+1, records+1, records-below))
		})
	}
}
