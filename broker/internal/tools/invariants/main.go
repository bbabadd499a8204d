// Command invariants prints the table `make invariants` shows: the eighteen
// invariants, the guards that cover each — tests named TestInvariantNN_*
// anywhere in the repository, and the chaos harness's checks — and whether
// they passed. It reads the output of `go test -json` on standard input;
// -catalog names the chaos checks (chaos -catalog) and -reports the
// report.json files of the last chaos campaigns (make chaos-short), whose
// verdicts are the checks' pass/fail. An invariant with no guard, or with a
// guard that failed, makes it exit non-zero.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// chaosCheck is one entry of the chaos harness's catalog.
type chaosCheck struct {
	Name       string
	Invariants []int
}

// chaosReport is the part of a campaign's report.json read here.
type chaosReport struct {
	Control    string   `json:"control"`
	Checks     []string `json:"checks"`
	Violations []string `json:"violations"`
}

// maxReports bounds how many campaign reports are read (invariant 13).
const maxReports = 1000

// chaosVerdicts reads the catalog and the reports: for each check, "pass"
// when honest campaigns ran it and none found anything, "FAIL" when one did,
// "not run" when no report names it. Negative-control campaigns are left
// out: they are meant to fail.
func chaosVerdicts(catalogPath, reportsGlob string) ([]chaosCheck, map[string]string, int, error) {
	if catalogPath == "" {
		return nil, nil, 0, nil
	}
	data, err := os.ReadFile(catalogPath)
	if err != nil {
		return nil, nil, 0, err
	}
	var catalog []chaosCheck
	if err := json.Unmarshal(data, &catalog); err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", catalogPath, err)
	}
	verdict := map[string]string{}
	for _, c := range catalog {
		verdict[c.Name] = "not run"
	}
	files, _ := filepath.Glob(reportsGlob)
	if len(files) > maxReports {
		files = files[len(files)-maxReports:]
	}
	honest := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, 0, err
		}
		var r chaosReport
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, nil, 0, fmt.Errorf("%s: %w", f, err)
		}
		if r.Control != "" {
			continue
		}
		honest++
		for _, name := range r.Checks {
			if verdict[name] == "not run" {
				verdict[name] = "pass"
			}
		}
		for _, name := range r.Violations {
			verdict[name] = "FAIL"
		}
	}
	return catalog, verdict, honest, nil
}

// titles are the invariants' short names, in the order of
// seeds/invariants.md.
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

type event struct {
	Action  string
	Package string
	Test    string
}

var guardName = regexp.MustCompile(`^TestInvariant(\d\d)_[^/]+$`)

func main() {
	catalogPath := flag.String("catalog", "", "the chaos checks as JSON (chaos -catalog)")
	reports := flag.String("reports", "", "glob of chaos campaign report.json files")
	flag.Parse()
	catalog, verdict, campaigns, err := chaosVerdicts(*catalogPath, *reports)
	if err != nil {
		fmt.Fprintln(os.Stderr, "invariants:", err)
		os.Exit(2)
	}
	type result struct {
		pkg, test string
		pass      bool
	}
	guards := map[int][]result{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || (e.Action != "pass" && e.Action != "fail") {
			continue
		}
		m := guardName.FindStringSubmatch(e.Test)
		if m == nil {
			continue
		}
		key := e.Package + "." + e.Test
		if seen[key] {
			continue
		}
		seen[key] = true
		var n int
		fmt.Sscanf(m[1], "%d", &n)
		if n < 1 || n > 18 {
			continue
		}
		guards[n] = append(guards[n], result{pkg: shortPkg(e.Package), test: e.Test, pass: e.Action == "pass"})
	}
	bad := 0
	var gaps []int
	fmt.Printf("%-3s %-56s %-6s %s\n", "#", "invariant", "status", "guards")
	for n := 1; n <= 18; n++ {
		rs := guards[n]
		sort.Slice(rs, func(i, j int) bool { return rs[i].pkg+rs[i].test < rs[j].pkg+rs[j].test })
		var checks []string
		for _, c := range catalog {
			if slices.Contains(c.Invariants, n) {
				checks = append(checks, c.Name)
			}
		}
		status := "pass"
		if len(rs)+len(checks) == 0 {
			status = "GAP"
			gaps = append(gaps, n)
			bad++
		}
		var names []string
		for _, r := range rs {
			mark := ""
			if !r.pass {
				mark = " (FAILED)"
				status = "FAIL"
			}
			names = append(names, r.pkg+"."+r.test+mark)
		}
		for _, c := range checks {
			v := verdict[c]
			if v == "FAIL" {
				status = "FAIL"
			}
			names = append(names, "chaos check "+c+" ("+v+")")
		}
		if status == "FAIL" {
			bad++
		}
		fmt.Printf("%-3d %-56s %-6s %d\n", n, titles[n], status, len(rs)+len(checks))
		for _, name := range names {
			fmt.Printf("%-3s %-56s %-6s   %s\n", "", "", "", name)
		}
	}
	if catalog != nil {
		fmt.Printf("\nchaos checks: verdicts from %d honest campaign report(s) matching %s", campaigns, *reports)
		if campaigns == 0 {
			fmt.Printf(" — none yet: run make chaos-short")
		}
		fmt.Println()
	}
	if len(gaps) > 0 {
		fmt.Printf("\ninvariants with no guard: %v\n", gaps)
	}
	if bad > 0 {
		os.Exit(1)
	}
}

func shortPkg(p string) string {
	return strings.TrimPrefix(strings.TrimPrefix(p, "saguin.dev/"), "storage/")
}
