package acl

import (
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// names lists every name over {a, b} up to n characters, "" included.
func names(n int) []string {
	out := []string{""}
	cur := []string{""}
	for i := 0; i < n; i++ {
		var next []string
		for _, p := range cur {
			next = append(next, p+"a", p+"b")
		}
		out = append(out, next...)
		cur = next
	}
	return out
}

var names8 = names(8)

func genPattern(t *rapid.T, label string) string {
	return rapid.StringMatching(`[ab*]{0,4}`).Draw(t, label)
}

// globRef is the pattern as a regular expression: the reference globMatch
// and globsMeet are checked against.
func globRef(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// globMatch agrees with the regular expression on every short name, and
// globsMeet finds a shared name exactly when one exists (two patterns of
// at most four characters share one of at most eight if any), giving a
// name both match.
func TestGlobMatchAndMeetAgreeWithBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genPattern(t, "a"), genPattern(t, "b")
		ra, rb := globRef(a), globRef(b)
		shared := false
		for _, n := range names8 {
			if globMatch(a, n) != ra.MatchString(n) {
				t.Fatalf("globMatch(%q, %q) = %v", a, n, !ra.MatchString(n))
			}
			shared = shared || (ra.MatchString(n) && rb.MatchString(n))
		}
		work := tieWork
		name, meets, ok := globsMeet(a, b, &work)
		if !ok || meets != shared {
			t.Fatalf("globsMeet(%q, %q) = %v (ok %v); brute force %v", a, b, meets, ok, shared)
		}
		if meets && !(globMatch(a, name) && globMatch(b, name)) {
			t.Fatalf("globsMeet(%q, %q) gave %q, which does not match both", a, b, name)
		}
	})
}

func TestLiteralsCountCharacters(t *testing.T) {
	for p, want := range map[string]int{"": 0, "*": 0, "a*b": 2, "é*": 1, "**x": 1, "dev-007": 7} {
		if got := literals(p); got != want {
			t.Errorf("literals(%q) = %d, want %d", p, got, want)
		}
	}
}
