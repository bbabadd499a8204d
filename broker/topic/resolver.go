package topic

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Route is one (channel, filter) pair a Resolver is built from. A channel
// with several filters (brace expansion) contributes one Route per filter.
type Route struct {
	Channel string
	Filter  string
}

// Resolver decides which channel holds a topic: the channel whose filter
// spells the topic out most exactly (invariant 12). It is a trie by level,
// so a lookup walks at most the trie nodes along the topic's own levels and
// never scans the configured filters; it is immutable after NewResolver and
// safe for concurrent use.
//
// Exactness is a lexicographic order on filters, compared level by level
// from the left (docs/configuration.md "`channels`"): at the first level where two filters that
// both match a topic differ, a literal beats +, + beats #, and a filter that
// ends there beats one continuing with #. Two distinct filters matching one
// topic always differ somewhere, so there is never a tie to break, and
// nothing depends on the order the routes were given in.
type Resolver struct {
	root   *node
	nodes  int
	routes []Route // sorted by filter, for Routes()
}

type node struct {
	id    int
	lit   map[string]*node
	plus  *node
	end   string // channel whose filter ends at this node ("" none)
	hash  string // channel whose filter is this node's prefix + "/#" ("" none)
	ranks []byte // the path's level kinds (rankLiteral/rankPlus), for Reach
}

// Ranks of what a filter has at a level, in order of exactness. rankEnd is
// "the filter ends here" compared against a filter continuing with #.
const (
	rankHash    byte = 0
	rankEnd     byte = 1
	rankPlus    byte = 2
	rankLiteral byte = 3
)

// NewResolver builds a resolver. Every filter must be valid and every
// channel name non-empty; a filter given for two different channels is an
// error naming both (invariant 12: the configuration, not the broker, picks).
// The same (channel, filter) twice is harmless and kept once.
func NewResolver(routes []Route) (*Resolver, error) {
	r := &Resolver{root: &node{}}
	r.nodes = 1
	sorted := append([]Route(nil), routes...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Filter != sorted[j].Filter {
			return sorted[i].Filter < sorted[j].Filter
		}
		return sorted[i].Channel < sorted[j].Channel
	})
	for _, rt := range sorted {
		if rt.Channel == "" {
			return nil, fmt.Errorf("filter %q: the channel name is empty", rt.Filter)
		}
		if err := ValidFilter(rt.Filter); err != nil {
			return nil, fmt.Errorf("channel %s filter %q: %w", rt.Channel, rt.Filter, err)
		}
		n := r.root
		levels := Split(rt.Filter)
		var slot *string
		for i, lvl := range levels {
			if lvl == MultiLevel {
				slot = &n.hash
				break
			}
			n = r.child(n, lvl)
			if i == len(levels)-1 {
				slot = &n.end
			}
		}
		switch *slot {
		case "":
			*slot = rt.Channel
			r.routes = append(r.routes, rt)
		case rt.Channel:
		default:
			return nil, fmt.Errorf("channels %s and %s both have the filter %q; a topic belongs to exactly one channel (invariant 12)",
				*slot, rt.Channel, rt.Filter)
		}
	}
	return r, nil
}

func (r *Resolver) child(n *node, lvl string) *node {
	if lvl == SingleLevel {
		if n.plus == nil {
			n.plus = r.newNode(n, rankPlus)
		}
		return n.plus
	}
	c := n.lit[lvl]
	if c == nil {
		if n.lit == nil {
			n.lit = make(map[string]*node)
		}
		c = r.newNode(n, rankLiteral)
		n.lit[lvl] = c
	}
	return c
}

func (r *Resolver) newNode(parent *node, rank byte) *node {
	ranks := make([]byte, len(parent.ranks)+1)
	copy(ranks, parent.ranks)
	ranks[len(parent.ranks)] = rank
	c := &node{id: r.nodes, ranks: ranks}
	r.nodes++
	return c
}

// Routes returns the routes the resolver holds, sorted by filter.
func (r *Resolver) Routes() []Route {
	return append([]Route(nil), r.routes...)
}

// Resolve returns the channel holding topic, or ok=false when no channel's
// filter matches it (the topic is broadcast). The topic must be valid.
func (r *Resolver) Resolve(topic string) (channel string, ok bool) {
	if topic == "" {
		return "", false
	}
	c := r.root.resolve(topic, 0, topic[0] == '$')
	return c, c != ""
}

// resolve searches n's subtree for the most exact filter matching the topic
// levels from pos on (pos > len(t) once the topic has ended). The order of
// the tries is the exactness order itself: every filter under the literal
// child beats every filter under +, which beat the # here, so the first hit
// is the winner. The trie is a tree, so each node is visited at most once.
func (n *node) resolve(t string, pos int, dollarFirst bool) string {
	if pos > len(t) {
		// A filter ending here beats one continuing with # (zero levels).
		if n.end != "" {
			return n.end
		}
		return n.hash
	}
	// invariant 12: a literal level, then +, then #: the most exact filter holds the topic, whatever the configuration's order.
	end := levelEnd(t, pos)
	if c := n.lit[t[pos:end]]; c != nil {
		if ch := c.resolve(t, end+1, false); ch != "" {
			return ch
		}
	}
	if dollarFirst {
		// MQTT-4.7.2-1: no leading wildcard matches a '$' topic.
		return ""
	}
	if n.plus != nil {
		if ch := n.plus.resolve(t, end+1, false); ch != "" {
			return ch
		}
	}
	return n.hash
}

// candidate is a filter that matches the topic being built in Reach: the one
// ending at node n (hash=false) or n's prefix + "/#" (hash=true).
type candidate struct {
	n    *node
	hash bool
}

func (c candidate) channel() string {
	if c.n == nil {
		return ""
	}
	if c.hash {
		return c.n.hash
	}
	return c.n.end
}

func (c candidate) id() int {
	if c.n == nil {
		return -1
	}
	if c.hash {
		return 2*c.n.id + 1
	}
	return 2 * c.n.id
}

// beats reports whether a is more exact than b; both match one topic.
func (a candidate) beats(b candidate) bool {
	if b.n == nil {
		return a.n != nil
	}
	if a.n == nil {
		return false
	}
	ra, rb := a.n.ranks, b.n.ranks
	for i := 0; ; i++ {
		ka, kb := rankAt(ra, i, a.hash), rankAt(rb, i, b.hash)
		if ka != kb {
			return ka > kb
		}
		if i >= len(ra) || i >= len(rb) {
			return false // identical filters: never two candidates
		}
	}
}

func rankAt(ranks []byte, i int, hash bool) byte {
	if i < len(ranks) {
		return ranks[i]
	}
	if hash {
		return rankHash
	}
	return rankEnd
}

// Reaching returns, sorted, every channel that holds some topic the filter
// matches: channel C is in the result exactly when a valid topic T exists
// with Match(filter, T) and Resolve(T) == C. The filter must be valid.
func (r *Resolver) Reaching(filter string) []string {
	chans, _ := r.Reach(filter)
	return chans
}

// Reach is Reaching plus whether the filter also matches some broadcast
// topic (one no channel holds).
//
// It explores topics symbolically, level by level, as the set of trie nodes
// whose filter prefixes match the topic so far. Where the subscription
// filter leaves a level free (+ or #), only the literals of those nodes'
// children can change which filters match; every other value behaves the
// same, so one "fresh" value stands for all of them. That makes the set of
// topic classes finite (the trie has finite depth) and the search exact.
// The # filters passed on the way always match, and of those only the most
// exact can win, so one is carried instead of a set.
func (r *Resolver) Reach(filter string) (channels []string, broadcast bool) {
	s := reachSearch{
		r:       r,
		f:       Split(filter),
		found:   make(map[string]bool),
		visited: make(map[string]bool),
	}
	s.walk([]*node{r.root}, candidate{}, 0, 0, false)
	for c := range s.found {
		if c == "" {
			broadcast = true
			continue
		}
		channels = append(channels, c)
	}
	sort.Strings(channels)
	return channels, broadcast
}

type reachSearch struct {
	r       *Resolver
	f       []string
	found   map[string]bool // channel names; "" stands for broadcast
	visited map[string]bool
	key     []byte // scratch for visited keys
}

// walk visits the class of topics whose first depth levels are fixed as
// described by alive (nodes at that depth matching them), best (the most
// exact # filter passed), fi (how many levels of the subscription filter are
// consumed; it stays on a "#") and emptyFirst (the topic so far is one empty
// level, which may not end there: "" is no topic).
func (s *reachSearch) walk(alive []*node, best candidate, fi, depth int, emptyFirst bool) {
	k := s.key[:0]
	k = strconv.AppendInt(k, int64(depth), 36)
	k = append(k, '|')
	k = strconv.AppendInt(k, int64(fi), 36)
	k = strconv.AppendBool(k, emptyFirst)
	k = strconv.AppendInt(k, int64(best.id()), 36)
	for _, n := range alive {
		k = append(k, ',')
		k = strconv.AppendInt(k, int64(n.id), 36)
	}
	s.key = k
	if s.visited[string(k)] {
		return
	}
	s.visited[string(k)] = true

	inHash := fi < len(s.f) && s.f[fi] == MultiLevel
	// May the topic end here?
	if depth > 0 && (fi == len(s.f) || inHash) && !(depth == 1 && emptyFirst) {
		win := best
		for _, n := range alive {
			if n.end != "" && (candidate{n, false}).beats(win) {
				win = candidate{n, false}
			}
			if n.hash != "" && (candidate{n, true}).beats(win) {
				win = candidate{n, true}
			}
		}
		s.found[win.channel()] = true
	}
	if fi == len(s.f) {
		return
	}
	if len(alive) == 0 {
		// No filter can join any more: every completion resolves to best.
		s.found[best.channel()] = true
		return
	}
	next := fi
	if !inHash {
		next = fi + 1
	}
	if lvl := s.f[fi]; !isWild(lvl) {
		s.step(alive, best, next, depth, lvl, false)
		return
	}
	// A free level: every literal a node in play has, and one fresh value.
	// A wildcard can never match a '$' first level, so at depth 0 the '$'
	// literals are not values this filter's topics can take. Order does not
	// matter: results collect into a set.
	var tried map[string]bool
	if len(alive) > 1 {
		tried = map[string]bool{}
	}
	for _, n := range alive {
		for v := range n.lit {
			if (depth == 0 && strings.HasPrefix(v, "$")) || tried[v] {
				continue
			}
			if tried != nil {
				tried[v] = true
			}
			s.step(alive, best, next, depth, v, false)
		}
	}
	s.step(alive, best, next, depth, "", true)
}

// step consumes one topic level with value v (or, when fresh, a value equal
// to no literal in play) and walks on.
func (s *reachSearch) step(alive []*node, best candidate, fi, depth int, v string, fresh bool) {
	dollar := depth == 0 && !fresh && strings.HasPrefix(v, "$")
	var nextAlive []*node
	for _, n := range alive {
		if n.hash != "" && !dollar {
			if c := (candidate{n, true}); c.beats(best) {
				best = c
			}
		}
		if !fresh {
			if c := n.lit[v]; c != nil {
				nextAlive = append(nextAlive, c)
			}
		}
		if n.plus != nil && !dollar {
			nextAlive = append(nextAlive, n.plus)
		}
	}
	if len(nextAlive) > 1 {
		// A canonical order, so one set of nodes is one visited key.
		sort.Slice(nextAlive, func(i, j int) bool { return nextAlive[i].id < nextAlive[j].id })
	}
	s.walk(nextAlive, best, fi, depth+1, depth == 0 && !fresh && v == "")
}

// MoreExact reports whether filter a is more exact than filter b by the
// order the resolver decides with (docs/configuration.md "`channels`"): compared level by level
// from the left, at the first level where they differ a literal beats +,
// + beats #, and a filter ending there beats one continuing with #. Two
// identical filters are not more exact than each other. saguin --route
// lists a configuration's filters in this order.
func MoreExact(a, b string) bool {
	ra, ha := filterRanks(a)
	rb, hb := filterRanks(b)
	for i := 0; ; i++ {
		ka, kb := rankAt(ra, i, ha), rankAt(rb, i, hb)
		if ka != kb {
			return ka > kb
		}
		if i >= len(ra) || i >= len(rb) {
			return false
		}
	}
}

// filterRanks is a filter's level kinds as the trie records them (a
// trailing # is not a level: it is the hash flag).
func filterRanks(f string) (ranks []byte, hash bool) {
	lv := Split(f)
	if n := len(lv); n > 0 && lv[n-1] == MultiLevel {
		lv, hash = lv[:n-1], true
	}
	ranks = make([]byte, len(lv))
	for i, l := range lv {
		ranks[i] = rankLiteral
		if l == SingleLevel {
			ranks[i] = rankPlus
		}
	}
	return ranks, hash
}
