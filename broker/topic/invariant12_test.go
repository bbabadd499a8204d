package topic

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// exactnessKey encodes invariant 12's order on filters as a string whose
// byte order is the order of exactness, one letter per level: d a spelled-out
// level, c a +, then a for a # or b where the filter ends. At the first level
// where two filters differ the higher letter wins - literal over +, + over #,
// and ending over continuing with # - which is "the first level at which two
// filters differ decides". A key holds a or b only as its last letter, so
// one key is never a proper prefix of another and plain string comparison is
// the whole rule. It shares no code with the Resolver or with refMoreExact.
func exactnessKey(filter string) string {
	var b strings.Builder
	for _, lvl := range strings.Split(filter, "/") {
		switch lvl {
		case MultiLevel:
			b.WriteByte('a')
			return b.String()
		case SingleLevel:
			b.WriteByte('c')
		default:
			b.WriteByte('d')
		}
	}
	b.WriteByte('b')
	return b.String()
}

// Level values for configuration filters and topics: few enough that
// filters collide and overlap, with an empty level and a multi-byte one.
var inv12Levels = []string{"a", "b", "c", "dev-1", "dev-2", "ü", ""}

// A configured channel as an operator writes it: a name and filters, each
// possibly holding {x,y} alternatives.
type inv12Channel struct {
	name    string
	written []string
}

// genWrittenFilter draws a channel filter as written in a configuration
// file (docs/configuration.md "`channels`"): a spelled-out first level not beginning with $, then
// literals, +, braces, and possibly a final #.
func genWrittenFilter(t *rapid.T, label string) string {
	lv := []string{rapid.SampledFrom([]string{"a", "b", "{a,b}", "dev-{1,2}"}).Draw(t, label+"-first")}
	for n := rapid.IntRange(0, 4).Draw(t, label+"-len"); n > 0; n-- {
		lv = append(lv, rapid.SampledFrom([]string{
			"a", "b", "c", "dev-1", "ü", "", "+", "+", "{a,b}", "{b,c,ü}", "dev-{1,2}",
		}).Draw(t, label+"-level"))
	}
	if rapid.IntRange(0, 2).Draw(t, label+"-hash") == 0 {
		lv = append(lv, MultiLevel)
	}
	return strings.Join(lv, "/")
}

// genConfig draws channels whose expanded filters are all distinct, as the
// configuration loader requires (a filter on two channels is a startup
// error, which config's TestInvariant12_ covers). A drawn filter whose
// expansion another channel already holds is left out.
func genConfig(t *rapid.T) []inv12Channel {
	owner := map[string]string{}
	var chans []inv12Channel
	for i, n := 0, rapid.IntRange(1, 6).Draw(t, "channels"); i < n; i++ {
		c := inv12Channel{name: fmt.Sprintf("ch%d", i)}
		for j, m := 0, rapid.IntRange(1, 3).Draw(t, "filters"); j < m; j++ {
			w := genWrittenFilter(t, "filter")
			exp, err := ExpandBraces(w)
			if err != nil {
				t.Fatalf("generated filter %q: %v", w, err)
			}
			if slices.ContainsFunc(exp, func(f string) bool { o, held := owner[f]; return held && o != c.name }) {
				continue
			}
			for _, f := range exp {
				owner[f] = c.name
			}
			c.written = append(c.written, w)
		}
		if len(c.written) > 0 {
			chans = append(chans, c)
		}
	}
	return chans
}

// reorderBraces rewrites every {x,y,...} in a written filter with its
// alternatives in another order: the same filter set, written differently.
func reorderBraces(t *rapid.T, written string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(written, '{')
		if i < 0 {
			b.WriteString(written)
			return b.String()
		}
		j := strings.IndexByte(written, '}')
		alts := rapid.Permutation(strings.Split(written[i+1:j], ",")).Draw(t, "alternatives")
		b.WriteString(written[:i] + "{" + strings.Join(alts, ",") + "}")
		written = written[j+1:]
	}
}

// routesOf expands a configuration into resolver routes in file order, the
// way the configuration loader does.
func routesOf(t *rapid.T, chans []inv12Channel) []Route {
	var routes []Route
	for _, c := range chans {
		for _, w := range c.written {
			exp, err := ExpandBraces(w)
			if err != nil {
				t.Fatalf("%q: %v", w, err)
			}
			for _, f := range exp {
				routes = append(routes, Route{Channel: c.name, Filter: f})
			}
		}
	}
	return routes
}

// instantiate draws a topic the filter matches: a value for each +, and zero
// to three levels for a #. Values include one no filter names ("zz").
func instantiate(t *rapid.T, filter string) string {
	var lv []string
	for _, l := range Split(filter) {
		switch l {
		case SingleLevel:
			lv = append(lv, rapid.SampledFrom(append([]string{"zz"}, inv12Levels...)).Draw(t, "plus"))
		case MultiLevel:
			for n := rapid.IntRange(0, 3).Draw(t, "hash-levels"); n > 0; n-- {
				lv = append(lv, rapid.SampledFrom(append([]string{"zz"}, inv12Levels...)).Draw(t, "hash"))
			}
		default:
			lv = append(lv, l)
		}
	}
	if tp := strings.Join(lv, "/"); tp != "" {
		return tp
	}
	return "zz"
}

// Invariant 12 as an operator meets it: channels with several filters and
// {a,b} alternatives, and topics anywhere under them. Whatever order the
// file lists the channels in, the filters of a channel, or the alternatives
// inside a brace, each topic resolves to the channel owning the most exact
// matching filter - and that filter is strictly more exact than every other
// one matching the topic, so there was no tie for the broker to break.
func TestInvariant12_BracedMultiFilterChannelsResolveToTheMostExactInAnyFileOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		chans := genConfig(t)
		routes := routesOf(t, chans)
		base, err := NewResolver(routes)
		if err != nil {
			t.Fatal(err)
		}
		// The same configuration written in other orders.
		var others []*Resolver
		for k := 0; k < 3; k++ {
			re := rapid.Permutation(chans).Draw(t, "channel-order")
			for i := range re {
				written := rapid.Permutation(re[i].written).Draw(t, "filter-order")
				for j, w := range written {
					written[j] = reorderBraces(t, w)
				}
				re[i] = inv12Channel{name: re[i].name, written: written}
			}
			r, err := NewResolver(routesOf(t, re))
			if err != nil {
				t.Fatalf("reordered configuration refused: %v", err)
			}
			others = append(others, r)
		}

		var topics []string
		for i := 0; i < 25; i++ {
			if rapid.IntRange(0, 4).Draw(t, "free") == 0 {
				// A topic drawn without regard to any filter, '$' ones included.
				lv := rapid.SliceOfN(rapid.SampledFrom(append([]string{"zz", "$x"}, inv12Levels...)), 1, 6).Draw(t, "levels")
				if tp := strings.Join(lv, "/"); tp != "" {
					topics = append(topics, tp)
				}
				continue
			}
			topics = append(topics, instantiate(t, rapid.SampledFrom(routes).Draw(t, "route").Filter))
		}

		for _, tp := range topics {
			got, ok := base.Resolve(tp)
			for i, r := range others {
				if g, o := r.Resolve(tp); g != got || o != ok {
					t.Fatalf("Resolve(%q) = %q,%v in file order but %q,%v in order %d; config %v", tp, got, ok, g, o, i, chans)
				}
			}
			var win *Route
			for i := range routes {
				rt := &routes[i]
				if !refMatch(rt.Filter, tp) {
					continue
				}
				if win == nil || exactnessKey(rt.Filter) > exactnessKey(win.Filter) {
					win = rt
				}
			}
			if win == nil {
				if ok {
					t.Fatalf("Resolve(%q) = %q, but no filter matches it; routes %v", tp, got, routes)
				}
				continue
			}
			if !ok || got != win.Channel {
				t.Fatalf("Resolve(%q) = %q,%v; the most exact matching filter is %q of %s; routes %v",
					tp, got, ok, win.Filter, win.Channel, routes)
			}
			for _, rt := range routes {
				if rt.Filter != win.Filter && refMatch(rt.Filter, tp) && exactnessKey(rt.Filter) >= exactnessKey(win.Filter) {
					t.Fatalf("topic %q: %q is as exact as the winner %q", tp, rt.Filter, win.Filter)
				}
			}
		}
	})
}

// The reason invariant 12 leaves the broker no tie to break: two filters
// that both match a topic and are equally exact at every level are character
// for character the same filter. Both filters are drawn freely (wildcards in
// any position) and the topic from one of them, so most pairs do meet.
func TestInvariant12_EquallyExactFiltersMatchingOneTopicAreTheSameFilter(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genFilter(t, "a"), genFilter(t, "b")
		var tp string
		if rapid.Bool().Draw(t, "from-a") {
			tp = instantiate(t, a)
		} else {
			tp = instantiate(t, b)
		}
		if !refMatch(a, tp) || !refMatch(b, tp) {
			return
		}
		if exactnessKey(a) == exactnessKey(b) && a != b {
			t.Fatalf("%q and %q both match %q and are equally exact at every level", a, b, tp)
		}
		// And the resolver, given both, picks the more exact whichever is first.
		if a == b {
			return
		}
		want := "A"
		if exactnessKey(b) > exactnessKey(a) {
			want = "B"
		}
		for _, routes := range [][]Route{{{"A", a}, {"B", b}}, {{"B", b}, {"A", a}}} {
			r, err := NewResolver(routes)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := r.Resolve(tp); got != want {
				t.Fatalf("filters %q (A) and %q (B), topic %q: resolved to %q, want %q", a, b, tp, got, want)
			}
		}
	})
}
