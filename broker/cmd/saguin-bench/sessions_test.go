package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker/config"
)

// TestMain lets the test binary serve as the mochi child the sessions
// scenarios start (startMochiChild runs os.Executable()).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == childMochi {
		os.Exit(serveMochiChild(os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// The sessions scenarios against mochi in a child process (small sizes):
// sessions are created, measured idle, reconnected with Session Present 1
// and measured connected; the table has mochi's figures and the run exits 0.
func TestRunMochiSessions(t *testing.T) {
	var out, errOut bytes.Buffer
	work := t.TempDir()
	code := run([]string{"saguin-bench", "-quick", "-brokers", "mochi", "-scenarios", "sessions",
		"-sessions", "60", "-rss-settle", "50ms", "-workdir", work}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	text := out.String()
	for _, re := range []string{
		`(?m)^\s*KiB per idle persistent session\s+-\s+-\s+-?\d+\.\d\s+-\s+-\s+-\s*$`,
		`(?m)^\s*KiB per connected client \(with its session\)\s+-\s+-\s+-?\d+\.\d\s+-\s+-\s+-\s*$`,
		`(?m)^\s*reconnect storm of 60, s\s+-\s+-\s+\d+\.\d\d\s+-\s+-\s+-\s*$`,
		// mochi keeps no backlog measurement.
		`(?m)^\s*backlog 200 x 100: delivered, s\s+-\s+-\s+-\s+-\s+-\s+-\s*$`,
		`(?m)^RSS mochi: [\d.]+ MiB at start, [\d.]+ idle, [\d.]+ connected, [\d.]+ after all left`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("no line matching %s in:\n%s", re, text)
		}
	}
	if !strings.Contains(text, "== saguin failures: none") || strings.Contains(text, "reference broker failures") {
		t.Errorf("failures reported:\n%s", text)
	}
}

// The backlog scenario end to end against mochi in a child process: every
// away session is stored its message and receives it on reconnecting. One
// message each, because mochi v2.7.9 resends an away session's messages
// sorted by a timestamp in whole seconds (Inflight.GetAll), so several
// published within a second come back in any order - which the scenario
// reports as the loss-or-reorder it is (the next test).
func TestBacklogOnMochi(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := startMochiChild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.stop(10 * time.Second); err != nil {
			t.Error(err)
		}
	}()
	o, err := parseFlags([]string{"-backlog-sessions", "20", "-backlog-messages", "1", "-rss-settle", "100ms", "-window", "4"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	b := &bench{o: o, out: &out, results: newResults()}
	var bc backlogCell
	if err := b.backlog(ctx, p, &bc); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !bc.ok || bc.store <= 0 || bc.deliver <= 0 {
		t.Fatalf("figures missing: %+v", bc)
	}
	if !strings.Contains(out.String(), "all 20 sessions reconnected and had their 1 messages") {
		t.Errorf("progress:\n%s", out.String())
	}
}

// A broker that reorders a backlog fails the scenario: mochi v2.7.9 does
// (see above), with 30 messages published within a second to 20 sessions.
func TestBacklogReorderFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := startMochiChild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.stop(10 * time.Second) }()
	o, err := parseFlags([]string{"-backlog-sessions", "20", "-backlog-messages", "30", "-rss-settle", "100ms", "-window", "8"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{o: o, out: &bytes.Buffer{}, results: newResults()}
	var bc backlogCell
	err = b.backlog(ctx, p, &bc)
	if err == nil || !strings.Contains(err.Error(), "lost or out of order") || bc.ok {
		t.Fatalf("a reordered backlog passed: %v %+v", err, bc)
	}
}

func TestBacklogOrder(t *testing.T) {
	o := backlogOrder{k: 3}
	for _, step := range []struct {
		seq int
		dup bool
		ok  bool
	}{{0, false, true}, {0, true, true}, {1, false, true}, {0, false, false}} {
		if err := o.observe(step.seq, step.dup); (err == nil) != step.ok {
			t.Fatalf("message %d dup %v: %v", step.seq, step.dup, err)
		}
	}
	if o.done() || o.dups != 1 {
		t.Fatalf("after 0, 0 (DUP), 1: %+v", o)
	}
	if err := o.observe(2, false); err != nil || !o.done() {
		t.Fatalf("last message: %v %+v", err, o)
	}
	for _, seq := range []int{3, 9} {
		if err := o.observe(seq, false); err == nil {
			t.Errorf("message %d past the %d published was accepted", seq, o.k)
		}
	}
	gap := backlogOrder{k: 5}
	if err := gap.observe(1, false); err == nil {
		t.Error("message 1 before 0 was accepted (a loss)")
	}
}

func TestBacklogPayload(t *testing.T) {
	buf := make([]byte, 128)
	backlogPayload(buf, 0xabc, 77)
	if seq, err := readBacklogPayload(buf, 0xabc); err != nil || seq != 77 {
		t.Fatalf("round trip: %d %v", seq, err)
	}
	if _, err := readBacklogPayload(buf, 0xabd); err == nil {
		t.Error("another run's payload was accepted")
	}
	if _, err := readBacklogPayload(buf[:15], 0xabc); err == nil {
		t.Error("a short payload was accepted")
	}
}

func TestVmRSS(t *testing.T) {
	kib, err := parseVmRSS([]byte("Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t   12345 kB\nVmData:\t1 kB\n"))
	if err != nil || kib != 12345 {
		t.Fatalf("parse: %d %v", kib, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\tx kB\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if kib, err := readRSS(os.Getpid()); err != nil || kib <= 0 {
		t.Fatalf("own RSS: %d %v", kib, err)
	}
}

// peekLength reads a Remaining Length without waiting for bytes a packet
// does not have: a 4-byte PUBACK alone in the stream must not block.
func TestPeekLength(t *testing.T) {
	for in, want := range map[string]int{
		"\x40\x02\x00\x01":     2,
		"\x30\x7f":             127,
		"\x30\x80\x01":         128,
		"\x30\xff\xff\xff\x7f": 268435455,
		"\xe0\x00":             0,
	} {
		r := bufio.NewReader(strings.NewReader(in))
		got, err := peekLength(r)
		if err != nil || got != want {
			t.Errorf("% x: %d %v, want %d", in, got, err, want)
		}
		if r.Buffered() != len(in) {
			t.Errorf("% x: bytes consumed", in)
		}
	}
	if _, err := peekLength(bufio.NewReader(strings.NewReader("\x30\xff\xff\xff\xff\x01"))); err == nil {
		t.Error("a five-byte Remaining Length was accepted")
	}
}

// The configuration the sessions scenarios give Sagüin is one the broker's
// own loader accepts, with the limits it says.
func TestSessionsConfigLoads(t *testing.T) {
	for _, storage := range []string{"memory", "sqlite"} {
		dir := t.TempDir()
		body, err := saguinConfigWith(storage, dir, "max_connections: 10064\n    max_connect_rate: none")
		if err != nil {
			t.Fatal(err)
		}
		path, err := writeConfigBody(dir, body)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatalf("%s: %v\n%s", storage, err, body)
		}
		if l := cfg.Broker.Limits; l.MaxConnections != 10064 || l.MaxConnectRate != 0 {
			t.Errorf("%s: limits %+v", storage, l)
		}
		if filepath.Dir(path) != dir {
			t.Errorf("written to %s", path)
		}
	}
}

func TestSessionsFlags(t *testing.T) {
	o, err := parseFlags([]string{"-quick"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.sessions != quickSessions || o.backlogSessions != quickBacklogSessions || o.backlogMessages != 100 || o.connectRate != "none" {
		t.Fatalf("quick: %+v", o)
	}
	o, err = parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.sessions != 10_000 || o.backlogSessions != 1_000 || o.backlogMessages != 100 {
		t.Fatalf("defaults are not the step's: %+v", o)
	}
	// Step 5's figures are a group of their own; make bench runs step 6's
	// table (main_test.go).
	if o, err = parseFlags([]string{"-scenarios", "sessions"}, &bytes.Buffer{}); err != nil || !o.runs("sessions") || o.runs("table") {
		t.Fatalf("-scenarios sessions: %+v %v", o.scenarios, err)
	}
	if o, err = parseFlags([]string{"-quick", "-sessions", "7", "-saguin-connect-rate", "500"}, &bytes.Buffer{}); err != nil || o.sessions != 7 || o.connectRate != "500" {
		t.Fatalf("explicit flags lost: %+v %v", o, err)
	}
	for _, args := range [][]string{
		{"-sessions", "0"},
		{"-sessions", "100001"},
		{"-backlog-sessions", "0"},
		{"-backlog-messages", "65536"},
		{"-backlog-sessions", "100000", "-backlog-messages", "101"},
		{"-dialers", "0"},
		{"-create-concurrency", "5000"},
		{"-sessions-timeout", "0s"},
		{"-rss-settle", "2m"},
		{"-saguin-connect-rate", "0"},
		{"-saguin-connect-rate", "fast"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
