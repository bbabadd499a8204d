package logging

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// buffer is a goroutine-safe log sink.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.TrimRight(b.b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newTest(level slog.Level) (*slog.Logger, *buffer) {
	var buf buffer
	return New(&buf, level), &buf
}

func TestCutBoundsWhatTheLineShows(t *testing.T) {
	if got := Cut("short", 10); got != "short" {
		t.Fatalf("a string within the bound changed: %q", got)
	}
	got := Cut(strings.Repeat("a", 500), 200)
	if !strings.HasPrefix(got, strings.Repeat("a", 200)+"…(cut from 500 bytes)") || len(got) != 200+len("…(cut from 500 bytes)") {
		t.Fatalf("cut: %q", got)
	}
	// Bytes the handler escapes count as their escapes: 50 NULs show as
	// 200 bytes (\x00), so 50 fit and the 51st is cut.
	got = Cut(strings.Repeat("\x00", 60), 200)
	if !strings.HasPrefix(got, strings.Repeat("\x00", 50)+"…") {
		t.Fatalf("escaped bytes: %q", got)
	}
	// Never inside a rune.
	got = Cut(strings.Repeat("é", 10), 5)
	if !strings.HasPrefix(got, "éé…") {
		t.Fatalf("rune boundary: %q", got)
	}
}

// A packet handed to the logger — a 1 MB publish included — is a summary
// of a few fields; a byte slice is its length; a struct of another type is
// named; a client-supplied string is cut at ClientValueMax, anything else at
// ValueMax; the same holds for attributes given to With and inside groups.
func TestBoundedValues(t *testing.T) {
	log, buf := newTest(slog.LevelDebug)
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 7,
		TopicName: strings.Repeat("t", 5000), Payload: bytes.Repeat([]byte{0xFF}, 1<<20)}
	type secret struct{ Payload []byte }
	log.With("client", strings.Repeat("c", 5000)).Info("x",
		"pk", pk, "ptr", &pk, "will", mqtt.Will{TopicName: "w", Payload: make([]byte, 3000)},
		"raw", make([]byte, 1<<20), "other", secret{Payload: make([]byte, 100)},
		"error", errors.New(strings.Repeat("e", 5000)), "note", strings.Repeat("n", 5000),
		slog.Group("g", "topic", strings.Repeat("g", 5000)))
	lines := buf.lines()
	if len(lines) != 1 {
		t.Fatalf("%d lines", len(lines))
	}
	line := lines[0]
	for _, want := range []string{
		"pk.type=PUBLISH pk.id=7 pk.qos=1 pk.topic=", "pk.payload_bytes=1048576",
		"ptr.type=PUBLISH", "will.topic=w will.qos=0 will.retain=false will.payload_bytes=3000",
		`raw="<1048576 bytes>"`, `other=<logging.secret>`,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("line lacks %q: %s", want, line)
		}
	}
	for key, max := range map[string]int{"client": ClientValueMax, "pk.topic": ClientValueMax, "g.topic": ClientValueMax,
		"error": ValueMax, "note": ValueMax} {
		i := strings.Index(line, " "+key+"=")
		if i < 0 {
			t.Errorf("no %s in %s", key, line)
			continue
		}
		v := line[i+len(key)+2:]
		v = v[:strings.Index(v, "…(cut from 5000 bytes)")]
		if n := len(strings.TrimPrefix(v, `"`)); n != max {
			t.Errorf("%s shows %d bytes before its cut, want %d", key, n, max)
		}
	}
	if len(line) > 4096 {
		t.Errorf("the line is %d bytes", len(line))
	}
	if strings.Contains(line, "255 255") || strings.Contains(line, "Payload") {
		t.Errorf("a payload was dumped: %.300s", line)
	}
}

func TestBoundedIsNotWrappedTwice(t *testing.T) {
	h := Bounded(slog.NewTextHandler(&buffer{}, nil))
	if Bounded(h) != h {
		t.Fatal("a bounded handler was wrapped again")
	}
}

// The substrate's info lines are its machinery: debug. A record with no
// message is a connection's end: debug, with a message. Its lines about a
// publish the broker's hook refused are dropped (the broker logged the
// refusal). A packet it refused is one warn refusal line, rate-limited,
// with a summary of the packet; a DISCONNECT with Will Message taking the
// same path is not a refusal. Every line says component=substrate, except
// refusals, which are the broker's.
func TestSubstrateMapsItsRecords(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		log, buf := newTest(level)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		r := NewRefusalLog(log, func() time.Time { return now })
		s := Substrate(log.With("broker", "b"), r)

		s.Info("added hook", "hook", "saguin")
		s.With("listener", "tcp").Warn("", "error", errors.New("EOF"))
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "a/b",
			Payload: make([]byte, 1<<20)}
		s.Error("publish packet error", "error", errors.New("refused"), "hook", "saguin", "packet", pk)
		s.Debug("publish packet rejected", "error", packets.ErrRejectPacket, "packet", pk)
		s.Debug("packet rejected", "packet", pk)
		s.Warn(mqtt.ErrMinimumKeepalive.Error(), "client", "c1", "keepalive", 0)
		s.Warn("error processing packet", "error", packets.ErrProtocolViolation, "client", "c2", "listener", "tcp", "pk", pk)
		s.Warn("error processing packet", "error", packets.ErrProtocolViolation, "client", "c2", "listener", "tcp", "pk", pk)
		s.Warn("error processing packet", "error", packets.CodeDisconnectWillMessage, "client", "c3", "pk", pk)

		lines := buf.lines()
		var want []string
		if level == slog.LevelDebug {
			want = []string{
				`level=DEBUG msg="added hook" broker=b component=substrate hook=saguin`,
				`level=DEBUG msg="connection ended" broker=b component=substrate listener=tcp error=EOF`,
				`level=DEBUG msg="` + mqtt.ErrMinimumKeepalive.Error() + `" broker=b component=substrate client=c1 keepalive=0`,
			}
		}
		want = append(want, `level=WARN msg="packet refused: connection closed" client=c2 code=0x82 error="`+
			packets.ErrProtocolViolation.Reason+`" listener=tcp packet.type=PUBLISH packet.qos=1 packet.topic=a/b packet.payload_bytes=1048576`)
		if level == slog.LevelDebug {
			want = append(want, `level=DEBUG msg="connection ended" broker=b component=substrate`)
		}
		if len(lines) != len(want) {
			t.Fatalf("at %s: %d lines, want %d:\n%s", level, len(lines), len(want), strings.Join(lines, "\n"))
		}
		for i, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("at %s, line %d:\n got %s\nwant …%s…", level, i, lines[i], w)
			}
		}
		if got := r.Counts(); len(got) != 1 || got[0] != (RefusalCount{Kind: KindPacket, Code: 0x82, Count: 2}) {
			t.Errorf("counts %+v", got)
		}
	}
}

// One client's refusals of one kind: the first is logged, the rest within
// the interval are counted; the interval's end brings one line with how
// many, and a later refusal is logged again, carrying the count held back
// since the last line. Every refusal is counted.
func TestRefusalLogOneClient(t *testing.T) {
	log, buf := newTest(slog.LevelDebug)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRefusalLog(log, func() time.Time { return now })
	for i := 0; i < 10000; i++ {
		r.Refused(Refusal{Level: slog.LevelWarn, Client: "c", Kind: "publish", Code: 0x90, Msg: "publish refused",
			Args: []any{"topic", "$saguin/x"}})
		now = now.Add(time.Microsecond)
	}
	if n := len(buf.lines()); n != 1 {
		t.Fatalf("10000 refusals within an interval wrote %d lines", n)
	}
	r.Flush(false) // less than an interval since the line: nothing
	if n := len(buf.lines()); n != 1 {
		t.Fatalf("an early flush wrote a line: %q", buf.lines())
	}
	now = now.Add(RefusalInterval)
	r.Flush(false)
	r.Flush(false)
	lines := buf.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], `level=WARN msg="refusals not logged" client=c kind=publish suppressed=9999`) {
		t.Fatalf("after the interval:\n%s", strings.Join(lines, "\n"))
	}
	// Within the interval after the summary, held back; after it, logged
	// with what was held.
	r.Refused(Refusal{Level: slog.LevelWarn, Client: "c", Kind: "publish", Code: 0x90, Msg: "publish refused"})
	now = now.Add(RefusalInterval)
	r.Refused(Refusal{Level: slog.LevelWarn, Client: "c", Kind: "publish", Code: 0x90, Msg: "publish refused"})
	lines = buf.lines()
	if len(lines) != 3 || !strings.Contains(lines[2], `msg="publish refused" client=c code=0x90 suppressed=1`) {
		t.Fatalf("a later refusal:\n%s", strings.Join(lines, "\n"))
	}
	// Another kind from the same client is logged on its own.
	r.Refused(Refusal{Level: slog.LevelWarn, Client: "c", Kind: "subscribe", Code: 0x83, Count: 3, Msg: "SUBSCRIBE refused"})
	if n := len(buf.lines()); n != 4 {
		t.Fatalf("another kind: %d lines", n)
	}
	want := []RefusalCount{{Kind: "publish", Code: 0x90, Count: 10002}, {Kind: "subscribe", Code: 0x83, Count: 3}}
	if got := r.Counts(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	// Idle for an interval: forgotten, so the map shrinks back.
	now = now.Add(RefusalInterval)
	r.Flush(false)
	if n := len(r.entries); n != 0 {
		t.Fatalf("%d idle entries kept", n)
	}
}

// Many clients: the tracked map never passes its bound (invariant 13), the
// lines of one interval never pass their budget, and nothing is lost from
// the counts or from the summaries (an evicted entry's pending count goes
// to one line about clients no longer tracked).
func TestRefusalLogManyClientsIsBounded(t *testing.T) {
	log, buf := newTest(slog.LevelDebug)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRefusalLog(log, func() time.Time { return now })
	const clients = 3 * refusalClients
	for round := 0; round < 3; round++ {
		for c := 0; c < clients; c++ {
			r.Refused(Refusal{Level: slog.LevelWarn, Client: fmt.Sprintf("client-%05d-", c) + strings.Repeat("x", 1000),
				Kind: "publish", Code: 0x90, Msg: "publish refused"})
			if n := len(r.entries); n > refusalClients {
				t.Fatalf("%d entries tracked, bound %d", n, refusalClients)
			}
		}
	}
	if n := len(buf.lines()); n != refusalLines {
		t.Fatalf("one interval wrote %d lines, budget %d", n, refusalLines)
	}
	var reported uint64
	count := func(lines []string) {
		for _, l := range lines {
			if i := strings.Index(l, "suppressed="); i >= 0 {
				var n uint64
				for _, ch := range l[i+len("suppressed="):] {
					if ch < '0' || ch > '9' {
						break
					}
					n = n*10 + uint64(ch-'0')
				}
				reported += n
			}
		}
	}
	// Flushes, an interval apart, each within the budget, until nothing is
	// pending.
	seen := len(buf.lines())
	for i := 0; i < 100 && (len(r.entries) > 0 || r.evicted > 0); i++ {
		now = now.Add(RefusalInterval)
		r.Flush(false)
		lines := buf.lines()[seen:]
		if len(lines) > refusalLines {
			t.Fatalf("a flush wrote %d lines, budget %d", len(lines), refusalLines)
		}
		count(lines)
		seen += len(lines)
	}
	if want := uint64(3*clients - refusalLines); reported != want {
		t.Fatalf("lines report %d refusals not logged, want %d", reported, want)
	}
	if got := r.Counts(); len(got) != 1 || got[0].Count != 3*clients {
		t.Fatalf("counts %+v", got)
	}
	for _, l := range buf.lines() {
		if len(l) > 1024 {
			t.Fatalf("a %d-byte line", len(l))
		}
	}
}

// Flush(true), at shutdown, writes what is pending whatever its age.
func TestRefusalLogFlushAll(t *testing.T) {
	log, buf := newTest(slog.LevelDebug)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewRefusalLog(log, func() time.Time { return now })
	for i := 0; i < 3; i++ {
		r.Refused(Refusal{Level: slog.LevelDebug, Client: "c", Kind: "publish rate", Code: 0x97, Msg: "publish refused"})
	}
	r.Flush(true)
	lines := buf.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], `level=DEBUG msg="refusals not logged" client=c kind="publish rate" suppressed=2`) {
		t.Fatalf("%s", strings.Join(lines, "\n"))
	}
}

func TestLevelOf(t *testing.T) {
	for name, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo,
		"warn": slog.LevelWarn, "error": slog.LevelError, "": slog.LevelInfo} {
		if got := LevelOf(name); got != want {
			t.Errorf("LevelOf(%q) = %s, want %s", name, got, want)
		}
	}
}

// New follows its Leveler as it changes (SIGUSR1 re-reads
// broker.log_level into a LevelVar).
func TestNewFollowsItsLevelVar(t *testing.T) {
	var lv slog.LevelVar
	lv.Set(slog.LevelWarn)
	var buf buffer
	log := New(&buf, &lv)
	log.Info("hidden")
	lv.Set(slog.LevelInfo)
	log.Info("shown")
	if lines := buf.lines(); len(lines) != 1 || !strings.Contains(lines[0], "msg=shown") {
		t.Fatalf("%q", lines)
	}
}
