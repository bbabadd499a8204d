package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// logsConfig: an append channel "events", a latest channel "state", and a
// message size that lets a client send a 1 MB publish for the broker to
// refuse.
const logsConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 2MiB
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
`

// maxLogLine bounds every line the broker writes, whatever a client sends
// (docs/operations.md "Logs": a client's mistake is at most one bounded line).
const maxLogLine = 1024

// logLine is one parsed slog text line: its keys in order and their values.
type logLine struct {
	raw  string
	keys []string
	vals map[string]string
}

func (l logLine) get(k string) string { return l.vals[k] }

// parseLogLine reads one line of log/slog's TextHandler: key=value pairs
// separated by single spaces, a value either bare (no space, quote or '=')
// or Go-quoted, beginning with time, level and msg.
func parseLogLine(line string) (logLine, error) {
	l := logLine{raw: line, vals: map[string]string{}}
	rest := line
	for rest != "" {
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 {
			return l, fmt.Errorf("no key=value at %q", cut(rest))
		}
		key := rest[:eq]
		if strings.ContainsAny(key, " \"") {
			return l, fmt.Errorf("bad key %q", cut(key))
		}
		rest = rest[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return l, fmt.Errorf("bad quoted value for %s: %v", key, err)
			}
			if val, err = strconv.Unquote(q); err != nil {
				return l, fmt.Errorf("bad quoted value for %s: %v", key, err)
			}
			rest = rest[len(q):]
		} else {
			end := strings.IndexByte(rest, ' ')
			if end < 0 {
				end = len(rest)
			}
			val = rest[:end]
			if strings.ContainsAny(val, `"=`) {
				return l, fmt.Errorf("bare value for %s holds a quote or '=': %q", key, cut(val))
			}
			rest = rest[end:]
		}
		if rest != "" {
			if rest[0] != ' ' {
				return l, fmt.Errorf("no space after %s", key)
			}
			rest = rest[1:]
		}
		if _, dup := l.vals[key]; dup {
			return l, fmt.Errorf("key %s given twice", key)
		}
		l.keys = append(l.keys, key)
		l.vals[key] = val
	}
	if len(l.keys) < 3 || l.keys[0] != "time" || l.keys[1] != "level" || l.keys[2] != "msg" {
		return l, fmt.Errorf("does not begin time= level= msg=")
	}
	if _, err := time.Parse(time.RFC3339Nano, l.vals["time"]); err != nil {
		return l, fmt.Errorf("time: %v", err)
	}
	switch l.vals["level"] {
	case "DEBUG", "INFO", "WARN", "ERROR":
	default:
		return l, fmt.Errorf("level %q", l.vals["level"])
	}
	return l, nil
}

func cut(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// checkLogLines parses every line of out, failing the test on a line that
// is not slog text or is longer than maxLogLine; it returns the lines.
func checkLogLines(t *testing.T, out string) []logLine {
	t.Helper()
	var lines []logLine
	for i, raw := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if raw == "" {
			continue
		}
		if len(raw) > maxLogLine {
			t.Errorf("log line %d is %d bytes (bound %d): %s", i+1, len(raw), maxLogLine, cut(raw))
		}
		l, err := parseLogLine(raw)
		if err != nil {
			t.Errorf("log line %d is not slog text key=value: %v: %s", i+1, err, cut(raw))
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

// substrateInternals are the substrate's own start and stop statements:
// they are about mochi-mqtt's machinery, not about the broker an operator
// runs, so they are never at info (docs/operations.md "A start" lists what is).
var substrateInternals = []string{
	"added hook", "attached listener", "mochi mqtt starting", "mochi mqtt server started",
	"gracefully stopping server", "stopping hook", "mochi mqtt server stopped",
}

// checkQuietSubstrate fails on any of the substrate's internals logged at
// info or above, and on any line with an empty message.
func checkQuietSubstrate(t *testing.T, lines []logLine) {
	t.Helper()
	for _, l := range lines {
		msg, level := l.get("msg"), l.get("level")
		if msg == "" {
			t.Errorf("a line with an empty message: %s", cut(l.raw))
		}
		for _, s := range substrateInternals {
			if msg == s && level != "DEBUG" {
				t.Errorf("the substrate's %q is logged at %s: %s", s, level, cut(l.raw))
			}
		}
	}
}

// publishRaw sends one QoS 1 PUBLISH and returns its PUBACK's reason code,
// skipping any PUBLISH the broker writes first (a seek's reply).
func publishRaw(t *testing.T, c *brokertest.RawClient, id uint16, pk packets.Packet) byte {
	t.Helper()
	pk.FixedHeader.Qos = 1
	pk.PacketID = id
	c.SendPublish(pk)
	for {
		got := c.Read()
		if got.FixedHeader.Type == packets.Puback && got.PacketID == id {
			return got.ReasonCode
		}
	}
}

// A client's mistakes — a refused 1 MB publish, a malformed seek, a point
// read without a Response Topic, a publish to a $saguin/ topic that is no
// route — are each one warn line naming the client, bounded whatever the
// client sent; never an ERROR, never a dump of the packet. The substrate's
// own machinery is not at info, and a client closing its connection is not
// a warning. Every line is slog text.
func TestLogClientMistakesAreOneBoundedWarnLineEach(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, brokertest.Config(t, dir, logsConfig))

	big, _ := brokertest.DialRaw(t, b.Address(), "big-publisher", true, 0)
	if code := publishRaw(t, big, 1, packets.Packet{TopicName: "$saguin/nothing/here",
		Payload: bytes.Repeat([]byte{0xAB}, 1<<20)}); code != 0x90 {
		t.Fatalf("1 MB publish to $saguin/nothing/here: PUBACK 0x%02x, want 0x90", code)
	}
	seeker, _ := brokertest.DialRaw(t, b.Address(), "bad-seeker", true, 300)
	if code := publishRaw(t, seeker, 1, packets.Packet{TopicName: "$saguin/consumer/events/seek",
		Payload: []byte("not a position")}); code != 0x83 {
		t.Fatalf("malformed seek: PUBACK 0x%02x, want 0x83", code)
	}
	reader, _ := brokertest.DialRaw(t, b.Address(), "no-response-topic", true, 0)
	if code := publishRaw(t, reader, 1, packets.Packet{TopicName: "$saguin/kv/get",
		Payload: []byte("state/a")}); code != 0x83 {
		t.Fatalf("point read without Response Topic: PUBACK 0x%02x, want 0x83", code)
	}
	router, _ := brokertest.DialRaw(t, b.Address(), "unknown-route", true, 0)
	if code := publishRaw(t, router, 1, packets.Packet{TopicName: "$saguin/no/such/route",
		Payload: []byte("x")}); code != 0x90 {
		t.Fatalf("unknown $saguin/ route: PUBACK 0x%02x, want 0x90", code)
	}
	// Connections ending: one dropped without DISCONNECT, one clean.
	leaver, _ := brokertest.DialRaw(t, b.Address(), "leaver", true, 0)
	leaver.Drop()
	polite, _ := brokertest.DialRaw(t, b.Address(), "polite", true, 0)
	polite.Disconnect()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	lines := checkLogLines(t, b.Log.String())
	checkQuietSubstrate(t, lines)
	for _, id := range []string{"big-publisher", "bad-seeker", "no-response-topic", "unknown-route"} {
		var warns []string
		for _, l := range lines {
			if l.get("client") == id && (l.get("level") == "WARN" || l.get("level") == "ERROR") {
				warns = append(warns, l.get("level")+" "+l.get("msg"))
			}
		}
		if len(warns) != 1 || !strings.HasPrefix(warns[0], "WARN ") {
			t.Errorf("client %s: want one WARN line for its refusal, got %q", id, warns)
		}
	}
	for _, l := range lines {
		if l.get("level") == "ERROR" {
			t.Errorf("an ERROR line for a client's mistake: %s", cut(l.raw))
		}
		if l.get("level") == "WARN" && (l.get("client") == "leaver" || l.get("client") == "polite" ||
			strings.Contains(l.get("error"), "EOF")) {
			t.Errorf("a connection's end is a warning: %s", cut(l.raw))
		}
		for k, v := range l.vals {
			if len(v) > 1000 && k != "msg" {
				t.Errorf("attribute %s holds %d bytes", k, len(v))
			}
		}
	}
}

// dialRawMQTT5 opens a raw MQTT 5 connection as id and returns it once the
// CONNACK has come, for tests that write bytes of their own on it (a flood
// of refused publishes, publishes sent in one segment).
func dialRawMQTT5(t *testing.T, addr, id string) (net.Conn, *bufio.Reader) {
	t.Helper()
	return dialRawMQTT5With(t, addr, id, packets.Properties{})
}

// dialRawMQTT5With is dialRawMQTT5 with the CONNECT's properties given.
func dialRawMQTT5With(t *testing.T, addr, id string, props packets.Properties) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var buf bytes.Buffer
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60}, Properties: props}
	if err := pk.ConnectEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	ack, err := brokertest.ReadPacket(r, 5)
	if err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v %v", ack, err)
	}
	return conn, r
}

// One client sending 10,000 publishes the broker refuses writes a bounded
// number of log lines and bytes: its first refusal, then, once the
// interval has passed, one line saying how many more there were. Every one
// is counted where the refusal metrics will read them.
func TestLogRefusalFloodIsRateLimitedAndCounted(t *testing.T) {
	const n = 10000
	fake := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), logsConfig), brokertest.WithClock(fake))
	conn, r := dialRawMQTT5(t, b.Address(), "flooder")
	before := len(b.Log.String())

	var stream bytes.Buffer
	for i := 0; i < n; i++ {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
			PacketID: uint16(i%60000 + 1), TopicName: "$saguin/no/such/route", Payload: []byte("bad")}
		if err := pk.PublishEncode(&stream); err != nil {
			t.Fatal(err)
		}
	}
	werr := make(chan error, 1)
	go func() { _, err := conn.Write(stream.Bytes()); werr <- err }()
	for i := 0; i < n; i++ {
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		pk, err := brokertest.ReadPacket(r, 5)
		if err != nil {
			t.Fatalf("after %d PUBACKs: %v", i, err)
		}
		if pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != 0x90 {
			t.Fatalf("answer %d: type %d code 0x%02x, want PUBACK 0x90", i, pk.FixedHeader.Type, pk.ReasonCode)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}

	flood := b.Log.String()[before:]
	lines := checkLogLines(t, flood)
	if len(lines) > 3 || len(flood) > 4096 {
		t.Errorf("%d refusals wrote %d log lines, %d bytes; want at most 3 lines and 4 KiB", n, len(lines), len(flood))
	}
	var counted uint64
	for _, c := range b.RefusalCounts() {
		if c.Kind == "publish" && c.Code == 0x90 {
			counted = c.Count
		}
	}
	if counted != n {
		t.Errorf("refusals counted: %d, want %d (%+v)", counted, n, b.RefusalCounts())
	}

	// Once the interval passes, one line says how many were not logged.
	deadline := time.Now().Add(10 * time.Second)
	for {
		fake.Advance(time.Minute)
		var found *logLine
		for _, l := range checkLogLines(t, b.Log.String()[before:]) {
			if l.get("client") == "flooder" && l.get("suppressed") != "" {
				found = &l
			}
		}
		if found != nil {
			if found.get("suppressed") != strconv.Itoa(n-1) || found.get("level") != "WARN" {
				t.Errorf("suppressed-refusals line: %s; want level WARN and suppressed=%d", found.raw, n-1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line says how many refusals were not logged:\n%s", b.Log.Tail(10))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// completeLines is out up to its last newline: a child's stdout is copied
// in chunks, which may end inside a line.
func completeLines(out string) string {
	return out[:strings.LastIndexByte(out, '\n')+1]
}

// The real binary's stdout is one slog text stream from its first line
// (storage's start-up statement included); nothing goes to stderr; the
// substrate's machinery is not at info; a refusal is one WARN line.
func TestLogBinaryStdoutIsOneSlogStream(t *testing.T) {
	dir := t.TempDir()
	cfg := brokertest.Config(t, dir, `
broker:
  id: logs
  log_level: info
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
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  events:
    type: append
    filter: "events/#"
`)
	var stdout, stderr brokertest.LogBuffer
	cmd := brokertest.Command(t, "--config", cfg)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	listening := regexp.MustCompile(`msg=listening .*address=(\S+)`)
	var addr string
	for deadline := time.Now().Add(60 * time.Second); addr == ""; {
		if m := listening.FindStringSubmatch(completeLines(stdout.String())); m != nil {
			addr = m[1]
			break
		}
		select {
		case <-exited:
			t.Fatalf("saguin exited:\n%s\n%s", stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("saguin did not listen:\n%s\n%s", stdout.String(), stderr.String())
		}
	}

	c, _ := brokertest.DialRaw(t, addr, "binary-client", true, 0)
	if code := publishRaw(t, c, 1, packets.Packet{TopicName: "$saguin/nothing", Payload: []byte("x")}); code != 0x90 {
		t.Fatalf("PUBACK 0x%02x, want 0x90", code)
	}
	// The refusal is logged before the PUBACK is written; the child's
	// stdout reaches the buffer through a pipe, so it is waited for.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(completeLines(stdout.String()), "$saguin/nothing"); {
		if time.Now().After(deadline) {
			t.Fatalf("the refusal was not logged:\n%s", stdout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// (A connection's end is asserted in-process, where Close orders it
	// before the log is read: TestLogClientMistakesAreOneBoundedWarnLineEach.)
	lines := checkLogLines(t, completeLines(stdout.String()))
	if stderr.String() != "" {
		t.Errorf("saguin wrote to stderr:\n%s", stderr.String())
	}
	if len(lines) == 0 || lines[0].get("msg") != "storage opened" {
		t.Errorf("the first line is not storage's start-up statement: %q", stdout.Tail(200))
	}
	checkQuietSubstrate(t, lines)
	refused := 0
	for _, l := range lines {
		if l.get("client") == "binary-client" && l.get("level") == "WARN" {
			refused++
		}
		if l.get("level") == "ERROR" || (l.get("level") == "WARN" && l.get("client") != "binary-client") {
			t.Errorf("unexpected %s line: %s", l.get("level"), cut(l.raw))
		}
	}
	if refused != 1 {
		t.Errorf("the refused publish: %d WARN lines, want 1", refused)
	}
}
