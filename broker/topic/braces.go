package topic

import (
	"fmt"
	"strings"
)

// MaxExpansions bounds how many filters one braced filter may expand into
// (invariant 13: the product of alternatives is checked before any filter is
// built, so "{a,b}/{a,b}/..." cannot allocate its way to an OOM).
const MaxExpansions = 1024

// HasBraces reports whether a configuration filter uses brace alternatives.
func HasBraces(filter string) bool {
	return strings.ContainsAny(filter, "{}")
}

// ExpandBraces expands "{a,b}" alternatives in a configuration filter into
// plain filters, every combination when there are several braces (docs/configuration.md "`channels`"): "x/{a,b}/{c,d}" gives x/a/c, x/a/d, x/b/c, x/b/d, in that order. A
// brace may sit inside a level ("dev-{a,b}") but holds no "/", no wildcard,
// and no empty alternative; braces do not nest, and a lone "{" or "}" is
// refused, so braces are never literal characters in a configuration filter.
// A filter without braces comes back alone. Repeated results are dropped.
func ExpandBraces(filter string) ([]string, error) {
	type part struct {
		alts []string // one element for literal text
	}
	var parts []part
	total := 1
	for i := 0; i < len(filter); {
		switch filter[i] {
		case '}':
			return nil, fmt.Errorf("a } at byte %d closes no brace; braces hold alternatives like {a,b}", i+1)
		case '{':
			j := strings.IndexAny(filter[i+1:], "{}")
			if j < 0 || filter[i+1+j] == '{' {
				if j >= 0 {
					return nil, fmt.Errorf("a brace at byte %d opens inside another; braces do not nest", i+2+j)
				}
				return nil, fmt.Errorf("the brace at byte %d is never closed; write {a,b}", i+1)
			}
			body := filter[i+1 : i+1+j]
			if body == "" {
				return nil, fmt.Errorf("the brace at byte %d is empty; write at least two alternatives, like {a,b}", i+1)
			}
			if strings.Contains(body, Separator) {
				return nil, fmt.Errorf("the brace {%s} contains /; a brace chooses within one level, so write {a,b}/c rather than {a/c,b/c}", body)
			}
			if strings.ContainsAny(body, "+#") {
				return nil, fmt.Errorf("the brace {%s} contains a wildcard; alternatives are literal text", body)
			}
			alts := strings.Split(body, ",")
			for _, a := range alts {
				if a == "" {
					return nil, fmt.Errorf("the brace {%s} has an empty alternative; every alternative between commas needs text", body)
				}
			}
			// Invariant 13: refuse before building the product.
			if total > MaxExpansions/len(alts) {
				return nil, fmt.Errorf("the braces expand to more than %d filters; split the channel or write fewer alternatives", MaxExpansions)
			}
			total *= len(alts)
			parts = append(parts, part{alts: alts})
			i += j + 2
		default:
			j := strings.IndexAny(filter[i:], "{}")
			if j < 0 {
				j = len(filter) - i
			}
			parts = append(parts, part{alts: []string{filter[i : i+j]}})
			i += j
		}
	}
	if len(parts) == 0 {
		return []string{filter}, nil
	}
	out := make([]string, 0, total)
	seen := make(map[string]bool, total)
	idx := make([]int, len(parts))
	var b strings.Builder
	for {
		b.Reset()
		for p, k := range idx {
			b.WriteString(parts[p].alts[k])
		}
		if s := b.String(); !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
		// Advance the odometer, rightmost brace fastest.
		p := len(idx) - 1
		for ; p >= 0; p-- {
			idx[p]++
			if idx[p] < len(parts[p].alts) {
				break
			}
			idx[p] = 0
		}
		if p < 0 {
			return out, nil
		}
	}
}
