package harness

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every check the harness can report has a catalog entry, so `make
// invariants` never leaves one out: the names are read from this package's
// source (Finding literals, protocol findings) and from the models'
// whole-history checks.
func TestCatalogNamesEveryCheck(t *testing.T) {
	literal := regexp.MustCompile(`Check: +"([a-z/-]+)"`)
	protocol := regexp.MustCompile(`protocolFinding\(\d+, "([a-z-]+)"`)
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		src, err := os.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		for _, m := range protocol.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
	}
	for name := range modelInvariant {
		names[name] = true
	}
	names["linearizable/append-"+chanEvents] = true
	names["linearizable/queue-"+chanJobs] = true
	names["linearizable/latest-"+chanState] = true
	if len(names) < 20 {
		t.Fatalf("found only %d check names in the source: the patterns no longer match it", len(names))
	}
	for name := range names {
		if name == "linearizable/" {
			continue // the prefix the model checks are built on
		}
		if _, ok := CatalogEntry(name); !ok {
			t.Errorf("check %q has no entry in Catalog", name)
		}
	}
	for _, c := range Catalog {
		if len(c.Invariants) == 0 && !slices.Contains(ruleOnly, c.Name) {
			t.Errorf("catalog entry %q names no invariant and is not one of the delivery rules of docs/channels.md %v", c.Name, ruleOnly)
		}
	}
}
