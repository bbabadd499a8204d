// Command invariants prints the table `make invariants` shows: for each of
// the eighteen invariants (docs/invariants.md), the guards that cover it —
// tests named TestInvariantNN_* anywhere in the repository, and the chaos
// harness's checks — and the code that keeps it: every comment line in
// non-test Go source that begins "invariant N:", with its file, line and the
// function (or type, constant, variable) it sits in, found by parsing the
// source rather than by matching text, so a marker names where it is.
//
// It reads the output of `go test -json` on standard input and gives each
// guard's pass/fail, counting its subtests and naming a failed one; a
// subtest named InvariantNN_* (a storagetest conformance case) is a guard
// of NN under whatever test runs it; with -check it runs nothing and reads nothing, and the
// guards are the test functions the source declares (the cheap mode make
// test runs). -catalog names the chaos checks (chaos -catalog) and -reports
// the report.json files of the last chaos campaigns (make chaos-short), whose
// verdicts are the checks' pass/fail.
//
// It exits 1, with a line naming each one, when an invariant has no guard,
// no code marked as keeping it, or a guard that failed; 2 when it cannot
// read what it was given.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

type options struct {
	root      string
	check     bool
	verbose   bool
	catalog   string
	reports   string
	harnesses []string
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("invariants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.root, "root", ".", "the repository: every module under it is read")
	fs.BoolVar(&o.check, "check", false, "run nothing: guards are the TestInvariantNN_ functions in the source, and standard input is not read")
	fs.BoolVar(&o.verbose, "v", false, "print each marker's comment under its site")
	fs.StringVar(&o.catalog, "catalog", "", "the chaos checks as JSON (chaos -catalog)")
	fs.StringVar(&o.reports, "reports", "", "glob of chaos campaign report.json files")
	harness := fs.String("harness", "", "comma-separated module directories that check the broker rather than are it: their markers are listed but keep no invariant")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "invariants: unexpected arguments %q\n", fs.Args())
		return 2
	}
	for _, h := range strings.Split(*harness, ",") {
		if h = strings.TrimSpace(h); h != "" {
			o.harnesses = append(o.harnesses, strings.Trim(h, "/"))
		}
	}
	t, err := scan(o.root)
	if err != nil {
		fmt.Fprintln(stderr, "invariants:", err)
		return 2
	}
	catalog, verdict, campaigns, err := chaosVerdicts(o.catalog, o.reports)
	if err != nil {
		fmt.Fprintln(stderr, "invariants:", err)
		return 2
	}
	var results map[testKey]string
	if !o.check {
		if results, err = readResults(stdin); err != nil {
			fmt.Fprintln(stderr, "invariants:", err)
			return 2
		}
	}
	rows := buildRows(t, results, catalog, verdict, o)
	return printTable(stdout, rows, t, o, catalog != nil, campaigns)
}

type event struct {
	Action  string
	Package string
	Test    string
}

// guardSegment is a test name, or one level of a subtest's name, that says
// which invariant it guards: TestInvariantNN_* at the top, InvariantNN_* for
// a subtest (a storagetest conformance case, say) under any parent.
var guardSegment = regexp.MustCompile(`^(?:Test)?Invariant(\d\d)_`)

// guardOf finds the guard a test path belongs to: the path down to its
// deepest level named for an invariant, and that invariant. Levels below it
// are the guard's subtests; a path with no such level is no guard's.
func guardOf(test string) (n int, guard string, ok bool) {
	levels := strings.Split(test, "/")
	for i := len(levels) - 1; i >= 0; i-- {
		m := guardSegment.FindStringSubmatch(levels[i])
		if m == nil || i == 0 && !strings.HasPrefix(levels[0], "Test") || i > 0 && strings.HasPrefix(levels[i], "Test") {
			continue
		}
		n, _ = strconv.Atoi(m[1])
		return n, strings.Join(levels[:i+1], "/"), true
	}
	return 0, "", false
}

// testKey names one test or subtest of one package.
type testKey struct{ pkg, test string }

// readResults reads `go test -json` and returns the outcome ("pass",
// "fail" or "skip") of every test that is a guard or one of a guard's
// subtests, at any depth.
func readResults(r io.Reader) (map[testKey]string, error) {
	results := map[testKey]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Action != "pass" && e.Action != "fail" && e.Action != "skip" {
			continue
		}
		if _, _, ok := guardOf(e.Test); !ok {
			continue
		}
		key := testKey{e.Package, e.Test}
		if results[key] == "fail" {
			continue // a guard that failed once failed
		}
		results[key] = e.Action
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading go test -json: %w", err)
	}
	return results, nil
}

// guardRun is one guard as it ran: its own outcome and its subtests'.
type guardRun struct {
	n      int
	key    testKey
	action string
	subs   map[string]string // subtest path below the guard → outcome
	used   bool
}

// runs groups the results by guard.
func runs(results map[testKey]string) map[testKey]*guardRun {
	out := map[testKey]*guardRun{}
	for k, action := range results {
		n, g, _ := guardOf(k.test)
		gk := testKey{k.pkg, g}
		r := out[gk]
		if r == nil {
			r = &guardRun{n: n, key: gk, subs: map[string]string{}}
			out[gk] = r
		}
		if g == k.test {
			r.action = action
		} else {
			r.subs[strings.TrimPrefix(k.test, g+"/")] = action
		}
	}
	return out
}

// tally is what one guard's run adds to its row: how many tests ran (the
// guard and each subtest), whether any failed, and the lines that say so.
func (r *guardRun) tally(name string) (counted int, failed bool, lines []string) {
	switch r.action {
	case "pass":
		counted++
	case "fail":
		counted++
		failed = true
		name += " (FAILED)"
	case "skip":
		name += " (skipped)"
	default:
		name += " (not run)"
	}
	lines = append(lines, name)
	var passed, skipped int
	var bad []string
	for _, sub := range slices.Sorted(maps.Keys(r.subs)) {
		switch r.subs[sub] {
		case "pass":
			passed++
		case "fail":
			failed = true
			bad = append(bad, "  subtest "+sub+" (FAILED)")
		case "skip":
			skipped++
		}
	}
	counted += passed + len(bad)
	if len(r.subs) > 0 {
		lines = append(lines, fmt.Sprintf("  subtests: %d passed, %d failed, %d skipped", passed, len(bad), skipped))
	}
	return counted, failed, append(lines, bad...)
}

// row is one invariant's line of the table.
type row struct {
	n       int
	guards  []string // printed, in order
	counted int      // guards that count: run (or, with -check, declared) tests, their subtests, and chaos checks
	failed  bool
	code    []site // markers in the broker's own modules
	others  []site // markers in harness modules: listed, not counted
}

func buildRows(t *tree, results map[testKey]string, catalog []chaosCheck, verdict map[string]string, o options) []row {
	rows := make([]row, 19)
	ran := runs(results)
	add := func(r *row, g *guardRun, name string) {
		c, failed, lines := g.tally(name)
		r.counted += c
		r.failed = r.failed || failed
		r.guards = append(r.guards, lines...)
	}
	for n := 1; n <= 18; n++ {
		r := row{n: n}
		for _, g := range t.guards[n] {
			if o.check {
				r.guards = append(r.guards, g.display())
				r.counted++
				continue
			}
			gr := ran[testKey{g.pkg, g.name}]
			if gr == nil {
				gr = &guardRun{subs: map[string]string{}}
			}
			gr.used = true
			add(&r, gr, g.display())
		}
		// Subtests named for an invariant (storagetest's conformance
		// cases): each run is a guard of its own; one that never ran is
		// listed as not run.
		for _, c := range t.cases[n] {
			if o.check {
				r.guards = append(r.guards, c.display()+" (a subtest)")
				r.counted++
				continue
			}
			seen := false
			for _, gk := range slices.SortedFunc(maps.Keys(ran), compareTestKeys) {
				gr := ran[gk]
				if gr.n != n || gr.used || path.Base(gr.key.test) != c.name || !strings.Contains(gr.key.test, "/") {
					continue
				}
				gr.used, seen = true, true
				add(&r, gr, t.displayPkg(gk.pkg)+"."+gk.test)
			}
			if !seen {
				r.guards = append(r.guards, c.display()+" (a subtest, not run)")
			}
		}
		for _, c := range catalog {
			if !slices.Contains(c.Invariants, n) {
				continue
			}
			v := verdict[c.Name]
			if v == "FAIL" {
				r.failed = true
			}
			r.guards = append(r.guards, "chaos check "+c.Name+" ("+v+")")
			r.counted++
		}
		for _, s := range t.sites[n] {
			if slices.Contains(o.harnesses, s.group) {
				r.others = append(r.others, s)
			} else {
				r.code = append(r.code, s)
			}
		}
		rows[n] = r
	}
	// A guard that ran but that the source scan did not find (a package
	// outside the root, say) still counts: the run is the evidence.
	for _, gk := range slices.SortedFunc(maps.Keys(ran), compareTestKeys) {
		gr := ran[gk]
		if gr.used || gr.n < 1 || gr.n > 18 {
			continue
		}
		add(&rows[gr.n], gr, gk.pkg+"."+gk.test)
	}
	return rows[1:]
}

func compareTestKeys(a, b testKey) int {
	return cmp.Or(cmp.Compare(a.pkg, b.pkg), cmp.Compare(a.test, b.test))
}

func printTable(w io.Writer, rows []row, t *tree, o options, haveCatalog bool, campaigns int) int {
	fmt.Fprintf(w, "%-3s %-56s %-6s %6s %5s\n", "#", "invariant", "status", "guards", "code")
	var problems []string
	for _, r := range rows {
		status := "pass"
		if o.check {
			status = "ok"
		}
		switch {
		case r.failed:
			status = "FAIL"
			problems = append(problems, fmt.Sprintf("invariant %d (%s): a guard failed", r.n, titles[r.n]))
		case r.counted == 0:
			status = "GAP"
		}
		if r.counted == 0 {
			problems = append(problems, fmt.Sprintf("invariant %d (%s): no guard — no test named TestInvariant%02d_* %s and no chaos check",
				r.n, titles[r.n], r.n, map[bool]string{true: "declared", false: "ran"}[o.check]))
		}
		if len(r.code) == 0 {
			if status != "FAIL" {
				status = "UNKEPT"
			}
			problems = append(problems, fmt.Sprintf("invariant %d (%s): no code marked as keeping it — a comment \"// invariant %d: why\" where the code keeps it",
				r.n, titles[r.n], r.n))
		}
		fmt.Fprintf(w, "%-3d %-56s %-6s %6d %5d\n", r.n, titles[r.n], status, r.counted, len(r.code))
		for _, g := range r.guards {
			if sub, ok := strings.CutPrefix(g, "  "); ok { // a line about the guard above
				fmt.Fprintf(w, "            %s\n", sub)
				continue
			}
			fmt.Fprintf(w, "      guard %s\n", g)
		}
		for _, s := range r.code {
			printSite(w, "code ", s, o.verbose)
		}
		for _, s := range r.others {
			printSite(w, "harness code", s, o.verbose)
		}
	}
	problems = append(problems, strays(t)...)
	var counts []string
	for _, r := range rows {
		counts = append(counts, fmt.Sprintf("%d:%d", r.n, len(r.code)))
	}
	fmt.Fprintf(w, "\ncode sites per invariant (%d Go files read): %s\n", t.files, strings.Join(counts, " "))
	if haveCatalog {
		fmt.Fprintf(w, "chaos checks: verdicts from %d honest campaign report(s) matching %s", campaigns, o.reports)
		if campaigns == 0 {
			fmt.Fprintf(w, " — none yet: run make chaos-short")
		}
		fmt.Fprintln(w)
	}
	if len(problems) == 0 {
		return 0
	}
	fmt.Fprintln(w)
	for _, p := range problems {
		fmt.Fprintln(w, p)
	}
	return 1
}

// strays are markers and guards naming an invariant that does not exist: a
// mistyped number would otherwise be a marker nobody reads and a guard the
// table never shows.
func strays(t *tree) []string {
	var out []string
	ns := make([]int, 0, len(t.sites)+len(t.guards))
	for n := range t.sites {
		ns = append(ns, n)
	}
	for n := range t.guards {
		if _, dup := t.sites[n]; !dup {
			ns = append(ns, n)
		}
	}
	for n := range t.cases {
		_, dup := t.sites[n]
		_, dup2 := t.guards[n]
		if !dup && !dup2 {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	for _, n := range ns {
		if n >= 1 && n <= 18 {
			continue
		}
		for _, s := range t.sites[n] {
			out = append(out, fmt.Sprintf("%s:%d %s: marks invariant %d, and there are eighteen", s.file, s.line, s.in, n))
		}
		for _, g := range t.guards[n] {
			out = append(out, fmt.Sprintf("%s:%d %s: guards invariant %d, and there are eighteen", g.file, g.line, g.name, n))
		}
		for _, c := range t.cases[n] {
			out = append(out, fmt.Sprintf("%s:%d %s: guards invariant %d, and there are eighteen", c.file, c.line, c.name, n))
		}
	}
	return out
}

func printSite(w io.Writer, label string, s site, verbose bool) {
	fmt.Fprintf(w, "      %s %s:%d %s\n", label, s.file, s.line, s.in)
	if verbose {
		fmt.Fprintf(w, "            // %s\n", s.text)
	}
}

// titles are the invariants' short names, in the order of
// docs/invariants.md.
var titles = [19]string{
	1:  "caught up vs position deleted: a stored floor",
	2:  "resolution, retention and eviction are distinct",
	3:  "a superseded delivery cannot resolve anything",
	4:  "exactly one consumer holds a queue record",
	5:  "the dead-letter move is atomic",
	6:  "transport ack is never application ack",
	7:  "visibility deadline never overlaps transport in-flight",
	8:  "message identity and stream position are distinct",
	9:  "offsets monotonic, never reused",
	10: "the broker is the only enforcement point",
	11: "a wildcard never reaches a queue",
	12: "the configuration decides a topic's channel",
	13: "everything that accumulates is bounded",
	14: "memory durability is exactly the last snapshot",
	15: "restart never resurrects a delivery",
	16: "no client can withhold another's acknowledgement",
	17: "only the owning connection changes a session",
	18: "nothing told before it is stored",
}
