// Command chaos runs Sagüin under chaos and checks what its clients saw.
//
//	chaos [-seed N] [-duration D | -cycles N] [-provider sqlite,memory]
//	      [-nemeses kill=2,term,stop,cut,powercut] [-epoch D] [-out DIR]
//	      [-control NAME] [-check HISTORY]
//
// -control runs a negative control, a campaign that must fail: two lie to
// the checks about an honest broker (memory-kill-durable, powercut-no-loss);
// the others build saguin with -tags saguinfaults and break it on purpose
// (next-offset-max-plus-one, split-dead-letter, sqlite-sync-off; see
// rfcs/chaos-harness.md for the check that catches each).
//
// A long -duration is run as consecutive campaigns (epochs) of at most
// -epoch each, alternating between the providers, seeds seed, seed+1, ...
// (-duration is the total, not per provider): every history stays small enough to
// check, and a failure names the one seed that replays it. Each campaign's
// history, notes, broker log and (on failure) porcupine visualisation are
// written under -out.
//
// It prints the cycles run, the operations checked, the violations and the
// seed of any failure. Exit status: 0 every campaign passed; 1 a violation or
// an inconclusive check; 2 the harness itself failed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"saguin.dev/chaos/harness"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", 0, "seed of the first campaign (0: from the clock)")
	duration := fs.Duration("duration", 0, "total chaos time across campaigns (with -cycles: the bound of one campaign)")
	cycles := fs.Int("cycles", 0, "nemeses per campaign (one campaign per provider)")
	providers := fs.String("provider", "sqlite", "comma-separated providers, each run in turn: sqlite, memory")
	nemeses := fs.String("nemeses", "kill=2,term,stop,cut", "nemeses and weights: kill, term, stop, cut, powercut")
	epoch := fs.Duration("epoch", 5*time.Minute, "longest single campaign when -duration is long")
	out := fs.String("out", "", "directory for histories and logs (default: a new temporary directory)")
	binary := fs.String("binary", "", "prebuilt saguin binary (default: build ../broker)")
	control := fs.String("control", "", "negative control, the run must fail: "+strings.Join(harness.Controls(), ", ")+
		" (the last three build the broker with -tags "+harness.FaultBuildTag+")")
	check := fs.String("check", "", "check an existing history (its notes beside it as notes.jsonl) and exit")
	workers := fs.Int("workers", 0, "queue workers (default 3)")
	interval := fs.Duration("publish-interval", 0, "mean pause between one producer's publishes (default 20ms)")
	checkTimeout := fs.Duration("check-timeout", 5*time.Minute, "bound on the linearizability search per model")
	waive := fs.String("waive", "", "comma-separated checks whose findings are a known broker gap (reported as waived, not failed)")
	logLevel := fs.String("broker-log-level", "info", "the broker's log_level: debug, info, warn or error (debug to diagnose a replay)")
	quiet := fs.Bool("q", false, "no progress lines")
	catalog := fs.Bool("catalog", false, "print the checks a campaign runs, with the invariants each guards, as JSON, and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *catalog {
		// For make invariants: the chaos checks beside the TestInvariantNN_ tests.
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(harness.Catalog); err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 1
		}
		return 0
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *check != "" {
		return checkOnly(*check, *checkTimeout, splitList(*waive), stdout, stderr)
	}
	if *duration <= 0 && *cycles <= 0 {
		fmt.Fprintln(stderr, "chaos: set -duration or -cycles")
		return 2
	}
	ns, err := harness.ParseNemeses(*nemeses)
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v\n", err)
		return 2
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, *logLevel) {
		fmt.Fprintf(stderr, "chaos: -broker-log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	if *control != "" && !slices.Contains(harness.Controls(), *control) {
		fmt.Fprintf(stderr, "chaos: unknown control %q (want %s)\n", *control, strings.Join(harness.Controls(), ", "))
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	if *out == "" {
		d, err := os.MkdirTemp("", "saguin-chaos-")
		if err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 2
		}
		*out = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var log io.Writer = stderr
	if *quiet {
		log = nil
	}
	bin := *binary
	if bin == "" {
		dir := filepath.Join(*out, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 2
		}
		if bin, err = harness.BuildBroker(ctx, "", dir, harness.ControlBuildTags(*control)...); err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 2
		}
	}

	type plan struct {
		provider string
		seed     uint64
		dur      time.Duration
	}
	var plans []plan
	next := *seed
	var provs []string
	for _, p := range strings.Split(*providers, ",") {
		provs = append(provs, strings.TrimSpace(p))
	}
	if *cycles > 0 {
		for _, p := range provs {
			plans = append(plans, plan{p, next, *duration})
			next++
		}
	} else {
		// -duration is the whole run: epochs alternate between the
		// providers, so a one-hour run is one hour, shared by both.
		for i, left := 0, *duration; left > 0; i, left = i+1, left-*epoch {
			plans = append(plans, plan{provs[i%len(provs)], next, min(left, *epoch)})
			next++
		}
	}

	start := time.Now()
	var totalCycles, totalOps, totalViolations int
	var failedSeeds []string
	for i, pl := range plans {
		dir := filepath.Join(*out, fmt.Sprintf("%02d-%s-seed%d", i+1, pl.provider, pl.seed))
		rep, err := harness.Run(ctx, harness.Options{
			Seed: pl.seed, Duration: pl.dur, Cycles: *cycles, Provider: pl.provider, Nemeses: ns,
			OutDir: dir, Binary: bin, Control: *control, Workers: *workers, PublishInterval: *interval,
			CheckTimeout: *checkTimeout, Log: log, Waive: splitList(*waive), BrokerLogLevel: *logLevel,
		})
		if err != nil {
			fmt.Fprintf(stderr, "chaos: campaign %d (seed %d, %s): %v\n", i+1, pl.seed, pl.provider, err)
			return 2
		}
		fmt.Fprintln(stdout, rep.Summary())
		totalCycles += rep.Cycles
		totalOps += rep.Stats.Operations
		totalViolations += len(rep.Violations)
		if !rep.OK() {
			failedSeeds = append(failedSeeds, fmt.Sprintf("%d (%s)", pl.seed, pl.provider))
		}
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Fprintf(stdout, "chaos: %d campaign(s), %d cycles, %d operations checked, %d violations, %s\n",
		len(plans), totalCycles, totalOps, totalViolations, time.Since(start).Round(time.Second))
	if len(failedSeeds) > 0 {
		fmt.Fprintf(stdout, "chaos: FAILED seeds: %s (out: %s)\n", strings.Join(failedSeeds, ", "), *out)
		return 1
	}
	fmt.Fprintf(stdout, "chaos: PASS (out: %s)\n", *out)
	return 0
}

func checkOnly(history string, timeout time.Duration, waive []string, stdout, stderr io.Writer) int {
	dir := filepath.Dir(history)
	res, err := harness.CheckFiles(history, filepath.Join(dir, "notes.jsonl"), harness.CheckOptions{Timeout: timeout, HTMLDir: dir})
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "operations=%d %s\n", res.Stats.Operations, res.Stats)
	failed := len(res.Inconclusive) > 0
	for _, v := range res.Violations {
		if slices.Contains(waive, v.Check) {
			fmt.Fprintf(stdout, "  waived: %s\n", v)
			continue
		}
		failed = true
		fmt.Fprintf(stdout, "  %s\n", v)
	}
	for _, k := range res.Inconclusive {
		fmt.Fprintf(stdout, "  inconclusive: %s\n", k)
	}
	for _, h := range res.HTML {
		fmt.Fprintf(stdout, "  visualisation: %s\n", h)
	}
	if failed {
		return 1
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
