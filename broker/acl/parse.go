package acl

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"saguin.dev/broker/config"
	"saguin.dev/broker/topic"
)

// Bounds of the file's own (invariant 13), beside the reader's.
const (
	// maxPatternBytes bounds a user pattern and a client_ids pattern: the
	// tie check's work is the product of two patterns' lengths.
	maxPatternBytes = 1024
	// maxGlobs bounds the patterns holding '*', which the tie check
	// compares pairwise; names written out are compared through a map.
	maxGlobs = 4096
	// tieWork bounds the cells the tie check may walk in all.
	tieWork = 64 << 20
	// maxRoleName is a role name's length, as a channel name's.
	maxRoleName = config.MaxChannelName
)

// parser reads one ACL file into roles and entries, recording every
// finding.
type parser struct {
	d     *config.Document
	env   env
	roles map[string]*role
	// reached memoizes Reach per filter: a rule list used through many
	// aliases is checked once per distinct filter, not once per use. It
	// holds at most one entry per distinct filter the file spells.
	reached map[string]reach
}

type reach struct {
	channels  []string
	broadcast bool
}

// reach is the resolver's Reach of a rule filter, %u and %c read as text.
func (p *parser) reach(f string) ([]string, bool) {
	if x, ok := p.reached[f]; ok {
		return x.channels, x.broadcast
	}
	chans, broadcast := p.env.resolver.Reach(f)
	p.reached[f] = reach{chans, broadcast}
	return chans, broadcast
}

// parse checks an ACL file the Document has read; the ACL is nil when
// there is any finding.
func parse(d *config.Document, root config.Node, e env) (*ACL, []config.Finding) {
	p := &parser{d: d, env: e, roles: map[string]*role{}, reached: map[string]reach{}}
	top, ok := d.Block(root)
	if !ok {
		return nil, d.Findings()
	}
	if top.Has("clients") {
		top.Get("clients")
		d.AddKey(top.KeyLine("clients"), "clients", "an ACL has no clients: block: the keys of users: are user names (the identity a client authenticates as), never client ids; to bind a user to client ids, give its entry client_ids:")
	}
	if v, has := top.Get("roles"); has {
		p.readRoles(v)
	}
	var entries []*entry
	if v, has := top.Get("users"); has {
		entries = p.readUsers(v)
	} else {
		d.AddKey(root.Line(), "users", "missing; users: gives roles to user names (with none, every client would be refused everything)")
	}
	top.Finish("roles", "users")
	exact, globs := p.index(entries)
	if d.HasFindings() {
		return nil, d.Findings()
	}
	return &ACL{
		path: d.Path(), roles: p.roles, entries: entries, exact: exact, globs: globs,
		channels: e.channels, resolver: e.resolver,
		brokerRate: e.limits.PublishRate, brokerBytes: e.limits.PublishBytes,
	}, nil
}

// readRoles reads roles: name -> list of rules.
func (p *parser) readRoles(v config.Node) {
	b, ok := p.d.Block(v)
	if !ok {
		return
	}
	for _, name := range b.Keys() {
		rv, _ := b.Get(name)
		if prob := roleNameProblem(name); prob != "" {
			p.d.AddKey(b.KeyLine(name), rv.Key(), "role name %q: %s", name, prob)
		}
		// Known even when its rules have findings, so that the users
		// naming it are not refused a second time.
		ro := &role{name: name}
		p.roles[name] = ro
		items, ok := p.d.Items(rv)
		if !ok {
			continue
		}
		for _, it := range items {
			if ru, ok := p.readRule(it); ok {
				ro.rules = append(ro.rules, ru)
			}
		}
	}
}

// roleNameProblem applies the rule the configuration's names follow:
// letters, digits, '-', '_' and '.'.
func roleNameProblem(name string) string {
	switch {
	case name == "":
		return "a role name is 1 to 128 bytes"
	case len(name) > maxRoleName:
		return "a role name is at most 128 bytes"
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return strconv.QuoteRune(c) + " is not allowed; a role name uses only letters a-z and A-Z, digits, -, _ and ."
		}
	}
	return ""
}

var ruleKeys = []string{"channel", "topic", "broker", "filter", "allow", "deny"}

// readRule reads one rule: its subject decides which keys it takes.
func (p *parser) readRule(v config.Node) (rule, bool) {
	d := p.d
	b, ok := d.Block(v)
	if !ok {
		return rule{}, false
	}
	var subjects []string
	for _, k := range []string{"channel", "topic", "broker"} {
		if b.Has(k) {
			subjects = append(subjects, k)
		}
	}
	switch len(subjects) {
	case 0:
		if onlyKnown(b, ruleKeys) {
			d.AddKey(v.Line(), v.Key(), "a rule names what it grants on: channel: <name>, topic: <filter> or broker: sessions (or features)")
		}
		b.Finish(ruleKeys...)
		return rule{}, false
	case 1:
	default:
		d.AddKey(v.Line(), v.Key(), "a rule has one subject, and this one names %s; write one rule for each", andList(subjects))
		b.Finish(ruleKeys...)
		return rule{}, false
	}
	ru := rule{line: v.Line()}
	switch subjects[0] {
	case "channel":
		ok = p.channelRule(v, b, &ru)
	case "topic":
		ok = p.topicRule(v, b, &ru)
	default:
		ok = p.brokerRule(v, b, &ru)
	}
	return ru, ok
}

// onlyKnown reports whether every key written in b is one of known.
func onlyKnown(b *config.Block, known []string) bool {
	for _, k := range b.Keys() {
		if !contains(known, k) {
			return false
		}
	}
	return true
}

// refuseDeny refuses deny: on a rule that is not broker: features.
func (p *parser) refuseDeny(b *config.Block) bool {
	dv, has := b.Get("deny")
	if has {
		p.d.Add(dv, "deny: is for broker: features only; rules only grant, and what no rule of the user's entry grants is refused already; remove it")
	}
	return !has
}

// channelRule reads a rule of kind 1: topics resolving to one channel,
// optionally narrowed by filter:.
func (p *parser) channelRule(v config.Node, b *config.Block, ru *rule) bool {
	d := p.d
	ru.kind = kindChannel
	cv, _ := b.Get("channel")
	name, good := d.Text(cv, "a channel name")
	var ch config.Channel
	known := false
	switch {
	case !good:
	case strings.Contains(name, "%"):
		d.Add(cv, "a channel is named as it is, never substituted: %%u and %%c are read in filter: only; name the channel and narrow it with filter: (like filter: \"<its filter with a level %%u>\")")
		good = false
	case p.env.channels != nil:
		ch, known = p.env.channels[name]
		if !known {
			hint := ""
			if s := config.Nearest(name, p.env.channelNames); s != "" {
				hint = "; did you mean " + s + "?"
			}
			d.Add(cv, "no channel of the configuration has this name%s (a topic no channel holds is broadcast: grant it with a topic: rule)", hint)
			good = false
		}
	}
	ru.channel = name
	good = p.refuseDeny(b) && good
	subject := "channel" // type unknown: any channel verb is taken
	if known {
		subject = ch.Type
	}
	verbs, ok := p.allow(v, b, subject)
	good = good && ok
	ru.verbs = verbs
	if fv, has := b.Get("filter"); has {
		written, filters, ok := p.filter(fv)
		good = good && ok
		ru.written, ru.filters = written, filters
		ru.usesUser, ru.usesClient = strings.Contains(written, "%u"), strings.Contains(written, "%c")
		if ok && known {
			good = p.narrows(fv, written, filters, ch) && good
		}
		if ok && verbs&wholeChannelVerbs != 0 {
			d.Add(fv, "a filter narrows the verbs asked per topic (write, read, delete), and %s acts on the whole channel (a seek moves the session's position in all of it; a worker is offered any job of its queue); put %s in a rule of its own without filter:",
				orList((verbs & wholeChannelVerbs).names()), orList((verbs & wholeChannelVerbs).names()))
			good = false
		}
	}
	b.Finish("channel", "filter", "allow")
	return good
}

// narrows checks that each expansion of a channel rule's filter matches
// some of the channel's topics, %u and %c read as literal text (docs/configuration.md "The ACL file"): one that matches none grants nothing and is a mistake.
func (p *parser) narrows(fv config.Node, written string, filters []string, ch config.Channel) bool {
	good := true
	for _, f := range filters {
		chans, _ := p.reach(f)
		if contains(chans, ch.Name) {
			continue
		}
		held := ""
		if len(chans) > 0 {
			held = "; the channel topics it matches are held by " + andList(chans)
		}
		p.d.Add(fv, "%smatches none of the topics of channel %s (filter %s), so it would grant nothing%s; write a filter inside the channel's",
			spelled(f, written, filters), ch.Name, ch.FilterAsWritten, held)
		good = false
	}
	return good
}

// spelled names the expansion at fault when the filter has several.
func spelled(f, written string, filters []string) string {
	if len(filters) > 1 || f != written {
		return "its expansion " + strconv.Quote(f) + " "
	}
	return ""
}

// topicRule reads a rule of kind 2: broadcast topics only.
func (p *parser) topicRule(v config.Node, b *config.Block, ru *rule) bool {
	d := p.d
	ru.kind = kindTopic
	tv, _ := b.Get("topic")
	written, filters, good := p.filter(tv)
	ru.written, ru.filters = written, filters
	ru.usesUser, ru.usesClient = strings.Contains(written, "%u"), strings.Contains(written, "%c")
	if good && p.env.channels != nil {
		good = p.reachesBroadcast(tv, written, filters)
	}
	if fv, has := b.Get("filter"); has {
		d.Add(fv, "a topic: rule is its own filter; filter: narrows channel rules only; remove it, or write the narrowing into topic:")
		good = false
	}
	good = p.refuseDeny(b) && good
	verbs, ok := p.allow(v, b, "topic")
	ru.verbs = verbs
	good = good && ok
	b.Finish("topic", "allow")
	return good
}

// reachesBroadcast refuses a topic: filter that no broadcast topic
// matches: one lying wholly inside channels' filters (docs/configuration.md "The ACL file"),
// which a topic: rule cannot grant on.
func (p *parser) reachesBroadcast(tv config.Node, written string, filters []string) bool {
	good := true
	for _, f := range filters {
		chans, broadcast := p.reach(f)
		if broadcast {
			continue
		}
		var where []string
		for _, name := range chans {
			c := p.env.channels[name]
			where = append(where, name+" (filter "+c.FilterAsWritten+", "+location(c.File, c.Line)+")")
		}
		fix := "a channel rule"
		if len(chans) == 1 {
			fix = "channel: " + chans[0] + " with filter: " + strconv.Quote(f)
		}
		p.d.Add(tv, "%slies wholly inside the filter of channel %s: a topic: rule grants on broadcast topics only, and it matches none; write it as %s",
			spelled(f, written, filters), andList(where), fix)
		good = false
	}
	return good
}

func location(file string, line int) string {
	if line == 0 {
		return file
	}
	return file + ":" + strconv.Itoa(line)
}

// brokerRule reads a rule of kind 3: broker: sessions or features.
func (p *parser) brokerRule(v config.Node, b *config.Block, ru *rule) bool {
	d := p.d
	bv, _ := b.Get("broker")
	what, good := d.Text(bv, "sessions or features")
	if fv, has := b.Get("filter"); has {
		d.Add(fv, "a broker: rule has no filter; remove it")
		good = false
	}
	switch {
	case !good:
	case what == "sessions":
		ru.kind = kindSessions
		good = p.refuseDeny(b)
		verbs, ok := p.allow(v, b, "sessions")
		ru.verbs, good = verbs, good && ok
	case what == "features":
		ru.kind = kindFeatures
		if av, has := b.Get("allow"); has {
			d.Add(av, "broker: features only denies: a feature is allowed unless a role of the user's entry denies it; write deny: [...] with the features to refuse")
			good = false
		}
		denies, ok := p.denies(v, b)
		ru.denies, good = denies, good && ok
	default:
		d.Add(bv, "it is sessions (allow: [disconnect]) or features (deny: [%s])", strings.Join(featureNames(), ", "))
		good = false
	}
	b.Finish("broker", "allow", "deny")
	return good
}

// allow reads allow:, the verbs subject takes (a channel type, "channel"
// for a channel of unknown type, "topic" or "sessions").
func (p *parser) allow(rv config.Node, b *config.Block, subject string) (verbSet, bool) {
	takes := verbsOf[subject]
	if subject == "channel" {
		takes = verbsOf["append"] | verbsOf["latest"] | verbsOf["queue"]
	}
	here := "(here " + strings.Join(takes.names(), ", ") + ")"
	set, ok := p.wordList(rv, b, "allow", "a verb",
		"a rule grants the verbs allow: lists "+here,
		"names no verb; list what the rule grants "+here+", or remove the rule",
		func(name string) (uint8, string) {
			v, known := verbNamed(name)
			switch {
			case !known:
				return 0, "unknown verb" + verbHint(name) + "; here the verbs are " + strings.Join(takes.names(), ", ")
			case takes&v == 0:
				return 0, wrongVerb(name, subject)
			}
			return uint8(v), ""
		})
	return verbSet(set), ok
}

// wordList reads a rule's list of words (allow: verbs, deny: features):
// written, not empty, each word one judge knows, listed once. judge gives
// a word's bit, or what is wrong with it.
func (p *parser) wordList(rv config.Node, b *config.Block, key, want, missing, empty string, judge func(string) (uint8, string)) (uint8, bool) {
	d := p.d
	lv, has := b.Get(key)
	if !has {
		d.AddKey(rv.Line(), rv.Key()+"."+key, "missing; %s", missing)
		return 0, false
	}
	items, ok := d.Items(lv)
	if !ok {
		return 0, false
	}
	if len(items) == 0 {
		d.Add(lv, "%s", empty)
		return 0, false
	}
	var set uint8
	good := true
	for _, it := range items {
		name, ok := d.Text(it, want)
		if !ok {
			good = false
			continue
		}
		bit, problem := judge(name)
		if problem == "" && set&bit != 0 {
			problem = "listed twice; keep one"
		}
		if problem != "" {
			d.Add(it, "%s", problem)
			good = false
		}
		set |= bit
	}
	return set, good
}

// verbHint maps the words other brokers' ACLs use to ours.
func verbHint(name string) string {
	switch strings.ToLower(name) {
	case "publish", "pub":
		return " (publishing is write)"
	case "subscribe", "sub", "readwrite":
		return " (receiving is read; a queue's jobs are consume)"
	}
	return ""
}

// denies reads a broker: features rule's deny: list.
func (p *parser) denies(rv config.Node, b *config.Block) (Feature, bool) {
	all := strings.Join(featureNames(), ", ")
	set, ok := p.wordList(rv, b, "deny", "a feature",
		"broker: features lists the features it refuses under deny: ("+all+")",
		"names no feature; list those to refuse ("+all+"), or remove the rule",
		func(name string) (uint8, string) {
			f, known := featureNamed(name)
			switch {
			case name == "retain":
				return 0, "the feature is spelled retained; write retained"
			case !known:
				return 0, "unknown feature; the features are " + all
			}
			return uint8(f), ""
		})
	return Feature(set), ok
}

// filter reads a rule's filter (channel rule filter:, or topic:): brace
// alternatives expanded first, then each expansion checked as an MQTT
// filter within broker.limits.max_topic_levels. %u and %c are left for
// For to substitute; here they are literal text, which a valid filter may
// hold within a level.
func (p *parser) filter(v config.Node) (written string, filters []string, ok bool) {
	d := p.d
	s, ok := d.Text(v, "an MQTT filter like sensors/%u/#")
	if !ok {
		return "", nil, false
	}
	if prob := placeholderProblem(s, "uc", "%u (the user name) and %c (the client id) are"); prob != "" {
		d.Add(v, "%s", prob)
		return s, nil, false
	}
	filters, err := topic.ExpandBraces(s)
	if err != nil {
		d.Add(v, "%v", err)
		return s, nil, false
	}
	// invariant 13: expansions count as values read; a braced rule used
	// through many aliases would otherwise multiply past the node bound.
	if !d.Spend(len(filters), v) {
		return s, nil, false
	}
	good := true
	for _, f := range filters {
		if err := topic.ValidFilter(f); err != nil {
			d.Add(v, "%s%v", spelled(f, s, filters), err)
			good = false
			continue
		}
		if n := topic.Levels(f); n > p.env.maxLevels {
			d.Add(v, "%sit has %d levels, more than broker.limits.max_topic_levels (%d), so no topic it could match is admitted; shorten it or raise the limit",
				spelled(f, s, filters), n, p.env.maxLevels)
			good = false
		}
	}
	return s, filters, good
}

// placeholderProblem refuses a '%' not followed by one of the letters
// allowed here: a mistyped %U or %user would otherwise be literal text
// granting on topics nobody uses.
func placeholderProblem(s, letters, allowed string) string {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+1 < len(s) && strings.IndexByte(letters, s[i+1]) >= 0 {
			i++
			continue
		}
		what := "a % at the end"
		if i+1 < len(s) {
			_, size := utf8.DecodeRuneInString(s[i+1:])
			what = strconv.Quote(s[i : i+1+size])
		}
		return what + " is not substituted: only " + allowed + "; a % of the topic's own cannot be written here"
	}
	return ""
}
