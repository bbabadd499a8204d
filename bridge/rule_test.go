package bridge

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func mustRule(t *testing.T, filter string, dir Direction, tmpl string) *Rule {
	t.Helper()
	r, _, err := NewRule(filter, dir, tmpl)
	if err != nil {
		t.Fatalf("NewRule(%q, %v, %q): %v", filter, dir, tmpl, err)
	}
	return r
}

func TestRuleMap(t *testing.T) {
	cases := []struct {
		filter string
		dir    Direction
		tmpl   string
		topic  string
		want   string // "" with ok false: no match
		ok     bool
		err    error
	}{
		{"fleet/+/telemetry/#", Out, "shore/$1/$#", "fleet/v7/telemetry/engine/rpm", "shore/v7/engine/rpm", true, nil},
		{"fleet/+/telemetry/#", Out, "shore/$1/$#", "fleet/v7/telemetry", "shore/v7", true, nil},
		{"fleet/+/telemetry/#", Out, "shore/$1/$#", "fleet/v7/telemetry/", "shore/v7/", true, nil},
		{"fleet/+/telemetry/#", Out, "shore/$1/$#", "fleet/v7/other/x", "", false, nil},
		{"a/+/+", In, "b/$2-$1", "a/x/y", "b/y-x", true, nil},
		{"a/+/+", In, "b/$2-$1", "a/x", "", false, nil},
		{"a/+/+", In, "b/$2-$1", "a/x/y/z", "", false, nil},
		{"a/+", In, "b/$1", "a/", "b/", true, nil},
		{"cmd/#", In, "$#", "cmd/valve/open", "valve/open", true, nil},
		{"cmd/#", In, "$#", "cmd", "", true, ErrUnmappable},
		{"+/x", In, "$1/y", "$SYS/x", "", false, nil},
		{"$SYS/broker/+", In, "peer/sys/$1", "$SYS/broker/uptime", "peer/sys/uptime", true, nil},
		{"#", Out, "up/$#", "$SYS/x", "", false, nil},
		{"#", Out, "up/$#", "a", "up/a", true, nil},
		{"site/+", Both, "", "site/a", "site/a", true, nil},
		{"site/+", Both, "", "site/a/b", "", false, nil},
		{"+", In, "$1", "$x", "", false, nil},
	}
	for _, c := range cases {
		r := mustRule(t, c.filter, c.dir, c.tmpl)
		got, ok, err := r.Map(c.topic)
		if got != c.want || ok != c.ok || !errors.Is(err, c.err) {
			t.Errorf("%s %q→%q: Map(%q) = %q, %v, %v; want %q, %v, %v", c.dir, c.filter, c.tmpl, c.topic, got, ok, err, c.want, c.ok, c.err)
		}
		if r.Matches(c.topic) != c.ok {
			t.Errorf("%q: Matches(%q) = %v, want %v", c.filter, c.topic, !c.ok, c.ok)
		}
	}
}

func TestRuleRefusals(t *testing.T) {
	cases := []struct {
		filter string
		dir    Direction
		tmpl   string
		want   string // in the error
	}{
		{"", In, "x", "empty"},
		{"a/#/b", In, "x/$#", "must be the last level"},
		{"a/b+c", In, "x", "mixes a wildcard"},
		{"a/b#", In, "x", "mixes a wildcard"},
		{"$saguin/catalogue/x", In, "x", "$saguin/"},
		{"$saguin", Out, "x", "$saguin/"},
		{"$SYS/#", Both, "", "a both rule keeps names"},
		{"a/+", Both, "b/$1", "remove topic"},
		{"a/+", In, "", "needs the name"},
		{"a/+", Out, "", "needs the name"},
		{"a/+", In, "b/$2", "$2 names a + level the filter does not have"},
		{"a/b", In, "c/$1", "the filter has none"},
		{"a/+", In, "c/$0", "$0 names a + level"},
		{"a/+", In, "c/$", "names nothing"},
		{"a/+", In, "c/$x", "names nothing"},
		{"a/#", In, "c", "must end in $#"},
		{"a/+", In, "c/$#", "the filter has no #"},
		{"a/#", In, "c/$#/d", "whole last level"},
		{"a/#", In, "c/x$#", "whole last level"},
		{"a/+", In, "c/+", "no wildcard"},
		{"a/+", In, "c/#", "no wildcard"},
		{"a/+", In, "/c/$1", "starts or ends with /"},
		{"a/+", In, "c/$1/", "starts or ends with /"},
		{"a", 0, "b", "in, out or both"},
		{strings.Repeat("a/", MaxRuleLevels) + "a", In, "b", "levels, over"},
	}
	for _, c := range cases {
		_, _, err := NewRule(c.filter, c.dir, c.tmpl)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRule(%q, %v, %q) = %v; want an error containing %q", c.filter, c.dir, c.tmpl, err, c.want)
		}
	}
}

// An unused "+" level refuses nothing; it is a note naming the level.
func TestRuleNotesAnUnusedLevel(t *testing.T) {
	_, notes, err := NewRule("a/+/+", Out, "b/$2")
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "$1") || !strings.Contains(notes[0], "1st") {
		t.Fatalf("notes %q, want one naming $1", notes)
	}
}

func TestParseDirection(t *testing.T) {
	for _, d := range []Direction{In, Out, Both} {
		got, err := ParseDirection(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDirection(%q) = %v, %v", d.String(), got, err)
		}
	}
	if _, err := ParseDirection("up"); err == nil || !strings.Contains(err.Error(), "in, out or both") {
		t.Errorf("ParseDirection(up) = %v", err)
	}
}

// For any filter of literal and "+" levels, optionally ending in "#", any
// template naming its levels in any order, and any topic the filter
// matches, Map fills each $i with the level the i-th "+" matched and $#
// with the rest — built here from the same values, never from the rule.
func TestRuleMapProperty(t *testing.T) {
	level := rapid.StringMatching(`[a-z0-9_-]{0,4}`)
	firstLevel := rapid.StringMatching(`[a-z0-9_-]{1,4}`)
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "levels")
		kinds := rapid.SliceOfN(rapid.Bool(), n, n).Draw(t, "plus")
		tail := rapid.Bool().Draw(t, "tail")
		var filter, topic []string
		var values []string
		for i, plus := range kinds {
			gen := level
			if i == 0 {
				gen = firstLevel // a topic has at least one character
			}
			v := gen.Draw(t, fmt.Sprintf("value%d", i))
			if plus {
				filter = append(filter, "+")
				values = append(values, v)
			} else {
				lit := rapid.StringMatching(`[a-z]{1,3}`).Draw(t, fmt.Sprintf("lit%d", i))
				filter = append(filter, lit)
				v = lit
			}
			topic = append(topic, v)
		}
		var rest []string
		if tail {
			filter = append(filter, "#")
			rest = rapid.SliceOfN(level, 0, 3).Draw(t, "rest")
			topic = append(topic, rest...)
		}
		// The template: a literal first level, then each $i in a drawn
		// order, then $# when the filter has a tail.
		order := rapid.Permutation(indices(len(values))).Draw(t, "order")
		tmpl := []string{"out"}
		want := []string{"out"}
		for _, i := range order {
			tmpl = append(tmpl, fmt.Sprintf("$%d", i+1))
			want = append(want, values[i])
		}
		if tail {
			tmpl = append(tmpl, "$#")
			want = append(want, rest...)
		}
		r, notes, err := NewRule(strings.Join(filter, "/"), Out, strings.Join(tmpl, "/"))
		if err != nil || len(notes) != 0 {
			t.Fatalf("NewRule(%q, %q): %v %q", strings.Join(filter, "/"), strings.Join(tmpl, "/"), err, notes)
		}
		got, ok, err := r.Map(strings.Join(topic, "/"))
		if !ok || err != nil || got != strings.Join(want, "/") {
			t.Fatalf("Map(%q) by %q→%q = %q, %v, %v; want %q", strings.Join(topic, "/"), r.Filter, r.Template, got, ok, err, strings.Join(want, "/"))
		}
	})
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestRuleReach(t *testing.T) {
	for _, c := range []struct{ filter, tmpl, want string }{
		{"fleet/+/telemetry/#", "shore/$1/$#", "shore/+/#"},
		{"a/+/+", "b/$2-$1", "b/+"},
		{"a/+", "b/site-$1/c", "b/+/c"},
		{"cmd/#", "$#", "#"},
		{"x/y", "plain/topic", "plain/topic"},
		{"x/+", "$1", "+"},
	} {
		r := mustRule(t, c.filter, In, c.tmpl)
		if got := r.Reach(); got != c.want {
			t.Errorf("%q -> %q: Reach %q, want %q", c.filter, c.tmpl, got, c.want)
		}
	}
	if got := mustRule(t, "s/+", Both, "").Reach(); got != "s/+" {
		t.Errorf("both rule reach %q", got)
	}
}

// Whatever filter, template and topic a configuration and a peer give,
// NewRule refuses or compiles without panicking, and a compiled rule's Map
// is consistent: it maps exactly the topics Matches accepts, and a name it
// makes is never empty, never starts with $, and holds no wildcard.
func FuzzRuleMap(f *testing.F) {
	f.Add("fleet/+/telemetry/#", "shore/$1/$#", "fleet/v7/telemetry/engine", uint8(0))
	f.Add("a/+/+", "b/$2-$1", "a/x/y", uint8(1))
	f.Add("cmd/#", "$#", "cmd", uint8(0))
	f.Add("$SYS/+", "sys/$1", "$SYS/uptime", uint8(0))
	f.Add("s/#", "", "s/a/b", uint8(2))
	f.Fuzz(func(t *testing.T, filter, tmpl, topic string, d uint8) {
		dir := []Direction{In, Out, Both}[int(d)%3]
		r, _, err := NewRule(filter, dir, tmpl)
		if err != nil {
			return
		}
		mapped, ok, err := r.Map(topic)
		if ok != r.Matches(topic) {
			t.Fatalf("Map says %v, Matches says %v for %q by %q", ok, !ok, topic, filter)
		}
		if !ok || err != nil {
			return
		}
		if mapped == "" || strings.HasPrefix(mapped, "$") && dir != Both {
			t.Fatalf("%q by %q -> %q gave %q", topic, filter, tmpl, mapped)
		}
		if dir != Both && strings.ContainsAny(mapped, "+#") && !strings.ContainsAny(topic, "+#") {
			t.Fatalf("%q by %q -> %q gave a wildcard: %q", topic, filter, tmpl, mapped)
		}
	})
}
