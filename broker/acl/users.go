package acl

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"saguin.dev/broker/config"
)

// The users: half of the file: which entry applies to a name (its
// patterns, checked for ties), and what the entry says beside its roles
// (client_ids:, limits:).

// usersKey renders a pattern's dotted key: quoted unless it is a plain name.
func usersKey(pattern string) string {
	if pattern != "" && roleNameProblem(pattern) == "" {
		return "users." + pattern
	}
	return "users[" + strconv.Quote(pattern) + "]"
}

// readUsers reads users: pattern -> roles, short or long form.
func (p *parser) readUsers(v config.Node) []*entry {
	d := p.d
	b, ok := d.Block(v)
	if !ok {
		return nil
	}
	if len(v.YAML().Content) == 0 { // as written: an exhausted budget reads as no keys
		d.Add(v, "names no user; give roles to user names here (with none, every client would be refused everything)")
	}
	var out []*entry
	for _, pattern := range b.Keys() {
		ev, _ := b.Get(pattern)
		ev = ev.WithKey(usersKey(pattern))
		e := &entry{pattern: pattern, literals: literals(pattern), glob: strings.Contains(pattern, "*"), line: b.KeyLine(pattern)}
		good := true
		switch {
		case hasControl(pattern):
			d.AddKey(e.line, ev.Key(), "a user name never holds a control character (a client naming itself so is refused at CONNECT); remove it")
			good = false
		case len(pattern) > maxPatternBytes:
			d.AddKey(e.line, ev.Key(), "the pattern is %d bytes; a user pattern is at most %d", len(pattern), maxPatternBytes)
			good = false
		}
		switch {
		case ev.IsNull():
			d.AddKey(e.line, ev.Key(), "names no role; an entry gives at least one, like [operators]")
			good = false
		case ev.YAML().Kind == yaml.SequenceNode:
			roles, ok := p.roleList(ev)
			e.roles, good = roles, good && ok
		case ev.YAML().Kind == yaml.MappingNode:
			good = p.userBlock(ev, e) && good
		default:
			d.Add(ev, "an entry is a list of roles, like [operators], or a block with roles:, and optionally limits: and client_ids:")
			good = false
		}
		if good {
			out = append(out, e)
		}
	}
	return out
}

// userBlock reads the long form of an entry.
func (p *parser) userBlock(v config.Node, e *entry) bool {
	d := p.d
	b, _ := d.Block(v)
	good := true
	if rv, has := b.Get("roles"); has {
		roles, ok := p.roleList(rv)
		e.roles, good = roles, ok
	} else {
		d.AddKey(e.line, v.Key()+".roles", "missing; an entry gives at least one role, like roles: [operators]")
		good = false
	}
	if lv, has := b.Get("limits"); has {
		lim, ok := p.limits(lv)
		e.limits, good = lim, good && ok
	}
	if cv, has := b.Get("client_ids"); has {
		ids, ok := p.clientIDs(cv)
		e.clientIDs, good = ids, good && ok
	}
	b.Finish("roles", "limits", "client_ids")
	return good
}

// roleList reads an entry's roles: at least one, each defined.
func (p *parser) roleList(v config.Node) ([]string, bool) {
	d := p.d
	items, ok := d.Items(v)
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		d.Add(v, "names no role; an entry gives at least one, like [operators]")
		return nil, false
	}
	known := make([]string, 0, len(p.roles))
	for name := range p.roles {
		known = append(known, name)
	}
	sort.Strings(known)
	var out []string
	good := true
	for _, it := range items {
		name, ok := d.Text(it, "a role name")
		switch {
		case !ok:
			good = false
		case p.roles[name] == nil:
			hint := ""
			if s := config.Nearest(name, known); s != "" {
				hint = "; did you mean " + s + "?"
			}
			d.Add(it, "no role of roles: has this name%s", hint)
			good = false
		case contains(out, name):
			d.Add(it, "listed twice; keep one")
			good = false
		default:
			out = append(out, name)
		}
	}
	return out, good
}

// limits reads an entry's limits: (docs/configuration.md "`broker.limits`": figures follow the user
// name). Each figure written replaces broker.limits' for this entry's
// users, up or down; none lifts the bound.
func (p *parser) limits(v config.Node) (entryLimits, bool) {
	d := p.d
	lim := entryLimits{set: true}
	b, ok := d.Block(v)
	if !ok {
		return lim, false
	}
	good := true
	if len(v.YAML().Content) == 0 {
		d.Add(v, "names no figure; write publish_rate: and publish_bytes: (either or both), or remove limits: to keep broker.limits' figures")
		good = false
	}
	if rv, has := b.Get("publish_rate"); has {
		n, ok := p.rate(rv)
		lim.rate, lim.rateSet, good = n, ok, good && ok
	}
	if bv, has := b.Get("publish_bytes"); has {
		n, ok := p.byteRate(bv)
		lim.bytes, lim.bytesSet, good = n, ok, good && ok
	}
	b.Finish("publish_rate", "publish_bytes")
	return lim, good
}

func (p *parser) rate(v config.Node) (int, bool) {
	s, ok := p.d.Text(v, "messages per second, like 100, or none")
	if !ok {
		return 0, false
	}
	if s == "none" {
		return 0, true
	}
	var n int64
	if v.YAML().ShortTag() != "!!int" || v.YAML().Decode(&n) != nil {
		p.d.Add(v, "it is a whole number of messages per second, like 100, or none for no bound")
		return 0, false
	}
	switch {
	case n == 0:
		p.d.Add(v, "a zero rate admits nothing; write 1 or more messages per second, or none for no bound")
		return 0, false
	case n < 0 || n > math.MaxInt32:
		p.d.Add(v, "it is from 1 to %d messages per second, or none for no bound", math.MaxInt32)
		return 0, false
	}
	return int(n), true
}

func (p *parser) byteRate(v config.Node) (int64, bool) {
	s, ok := p.d.Text(v, "a size per second like 64KiB, or none")
	if !ok {
		return 0, false
	}
	if s == "none" {
		return 0, true
	}
	n, err := config.ParseBytes(s)
	switch {
	case err != nil:
		p.d.Add(v, "%v (or none for no bound)", err)
		return 0, false
	case n == 0:
		p.d.Add(v, "a zero byte rate admits nothing; write a size per second like 64KiB, or none for no bound")
		return 0, false
	}
	return n, true
}

// clientIDs reads client_ids: one pattern or a list, none empty.
func (p *parser) clientIDs(v config.Node) ([]string, bool) {
	d := p.d
	var items []config.Node
	switch {
	case v.IsNull():
	case v.YAML().Kind == yaml.SequenceNode:
		var ok bool
		if items, ok = d.Items(v); !ok {
			return nil, false
		}
	default:
		items = []config.Node{v}
	}
	if len(items) == 0 {
		d.Add(v, "names no client id, so it would admit none; write a pattern like \"%%u-*\", or remove client_ids: to admit any")
		return nil, false
	}
	out := make([]string, 0, len(items))
	good := true
	for _, it := range items {
		s, ok := d.Text(it, "a client id pattern like \"%u-*\"")
		switch {
		case !ok:
			good = false
		case s == "":
			d.Add(it, "an empty pattern admits no client id a client can connect with; write a pattern like \"%%u-*\"")
			good = false
		case len(s) > maxPatternBytes:
			d.Add(it, "the pattern is %d bytes; a client id pattern is at most %d", len(s), maxPatternBytes)
			good = false
		case strings.Contains(s, "%c"):
			d.Add(it, "client_ids are matched against the client id itself, so %%c would admit every id; write the pattern the ids follow")
			good = false
		default:
			if prob := placeholderProblem(s, "u", "%u (the user name) is"); prob != "" {
				d.Add(it, "%s", prob)
				good = false
				continue
			}
			out = append(out, s)
		}
	}
	return out, good
}

// index splits the entries into names written out and patterns with '*',
// and refuses every tie: two patterns with as many literal characters
// that some one name matches both (docs/configuration.md "The ACL file"). A name written out
// ties with a pattern exactly when the pattern, its '*'s removed, is that
// name (every '*' then matches nothing), so those are found through a
// map; patterns are compared pairwise among those of one exactness.
func (p *parser) index(entries []*entry) (map[string]*entry, []*entry) {
	exact := map[string]*entry{}
	var globs []*entry
	for _, e := range entries {
		if e.glob {
			globs = append(globs, e)
		} else {
			exact[e.pattern] = e
		}
	}
	// invariant 13: patterns with '*' are compared pairwise; their count
	// is bounded before any pair is.
	if len(globs) > maxGlobs {
		e := globs[maxGlobs]
		p.d.AddKey(e.line, usersKey(e.pattern), "the file has more than %d patterns with *, which are compared pairwise for ties; write names out, or group users under fewer patterns", maxGlobs)
		return exact, globs
	}
	for _, g := range globs {
		if x, ok := exact[strings.ReplaceAll(g.pattern, "*", "")]; ok {
			p.tie(x, g, x.pattern)
		}
	}
	byExactness := map[int][]*entry{}
	for _, g := range globs {
		byExactness[g.literals] = append(byExactness[g.literals], g)
	}
	work := tieWork
	for _, group := range byExactness {
		for i, a := range group {
			for _, b := range group[i+1:] {
				name, meets, ok := globsMeet(a.pattern, b.pattern, &work)
				if !ok {
					p.d.AddKey(b.line, usersKey(b.pattern), "the patterns with * are too many or too long to compare for ties; write names out, or use fewer, shorter patterns")
					return exact, globs
				}
				if meets {
					p.tie(a, b, name)
				}
			}
		}
	}
	// Most exact first: For takes the first that matches. Among equally
	// exact patterns at most one matches any name (ties are refused).
	sort.SliceStable(globs, func(i, j int) bool { return globs[i].literals > globs[j].literals })
	return exact, globs
}

// tie is the finding for two equally exact patterns that both match name,
// placed on the later one.
func (p *parser) tie(a, b *entry, name string) {
	if a.line > b.line {
		a, b = b, a
	}
	chars := "characters"
	if a.literals == 1 {
		chars = "character"
	}
	p.d.AddKey(b.line, usersKey(b.pattern), "this pattern and %q (line %d) both match the name %q with %d literal %s each, so neither is more exact and nothing says which applies; make one more exact, or merge the two",
		a.pattern, a.line, name, a.literals, chars)
}
