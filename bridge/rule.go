package bridge

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Direction is which way a rule carries records across the link.
type Direction uint8

const (
	// In: the peer's topics matching the filter are subscribed to and
	// stored here under the rule's topic template.
	In Direction = iota + 1
	// Out: our records matching the filter are read and published to the
	// peer under the rule's topic template.
	Out
	// Both: In and Out under the same names (identity mapping), with No
	// Local on the peer's subscription so nothing echoes back.
	Both
)

// ParseDirection reads the direction key of a rule: "in", "out" or
// "both"; there is no default (docs/bridge.md "Rules").
func ParseDirection(s string) (Direction, error) {
	switch s {
	case "in":
		return In, nil
	case "out":
		return Out, nil
	case "both":
		return Both, nil
	}
	return 0, fmt.Errorf("direction %q: write in, out or both", s)
}

func (d Direction) String() string {
	switch d {
	case In:
		return "in"
	case Out:
		return "out"
	case Both:
		return "both"
	}
	return "direction(" + strconv.Itoa(int(d)) + ")"
}

// Rule is one entry of a bridge's topics list, its braces already
// expanded (one Rule per spelling): which topics cross, which way, and the
// name each takes on the other side.
type Rule struct {
	Filter    string
	Direction Direction
	// Template is the topic as written ("" on a both rule, which keeps
	// every name as it is).
	Template string

	levels []string // the filter, level by level
	pieces []piece  // the template, compiled; nil on a both rule
	used   []bool   // used[i]: the template names $i+1
	tail   bool     // the filter ends in # (and the template in $#)
}

// piece is a run of the template: literal text, or the topic level the
// filter's ref-th "+" matched (1-based), or with ref == tailRef what its
// "#" matched.
type piece struct {
	lit string
	ref int
}

const tailRef = -1

// Limits on what a rule holds, checked before anything is built from it
// (invariant 13: a configuration is input too).
const (
	// MaxRuleLevels bounds the levels of a rule's filter and template; the
	// broker also holds them to limits.max_topic_levels.
	MaxRuleLevels = 200
	// MaxRuleLength bounds a filter or template in bytes: an MQTT topic's
	// own ceiling.
	MaxRuleLength = 65535
)

// RuleError is a refused rule: which of its keys (filter, direction or
// topic) is at fault, as written, and why.
type RuleError struct {
	Key   string // "filter", "direction" or "topic"
	Value string // as written
	Err   error
}

func (e *RuleError) Error() string {
	if e.Value == "" {
		return e.Key + ": " + e.Err.Error()
	}
	return fmt.Sprintf("%s %q: %v", e.Key, e.Value, e.Err)
}

func (e *RuleError) Unwrap() error { return e.Err }

// ErrUnmappable is what Map reports for a topic the rule's filter matches
// whose mapped name is empty or starts with "$": such a record is dropped
// and counted as unmappable, never published under a name nobody chose.
var ErrUnmappable = errors.New("the mapped topic is empty or starts with $")

// NewRule checks and compiles one rule. filter must be a plain MQTT filter
// (braces expanded by the caller); template is required on in and out and
// refused on both. The notes are remarks that refuse nothing (a "+" level
// the template does not use); the error names what to fix.
func NewRule(filter string, dir Direction, template string) (*Rule, []string, error) {
	if dir != In && dir != Out && dir != Both {
		return nil, nil, &RuleError{Key: "direction", Err: errors.New("write in, out or both")}
	}
	levels, err := checkFilter(filter)
	if err != nil {
		return nil, nil, &RuleError{Key: "filter", Value: filter, Err: err}
	}
	r := &Rule{Filter: filter, Direction: dir, Template: template, levels: levels}
	r.tail = levels[len(levels)-1] == "#"
	plus := 0
	for _, l := range levels {
		if l == "+" {
			plus++
		}
	}
	if strings.HasPrefix(filter, "$") && dir == Both {
		return nil, nil, &RuleError{Key: "filter", Value: filter, Err: errors.New("a both rule keeps names as they are, and a $ topic is the broker's own on each side; bridge it in with a topic template instead")}
	}
	if dir == Both {
		if template != "" {
			return nil, nil, &RuleError{Key: "topic", Value: template, Err: errors.New("a both rule keeps every name as it is; remove topic, or split the rule into an in and an out rule")}
		}
		r.used = make([]bool, plus)
		return r, nil, nil
	}
	if template == "" {
		return nil, nil, &RuleError{Key: "topic", Err: fmt.Errorf("an %s rule needs the name records take on the other side, like %q", dir, exampleTemplate(levels))}
	}
	r.pieces, r.used, err = compileTemplate(template, plus, r.tail)
	if err != nil {
		return nil, nil, &RuleError{Key: "topic", Value: template, Err: err}
	}
	var notes []string
	for i, u := range r.used {
		if !u {
			notes = append(notes, fmt.Sprintf("the topic does not use $%d: every topic the filter's %s \"+\" matches lands on the same name", i+1, ordinal(i+1)))
		}
	}
	return r, notes, nil
}

// checkFilter reads a filter the way the bridge uses it — sent to the peer
// as a SUBSCRIBE (in) or matched against our topics (out) — and refuses
// what no topic could match or what the broker keeps for itself.
func checkFilter(filter string) ([]string, error) {
	switch {
	case filter == "":
		return nil, errors.New("empty; write a filter like fleet/+/telemetry/#")
	case len(filter) > MaxRuleLength:
		return nil, fmt.Errorf("%d bytes, over MQTT's %d", len(filter), MaxRuleLength)
	case strings.ContainsRune(filter, 0):
		return nil, errors.New("contains a NUL character")
	case filter == "$saguin" || strings.HasPrefix(filter, "$saguin/"):
		return nil, errors.New("$saguin/ topics are the broker's own control topics and never cross a bridge")
	case strings.Count(filter, "/")+1 > MaxRuleLevels:
		return nil, fmt.Errorf("%d levels, over %d", strings.Count(filter, "/")+1, MaxRuleLevels)
	}
	levels := strings.Split(filter, "/")
	for i, l := range levels {
		switch {
		case l == "#" && i != len(levels)-1:
			return nil, errors.New("# stands for the rest of the topic and must be the last level")
		case l == "+" || l == "#":
		case strings.ContainsAny(l, "+#"):
			return nil, fmt.Errorf("level %q mixes a wildcard with text, so it matches no topic; a wildcard is a whole level (+ or #)", l)
		}
	}
	return levels, nil
}

// compileTemplate reads a topic template: literal text with $1…$N naming
// the filter's "+" levels (N of them) and $# naming what its "#" matched —
// a whole last level, only when the filter ends in "#", and then required.
func compileTemplate(t string, plus int, tail bool) ([]piece, []bool, error) {
	switch {
	case len(t) > MaxRuleLength:
		return nil, nil, fmt.Errorf("%d bytes, over MQTT's %d", len(t), MaxRuleLength)
	case strings.ContainsRune(t, 0):
		return nil, nil, errors.New("contains a NUL character")
	}
	if strings.ContainsAny(strings.ReplaceAll(t, "$#", ""), "+#") {
		return nil, nil, errors.New("a topic names one place and holds no wildcard; use $1…$N for the filter's + levels and $# for its #")
	}
	if strings.HasPrefix(t, "/") || strings.HasSuffix(t, "/") {
		return nil, nil, errors.New("starts or ends with /, which adds an empty level; remove it")
	}
	if strings.Count(t, "/")+1 > MaxRuleLevels {
		return nil, nil, fmt.Errorf("%d levels, over %d", strings.Count(t, "/")+1, MaxRuleLevels)
	}
	used := make([]bool, plus)
	var pieces []piece
	var lit strings.Builder
	hasTail := false
	for i := 0; i < len(t); {
		c := t[i]
		if c != '$' {
			lit.WriteByte(c)
			i++
			continue
		}
		if i+1 < len(t) && t[i+1] == '#' {
			if !tail {
				return nil, nil, errors.New("$# names what the filter's # matched, and the filter has no #")
			}
			if i+2 != len(t) || (i > 0 && t[i-1] != '/') {
				return nil, nil, errors.New("$# stands for the rest of the topic: it is a whole last level, like fleet/$#")
			}
			if lit.Len() > 0 {
				pieces = append(pieces, piece{lit: lit.String()})
				lit.Reset()
			}
			pieces = append(pieces, piece{ref: tailRef})
			hasTail = true
			i += 2
			continue
		}
		j := i + 1
		for j < len(t) && t[j] >= '0' && t[j] <= '9' {
			j++
		}
		if j == i+1 {
			return nil, nil, fmt.Errorf("a $ at byte %d names nothing; write $1…$%d for the filter's + levels or $# for its #", i+1, plus)
		}
		n, err := strconv.Atoi(t[i+1 : j])
		if err != nil || n < 1 || n > plus {
			if plus == 0 {
				return nil, nil, fmt.Errorf("%s names a + level, and the filter has none", t[i:j])
			}
			return nil, nil, fmt.Errorf("%s names a + level the filter does not have; it has %d ($1…$%d)", t[i:j], plus, plus)
		}
		if lit.Len() > 0 {
			pieces = append(pieces, piece{lit: lit.String()})
			lit.Reset()
		}
		pieces = append(pieces, piece{ref: n})
		used[n-1] = true
		i = j
	}
	if lit.Len() > 0 {
		pieces = append(pieces, piece{lit: lit.String()})
	}
	if tail && !hasTail {
		return nil, nil, errors.New("the filter ends in #, so the topic must end in $# to keep the rest of each name; without it every topic below lands on one name")
	}
	return pieces, used, nil
}

// Reach is the filter of the names the rule maps to: each level of the
// template that holds a $N is "+", $# is "#"; on a both rule, the filter
// itself. The broker resolves it to learn which channels (or broadcast)
// records of the rule can land on.
func (r *Rule) Reach() string {
	if r.Direction == Both {
		return r.Filter
	}
	// A NUL marks where a $N goes (a template holds none of its own).
	var b strings.Builder
	for _, p := range r.pieces {
		switch {
		case p.ref == tailRef:
			b.WriteString("#") // a whole last level (compileTemplate)
		case p.ref > 0:
			b.WriteByte(0)
		default:
			b.WriteString(p.lit)
		}
	}
	levels := strings.Split(b.String(), "/")
	for i, l := range levels {
		if strings.ContainsRune(l, 0) {
			levels[i] = "+"
		}
	}
	return strings.Join(levels, "/")
}

// Matches reports whether topic is one the rule's filter matches (MQTT 5
// §4.7: a topic starting with $ is not matched by a filter starting with a
// wildcard).
func (r *Rule) Matches(topic string) bool {
	_, _, ok := r.match(topic)
	return ok
}

// Map gives the name a topic the filter matches takes on the other side:
// the topic itself on a both rule, else the template with $1…$N and $#
// filled in. A "#" that matched no level takes its separator with it
// ("a/$#" from a filter "x/#" and the topic "x" gives "a"). ok is false
// when the filter does not match; err is ErrUnmappable when the result is
// empty or starts with "$".
func (r *Rule) Map(topic string) (mapped string, ok bool, err error) {
	plus, rest, ok := r.match(topic)
	if !ok {
		return "", false, nil
	}
	noTail := rest == nil
	if r.Direction == Both {
		return topic, true, nil
	}
	var b strings.Builder
	for _, p := range r.pieces {
		switch {
		case p.ref == tailRef:
			if noTail {
				// The separator before $# goes with the empty tail.
				s := b.String()
				b.Reset()
				b.WriteString(strings.TrimSuffix(s, "/"))
				continue
			}
			b.WriteString(*rest)
		case p.ref > 0:
			b.WriteString(plus[p.ref-1])
		default:
			b.WriteString(p.lit)
		}
	}
	mapped = b.String()
	if mapped == "" || strings.HasPrefix(mapped, "$") {
		return "", true, ErrUnmappable
	}
	return mapped, true, nil
}

// match walks topic against the filter: what each "+" matched, in order,
// and what "#" matched — nil when it matched no level at all ("a/#"
// matching "a"), which is not the same as one empty level ("a/").
func (r *Rule) match(topic string) (plus []string, rest *string, ok bool) {
	if topic == "" {
		return nil, nil, false
	}
	if strings.HasPrefix(topic, "$") && (r.levels[0] == "+" || r.levels[0] == "#") {
		return nil, nil, false
	}
	pos := 0 // where the next level starts; past the end once there is none
	for i, l := range r.levels {
		if l == "#" {
			if pos > len(topic) {
				return plus, nil, true
			}
			tail := topic[pos:]
			return plus, &tail, true
		}
		if pos > len(topic) {
			return nil, nil, false
		}
		end := strings.IndexByte(topic[pos:], '/')
		if end < 0 {
			end = len(topic)
		} else {
			end += pos
		}
		level := topic[pos:end]
		if l == "+" {
			plus = append(plus, level)
		} else if l != level {
			return nil, nil, false
		}
		if i == len(r.levels)-1 {
			return plus, nil, end == len(topic)
		}
		pos = end + 1
	}
	return nil, nil, false
}

// exampleTemplate suggests a template for a filter: its levels with each
// "+" as $1…$N and "#" as $#.
func exampleTemplate(levels []string) string {
	out := make([]string, 0, len(levels)+1)
	out = append(out, "site")
	n := 0
	for _, l := range levels {
		switch l {
		case "+":
			n++
			out = append(out, "$"+strconv.Itoa(n))
		case "#":
			out = append(out, "$#")
		default:
			out = append(out, l)
		}
	}
	return strings.Join(out, "/")
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return strconv.Itoa(n) + suffix
}
