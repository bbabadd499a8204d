// Command saguin-bench measures Sagüin beside mosquitto, a bare
// mochi-mqtt server and NATS server's MQTT listener in one run and prints
// one table of figures and ratios. By default (make bench) that is the
// table of step 6 (table.go): QoS 1 publish with 64 in flight (broadcast,
// append on memory and on sqlite), the deep-window shape of issue 13 (8
// publishers x 64 in flight: broadcast, append on sqlite), QoS 0 publish, a fan-out from one
// publisher to 50 subscribers, the deaf-subscriber case, connection storms
// of 2,000 and 10,000 clients, the queue cycle, the replay and the
// start-up over 1,000,000 records; NATS is the durable MQTT 3.1.1 peer,
// "n/a" where a scenario needs what it lacks. Beside the table, the bridge
// row (bridge.go): 50,000 QoS 1 records from a mosquitto hub across a
// Sagüin bridge into an append channel, and across mosquitto's own bridge
// into a mosquitto edge, in the same run.
//
// The other scenario groups (-scenarios) measure, on paho-based load:
//
//   - QoS 1 publish throughput into an append channel (memory and sqlite
//     providers) and QoS 1 broadcast, with 1, 8 and 64 concurrent
//     publishers one publish in flight each, and 8 publishers keeping 64 in
//     flight each (-deep-windows); the reference brokers have no channels,
//     so Sagüin's append figures are set beside their QoS 1 broadcast to
//     one subscriber; on sqlite, the batch sizes group commit reached (the
//     provider's close line);
//   - the replay rate of a 100,000-record channel to one consumer;
//   - broker start-up time over a 1,000,000-record sqlite database;
//   - a 10,000-topic latest channel's state sent to a new subscriber, one
//     latest update fanned out to 1,000 subscribers (beside the reference
//     brokers' retained messages), and point reads per second on
//     $saguin/kv/get from 1 and 32 clients (Sagüin alone; latest.go);
//   - the memory of 10,000 idle durable sessions and of as many connected
//     clients, the time for all of them to reconnect at once, and an
//     offline backlog of 100 messages for 1,000 away sessions stored and
//     delivered (sessions.go).
//
// Every figure comes from a run whose messages were all accounted for: a
// PUBACK other than 0x00, a message lost, duplicated or reordered, or a gap
// in a replay's offsets fails that scenario, and any Sagüin failure makes
// the command exit 1. A broadcast subscriber may fall at most -max-lag
// messages behind the publishers, so a figure is a delivery rate the broker
// sustains, not the size of the queue it drops at. Where a reference broker
// fails (mochi v2.7.9's QoS 1 delivery deadlocks; mosquitto 2.0.11 drops a
// subscriber's messages at 64 publishers), the failure is listed and the
// figure set beside Sagüin's is re-measured under a footnoted fallback.
// Every process it starts is stopped on the way out, on a signal too.
//
//	go run ./cmd/saguin-bench            the full table (about 15 minutes)
//	go run ./cmd/saguin-bench -quick     a smoke run of it (about 4 minutes)
//	go run ./cmd/saguin-bench -scenarios throughput,replay,startup,latest,sessions   the earlier groups
//	go run ./cmd/saguin-bench -quick -scenarios latest    the latest figures alone
//	go run ./cmd/saguin-bench -quick -scenarios sessions  session memory, reconnect storm, offline backlog
//	go run ./cmd/saguin-bench -quick -scenarios bridge    the bridge row alone
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if os.Getenv(childEnv) == childMochi {
		// A copy of this command serving mochi for the sessions scenarios,
		// which read a broker's memory from a process of its own.
		os.Exit(serveMochiChild(os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// options are the command's flags after -quick has filled in what was not
// set explicitly.
type options struct {
	duration       time.Duration
	quick          bool
	publishers     []int
	window         int
	deep           []shape // -deep-windows: extra throughput shapes
	payload        int
	brokers        []string
	storages       []string
	replayRecords  int64
	startupRecords int64
	startupRuns    int
	saguinBin      string
	saguinSrc      string
	mosquitto      string
	workdir        string
	keep           bool
	receiveMax     int
	maxLag         int64
	ackTimeout     time.Duration
	verifyAppend   bool
	mochiQoS1      bool
	gogc           int
	timeout        time.Duration
	scenarios      []string
	// latest scenarios (latest.go)
	stateTopics  int
	fanOutSubs   int
	fanOutRounds int
	readClients  []int
	// sessions scenarios (sessions.go)
	sessions          int
	backlogSessions   int
	backlogMessages   int
	dialers           int
	createConcurrency int
	sessionsTimeout   time.Duration
	rssSettle         time.Duration
	connectRate       string
	// the table (table.go)
	natsBin      string
	storms       []int
	inFlight     int
	fanSubs      int
	deafMessages int
	deafWait     time.Duration
	queueWorkers int
}

func (o options) has(broker string) bool { return slices.Contains(o.brokers, broker) }

// runs reports whether a scenario group was selected with -scenarios.
func (o options) runs(scenario string) bool { return slices.Contains(o.scenarios, scenario) }

// scenarioGroups are what -scenarios selects from: the throughput table
// (append, its read-back, broadcast), the replay, the start-up, and the
// latest channel's figures, and durable sessions' memory, reconnect storm
// and offline backlog.
var scenarioGroups = []string{"table", "throughput", "replay", "startup", "latest", "sessions", "bridge"}

// defaultScenarios are what `make bench` runs: the one table, whose
// replay and start-up rows the replay and startup groups measure.
var defaultScenarios = []string{"table", "replay", "startup", "bridge"}

// brokerNames are what -brokers selects from.
var brokerNames = []string{"saguin", "mochi", "mosquitto", "nats"}

// Bounds on what the flags may ask for (invariant 13: a benchmark that
// allocates per publisher or per record takes no unbounded count).
const (
	maxPublishers     = 4096
	maxRecords        = 100_000_000
	maxRunDuration    = 10 * time.Minute
	defaultDuration   = 10 * time.Second
	quickDuration     = time.Second
	defaultStartupRec = 1_000_000
	quickStartupRec   = 5_000
	defaultReplayRec  = 100_000
	quickReplayRec    = 5_000
)

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("saguin-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var pubs, deep, brokers, storages, scenarios, readClients, storms string
	fs.DurationVar(&o.duration, "duration", defaultDuration, "length of each throughput run (in-flight PUBACKs are still awaited)")
	fs.BoolVar(&o.quick, "quick", false, "smoke mode: 1s runs, 5,000-record replay and start-up database (explicit flags still win)")
	fs.StringVar(&pubs, "publishers", "1,8,64", "comma-separated concurrent publisher counts")
	fs.IntVar(&o.window, "window", 1, "QoS 1 publishes each publisher keeps in flight")
	fs.StringVar(&deep, "deep-windows", "8x64", "throughput: extra shapes, publishers x publishes in flight each (\"\" for none)")
	fs.IntVar(&o.payload, "payload", 128, "payload bytes")
	fs.StringVar(&brokers, "brokers", strings.Join(brokerNames, ","), "brokers to measure (nats: the table only)")
	fs.StringVar(&storages, "storages", "memory,sqlite", "Sagüin storage providers to measure")
	fs.Int64Var(&o.replayRecords, "replay-records", defaultReplayRec, "records in the replayed channel")
	fs.Int64Var(&o.startupRecords, "startup-records", defaultStartupRec, "records in the sqlite database start-up is timed over (0 = skip)")
	fs.IntVar(&o.startupRuns, "startup-runs", 3, "start-ups timed; the median is reported")
	fs.StringVar(&o.saguinBin, "saguin-bin", "", "use this saguin binary instead of building ./cmd/saguin")
	fs.StringVar(&o.saguinSrc, "saguin-src", "", "the saguin.dev/broker module to build (default: found from the working directory)")
	fs.StringVar(&o.mosquitto, "mosquitto", "/usr/sbin/mosquitto", "mosquitto binary")
	fs.StringVar(&o.workdir, "workdir", "", "parent directory for data and configurations (default: the system temp dir)")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory")
	fs.IntVar(&o.receiveMax, "receive-maximum", 1024, "Receive Maximum of every subscriber")
	fs.Int64Var(&o.maxLag, "max-lag", 250, "broadcast: publishers wait while the subscriber is this many messages behind (0 = never; then brokers drop at their queue bounds)")
	fs.DurationVar(&o.ackTimeout, "ack-timeout", 10*time.Second, "longest wait for one PUBACK (or for a stalled subscriber)")
	fs.BoolVar(&o.verifyAppend, "verify-append", true, "read each append channel back and account for every acknowledged record")
	fs.BoolVar(&o.mochiQoS1, "mochi-qos1", true, "try mochi with a QoS 1 subscriber before falling back to QoS 0")
	fs.IntVar(&o.gogc, "gogc", 400, "GC percent of this process (load generator and in-process mochi)")
	fs.DurationVar(&o.timeout, "timeout", 45*time.Minute, "bound on the whole run")
	fs.StringVar(&scenarios, "scenarios", strings.Join(defaultScenarios, ","), "scenario groups to run: some of "+strings.Join(scenarioGroups, ", "))
	latestFlags(fs, &o, &readClients)
	tableFlags(fs, &o, &storms)
	sessionFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["duration"] {
			o.duration = quickDuration
		}
		if !set["replay-records"] {
			o.replayRecords = quickReplayRec
		}
		if !set["startup-records"] {
			o.startupRecords = quickStartupRec
		}
	}
	var err error
	if o.publishers, err = parseCounts(pubs); err != nil {
		return o, fmt.Errorf("-publishers: %w", err)
	}
	if o.deep, err = parseShapes(deep); err != nil {
		return o, fmt.Errorf("-deep-windows: %w", err)
	}
	if o.brokers, err = parseSet(brokers, brokerNames); err != nil {
		return o, fmt.Errorf("-brokers: %w", err)
	}
	if o.storages, err = parseSet(storages, []string{"memory", "sqlite"}); err != nil {
		return o, fmt.Errorf("-storages: %w", err)
	}
	if o.scenarios, err = parseSet(scenarios, scenarioGroups); err != nil {
		return o, fmt.Errorf("-scenarios: %w", err)
	}
	if err := checkLatest(&o, set, readClients); err != nil {
		return o, err
	}
	if err := checkSessions(&o, set); err != nil {
		return o, err
	}
	if err := checkTable(&o, set, storms); err != nil {
		return o, err
	}
	switch {
	case o.duration <= 0 || o.duration > maxRunDuration:
		return o, fmt.Errorf("-duration %s: want above 0 and at most %s", o.duration, maxRunDuration)
	case o.window < 1 || o.window > 65535:
		return o, fmt.Errorf("-window %d: want 1..65535", o.window)
	case o.payload < 16 || o.payload > 1<<20:
		return o, fmt.Errorf("-payload %d: want 16..1048576", o.payload)
	case o.replayRecords < 1 || o.replayRecords > maxRecords:
		return o, fmt.Errorf("-replay-records %d: want 1..%d", o.replayRecords, maxRecords)
	case o.startupRecords < 0 || o.startupRecords > maxRecords:
		return o, fmt.Errorf("-startup-records %d: want 0..%d", o.startupRecords, maxRecords)
	case o.startupRuns < 1 || o.startupRuns > 25:
		return o, fmt.Errorf("-startup-runs %d: want 1..25", o.startupRuns)
	case o.maxLag < 0 || o.maxLag > maxRecords:
		return o, fmt.Errorf("-max-lag %d: want 0..%d", o.maxLag, maxRecords)
	case o.receiveMax < 1 || o.receiveMax > 65535:
		return o, fmt.Errorf("-receive-maximum %d: want 1..65535", o.receiveMax)
	case o.ackTimeout <= 0:
		return o, fmt.Errorf("-ack-timeout %s: want above 0", o.ackTimeout)
	case o.timeout <= 0:
		return o, fmt.Errorf("-timeout %s: want above 0", o.timeout)
	}
	return o, nil
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxPublishers {
			return nil, fmt.Errorf("%q: want counts from 1 to %d", f, maxPublishers)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func parseSet(s string, allowed []string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(allowed, f) {
			return nil, fmt.Errorf("%q: want some of %s", f, strings.Join(allowed, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty: want some of %s", strings.Join(allowed, ", "))
	}
	return out, nil
}

// run is the whole command; args[0] is the program name. It returns the
// exit code: 0, 1 when a Sagüin scenario failed or the run could not be
// made, 2 for bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args[1:], stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "saguin-bench:", err)
		}
		return 2
	}
	started := time.Now()
	fmt.Fprintf(stdout, "command: %s\n", shellQuote(args))
	if wd, err := os.Getwd(); err == nil {
		fmt.Fprintf(stdout, "directory: %s\n", wd)
	}
	prevGC := debug.SetGCPercent(o.gogc)
	defer debug.SetGCPercent(prevGC)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	parent := o.workdir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "saguin-bench-")
	if err != nil {
		fmt.Fprintln(stderr, "saguin-bench:", err)
		return 1
	}
	if o.keep {
		defer fmt.Fprintf(stdout, "work directory kept: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	b := &bench{o: o, dir: dir, out: stdout, results: newResults()}
	// Every process a scenario starts is stopped by that scenario's own
	// defer, so a failure, a signal (ctx) or a panic on this goroutine all
	// unwind through them; a child also gets SIGKILL from the kernel if this
	// process dies without unwinding (Pdeathsig).
	b.header(ctx)
	b.runAll(ctx)
	b.report(time.Since(started))
	if ctx.Err() != nil {
		fmt.Fprintf(stdout, "run cut short: %v\n", context.Cause(ctx))
		return 1
	}
	if b.results.saguinFailed() {
		return 1
	}
	return 0
}

// shellQuote renders argv as one line a shell would split back the same.
func shellQuote(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ',' || r == '=' || r == ':' ||
				r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) < 0 {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}
