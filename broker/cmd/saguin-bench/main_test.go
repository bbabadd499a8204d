package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// A smoke run of the whole command against the in-process mochi alone (no
// saguin build, no mosquitto): it measures, accounts for every message,
// prints the table and exits 0. mochi's QoS 1 attempt is off because that
// path deadlocks in mochi v2.7.9 and would only add its timeout.
func TestRunMochiOnly(t *testing.T) {
	var out, errOut bytes.Buffer
	work := t.TempDir()
	code := run([]string{"saguin-bench", "-quick", "-brokers", "mochi", "-mochi-qos1=false",
		"-duration", "300ms", "-publishers", "1,8", "-workdir", work, "-scenarios", "throughput"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	text := out.String()
	if !strings.HasPrefix(text, "command: saguin-bench -quick -brokers mochi -mochi-qos1=false -duration 300ms -publishers 1,8 -workdir ") {
		t.Errorf("the command line is not the first line:\n%s", text)
	}
	for _, pubs := range []string{"1", "8"} {
		row := regexp.MustCompile(`(?m)^\s*broadcast\s+` + pubs + `\s+1\s+-\s+([\d,]+) \*\s+-\s+-\s+-\s*$`)
		m := row.FindStringSubmatch(text)
		if m == nil || m[1] == "0" {
			t.Errorf("no broadcast row with a mochi figure for %s publishers:\n%s", pubs, text)
		}
	}
	// The deep-window shape (-deep-windows, default 8x64) is measured beside
	// them, in a row of its own.
	if !regexp.MustCompile(`(?m)^\s*broadcast\s+8\s+64\s+-\s+[\d,]+ \*\s+-\s+-\s+-\s*$`).MatchString(text) {
		t.Errorf("no broadcast row for 8 publishers x 64 in flight:\n%s", text)
	}
	if !strings.Contains(text, "== saguin failures: none") {
		t.Errorf("failures reported:\n%s", text)
	}
	// The work directory is removed on the way out.
	if entries, err := os.ReadDir(work); err != nil || len(entries) != 0 {
		t.Errorf("work directory left behind: %v %v", entries, err)
	}
}

// The latest scenarios alone against mochi (small sizes): its retained
// state and fan-out are measured and accounted for, the latest table is
// printed, no throughput table, and the run exits 0.
func TestRunMochiLatestOnly(t *testing.T) {
	var out, errOut bytes.Buffer
	work := t.TempDir()
	code := run([]string{"saguin-bench", "-quick", "-brokers", "mochi", "-mochi-qos1=false", "-scenarios", "latest",
		"-state-topics", "300", "-fanout-subscribers", "40", "-fanout-rounds", "2", "-workdir", work}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	text := out.String()
	for _, re := range []string{
		// QoS 1 was not tried (-mochi-qos1=false); QoS 0 always is.
		`(?m)^\s*state of 300 topics to a new QoS 1 subscriber\s+-\s+-\s+-\s+-\s+-\s+-\s*$`,
		`(?m)^\s*state of 300 topics to a new QoS 0 subscriber\s+-\s+-\s+\d+\.\d\d\s+-\s+-\s+-\s*$`,
		// The fan-out at QoS 0 is footnoted as such.
		`(?m)^\s*fan-out to 40, all received\s+-\s+-\s+\d+\.\d\d \+\s+-\s+-\s+-\s*$`,
		`(?m)^\s*fan-out, per-subscriber p99\s+-\s+-\s+\d+\.\d\d \+\s+-\s+-\s+-\s*$`,
		`(?m)^\+ mochi fan-out to QoS 0 subscribers$`,
	} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("no line matching %s in:\n%s", re, text)
		}
	}
	if strings.Contains(text, "msgs/s: QoS 1 PUBACKs") || !strings.Contains(text, "== saguin failures: none") {
		t.Errorf("throughput table printed, or failures:\n%s", text)
	}
}

func TestFlagsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"-publishers", "0"},
		{"-publishers", "1,x"},
		{"-brokers", "emqx"},
		{"-storms", "0"},
		{"-storms", "100001"},
		{"-in-flight", "0"},
		{"-fanout", "0"},
		{"-deaf-messages", "0"},
		{"-deaf-wait", "6m"},
		{"-queue-workers", "0"},
		{"-storages", ""},
		{"-duration", "0s"},
		{"-window", "0"},
		{"-deep-windows", "8"},
		{"-deep-windows", "0x64"},
		{"-deep-windows", "8x0"},
		{"-payload", "8"},
		{"-replay-records", "0"},
		{"-startup-runs", "0"},
		{"-scenarios", "throughput,soak"},
		{"-scenarios", ""},
		{"-state-topics", "0"},
		{"-state-topics", "1000001"},
		{"-fanout-subscribers", "0"},
		{"-fanout-subscribers", "10001"},
		{"-fanout-rounds", "0"},
		{"-fanout-rounds", "1001"},
		{"-point-read-clients", "0"},
		{"-point-read-clients", "1,5000"},
		{"stray"},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"saguin-bench"}, args...), &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}

func TestQuickDefaultsYieldToExplicitFlags(t *testing.T) {
	o, err := parseFlags([]string{"-quick"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.duration != quickDuration || o.replayRecords != quickReplayRec || o.startupRecords != quickStartupRec || o.fanOutRounds != quickFanOutRounds {
		t.Fatalf("quick: %+v", o)
	}
	o, err = parseFlags([]string{"-quick", "-duration", "3s", "-startup-records", "7"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.duration != 3*time.Second || o.startupRecords != 7 || o.replayRecords != quickReplayRec {
		t.Fatalf("explicit flags lost: %+v", o)
	}
	o, err = parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.duration != defaultDuration || o.replayRecords != 100_000 || o.startupRecords != 1_000_000 ||
		len(o.publishers) != 3 || o.publishers[2] != 64 || !slices.Equal(o.deep, []shape{{8, 64}}) {
		t.Fatalf("defaults are not the issue's: %+v", o)
	}
	// Issue 5's figures: a 10,000-topic state, fan-out to 1,000, point
	// reads from 1 and 32 clients.
	if o.stateTopics != 10_000 || o.fanOutSubs != 1_000 || o.fanOutRounds != defaultFanOutRounds ||
		len(o.readClients) != 2 || o.readClients[0] != 1 || o.readClients[1] != 32 {
		t.Fatalf("latest defaults are not the issue's: %+v", o)
	}
	// Step 6's table by default: every peer, 64 in flight, fan-out to 50,
	// storms of 2,000 then 10,000, 30,000 publishes beside a deaf
	// subscriber; with the replay and start-up its rows need, and Step 12's
	// bridge row.
	if !slices.Equal(o.scenarios, []string{"table", "replay", "startup", "bridge"}) || !slices.Equal(o.brokers, brokerNames) ||
		o.inFlight != 64 || o.fanSubs != 50 || !slices.Equal(o.storms, []int{2000, 10000}) || o.deafMessages != 30_000 {
		t.Fatalf("table defaults are not step 6's: %+v", o)
	}
	if o, err = parseFlags([]string{"-quick"}, &bytes.Buffer{}); err != nil || !slices.Equal(o.storms, []int{2000}) {
		t.Fatalf("-quick storms: %v %+v", err, o.storms)
	}
}

func TestListeningLine(t *testing.T) {
	for line, want := range map[string]string{
		`time=2026-11-29T21:49:53.466Z level=INFO msg=listening broker=bench listener=tcp address=127.0.0.1:35423`: "127.0.0.1:35423",
		`level=INFO msg="listening" address="127.0.0.1:1883" other=x`:                                              "127.0.0.1:1883",
		`level=INFO msg="attached listener" broker=bench id=tcp protocol=tcp address=127.0.0.1:35423`:              "",
		`level=INFO msg="operations listening" address=127.0.0.1:9000`:                                             "",
	} {
		m := listeningLine.FindStringSubmatch(line)
		got := ""
		if m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", line, got, want)
		}
	}
}

func TestSaguinConfig(t *testing.T) {
	mem, err := saguinConfig("memory", "/d")
	if err != nil || !strings.Contains(mem, "type: memory\n        snapshot_dir: none") {
		t.Fatalf("memory: %v\n%s", err, mem)
	}
	sq, err := saguinConfig("sqlite", "/d")
	if err != nil || !strings.Contains(sq, `file_path: "/d/saguin.db"`) {
		t.Fatalf("sqlite: %v\n%s", err, sq)
	}
	for _, want := range []string{`filter: "events/#"`, `filter: "replay/#"`, "type: latest\n    filter: \"state/#\"", "type: latest\n    filter: \"fanout/#\"", "type: queue\n    filter: \"jobs/#\"", `address: "127.0.0.1:0"`, "default_retention_period: none"} {
		if !strings.Contains(sq, want) {
			t.Errorf("configuration lacks %q", want)
		}
	}
	if _, err := saguinConfig("tape", "/d"); err == nil {
		t.Fatal("an unknown storage type was rendered")
	}
}

func TestFormatting(t *testing.T) {
	for f, want := range map[float64]string{0: "0", 999.4: "999", 1000: "1,000", 30000: "30,000", 1234567.6: "1,234,568", -4500: "-4,500"} {
		if got := commas(f); got != want {
			t.Errorf("commas(%v) = %q, want %q", f, got, want)
		}
	}
	ms := time.Millisecond
	if m := median([]time.Duration{30 * ms, 10 * ms, 20 * ms}); m != 20*ms {
		t.Errorf("median of three = %s", m)
	}
	if m := median([]time.Duration{40 * ms, 10 * ms}); m != 25*ms {
		t.Errorf("median of two = %s", m)
	}
	if got := shellQuote([]string{"bench", "-x", "a b", "it's", ""}); got != `bench -x 'a b' 'it'\''s' ''` {
		t.Errorf("shellQuote = %s", got)
	}
	if ratio(cell{rate: 3, ok: true}, cell{rate: 2, ok: true}) != "1.50" || ratio(cell{rate: 3, ok: true}, cell{}) != "-" {
		t.Error("ratio")
	}
}
