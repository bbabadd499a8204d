package acl

import (
	"strconv"
	"strings"

	"saguin.dev/broker/topic"
)

// Grants is what one connection may do: the union of the roles of the one
// users: entry that applies to its user name, with %u and %c substituted
// for its user name and client id. For builds it once per connection (and
// again after a reload); it is immutable and safe for concurrent use, and
// its per-topic questions do not allocate.
type Grants struct {
	acl      *ACL
	user     string
	clientID string
	entry    *entry // nil: no pattern matches the name; nothing is granted

	clientIDAllowed bool
	denied          Feature
	disconnect      bool
	limits          PublishLimits
	// channels holds the grants on each channel a rule names.
	channels map[string]*channelGrants
	// broadcastRead and broadcastWrite are the topic: rules' filters,
	// substituted, by verb.
	broadcastRead, broadcastWrite []string
	withheld                      []WithheldGrant
}

// channelGrants is one channel's table: the verbs granted on all of it,
// and the filters narrowing the others, each with its verbs.
type channelGrants struct {
	whole    verbSet
	narrowed []narrowGrant
	any      verbSet // every verb granted on some topic of the channel
}

type narrowGrant struct {
	filter string
	verbs  verbSet
}

// PublishLimits are the publish figures that apply to a connection
// (docs/configuration.md "`broker.limits`"): those of the applying entry's limits: where it writes
// them, broker.limits' otherwise. Zero means no bound.
type PublishLimits struct {
	Rate  int   // messages per second
	Bytes int64 // bytes per second
	// FromEntry reports that the applying entry has limits: (some figure
	// may still be broker.limits', where the entry leaves it out).
	FromEntry bool
}

// For compiles the grants of a connection authenticated as user (the
// password user, or the certificate or proxied name; "" for an anonymous
// client) with clientID. It is computed once per connection, at CONNECT.
func (a *ACL) For(user, clientID string) *Grants {
	return a.grants(user, clientID, true)
}

// applying returns the entry deciding for name (docs/configuration.md "The ACL file"): a name
// written out, else the most exact pattern matching it; nil when none does.
func (a *ACL) applying(name string) *entry {
	if e, ok := a.exact[name]; ok {
		return e
	}
	for _, e := range a.globs {
		if globMatch(e.pattern, name) {
			return e
		}
	}
	return nil
}

// grants compiles the Grants; without a client id (--acl asked for a
// user alone) %c is left as written and client_ids are not judged.
func (a *ACL) grants(user, clientID string, withClientID bool) *Grants {
	g := &Grants{acl: a, user: user, clientID: clientID, clientIDAllowed: true,
		limits: PublishLimits{Rate: a.brokerRate, Bytes: a.brokerBytes}}
	e := a.applying(user)
	g.entry = e
	if e == nil {
		return g
	}
	if withClientID {
		g.clientIDAllowed = e.admits(user, clientID)
	}
	if e.limits.set {
		g.limits.FromEntry = true
		if e.limits.rateSet {
			g.limits.Rate = e.limits.rate
		}
		if e.limits.bytesSet {
			g.limits.Bytes = e.limits.bytes
		}
	}
	a.eachRule(e, user, clientID, withClientID, func(ro *role, ru *rule, filters []string, withheld string) {
		if withheld != "" {
			shown := a.describe(ro, ru, "%u", "%c", true) // as written

			g.withheld = append(g.withheld, WithheldGrant{Grant: shown, Reason: withheld})
			return
		}
		g.add(ru, filters)
	})
	return g
}

// eachRule calls fn with every rule of e's roles and its filters
// substituted, or the reason the rule grants nothing for this identity.
// For and Explain both read the rules through it, so what --acl shows is
// what the broker enforces.
func (a *ACL) eachRule(e *entry, user, clientID string, withClientID bool, fn func(*role, *rule, []string, string)) {
	for _, name := range e.roles {
		ro := a.roles[name]
		for i := range ro.rules {
			ru := &ro.rules[i]
			if why := ru.withholds(user, clientID, withClientID); why != "" {
				fn(ro, ru, nil, why)
				continue
			}
			filters := ru.filters
			if ru.usesUser || (ru.usesClient && withClientID) {
				filters = make([]string, len(ru.filters))
				for k, f := range ru.filters {
					filters[k] = substitute(f, user, clientID, withClientID)
				}
			}
			fn(ro, ru, filters, "")
		}
	}
}

// withholds says why the rule grants nothing for this identity (docs/configuration.md "The ACL file"): the value %u or %c stands for holds '+', '#' or '/', which would
// widen the filter beyond the one name; or it is empty (an anonymous
// client has no name to be narrowed to; rfcs/acl.md). "" when it grants.
func (ru *rule) withholds(user, clientID string, withClientID bool) string {
	if ru.usesUser {
		if why := unfit(user); why != "" {
			return "%u is the user name, which " + why
		}
	}
	if ru.usesClient && withClientID {
		if why := unfit(clientID); why != "" {
			return "%c is the client id, which " + why
		}
	}
	return ""
}

func unfit(v string) string {
	if v == "" {
		return "is empty"
	}
	if i := strings.IndexAny(v, "+#/"); i >= 0 {
		return "holds " + strconv.Quote(v[i:i+1])
	}
	if strings.IndexByte(v, 0) >= 0 || len(v) > topic.MaxLength {
		return "cannot be part of a topic"
	}
	return ""
}

// substitute replaces %u and %c in one pass: a %u inside the user name is
// not replaced again. Without a client id, %c is left as written.
func substitute(f, user, clientID string, withClientID bool) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] == '%' && i+1 < len(f) {
			switch {
			case f[i+1] == 'u':
				b.WriteString(user)
				i++
				continue
			case f[i+1] == 'c' && withClientID:
				b.WriteString(clientID)
				i++
				continue
			}
		}
		b.WriteByte(f[i])
	}
	return b.String()
}

// admits reports whether clientID may use this entry's user name: any id
// when the entry has no client_ids:, else one matching a pattern with %u
// substituted. A user name holding '*' is never substituted: it would
// make a pattern of itself (docs/configuration.md "The ACL file"), so a pattern with %u admits
// nothing for it.
func (e *entry) admits(user, clientID string) bool {
	if e.clientIDs == nil {
		return true
	}
	for _, p := range e.clientIDs {
		if strings.Contains(p, "%u") {
			if strings.Contains(user, "*") {
				continue
			}
			p = substitute(p, user, "", false)
		}
		if globMatch(p, clientID) {
			return true
		}
	}
	return false
}

// add merges one rule's grant into the tables.
func (g *Grants) add(ru *rule, filters []string) {
	switch ru.kind {
	case kindFeatures:
		g.denied |= ru.denies
	case kindSessions:
		g.disconnect = g.disconnect || ru.verbs&verbDisconnect != 0
	case kindTopic:
		for _, f := range filters {
			if ru.verbs&verbRead != 0 {
				g.broadcastRead = append(g.broadcastRead, f)
			}
			if ru.verbs&verbWrite != 0 {
				g.broadcastWrite = append(g.broadcastWrite, f)
			}
		}
	case kindChannel:
		if g.channels == nil {
			g.channels = map[string]*channelGrants{}
		}
		cg := g.channels[ru.channel]
		if cg == nil {
			cg = &channelGrants{}
			g.channels[ru.channel] = cg
		}
		cg.any |= ru.verbs
		if ru.filters == nil {
			cg.whole |= ru.verbs
			return
		}
		for _, f := range filters {
			cg.narrowed = append(cg.narrowed, narrowGrant{filter: f, verbs: ru.verbs})
		}
	}
}

// User is the identity the grants were compiled for.
func (g *Grants) User() string { return g.user }

// Pattern is the users: key that applies, and false when none matches
// the user name (the connection is granted nothing).
func (g *Grants) Pattern() (string, bool) {
	if g.entry == nil {
		return "", false
	}
	return g.entry.pattern, true
}

// ClientIDAllowed reports whether the applying entry's client_ids: admit
// the client id (always, when it has none or no entry applies); when not,
// the broker refuses the CONNECT (0x86).
func (g *Grants) ClientIDAllowed() bool { return g.clientIDAllowed }

// Denies reports whether a role of the entry denies the feature; with
// several features in f, whether it denies any of them.
func (g *Grants) Denies(f Feature) bool { return g.denied&f != 0 }

// PublishLimits are the publish figures for this connection.
func (g *Grants) PublishLimits() PublishLimits { return g.limits }

// MayDisconnect reports broker: sessions allow: [disconnect]: the client
// may hang up others through $saguin/sessions/disconnect.
func (g *Grants) MayDisconnect() bool { return g.disconnect }

// Withheld lists the rules that grant nothing to this identity because
// %u or %c would substitute a value that does not fit (docs/configuration.md "The ACL file");
// the broker logs them once, at connect.
func (g *Grants) Withheld() []WithheldGrant { return g.withheld }

// MayWrite reports whether the client may publish to topic, which the
// resolver put in channel ("" for a broadcast topic). A latest channel's
// delete (a zero-length publish) is MayDelete's, not this.
func (g *Grants) MayWrite(topicName, channel string) bool {
	if channel == "" {
		return matchesAny(g.broadcastWrite, topicName)
	}
	return g.onTopic(channel, topicName, verbWrite)
}

// MayDelete reports whether the client may delete topic's value on a
// latest channel (a zero-length publish). write alone does not delete
// (rfcs/acl.md).
func (g *Grants) MayDelete(topicName, channel string) bool {
	return g.onTopic(channel, topicName, verbDelete)
}

// MayRead reports whether topic, held by channel ("" for broadcast), may
// be delivered to the client: asked on every delivery, so that a reload
// reaches live subscriptions; also a point read's key on a latest
// channel. It does not allocate, and costs one map lookup and a match per
// narrowing filter of that channel (or per topic: read filter).
func (g *Grants) MayRead(topicName, channel string) bool {
	if channel == "" {
		return matchesAny(g.broadcastRead, topicName)
	}
	return g.onTopic(channel, topicName, verbRead)
}

// MaySeek reports whether the client may move its position in the append
// channel ($saguin/consumer/<channel>/seek).
func (g *Grants) MaySeek(channel string) bool { return g.onChannel(channel, verbSeek) }

// MayConsume reports whether the client may work the queue: subscribe
// $saguin/queue/<queue>, answer on its response topic, and be offered
// its jobs (a job offered to a worker that may no longer consume goes
// back with its attempt unspent, the broker's part).
func (g *Grants) MayConsume(queue string) bool { return g.onChannel(queue, verbConsume) }

// Verbs lists the client's verbs on channel, those granted on some of its
// topics included, in the file format's order: what $saguin/catalogue/
// <channel> answers with. Never nil.
func (g *Grants) Verbs(channel string) []string {
	if cg := g.channels[channel]; cg != nil {
		return cg.any.names()
	}
	return []string{}
}

func (g *Grants) onChannel(channel string, v verbSet) bool {
	cg := g.channels[channel]
	return cg != nil && cg.whole&v != 0
}

func (g *Grants) onTopic(channel, topicName string, v verbSet) bool {
	cg := g.channels[channel]
	if cg == nil {
		return false
	}
	if cg.whole&v != 0 {
		return true
	}
	for i := range cg.narrowed {
		if n := &cg.narrowed[i]; n.verbs&v != 0 && topic.Match(n.filter, topicName) {
			return true
		}
	}
	return false
}

func matchesAny(filters []string, topicName string) bool {
	for _, f := range filters {
		if topic.Match(f, topicName) {
			return true
		}
	}
	return false
}
