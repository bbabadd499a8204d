// Command invariants prints the table `make invariants` shows: the eighteen
// invariants, the guards that cover each (tests named TestInvariantNN_*
// anywhere in the repository), and whether they passed. It reads the output
// of `go test -json` on standard input; an invariant with no guard, or with a
// guard that failed, makes it exit non-zero.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

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
		status := "pass"
		if len(rs) == 0 {
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
		if status == "FAIL" {
			bad++
		}
		fmt.Printf("%-3d %-56s %-6s %d\n", n, titles[n], status, len(rs))
		for _, name := range names {
			fmt.Printf("%-3s %-56s %-6s   %s\n", "", "", "", name)
		}
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
