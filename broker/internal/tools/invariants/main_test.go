package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// fixture is a small tree in which every invariant has a guard and every
// one but 7 is marked (7 is cited, marked in a block comment, a test file
// and the harness module, none of which keeps it).
const fixture = "testdata/fixture"

// invoke runs the tool as make invariants does and returns its exit code and
// what it printed.
func invoke(t *testing.T, stdin string, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	if errOut.Len() > 0 {
		t.Logf("stderr: %s", errOut.String())
	}
	return code, out.String()
}

// problemLines are the lines after the table that say what is wrong.
func problemLines(out string) []string {
	var ps []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "invariant ") || strings.Contains(l, "and there are eighteen") {
			ps = append(ps, l)
		}
	}
	return ps
}

func TestUnmarkedInvariantFailsNamingIt(t *testing.T) {
	code, out := invoke(t, "", "-root", fixture, "-check", "-harness", "harness")
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	want := []string{`invariant 7 (visibility deadline never overlaps transport in-flight): no code marked as keeping it — a comment "// invariant 7: why" where the code keeps it`}
	if got := problemLines(out); !slices.Equal(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s\noutput:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), out)
	}
	if !regexp.MustCompile(`(?m)^7 +visibility deadline never overlaps transport in-flight +UNKEPT +1 +0$`).MatchString(out) {
		t.Errorf("invariant 7's row is not UNKEPT with 1 guard and 0 code sites:\n%s", out)
	}
	if !strings.Contains(out, "code sites per invariant (5 Go files read): 1:2 2:1 3:1 4:1 5:1 6:1 7:0 8:1 9:1 10:1 11:1 12:1 13:1 14:1 15:1 16:1 17:1 18:1") {
		t.Errorf("summary line missing or wrong:\n%s", out)
	}
	// The harness's marker is listed under 7, and keeps nothing.
	if !strings.Contains(out, "      harness code harness/check.go:6 check\n") {
		t.Errorf("the harness marker is not listed:\n%s", out)
	}
}

func TestEveryMarkerNamesItsDeclaration(t *testing.T) {
	_, out := invoke(t, "", "-root", fixture, "-check", "-harness", "harness")
	for _, want := range []string{
		"code  keep.go:7 const maxItems",              // a doc comment line
		"code  keep.go:12 type box (field floor)",     // a field's trailing comment
		"code  keep.go:13 type box (field next)",      // a field's doc comment
		"code  keep.go:20 (*box).read",                // a pointer receiver's method
		"code  keep.go:26 take",                       // a paragraph of a doc comment, two invariants
		"code  keep.go:31 answer (in a func literal)", // inside a closure
		"code  keep.go:43 (pair).key",                 // a generic receiver
		"code  keep.go:47 var resolved",               // one spec of a var block
		"code  keep.go:49 var ids",                    // "invariants 8 and 10"
		"code  keep.go:53 (package level)",            // attached to nothing
		"code  keep.go:55 route",                      // trailing a one-line function
		"code  store/store.go:8 (Store).Snapshot",     // a value receiver, another package
		"code  store/store.go:14 (*Store).Ack",        // an unnamed pointer receiver
	} {
		if !strings.Contains(out, "      "+want+"\n") {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
	// Under both invariants a two-invariant line marks.
	for _, n := range []string{"4", "5"} {
		if !regexp.MustCompile(`(?s)\n` + n + ` +[^\n]*\n(      [^\n]*\n)*      code  keep.go:26 take\n`).MatchString(out) {
			t.Errorf("keep.go:26 is not listed under invariant %s:\n%s", n, out)
		}
	}
}

func TestGuardsAreTopLevelTestFunctions(t *testing.T) {
	_, out := invoke(t, "", "-root", fixture, "-check", "-harness", "harness")
	for _, want := range []string{
		"guard example.test/fixture.TestInvariant07_Deadline", // a package at the root: its path
		"guard store.TestInvariant14_Snapshot",                // a directory
	} {
		if !strings.Contains(out, "      "+want+"\n") {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
	for _, never := range []string{"TestInvariant07_Method", "testInvariant07_lower", "TestInvariant7_OneDigit"} {
		if strings.Contains(out, never) {
			t.Errorf("%s listed as a guard:\n%s", never, out)
		}
	}
}

func TestHarnessMarkersKeepOnlyWhenNotNamedHarness(t *testing.T) {
	// Without -harness, the harness module is code like any other, and its
	// marker keeps invariant 7: the fixture passes.
	code, out := invoke(t, "", "-root", fixture, "-check")
	if code != 0 {
		t.Fatalf("exit %d, want 0; output:\n%s", code, out)
	}
	if !strings.Contains(out, "      code  harness/check.go:6 check\n") {
		t.Errorf("the harness marker does not keep invariant 7 without -harness:\n%s", out)
	}
}

// copyFixture copies the fixture into a temporary directory and applies
// edit to the file named rel, so one test can break one thing.
func copyFixture(t *testing.T, rel string, edit func(string) string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(fixture, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, err := filepath.Rel(fixture, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, r), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if filepath.ToSlash(r) == rel {
			edited := edit(string(data))
			if edited == string(data) {
				t.Fatalf("the edit changed nothing in %s", rel)
			}
			data = []byte(edited)
		}
		return os.WriteFile(filepath.Join(dst, r), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestInvariantWithNoGuardFailsNamingIt(t *testing.T) {
	root := copyFixture(t, "guard_test.go", func(s string) string {
		return strings.Replace(s, "func TestInvariant03_Stale(t *testing.T)         {}\n", "", 1)
	})
	code, out := invoke(t, "", "-root", root, "-check")
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	want := []string{"invariant 3 (a superseded delivery cannot resolve anything): no guard — no test named TestInvariant03_* declared and no chaos check"}
	if got := problemLines(out); !slices.Equal(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !regexp.MustCompile(`(?m)^3 +a superseded delivery cannot resolve anything +GAP +0 +1$`).MatchString(out) {
		t.Errorf("invariant 3's row is not a GAP:\n%s", out)
	}
}

func TestChaosCheckIsAGuard(t *testing.T) {
	root := copyFixture(t, "guard_test.go", func(s string) string {
		return strings.Replace(s, "func TestInvariant03_Stale(t *testing.T)         {}\n", "", 1)
	})
	dir := t.TempDir()
	catalog := filepath.Join(dir, "catalog.json")
	if err := os.WriteFile(catalog, []byte(`[{"Name": "queue-resolved", "Invariants": [3, 15]}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "c1", "report.json")
	if err := os.MkdirAll(filepath.Dir(report), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(report, []byte(`{"checks": ["queue-resolved"], "violations": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := invoke(t, "", "-root", root, "-check", "-catalog", catalog, "-reports", filepath.Join(dir, "*", "report.json"))
	if code != 0 {
		t.Fatalf("exit %d, want 0 (the chaos check guards invariant 3); output:\n%s", code, out)
	}
	if !strings.Contains(out, "      guard chaos check queue-resolved (pass)\n") {
		t.Errorf("the chaos check is not listed with its verdict:\n%s", out)
	}
}

func TestMarkerOfNoInvariantFails(t *testing.T) {
	root := copyFixture(t, "keep.go", func(s string) string {
		return strings.Replace(s, "// invariant 12: a trailing comment.", "// invariant 21: a trailing comment.", 1)
	})
	code, out := invoke(t, "", "-root", root, "-check", "-harness", "harness")
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	got := problemLines(out)
	for _, want := range []string{
		"invariant 12 (the configuration decides a topic's channel): no code marked as keeping it — a comment \"// invariant 12: why\" where the code keeps it",
		"keep.go:55 route: marks invariant 21, and there are eighteen",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("no problem line %q in:\n%s", want, strings.Join(got, "\n"))
		}
	}
}

func TestFullModeReadsGoTestResults(t *testing.T) {
	// A guard that failed, one skipped, and every other one passed — as go
	// test -json reports them, subtests and output lines included.
	var in strings.Builder
	for _, line := range []string{
		`{"Action":"run","Package":"example.test/fixture","Test":"TestInvariant01_Floor"}`,
		`{"Action":"output","Package":"example.test/fixture","Test":"TestInvariant01_Floor","Output":"--- FAIL\n"}`,
		`{"Action":"pass","Package":"example.test/fixture","Test":"TestInvariant01_Floor/sub"}`,
		`{"Action":"fail","Package":"example.test/fixture","Test":"TestInvariant01_Floor"}`,
		`{"Action":"skip","Package":"example.test/fixture","Test":"TestInvariant02_Distinct"}`,
		`not json at all`,
	} {
		in.WriteString(line + "\n")
	}
	for _, g := range []string{"03_Stale", "04_OneHolder", "05_Atomic", "06_Puback", "07_Deadline", "08_Identity",
		"09_Offsets", "10_Broker", "11_Wildcard", "12_Configuration", "13_Bounded"} {
		in.WriteString(`{"Action":"pass","Package":"example.test/fixture","Test":"TestInvariant` + g + `"}` + "\n")
	}
	for _, g := range []string{"14_Snapshot", "15_NoLease", "16_Publisher", "17_Owner", "18_Told"} {
		in.WriteString(`{"Action":"pass","Package":"example.test/fixture/store","Test":"TestInvariant` + g + `"}` + "\n")
	}
	code, out := invoke(t, in.String(), "-root", fixture)
	if code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out)
	}
	got := problemLines(out)
	want := []string{
		"invariant 1 (caught up vs position deleted: a stored floor): a guard failed",
		"invariant 2 (resolution, retention and eviction are distinct): no guard — no test named TestInvariant02_* ran and no chaos check",
		// Without -harness the harness marker keeps 7; nothing else is wrong.
	}
	if !slices.Equal(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s\noutput:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), out)
	}
	for _, line := range []string{
		"      guard example.test/fixture.TestInvariant01_Floor (FAILED)\n            subtests: 1 passed, 0 failed, 0 skipped\n",
		"      guard example.test/fixture.TestInvariant02_Distinct (skipped)\n",
		"      guard store.TestInvariant18_Told\n",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("no line %q in:\n%s", line, out)
		}
	}
	// The guard and its subtest both ran: two tests count for invariant 1.
	if !regexp.MustCompile(`(?m)^1 +caught up vs position deleted: a stored floor +FAIL +2 +2$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^2 +resolution, retention and eviction are distinct +GAP +0 +1$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^3 +a superseded delivery cannot resolve anything +pass +1 +1$`).MatchString(out) {
		t.Errorf("rows 1-3 are not FAIL, GAP, pass:\n%s", out)
	}
}

func TestFullModeGuardThatDidNotRunIsListed(t *testing.T) {
	// Nothing ran: every guard is listed as not run, and every invariant
	// is a gap.
	code, out := invoke(t, "", "-root", fixture)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(out, "      guard store.TestInvariant16_Publisher (not run)\n") {
		t.Errorf("a guard that did not run is not listed as such:\n%s", out)
	}
	if n := len(problemLines(out)); n != 18 {
		t.Errorf("%d problems, want 18 (each invariant with no guard run):\n%s", n, out)
	}
}

func TestMarkerNumbers(t *testing.T) {
	for _, c := range []struct {
		comment string
		want    []int
	}{
		{"// invariant 13: bounded", []int{13}},
		{"//invariant 1: no space after the slashes", []int{1}},
		{"// Invariant 17: capitalised", []int{17}},
		{"// Invariants 4, 5: two", []int{4, 5}},
		{"// invariants 1 and 9: two, with and", []int{1, 9}},
		{"// invariant 13 on the test's side too: a citation", nil},
		{"// Invariant 18's second exception: a citation", nil},
		{"// (invariant 1), mid-sentence", nil},
		{"// see invariant 7: a sentence", nil},
		{"/* invariant 3: a block comment */", nil},
		{"// invariant: no number", nil},
	} {
		if got := markerNumbers(c.comment); !slices.Equal(got, c.want) {
			t.Errorf("markerNumbers(%q) = %v, want %v", c.comment, got, c.want)
		}
	}
}

// The repository itself: every invariant has a guard and marked code. go
// test in broker thus fails on a removed marker even where make
// invariants-check is not run.
func TestRepositoryKeepsEveryInvariant(t *testing.T) {
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("the repository root is not at %s: %v", root, err)
	}
	code, out := invoke(t, "", "-root", root, "-check", "-harness", "chaos,linearizability")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, strings.Join(problemLines(out), "\n"))
	}
}

// TestSubtestsNamedForAnInvariantAreItsGuards: a subtest at any depth
// whose name begins InvariantNN_ is a guard of NN wherever it runs (the
// storagetest conformance cases, run by each provider), a failed subtest
// of a guard fails its invariant and is named, and -check lists the names
// the source declares.
func TestSubtestsNamedForAnInvariantAreItsGuards(t *testing.T) {
	root := copyFixture(t, "guard_test.go", func(s string) string {
		return strings.Replace(s, "func TestInvariant03_Stale(t *testing.T)         {}\n", "", 1)
	})
	cases := "package store\n\nvar cases = []string{\"Invariant03_" + "StaleAnswer\"}\n"
	if err := os.WriteFile(filepath.Join(root, "store", "cases.go"), []byte(cases), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := invoke(t, "", "-root", root, "-check")
	if code != 0 || !strings.Contains(out, "      guard store.Invariant03_StaleAnswer (a subtest)\n") {
		t.Fatalf("-check: exit %d, the declared subtest not listed as invariant 3's guard:\n%s", code, out)
	}

	var in strings.Builder
	ev := func(action, pkg, test string) {
		in.WriteString(`{"Action":"` + action + `","Package":"` + pkg + `","Test":"` + test + `"}` + "\n")
	}
	const fx, st = "example.test/fixture", "example.test/fixture/store"
	ev("pass", st, "TestConformance/variant/Invariant03_StaleAnswer")
	ev("pass", st, "TestConformance/variant/Invariant03_StaleAnswer/deeper")
	ev("pass", st, "TestInvariantConformance/Invariant03_StaleAnswer")
	ev("pass", st, "TestConformance/variant/NotAGuard")
	ev("fail", fx, "TestInvariant01_Floor/broken")
	ev("pass", fx, "TestInvariant01_Floor/fine")
	ev("fail", fx, "TestInvariant01_Floor")
	for _, g := range []string{"02_Distinct", "04_OneHolder", "05_Atomic", "06_Puback", "07_Deadline", "08_Identity",
		"09_Offsets", "10_Broker", "11_Wildcard", "12_Configuration", "13_Bounded"} {
		ev("pass", fx, "TestInvariant"+g)
	}
	for _, g := range []string{"14_Snapshot", "15_NoLease", "16_Publisher", "17_Owner", "18_Told"} {
		ev("pass", st, "TestInvariant"+g)
	}
	code, out = invoke(t, in.String(), "-root", root)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	if got, want := problemLines(out), []string{"invariant 1 (caught up vs position deleted: a stored floor): a guard failed"}; !slices.Equal(got, want) {
		t.Fatalf("problems %q, want %q:\n%s", got, want, out)
	}
	for _, want := range []string{
		"      guard example.test/fixture.TestInvariant01_Floor (FAILED)\n            subtests: 1 passed, 1 failed, 0 skipped\n            subtest broken (FAILED)\n",
		"      guard store.TestConformance/variant/Invariant03_StaleAnswer\n            subtests: 1 passed, 0 failed, 0 skipped\n",
		"      guard store.TestInvariantConformance/Invariant03_StaleAnswer\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^1 +caught up vs position deleted: a stored floor +FAIL +3 +2$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^3 +a superseded delivery cannot resolve anything +pass +3 +1$`).MatchString(out) {
		t.Errorf("row 1 is not FAIL with 3 tests, or row 3 not pass with 3 (two runs of the case, one subtest):\n%s", out)
	}
	if strings.Contains(out, "NotAGuard") {
		t.Errorf("a conformance case not named for an invariant is listed:\n%s", out)
	}
}
