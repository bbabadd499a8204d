package topic

import (
	"reflect"
	"strings"
	"testing"
)

func TestValidTopic(t *testing.T) {
	for _, tc := range []struct {
		topic string
		bad   string // substring of the error; "" = valid
	}{
		{"a", ""},
		{"a/b/c", ""},
		{"/", ""},
		{"a//b", ""},
		{"$SYS/x", ""},
		{"ü/ß", ""},
		{"", "empty"},
		{"a/+/b", "level 2 \"+\" holds a wildcard"},
		{"a/b#", "level 2 \"b#\" holds a wildcard"},
		{"a\x00b", "NUL"},
		{"a\xffb", "UTF-8"},
		{strings.Repeat("x", MaxLength+1), "65535"},
	} {
		err := ValidTopic(tc.topic)
		checkErr(t, "ValidTopic("+short(tc.topic)+")", err, tc.bad)
	}
}

func TestValidFilter(t *testing.T) {
	for _, tc := range []struct {
		filter string
		bad    string
	}{
		{"a", ""},
		{"#", ""},
		{"+", ""},
		{"a/+/#", ""},
		{"+/+", ""},
		{"/#", ""},
		{"a//+", ""},
		{"$share/x/#", ""},
		{"", "empty"},
		{"a/#/b", "# is level 2 of 3"},
		{"#/#", "# is level 1 of 2"},
		{"a/b#", "level 2 \"b#\" mixes #"},
		{"a/+b/c", "level 2 \"+b\" mixes +"},
		{"a+", "level 1 \"a+\" mixes +"},
		{"a/\x00", "NUL"},
		{"\xc3", "UTF-8"},
	} {
		checkErr(t, "ValidFilter("+short(tc.filter)+")", ValidFilter(tc.filter), tc.bad)
	}
}

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/b", "a/b/c", false},
		{"a/b/c", "a/b", false},
		{"a/+", "a/b", true},
		{"a/+", "a/", true},
		{"a/+", "a", false},
		{"a/+", "a/b/c", false},
		{"+/+", "/", true},
		{"a/#", "a", true}, // # matches zero levels
		{"a/#", "a/b/c", true},
		{"a/#", "ab", false},
		{"a/+/location/#", "a/x/location", true}, // docs/configuration.md "`channels`"'s example
		{"a/+/location/#", "a/x/location/y/z", true},
		{"a/+/location/#", "a/x/place", false},
		{"#", "a", true},
		{"#", "/", true},
		{"#", "$SYS/x", false}, // MQTT-4.7.2-1
		{"+/x", "$SYS/x", false},
		{"$SYS/#", "$SYS/x", true},
		{"$SYS/+", "$SYS/x", true},
		{"a/$x", "a/$x", true},
		{"a/+", "a/$x", true}, // only the first level is special
		{"/#", "/a", true},
		{"/#", "a", false},
		{"a//b", "a//b", true},
		{"a/+/b", "a//b", true},
	} {
		if got := Match(tc.filter, tc.topic); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.filter, tc.topic, got, tc.want)
		}
	}
}

func TestOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/+", "+/b", true},
		{"a/#", "a", true},
		{"a/#", "b/#", false},
		{"a/+/c", "a/b/#", true},
		{"a/+", "a/+/+", false},
		{"a/+/#", "a", false},
		{"#", "$SYS/#", false},
		{"+/x", "$SYS/x", false},
		{"#", "+", true},
		{"$SYS/#", "$SYS/x", true},
		{"a/b/c", "a/+/#", true},
		{"+", "/#", false}, // the only common topic would be ""
		{"/#", "/+", true},
	} {
		if got := Overlap(tc.a, tc.b); got != tc.want {
			t.Errorf("Overlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := Overlap(tc.b, tc.a); got != tc.want {
			t.Errorf("Overlap(%q, %q) = %v, want %v (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestInside(t *testing.T) {
	for _, tc := range []struct {
		inner, outer string
		want         bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/+", true},
		{"a/b", "a/#", true},
		{"a", "a/#", true},
		{"a/#", "a/#", true},
		{"a/#", "a/+/#", false}, // "a" matches the first only
		{"a/+/#", "a/#", true},
		{"a/+", "a/b", false},
		{"a/#", "a/+", false},
		{"a/b/c", "a/+", false},
		{"a", "a/+", false},
		{"#", "#", true},
		{"$SYS/x", "#", false},
		{"$SYS/x", "+/x", false},
		{"$SYS/x", "$SYS/+", true},
		{"+/x", "#", true},
		{"#", "+/#", true}, // every topic has a first level
		{"#", "+", false},
		{"/#", "/+/#", true}, // "/#" would match "" only at zero levels
		{"/#", "/+/+/#", false},
	} {
		if got := Inside(tc.inner, tc.outer); got != tc.want {
			t.Errorf("Inside(%q, %q) = %v, want %v", tc.inner, tc.outer, got, tc.want)
		}
	}
}

func TestLevels(t *testing.T) {
	for s, want := range map[string]int{"a": 1, "a/b": 2, "/": 2, "a//b": 3, "a/+/#": 3} {
		if got := Levels(s); got != want {
			t.Errorf("Levels(%q) = %d, want %d", s, got, want)
		}
		if got := len(Split(s)); got != want {
			t.Errorf("len(Split(%q)) = %d, want %d", s, got, want)
		}
	}
}

func TestExpandBraces(t *testing.T) {
	for _, tc := range []struct {
		filter string
		want   []string
		bad    string
	}{
		{filter: "a/b", want: []string{"a/b"}},
		{filter: "a/{x,y}", want: []string{"a/x", "a/y"}},
		{filter: "a/{x,y}/{1,2}", want: []string{"a/x/1", "a/x/2", "a/y/1", "a/y/2"}},
		{filter: "dev-{a,b}/#", want: []string{"dev-a/#", "dev-b/#"}},
		{filter: "{a,b}{c,d}", want: []string{"ac", "ad", "bc", "bd"}},
		{filter: "x/{a,a}", want: []string{"x/a"}},
		{filter: "x/{one}", want: []string{"x/one"}},
		{filter: "x/{a/b,c}", bad: "contains /"},
		{filter: "x/{}", bad: "empty"},
		{filter: "x/{a,}", bad: "empty alternative"},
		{filter: "x/{,a}", bad: "empty alternative"},
		{filter: "x/{a", bad: "never closed"},
		{filter: "x/a}", bad: "closes no brace"},
		{filter: "x/{a,{b}}", bad: "do not nest"},
		{filter: "x/{+,a}", bad: "wildcard"},
		{filter: strings.Repeat("{a,b,c,d}/", 6) + "x", bad: "more than 1024"},
	} {
		got, err := ExpandBraces(tc.filter)
		checkErr(t, "ExpandBraces("+short(tc.filter)+")", err, tc.bad)
		if tc.bad == "" && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ExpandBraces(%q) = %q, want %q", tc.filter, got, tc.want)
		}
	}
	if got, err := ExpandBraces(strings.Repeat("{a,b}/", 10) + "x"); err != nil || len(got) != 1024 {
		t.Errorf("ten two-way braces: %d filters, err %v; want exactly the bound, 1024", len(got), err)
	}
}

// Every example of docs/channels.md "The dead-letter channel".
func TestDeadLetterFilterAndTopic(t *testing.T) {
	for _, tc := range []struct{ queue, dlq string }{
		{"iot/water/+/inspect", "iot/water/+/inspect/__dlq"},
		{"iot/water/+/+", "iot/water/+/+/__dlq"},
		{"iot/water/+/inspect/#", "iot/water/+/inspect/__dlq/#"},
		{"jobs/#", "jobs/__dlq/#"},
		{"#", "__dlq/#"},
		{"jobs", "jobs/__dlq"},
	} {
		if got := DeadLetterFilter(tc.queue); got != tc.dlq {
			t.Errorf("DeadLetterFilter(%q) = %q, want %q", tc.queue, got, tc.dlq)
		}
	}
	for _, tc := range []struct{ queue, topic, want string }{
		{"iot/water/+/inspect", "iot/water/w-7/inspect", "iot/water/w-7/inspect/__dlq"},
		{"iot/water/+/+", "iot/water/w-7/x", "iot/water/w-7/x/__dlq"},
		{"iot/water/+/inspect/#", "iot/water/w-7/inspect/a/b", "iot/water/w-7/inspect/__dlq/a/b"},
		{"iot/water/+/inspect/#", "iot/water/w-7/inspect", "iot/water/w-7/inspect/__dlq"},
		{"jobs/#", "jobs/resize/42", "jobs/__dlq/resize/42"},
		{"jobs/#", "jobs", "jobs/__dlq"},
		{"jobs/#", "jobs/", "jobs/__dlq/"},
	} {
		got, err := DeadLetterTopic(tc.queue, tc.topic)
		if err != nil || got != tc.want {
			t.Errorf("DeadLetterTopic(%q, %q) = %q, %v; want %q", tc.queue, tc.topic, got, err, tc.want)
			continue
		}
		if !Match(DeadLetterFilter(tc.queue), got) {
			t.Errorf("dead-letter topic %q does not match dead-letter filter %q", got, DeadLetterFilter(tc.queue))
		}
	}
	if _, err := DeadLetterTopic("jobs/#", "other/x"); err == nil {
		t.Error("DeadLetterTopic of a topic outside the queue: no error")
	}
}

func checkErr(t *testing.T, what string, err error, bad string) {
	t.Helper()
	switch {
	case bad == "" && err != nil:
		t.Errorf("%s: unexpected error %v", what, err)
	case bad != "" && err == nil:
		t.Errorf("%s: no error, want one containing %q", what, bad)
	case bad != "" && !strings.Contains(err.Error(), bad):
		t.Errorf("%s: error %q does not contain %q", what, err, bad)
	}
}

func short(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
