package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// QoS 2 inbound on channels: held publishes (rfcs/qos2-holds.md, qos2.go).

const qos2Config = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  qos2:
    max_inflight_per_client: 2
    expires_after: 1m
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
{{.Extra}}
`

func qos2ConfigWith(t *testing.T, provider, extra string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		t.Fatal(err)
	}
	tmpl := strings.Replace(qos2Config, "{{.Provider}}", provider, 1)
	tmpl = strings.Replace(tmpl, "{{.Extra}}", extra, 1)
	return brokertest.Config(t, dir, tmpl)
}

var qos2Providers = []struct{ name, provider string }{
	{"memory", memoryProvider},
	{"sqlite", sqliteProvider},
}

// q2Client is an MQTT 5 client written packet by packet, for the exchange
// steps a library hides (PUBREC, PUBREL, PUBCOMP and their reason codes).
type q2Client struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// q2Dial connects with the given Clean Start and Session Expiry and
// returns the client and the CONNACK's Session Present.
func q2Dial(t *testing.T, addr, id string, clean bool, expiry uint32) (*q2Client, bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := &q2Client{t: t, conn: conn, r: bufio.NewReader(conn)}
	c.send(packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: clean, Keepalive: 60},
		Properties:      packets.Properties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: expiry > 0},
	})
	ack := c.read()
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", ack)
	}
	return c, ack.SessionPresent
}

func (c *q2Client) send(pk packets.Packet) {
	c.t.Helper()
	pk.ProtocolVersion = 5
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Pubrel:
		err = pk.PubrelEncode(&buf)
	case packets.Disconnect:
		err = pk.DisconnectEncode(&buf)
	default:
		c.t.Fatalf("q2Client cannot send packet type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next packet decoded (fails the test after 20 s).
func (c *q2Client) read() packets.Packet {
	c.t.Helper()
	pk, err := c.readErr()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return pk
}

func (c *q2Client) readErr() (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var pk packets.Packet
	hb, err := c.r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	if pk.FixedHeader.Remaining, _, err = packets.DecodeLength(c.r); err != nil {
		return pk, err
	}
	body := make([]byte, pk.FixedHeader.Remaining)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return pk, err
	}
	pk.ProtocolVersion = 5
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	}
	return pk, err
}

// expect reads the next packet and checks its type, packet id and reason.
func (c *q2Client) expect(what string, typ byte, pid uint16, code byte) packets.Packet {
	c.t.Helper()
	pk := c.read()
	if pk.FixedHeader.Type != typ || (typ != packets.Disconnect && pk.PacketID != pid) || pk.ReasonCode != code {
		c.t.Fatalf("%s: got packet type %d id %d reason 0x%02x (%s), want type %d id %d reason 0x%02x",
			what, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString, typ, pid, code)
	}
	return pk
}

func (c *q2Client) publish2(pid uint16, topic, payload string) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, PacketID: pid,
		TopicName: topic, Payload: []byte(payload)})
}

// hold publishes at QoS 2 and expects PUBREC with the given reason.
func (c *q2Client) hold(pid uint16, topic, payload string, code byte) {
	c.t.Helper()
	c.publish2(pid, topic, payload)
	c.expect(fmt.Sprintf("PUBREC for %d", pid), packets.Pubrec, pid, code)
}

func (c *q2Client) pubrel(pid uint16) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, PacketID: pid})
}

// release sends PUBREL and expects PUBCOMP with the given reason.
func (c *q2Client) release(pid uint16, code byte) {
	c.t.Helper()
	c.pubrel(pid)
	c.expect(fmt.Sprintf("PUBCOMP for %d", pid), packets.Pubcomp, pid, code)
}

func (c *q2Client) drop() { _ = c.conn.Close() }

// disconnect sends DISCONNECT 0x00 and waits for the broker's close, which
// comes after the session is stored (invariant 18).
func (c *q2Client) disconnect() {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}})
	for {
		if _, err := c.readErr(); err != nil {
			return
		}
	}
}

// qos1 publishes one QoS 1 record through a library client and checks its
// PUBACK reason.
func qos1(t *testing.T, addr, topic, payload string, code byte) {
	t.Helper()
	p := brokertest.Connect(t, addr, "", brokertest.ClientOptions{CleanStart: true})
	defer p.Close()
	resp, err := p.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
	if err != nil {
		t.Fatalf("publish %s: %v", payload, err)
	}
	if resp.ReasonCode != code {
		t.Fatalf("publish %s: PUBACK 0x%02x, want 0x%02x", payload, resp.ReasonCode, code)
	}
}

// nextRecord reads a delivery and returns its payload and saguin-offset.
func nextRecord(t *testing.T, c *brokertest.Client) (string, string) {
	t.Helper()
	m := c.Next(wait)
	if m == nil {
		t.Fatal("no delivery")
	}
	off := ""
	if m.Properties != nil {
		off = m.Properties.User.Get("saguin-offset")
	}
	return string(m.Payload), off
}

func wantRecord(t *testing.T, c *brokertest.Client, payload, offset string) {
	t.Helper()
	p, off := nextRecord(t, c)
	if p != payload || off != offset {
		t.Fatalf("delivery %q at offset %s, want %q at offset %s", p, off, payload, offset)
	}
}

// waitQoS2 waits until the broker's QoS 2 counters are want: a drop is
// counted once its store write returns, on the goroutine that made it.
func waitQoS2(t *testing.T, b *brokertest.Broker, want broker.QoS2Stats) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for b.QoS2Stats() != want {
		if time.Now().After(deadline) {
			t.Fatalf("QoS2Stats = %+v, want %+v", b.QoS2Stats(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestInvariant01_HeldPublishTakesNoOffsetUntilReleased: a QoS 2 publish
// is PUBREC'd and held — no offset, not delivered — while a QoS 1 publish
// after it takes the next offset and is delivered; PUBREL writes it at the
// offset after that and PUBCOMP follows; a second PUBREL is answered
// 0x92. Broadcast QoS 2 is untouched.
func TestInvariant01_HeldPublishTakesNoOffsetUntilReleased(t *testing.T) {
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			b := brokertest.Start(t, qos2ConfigWith(t, pv.provider, ""))
			sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
			sub.Subscribe("events/#", 1)
			pub, _ := q2Dial(t, b.Address(), "pub", true, 0)
			pub.hold(1, "events/a", "held", 0x00)
			if s := b.QoS2Stats(); s.Held != 1 {
				t.Fatalf("QoS2Stats = %+v, want one held", s)
			}
			qos1(t, b.Address(), "events/a", "plain", 0x00)
			wantRecord(t, sub, "plain", "1")
			pub.release(1, 0x00)
			wantRecord(t, sub, "held", "2")
			pub.release(1, 0x92)
			// The connection still serves exchanges, broadcast ones too
			// (the substrate's own PUBREC/PUBREL/PUBCOMP).
			pub.hold(2, "elsewhere/x", "broadcast", 0x00)
			pub.release(2, 0x00)
			pub.hold(3, "events/a", "again", 0x00)
			pub.release(3, 0x00)
			wantRecord(t, sub, "again", "3")
			if s := b.QoS2Stats(); s.Held != 0 || s.Abandoned != 0 {
				t.Fatalf("QoS2Stats = %+v, want nothing held or abandoned", s)
			}
		})
	}
}

// TestQoS2InflightAllowanceRefusesAtPubrec: a client holding
// max_inflight_per_client exchanges has its next QoS 2 publish refused at
// PUBREC 0x97, nothing held, the connection kept; once one completes it
// may hold again.
func TestQoS2InflightAllowanceRefusesAtPubrec(t *testing.T) {
	b := brokertest.Start(t, qos2ConfigWith(t, memoryProvider, ""))
	pub, _ := q2Dial(t, b.Address(), "pub", true, 0)
	pub.hold(1, "events/a", "one", 0x00)
	pub.hold(2, "events/a", "two", 0x00)
	pub.hold(3, "events/a", "three", 0x97)
	if s := b.QoS2Stats(); s.Held != 2 {
		t.Fatalf("QoS2Stats = %+v, want 2 held", s)
	}
	pub.release(3, 0x92) // nothing was held for it
	pub.release(1, 0x00)
	pub.hold(3, "events/a", "three", 0x00)
	pub.release(2, 0x00)
	pub.release(3, 0x00)
	sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
	sub.Subscribe("events/#", 1)
	wantRecord(t, sub, "one", "1")
	wantRecord(t, sub, "two", "2")
	wantRecord(t, sub, "three", "3")
}

// TestQoS2ExpiredHoldIsAbandoned: a hold older than broker.qos2.expires_after
// is dropped and counted (saguin_qos2_abandoned_total) — by the sweep, or
// when its PUBREL finds it expired — and the late PUBREL gets PUBCOMP 0x92;
// nothing reaches the channel.
func TestQoS2ExpiredHoldIsAbandoned(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, qos2ConfigWith(t, sqliteProvider, ""), brokertest.WithClock(clk))
	pub, _ := q2Dial(t, b.Address(), "pub", false, 600)
	pub.hold(1, "events/a", "late", 0x00)
	clk.Advance(time.Minute)
	pub.release(1, 0x92) // judged at the PUBREL, whatever the sweep did
	// Counted once its drop is stored: by the PUBREL, or by a sweep the
	// advance woke, which may still be finishing.
	waitQoS2(t, b, broker.QoS2Stats{Held: 0, Abandoned: 1})

	pub.hold(2, "events/a", "swept", 0x00)
	clk.Advance(61 * time.Second)
	deadline := time.Now().Add(wait)
	for b.QoS2Stats().Abandoned != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweep never dropped the expired hold: %+v", b.QoS2Stats())
		}
		clk.Advance(time.Second) // the sweep ticks on the broker's clock
		time.Sleep(10 * time.Millisecond)
	}
	pub.release(2, 0x92)
	waitQoS2(t, b, broker.QoS2Stats{Held: 0, Abandoned: 2})
	qos1(t, b.Address(), "events/a", "marker", 0x00)
	sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
	sub.Subscribe("events/#", 1)
	wantRecord(t, sub, "marker", "1")
}

// TestQoS2ReleaseIntoFullChannelDisconnects: an append channel that filled
// between PUBREC and PUBREL refuses the release: DISCONNECT 0x97, no
// PUBCOMP, the hold kept. Once retention made room (here the size sweep of
// a restart), the PUBREL re-sent on the resumed session completes, once.
// Also a QoS 2 publish to a channel already at max_bytes is refused at
// PUBREC 0x97.
func TestQoS2ReleaseIntoFullChannelDisconnects(t *testing.T) {
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
			cfg := qos2ConfigWith(t, pv.provider, "    max_bytes: 2KiB\n    retention_bytes: 1KiB")
			b := brokertest.Start(t, cfg, brokertest.WithClock(clk))
			pub, _ := q2Dial(t, b.Address(), "pub", false, 600)
			held := strings.Repeat("h", 450) // larger than any filler: a refused filler means no room for it
			pub.hold(1, "events/a", held, 0x00)
			payload := strings.Repeat("x", 400)
			filled := 0
			for ; ; filled++ {
				if filled > 10 {
					t.Fatal("the channel never filled")
				}
				p := brokertest.Connect(t, b.Address(), "", brokertest.ClientOptions{CleanStart: true})
				resp, err := p.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte(payload)})
				p.Close()
				if resp != nil && resp.ReasonCode == 0x97 {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			pub.hold(2, "events/a", payload, 0x97) // already full at PUBLISH: nothing held
			pub.pubrel(1)
			pub.expect("release into a full channel", packets.Disconnect, 0, 0x97)
			if _, err := pub.readErr(); err == nil {
				t.Fatal("a packet followed the DISCONNECT (a PUBCOMP?)")
			}
			if s := b.QoS2Stats(); s.Held != 1 || s.Abandoned != 0 {
				t.Fatalf("QoS2Stats = %+v, want the hold kept", s)
			}
			b.Restart() // its start-up size sweep trims to retention_bytes
			pub, present := q2Dial(t, b.Address(), "pub", false, 600)
			if !present {
				t.Fatal("the session with the hold did not come back (Session Present 0)")
			}
			pub.release(1, 0x00)
			pub.release(1, 0x92)
			sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
			sub.Subscribe("events/#", 1)
			var last, lastOff string
			for range filled - 1 { // retention kept at least one full record
				if p, off := nextRecord(t, sub); p == held {
					last, lastOff = p, off
					break
				}
			}
			if last == "" {
				last, lastOff = nextRecord(t, sub)
			}
			if want := fmt.Sprint(filled + 1); last != held || lastOff != want {
				t.Fatalf("last record %.10q at %s, want the held one at %s", last, lastOff, want)
			}
		})
	}
}

// TestQoS2CleanStartDropsHolds: a session ended by a Clean Start takes its
// holds with it (counted abandoned); the new session's PUBREL for the old
// packet id is answered 0x92 and nothing is written.
func TestQoS2CleanStartDropsHolds(t *testing.T) {
	b := brokertest.Start(t, qos2ConfigWith(t, sqliteProvider, ""))
	pub, _ := q2Dial(t, b.Address(), "pub", false, 600)
	pub.hold(1, "events/a", "gone", 0x00)
	pub.drop()
	pub, present := q2Dial(t, b.Address(), "pub", true, 600)
	if present {
		t.Fatal("Clean Start answered Session Present 1")
	}
	pub.release(1, 0x92)
	if s := b.QoS2Stats(); s.Held != 0 || s.Abandoned != 1 {
		t.Fatalf("QoS2Stats = %+v, want the hold abandoned", s)
	}
	qos1(t, b.Address(), "events/a", "marker", 0x00)
	sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
	sub.Subscribe("events/#", 1)
	wantRecord(t, sub, "marker", "1")
}

// TestQoS2HoldOfASessionNotRestoredIsDroppedAtStart: a session that
// expired while the broker was stopped does not come back, and neither do
// its holds: dropped at start and counted; the client (Session Present 0)
// gets 0x92 for its PUBREL.
func TestQoS2HoldOfASessionNotRestoredIsDroppedAtStart(t *testing.T) {
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
			cfg := qos2ConfigWith(t, pv.provider, "")
			b := brokertest.Start(t, cfg, brokertest.WithClock(clk))
			pub, _ := q2Dial(t, b.Address(), "pub", false, 5)
			pub.hold(1, "events/a", "gone", 0x00)
			kept, _ := q2Dial(t, b.Address(), "kept", false, 600)
			kept.hold(1, "events/a", "kept", 0x00)
			pub.disconnect()
			kept.disconnect()
			if s := b.QoS2Stats(); s.Held != 2 {
				t.Fatalf("QoS2Stats before the restart = %+v, want both held", s)
			}
			// Stopped first, so every connection's end is noticed before
			// the clock moves: the session's expiry runs from that moment.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			clk.Advance(30 * time.Second) // less than expires_after: the hold itself is still young
			b = brokertest.Start(t, cfg, brokertest.WithClock(clk))
			if s := b.QoS2Stats(); s.Held != 1 || s.Abandoned != 1 {
				t.Fatalf("QoS2Stats after start = %+v, want kept's hold only, pub's abandoned", s)
			}
			pub, present := q2Dial(t, b.Address(), "pub", false, 5)
			if present {
				t.Fatal("an expired session came back")
			}
			pub.release(1, 0x92)
			kept, present = q2Dial(t, b.Address(), "kept", false, 600)
			if !present {
				t.Fatal("the kept session did not come back")
			}
			kept.release(1, 0x00)
			sub := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{})
			sub.Subscribe("events/#", 1)
			wantRecord(t, sub, "kept", "1")
		})
	}
}

// TestQoS2KilledBrokerCompletesFromTheHold: sqlite keeps the hold across a
// SIGKILL; the resumed session (Session Present 1) re-sends PUBREL and the
// release writes exactly one record; a second PUBREL is answered 0x92.
func TestQoS2KilledBrokerCompletesFromTheHold(t *testing.T) {
	cfg := qos2ConfigWith(t, sqliteProvider, "")
	p := brokertest.StartProcess(t, cfg)
	pub, _ := q2Dial(t, p.Address(), "pub", false, 600)
	pub.hold(7, "events/a", "held", 0x00)
	p.Kill()
	p.Restart()
	pub, present := q2Dial(t, p.Address(), "pub", false, 600)
	if !present {
		t.Fatal("the session did not survive the kill")
	}
	pub.hold(7, "events/a", "held", 0x00) // a re-sent PUBLISH is the same exchange, held once
	pub.release(7, 0x00)
	pub.release(7, 0x92)
	qos1(t, p.Address(), "events/a", "marker", 0x00)
	sub := brokertest.Connect(t, p.Address(), "reader", brokertest.ClientOptions{})
	sub.Subscribe("events/#", 1)
	wantRecord(t, sub, "held", "1")
	wantRecord(t, sub, "marker", "2")
}

// TestQoS2ReleaseIntoQueueAndLatest: a held job is not offered and a held
// value is not served until the PUBREL; the release enqueues the job (after
// one published later at QoS 1 — the hold took no offset) and replaces the
// value at the channel's next offset.
func TestQoS2ReleaseIntoQueueAndLatest(t *testing.T) {
	extra := `  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
  state:
    type: latest
    filter: "state/#"`
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			b := brokertest.Start(t, qos2ConfigWith(t, pv.provider, extra))
			w := brokertest.Connect(t, b.Address(), "worker", brokertest.ClientOptions{CleanStart: true})
			w.Subscribe("$saguin/queue/jobs", 1)
			l := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
			l.Subscribe("state/#", 1)
			pub, _ := q2Dial(t, b.Address(), "pub", true, 0)
			pub.hold(1, "jobs/a", "job-held", 0x00)
			pub.hold(2, "state/a", "value-held", 0x00)
			qos1(t, b.Address(), "jobs/a", "job-plain", 0x00)
			qos1(t, b.Address(), "state/b", "value-plain", 0x00)
			wantRecord(t, l, "value-plain", "1")
			job := w.Next(wait)
			if job == nil || string(job.Payload) != "job-plain" {
				t.Fatalf("first job offered: %+v, want job-plain (the held one is no job yet)", job)
			}
			answer(t, w, job, "ack")
			pub.release(1, 0x00)
			job = w.Next(wait)
			if job == nil || string(job.Payload) != "job-held" {
				t.Fatalf("job offered after the release: %+v, want job-held", job)
			}
			answer(t, w, job, "ack")
			pub.release(2, 0x00)
			wantRecord(t, l, "value-held", "2")
			pub.release(2, 0x92)
		})
	}
}

// rfcs/sessions-ownership.md: a hold the store refuses to drop (its session ended) stays
// in the index and is dropped again every second until the store takes it,
// then counted abandoned once; the exchange is gone for its client meanwhile
// (a later PUBREL is 0x92, never completed).
func TestQoS2RefusedDropIsRetriedEverySecond(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, qos2ConfigWith(t, sqliteProvider, ""), brokertest.WithClock(clk))
	b.RefuseHoldDrops("main", 2)
	pub, _ := q2Dial(t, b.Address(), "pub", false, 600)
	pub.hold(1, "events/a", "dropped", 0x00)
	pub, _ = q2Dial(t, b.Address(), "pub", true, 0) // Clean Start ends the session: its holds go
	pub.release(1, 0x92)
	if s := b.QoS2Stats(); s.Abandoned != 0 {
		t.Fatalf("counted abandoned though the store refused the drop: %+v", s)
	}
	deadline := time.Now().Add(wait)
	for b.QoS2Stats().Abandoned != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the refused drop was never retried: %+v", b.QoS2Stats())
		}
		clk.Advance(time.Second) // the retry ticks on the broker's clock, well before the 6 s sweep
		time.Sleep(10 * time.Millisecond)
	}
	if elapsed := clk.Now().Sub(time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)); elapsed >= 6*time.Second {
		t.Fatalf("dropped only after %s: the expiry sweep did it, not the one-second retry", elapsed)
	}
	waitQoS2(t, b, broker.QoS2Stats{Held: 0, Abandoned: 1})
}

// docs/channels.md "`latest`" at QoS 2: a zero-length publish to a latest channel deletes
// its topic's value when released, and deleting a topic that holds no value
// stores nothing — no tombstone, no offset taken — exactly as at QoS 1.
func TestQoS2DeletionOfAnUnsetLatestTopicStoresNothing(t *testing.T) {
	extra := `  state:
    type: latest
    filter: "state/#"`
	for _, pv := range qos2Providers {
		t.Run(pv.name, func(t *testing.T) {
			b := brokertest.Start(t, qos2ConfigWith(t, pv.provider, extra))
			pub, _ := q2Dial(t, b.Address(), "pub", true, 0)
			pub.hold(1, "state/never", "", 0x00)
			pub.release(1, 0x00)
			qos1(t, b.Address(), "state/set", "v", 0x00)
			pub.hold(2, "state/set", "", 0x00) // a deletion of a value that exists
			pub.release(2, 0x00)
			w := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
			sa, err := w.SubscribeWith(&paho.Subscribe{
				Subscriptions: []paho.SubscribeOptions{{Topic: "state/#", QoS: 1}},
				Properties:    &paho.SubscribeProperties{User: paho.UserProperties{{Key: "saguin-deletions", Value: "true"}}},
			})
			if err != nil || sa.Reasons[0] != 1 {
				t.Fatalf("subscribe with deletions: %v %v", err, sa)
			}
			p := w.Next(wait)
			if p.Topic != "state/set" || len(p.Payload) != 0 || p.Properties.User.Get("saguin-offset") != "2" {
				t.Fatalf("first of the state: %s %q offset %s; want state/set's tombstone at offset 2 (nothing stored for state/never)",
					p.Topic, p.Payload, p.Properties.User.Get("saguin-offset"))
			}
			w.Quiet(300 * time.Millisecond)
		})
	}
}
