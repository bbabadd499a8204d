package acl

import (
	"strings"
	"unicode/utf8"
)

// A user pattern (a key of users:) is a name in which '*' stands for any
// run of characters, the empty run included (docs/configuration.md "The ACL file"). Its
// exactness is how many literal characters it has: of the patterns
// matching a name, the one with the most decides.

// literals counts a pattern's characters other than '*'.
func literals(pattern string) int {
	return utf8.RuneCountInString(pattern) - strings.Count(pattern, "*")
}

// globMatch reports whether pattern matches name. Byte-wise matching is
// character-wise for valid UTF-8: a literal run of whole characters can
// only be found at character boundaries. It does not allocate, and keeps
// one backtrack point (the last '*'), so it is linear in practice and
// O(len(pattern) × len(name)) at worst.
func globMatch(pattern, name string) bool {
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case p < len(pattern) && pattern[p] == name[n]:
			p++
			n++
		case star >= 0:
			// The last '*' takes one more byte and the rest is tried again.
			mark++
			p, n = star+1, mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// globsMeet reports whether some name matches both patterns, and one such
// name: the load-time test for a tie (docs/configuration.md "The ACL file": two equally exact
// patterns that could both match one name are refused, and the finding
// shows the name). It walks the product of the two patterns as automata:
// a '*' may be skipped, or may take a character the other side writes
// literally; two literals must be equal. dead holds the states (i, j)
// known to lead nowhere, so the walk is O(len(a) × len(b)), charged to
// *work before it starts; ok=false when the work is spent.
func globsMeet(a, b string, work *int) (name string, meets, ok bool) {
	// A literal prefix or suffix the two disagree on rules a meeting out
	// at once; most pairs of a real file end here.
	if !affixesAgree(a, b) {
		return "", false, true
	}
	// invariant 13: the walk's table is charged before it is allocated.
	cells := (len(a) + 1) * (len(b) + 1)
	if *work < cells {
		return "", false, false
	}
	*work -= cells
	dead := make([]bool, cells)
	var taken []byte // the name, last character first
	var meet func(i, j int) bool
	meet = func(i, j int) bool {
		if i == len(a) && j == len(b) {
			return true
		}
		k := i*(len(b)+1) + j
		if dead[k] {
			return false
		}
		aStar := i < len(a) && a[i] == '*'
		bStar := j < len(b) && b[j] == '*'
		switch {
		case aStar && meet(i+1, j):
			return true
		case bStar && meet(i, j+1):
			return true
		case i < len(a) && j < len(b):
			switch {
			case aStar && !bStar && meet(i, j+1): // a's '*' takes b's character
				taken = append(taken, b[j])
				return true
			case bStar && !aStar && meet(i+1, j):
				taken = append(taken, a[i])
				return true
			case !aStar && !bStar && a[i] == b[j] && meet(i+1, j+1):
				taken = append(taken, a[i])
				return true
			}
		}
		dead[k] = true
		return false
	}
	if !meet(0, 0) {
		return "", false, true
	}
	for l, r := 0, len(taken)-1; l < r; l, r = l+1, r-1 {
		taken[l], taken[r] = taken[r], taken[l]
	}
	return string(taken), true, true
}

// affixesAgree compares the literal text before the first '*' and after
// the last: when one is not a prefix (suffix) of the other, no name has both.
func affixesAgree(a, b string) bool {
	pa, pb := literalPrefix(a), literalPrefix(b)
	if !strings.HasPrefix(pa, pb) && !strings.HasPrefix(pb, pa) {
		return false
	}
	sa, sb := literalSuffix(a), literalSuffix(b)
	return strings.HasSuffix(sa, sb) || strings.HasSuffix(sb, sa)
}

func literalPrefix(p string) string {
	if i := strings.IndexByte(p, '*'); i >= 0 {
		return p[:i]
	}
	return p
}

func literalSuffix(p string) string {
	if i := strings.LastIndexByte(p, '*'); i >= 0 {
		return p[i+1:]
	}
	return p
}
