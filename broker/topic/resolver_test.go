package topic

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// refMatch is MQTT matching written the plain way, over split levels, as an
// independent reference for Match and the trie.
func refMatch(filter, topic string) bool {
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	if strings.HasPrefix(topic, "$") && (f[0] == "+" || f[0] == "#") {
		return false
	}
	for i, lvl := range f {
		if lvl == "#" {
			return true
		}
		if i >= len(t) || (lvl != "+" && lvl != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}

// refMoreExact is docs/configuration.md "`channels`" as written: compare level by level from the
// left; at the first differing level a literal beats + and #, + beats #, and
// a filter ending there beats one continuing with #.
func refMoreExact(a, b string) bool {
	la, lb := strings.Split(a, "/"), strings.Split(b, "/")
	kind := func(l []string, i int) int {
		switch {
		case i >= len(l):
			return 1 // ended
		case l[i] == "#":
			return 0
		case l[i] == "+":
			return 2
		default:
			return 3
		}
	}
	for i := 0; i <= len(la) || i <= len(lb); i++ {
		if ka, kb := kind(la, i), kind(lb, i); ka != kb {
			return ka > kb
		}
	}
	return false
}

// bruteResolve scans every route: the reference the trie must agree with.
func bruteResolve(routes []Route, topic string) (string, bool) {
	best := -1
	for i, r := range routes {
		if refMatch(r.Filter, topic) && (best < 0 || refMoreExact(r.Filter, routes[best].Filter)) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	return routes[best].Channel, true
}

func TestResolverTable(t *testing.T) {
	routes := []Route{
		{"all-sensors", "sensors/#"},
		{"temps", "sensors/+/temp"},
		{"kitchen", "sensors/kitchen/#"},
		{"kitchen-temp", "sensors/kitchen/temp"},
		{"deep", "sensors/+/+/#"},
		{"root", "sensors"},
		{"jobs", "jobs/#"},
		{"jobs__dlq", "jobs/__dlq/#"},
		{"sys", "$SYS/#"},
	}
	r, err := NewResolver(routes)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ topic, want string }{
		{"sensors/kitchen/temp", "kitchen-temp"},
		{"sensors/hall/temp", "temps"},
		{"sensors/kitchen/humidity", "kitchen"},
		{"sensors/kitchen", "kitchen"},    // # matches zero levels
		{"sensors/hall/humidity", "deep"}, // + beats # at level 2; deep's # takes zero levels
		{"sensors/hall", "all-sensors"},
		{"sensors/hall/temp/raw", "deep"}, // + beats # at level 3
		{"sensors/kitchen/temp/raw", "kitchen"},
		{"sensors", "root"}, // ending here beats continuing with #
		{"jobs/resize", "jobs"},
		{"jobs/__dlq/resize", "jobs__dlq"},
		{"jobs", "jobs"},
		{"$SYS/uptime", "sys"},
		{"weather/now", ""},
		{"sensorsx", ""},
	} {
		got, ok := r.Resolve(tc.topic)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.topic, got, ok, tc.want)
		}
	}
	// A leading wildcard never takes a '$' topic.
	r2, err := NewResolver([]Route{{"everything", "#"}, {"plus", "+/x"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range []string{"$SYS/x", "$share/x"} {
		if ch, ok := r2.Resolve(tp); ok {
			t.Errorf("Resolve(%q) = %q; a leading wildcard must not take a $ topic", tp, ch)
		}
	}
	if ch, _ := r2.Resolve("a/x"); ch != "plus" {
		t.Errorf("Resolve(a/x) = %q, want plus", ch)
	}
}

func TestNewResolverRefusesOneFilterForTwoChannels(t *testing.T) {
	_, err := NewResolver([]Route{{"a", "x/#"}, {"b", "x/#"}})
	if err == nil || !strings.Contains(err.Error(), "a and b") {
		t.Fatalf("err = %v; want one naming both channels", err)
	}
	if _, err := NewResolver([]Route{{"a", "x/#"}, {"a", "x/#"}}); err != nil {
		t.Fatalf("same route twice: %v", err)
	}
	if _, err := NewResolver([]Route{{"a", "x/#/y"}}); err == nil {
		t.Fatal("invalid filter accepted")
	}
}

func TestReachingTable(t *testing.T) {
	r, err := NewResolver([]Route{
		{"all", "s/#"},
		{"temps", "s/+/temp"},
		{"k", "s/k/#"},
		{"kt", "s/k/temp"},
		{"q", "jobs/#"},
		{"q__dlq", "jobs/__dlq/#"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		filter    string
		want      []string
		broadcast bool
	}{
		{"#", []string{"all", "k", "kt", "q", "q__dlq", "temps"}, true},
		{"s/+/temp", []string{"kt", "temps"}, false}, // s/k/temp is kt's, so k holds none of these
		{"s/k/temp", []string{"kt"}, false},
		{"s/x/temp", []string{"temps"}, false},
		{"s/k/+", []string{"k", "kt"}, false},
		{"jobs/+", []string{"q", "q__dlq"}, false}, // jobs/__dlq is the dlq's (zero-level #)
		{"jobs/x", []string{"q"}, false},
		{"other/#", nil, true},
		{"s", []string{"all"}, false},
		{"$SYS/#", nil, true},
	} {
		got, bc := r.Reach(tc.filter)
		if !reflect.DeepEqual(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("Reach(%q) = %q, want %q", tc.filter, got, tc.want)
		}
		if bc != tc.broadcast {
			t.Errorf("Reach(%q) broadcast = %v, want %v", tc.filter, bc, tc.broadcast)
		}
	}
}

// genFilter draws a filter over a small alphabet so that random filter sets
// overlap often. "$s" exercises the '$' rule, "" empty levels.
func genFilter(t *rapid.T, label string) string {
	n := rapid.IntRange(1, 4).Draw(t, label+"-len")
	lv := make([]string, n)
	for i := range lv {
		lv[i] = rapid.SampledFrom([]string{"a", "b", "$s", "", "+", "+", "a"}).Draw(t, fmt.Sprintf("%s-%d", label, i))
	}
	if rapid.Bool().Draw(t, label+"-hash") {
		if n == 1 && rapid.Bool().Draw(t, label+"-bare") {
			return "#"
		}
		lv[n-1] = "#"
	}
	if n == 1 && lv[0] == "" {
		return "a" // "" is no filter
	}
	return strings.Join(lv, "/")
}

// universe lists every valid topic over the filters' alphabet plus one
// value ("z") no filter names, up to one level deeper than any filter: a
// complete set of representatives for matching and resolution.
func universe(depth int) []string {
	alpha := []string{"a", "b", "$s", "", "z"}
	var out []string
	cur := []string{""}
	for d := 1; d <= depth; d++ {
		var next []string
		for _, p := range cur {
			for _, v := range alpha {
				tp := v
				if d > 1 {
					tp = p + "/" + v
				}
				next = append(next, tp)
				if tp != "" {
					out = append(out, tp)
				}
			}
		}
		cur = next
	}
	return out
}

var universe5 = universe(5)

func genRoutes(t *rapid.T) []Route {
	filters := rapid.SliceOfNDistinct(rapid.Custom(func(t *rapid.T) string { return genFilter(t, "f") }),
		1, 8, rapid.ID[string]).Draw(t, "filters")
	routes := make([]Route, len(filters))
	for i, f := range filters {
		routes[i] = Route{Channel: fmt.Sprintf("c%d", i), Filter: f}
	}
	return routes
}

func TestInvariant12_MostExactFilterHoldsTheTopicRegardlessOfOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		routes := genRoutes(t)
		r, err := NewResolver(routes)
		if err != nil {
			t.Fatal(err)
		}
		perms := []*Resolver{r}
		for i := 0; i < 3; i++ {
			p, err := NewResolver(rapid.Permutation(routes).Draw(t, "perm"))
			if err != nil {
				t.Fatal(err)
			}
			perms = append(perms, p)
		}
		rev := slices.Clone(routes)
		slices.Reverse(rev)
		if p, err := NewResolver(rev); err == nil {
			perms = append(perms, p)
		} else {
			t.Fatal(err)
		}
		for _, tp := range universe5 {
			want, wantOK := bruteResolve(routes, tp)
			for i, p := range perms {
				got, ok := p.Resolve(tp)
				if got != want || ok != wantOK {
					t.Fatalf("order %d: Resolve(%q) = %q,%v; brute force says %q,%v; routes %v",
						i, tp, got, ok, want, wantOK, routes)
				}
			}
		}
	})
}

func TestReachingAgreesWithBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		routes := genRoutes(t)
		r, err := NewResolver(routes)
		if err != nil {
			t.Fatal(err)
		}
		sub := genFilter(t, "sub")
		set := map[string]bool{}
		wantBC := false
		for _, tp := range universe5 {
			if !refMatch(sub, tp) {
				continue
			}
			if ch, ok := bruteResolve(routes, tp); ok {
				set[ch] = true
			} else {
				wantBC = true
			}
		}
		var want []string
		for c := range set {
			want = append(want, c)
		}
		sort.Strings(want)
		got, bc := r.Reach(sub)
		if !slices.Equal(got, want) || bc != wantBC {
			t.Fatalf("Reach(%q) = %q, broadcast %v; brute force %q, broadcast %v; routes %v",
				sub, got, bc, want, wantBC, routes)
		}
	})
}

func TestMatchOverlapInsideAgreeWithBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genFilter(t, "a"), genFilter(t, "b")
		overlap, inside, anyA := false, true, false
		for _, tp := range universe5 {
			ma, mb := refMatch(a, tp), refMatch(b, tp)
			if Match(a, tp) != ma {
				t.Fatalf("Match(%q, %q) = %v, reference %v", a, tp, !ma, ma)
			}
			overlap = overlap || (ma && mb)
			inside = inside && (!ma || mb)
			anyA = anyA || ma
		}
		if !anyA {
			t.Fatalf("filter %q matches no topic of the universe; the universe is incomplete", a)
		}
		if got := Overlap(a, b); got != overlap {
			t.Fatalf("Overlap(%q, %q) = %v, brute force %v", a, b, got, overlap)
		}
		if got := Inside(a, b); got != inside {
			t.Fatalf("Inside(%q, %q) = %v, brute force %v", a, b, got, inside)
		}
	})
}

// A dead letter's topic matches the dead-letter filter, and a resolver
// holding the queue and its dead-letter channel puts it in the latter.
func TestDeadLetterTopicsResolveToTheDeadLetterChannel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// Channel filters begin with a literal not starting with '$' (docs/configuration.md "`channels`").
		q := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "first")
		if rapid.Bool().Draw(t, "more") {
			q += "/" + genFilter(t, "q")
		}
		dlq := DeadLetterFilter(q)
		r, err := NewResolver([]Route{{"q", q}, {"q__dlq", dlq}})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range universe5 {
			if !Match(q, tp) {
				continue
			}
			d, err := DeadLetterTopic(q, tp)
			if err != nil {
				t.Fatal(err)
			}
			if !Match(dlq, d) {
				t.Fatalf("DeadLetterTopic(%q, %q) = %q does not match %q", q, tp, d, dlq)
			}
			if ch, _ := r.Resolve(d); ch != "q__dlq" {
				t.Fatalf("dead letter %q of %q resolves to %q", d, tp, ch)
			}
		}
	})
}

func BenchmarkResolve(b *testing.B) {
	var routes []Route
	for i := 0; i < 2000; i++ {
		routes = append(routes, Route{fmt.Sprintf("dev%d", i), fmt.Sprintf("site/%d/+/telemetry/#", i)})
		routes = append(routes, Route{fmt.Sprintf("cmd%d", i), fmt.Sprintf("site/%d/cmd", i)})
	}
	routes = append(routes, Route{"site", "site/#"})
	r, err := NewResolver(routes)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if ch, _ := r.Resolve("site/1234/pump-3/telemetry/flow"); ch != "dev1234" {
			b.Fatal(ch)
		}
	}
}

func BenchmarkReachEverything(b *testing.B) {
	var routes []Route
	for i := 0; i < 2000; i++ {
		routes = append(routes, Route{fmt.Sprintf("dev%d", i), fmt.Sprintf("site/%d/+/telemetry/#", i)})
		routes = append(routes, Route{fmt.Sprintf("cmd%d", i), fmt.Sprintf("site/%d/cmd", i)})
	}
	routes = append(routes, Route{"site", "site/#"})
	r, err := NewResolver(routes)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if got := r.Reaching("site/+/+/telemetry/x"); len(got) != 2001 {
			b.Fatal(len(got))
		}
	}
}

// MoreExact is the resolver's own order: of two filters that both match a
// topic, the resolver picks the one MoreExact says is more exact, whichever
// order the routes are given in.
func TestMoreExactAgreesWithTheResolver(t *testing.T) {
	filters := []string{"a/#", "a/+", "a/b", "a/+/#", "a/b/#", "+/b", "+/+", "#", "a/+/c", "+/b/c", "a/b/c", "+/#", "a/b/+"}
	topics := []string{"a", "a/b", "a/c", "a/b/c", "a/x/c", "x/b/c", "a/b/d", "x/b", "a/b/c/d"}
	for i, fa := range filters {
		for _, fb := range filters[i+1:] {
			r, err := NewResolver([]Route{{Channel: "A", Filter: fa}, {Channel: "B", Filter: fb}})
			if err != nil {
				t.Fatal(err)
			}
			for _, tp := range topics {
				if !Match(fa, tp) || !Match(fb, tp) {
					continue
				}
				got, _ := r.Resolve(tp)
				want := "B"
				if MoreExact(fa, fb) {
					want = "A"
				}
				if got != want {
					t.Errorf("topic %q, filters A=%q B=%q: resolver picks %s, MoreExact says %s", tp, fa, fb, got, want)
				}
				if MoreExact(fa, fb) == MoreExact(fb, fa) {
					t.Errorf("MoreExact(%q, %q) and its converse agree", fa, fb)
				}
			}
		}
	}
}
