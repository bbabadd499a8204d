package main

import (
	"bufio"
	"bytes"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The table against mochi alone, small and short (mochi runs in a child
// copy of this test binary: see TestMain): every scenario a peer has gives
// mochi a figure - its QoS 1 delivery may stall, and then the figure is
// the footnoted QoS 0 one - the rows only Sagüin has say n/a, a broker not
// run says -, and the run exits 0 (a peer's failure is listed, not fatal).
func TestRunTableMochi(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"saguin-bench", "-quick", "-brokers", "mochi", "-scenarios", "table", "-duration", "300ms",
		"-in-flight", "4", "-fanout", "5", "-storms", "100", "-deaf-messages", "2000", "-deaf-wait", "500ms",
		"-ack-timeout", "2s", "-rss-settle", "0s", "-deep-windows", "2x8", "-workdir", t.TempDir()}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	text := out.String()
	num := `[\d,]+(\.\d+)?( \[\d\])*`
	for _, re := range []string{
		`(?m)^\s*QoS 1 publish, 4 in flight, broadcast, msgs/s\s+-\s+` + num + `\s+-\s+-\s+-\s+-\s+-\s*$`,
		`(?m)^\s*QoS 1 publish, 2 publishers x 8 in flight, broadcast, msgs/s\s+-\s+` + num + `\s+-\s+-\s+-\s+-\s+-\s*$`,
		`(?m)^\s*QoS 0 publish, 4 publishers, delivered msgs/s\s+-\s+` + num + `\s+-\s+-`,
		`(?m)^\s*fan-out 1 -> 5, end-to-end p99, ms\s+-\s+` + num + `\s+-\s+-`,
		`(?m)^\s*2,000 QoS 1 publishes, subscriber keeping up: last PUBACK, s\s+-\s+` + num + `\s+-\s+-`,
		`(?m)^\s*QoS 0 subscriber not reading: disconnected\?\s+-\s+(yes|no) \[\d\]\s+-\s+-`,
		`(?m)^\s*connection storm of 100: RSS per connection, KiB\s+-\s+` + num + `\s+-\s+-`,
		`(?m)^\s*queue cycle on sqlite, jobs/s\s+-\s+n/a\s+n/a\s+n/a\s+-\s+-\s+-\s*$`,
		`(?m)^== saguin failures: none$`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("no match for %s in:\n%s", re, text)
		}
	}
}

// A payload carries its publisher, sequence and send time; the checker
// takes each publisher's sequence in order and names a duplicate, a loss
// and a stranger.
func TestSeqCheck(t *testing.T) {
	buf := make([]byte, 32)
	c := newSeqCheck(2)
	send := func(pub uint32, seq uint64) error {
		putPayload(buf, pub, seq, time.Duration(seq)*time.Millisecond)
		sent, err := c.observe(buf)
		if err == nil && sent != time.Duration(seq)*time.Millisecond {
			t.Fatalf("send time %s, want %dms", sent, seq)
		}
		return err
	}
	for _, ps := range [][2]uint64{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}} {
		if err := send(uint32(ps[0]), ps[1]); err != nil {
			t.Fatalf("in order %v: %v", ps, err)
		}
	}
	if err := send(0, 2); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("a repeat: %v", err)
	}
	if err := send(1, 3); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("a gap: %v", err)
	}
	if err := send(2, 0); err == nil || !strings.Contains(err.Error(), "did not publish") {
		t.Errorf("an unknown publisher: %v", err)
	}
	if _, err := c.observe([]byte("short")); err == nil {
		t.Error("a short payload was taken")
	}
}

// What the client writes, it reads back: a PUBLISH with Response Topic and
// Correlation Data in MQTT 5, and without properties in 3.1.1; a PUBACK's
// reason code; and a declared length past the bound is refused before any
// allocation.
func TestWireRoundTrip(t *testing.T) {
	for _, v := range []byte{mqtt311, mqtt5} {
		a, b := net.Pipe()
		w := &wconn{c: a, v: v, id: "w"}
		w.w = newTestWriter(a)
		r := &wconn{c: b, v: v, id: "r"}
		r.r = newTestReader(b)
		props := &pubProps{responseTopic: "$saguin/queue/jobs/response", correlation: []byte{1, 2, 3}}
		go func() {
			_ = w.writePublish("jobs/a", 1, 7, []byte("payload"), props)
			_ = w.writePuback(9)
			_ = w.flush()
		}()
		typ, flags, body, err := r.read()
		if err != nil || typ != pPUBLISH {
			t.Fatalf("v%d: %d %v", v, typ, err)
		}
		var p wpublish
		if err := r.decodePublishBody(flags, body, &p); err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if p.qos != 1 || p.id != 7 || string(p.topic) != "jobs/a" || string(p.payload) != "payload" {
			t.Errorf("v%d: %+v", v, p)
		}
		if v == mqtt5 && (p.props.responseTopic != props.responseTopic || !bytes.Equal(p.props.correlation, props.correlation)) {
			t.Errorf("v5 properties: %+v", p.props)
		}
		typ, _, body, err = r.read()
		if err != nil || typ != pPUBACK {
			t.Fatalf("v%d: %d %v", v, typ, err)
		}
		if id, reason, err := pubackReason(body); id != 9 || reason != 0 || err != nil {
			t.Errorf("PUBACK: %d 0x%02x %v", id, reason, err)
		}
		if _, reason, _ := pubackReason([]byte{0, 9, 0x87}); reason != 0x87 {
			t.Errorf("PUBACK reason: 0x%02x", reason)
		}
		go func() {
			// A PUBLISH declaring 268 MB.
			_, _ = a.Write([]byte{0x30, 0xff, 0xff, 0xff, 0x7f})
		}()
		if _, _, _, err := r.read(); err == nil || !strings.Contains(err.Error(), "at most") {
			t.Errorf("an oversized packet: %v", err)
		}
		_ = a.Close()
		_ = b.Close()
	}
}

// Properties the table does not use are skipped by their declared shapes;
// one truncated or unknown is an error, not a misread.
func TestParsePubProps(t *testing.T) {
	var p pubProps
	ok := []byte{0x01, 1, 0x02, 0, 0, 0, 9, 0x23, 0, 3, 0x0B, 0x81, 0x01, 0x26, 0, 1, 'k', 0, 1, 'v', 0x08, 0, 2, 'r', 't', 0x09, 0, 1, 7}
	if err := parsePubProps(ok, &p); err != nil || p.responseTopic != "rt" || !bytes.Equal(p.correlation, []byte{7}) {
		t.Fatalf("%v %+v", err, p)
	}
	for _, bad := range [][]byte{{0x08, 0, 5, 'a'}, {0x26, 0, 1, 'k'}, {0x7f}, {0x02, 0}} {
		if err := parsePubProps(bad, &pubProps{}); err == nil {
			t.Errorf("% x was taken", bad)
		}
	}
}

// The NATS configuration is what its MQTT needs: a server name, JetStream
// storing under the run's directory, and listeners on loopback only.
func TestNATSConfig(t *testing.T) {
	c := natsConfig("/w", 4222, 1883)
	for _, want := range []string{"server_name: saguin_bench", "listen: 127.0.0.1:4222", "store_dir: \"/w/jetstream\"", "mqtt {\n  listen: 127.0.0.1:1883\n}"} {
		if !strings.Contains(c, want) {
			t.Errorf("lacks %q:\n%s", want, c)
		}
	}
}

// drainDeaf tells a connection the broker closed from one it keeps open.
func TestDrainDeaf(t *testing.T) {
	a, b := net.Pipe()
	c := &wconn{c: b, v: mqtt5, id: "deaf"}
	c.r = newTestReader(b)
	go func() {
		_, _ = a.Write([]byte{0x30, 0x05, 0, 1, 't', 'x', 'y'})
		_ = a.Close()
	}()
	if gone, how := drainDeaf(c, time.Second); !gone || !strings.Contains(how, "1 buffered") {
		t.Errorf("closed: %v %s", gone, how)
	}
	a, b = net.Pipe()
	defer a.Close()
	c = &wconn{c: b, v: mqtt5, id: "deaf"}
	c.r = newTestReader(b)
	if gone, how := drainDeaf(c, 100*time.Millisecond); gone {
		t.Errorf("open: %v %s", gone, how)
	}
}

func newTestWriter(c net.Conn) *bufio.Writer { return bufio.NewWriter(c) }
func newTestReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

// Against an in-process Sagüin: the append row's records read back whole
// (a record missing from the channel would fail it), and the queue cycle
// accounts for every job once, on both providers.
func TestTableChannelsOnSaguin(t *testing.T) {
	for _, storage := range []string{"memory", "sqlite"} {
		t.Run(storage, func(t *testing.T) {
			addr := benchBroker(t, storage).Address()
			ctx := t.Context()
			res, err := tpublish(ctx, tpubConfig{addr: addr, version: mqtt5, ids: "app", topic: "events/t", pubs: 4, window: 1, qos: 1,
				duration: 300 * time.Millisecond, payload: 64, ackTimeout: 5 * time.Second})
			if err != nil || res.acked == 0 || res.acked != res.sent {
				t.Fatalf("append: %+v %v", res, err)
			}
			if _, err := treadBack(ctx, addr, "rb", "events/t/#", 4, res.acked, 5*time.Second); err != nil {
				t.Fatalf("read back: %v", err)
			}
			// One record fewer than the channel holds is a stranger.
			if _, err := treadBack(ctx, addr, "rb2", "events/t/#", 4, res.acked-1, 5*time.Second); err == nil {
				t.Fatal("a read back expecting fewer records than stored passed")
			}
			q, err := tqueue(ctx, addr, "qt", 2, 4, 4, 300*time.Millisecond, 64, 5*time.Second)
			if err != nil || q.jobs == 0 || q.elapsed <= 0 {
				t.Fatalf("queue: %+v %v", q, err)
			}
		})
	}
}
