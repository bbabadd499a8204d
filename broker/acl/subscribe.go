package acl

import (
	"fmt"

	"saguin.dev/broker/topic"
)

// SubscribeRefusal is why the ACL refuses a subscription filter: the
// channel whose topics it reaches without a covering read grant, or
// broadcast ("" Channel) without a covering topic: rule.
type SubscribeRefusal struct {
	Filter  string
	Channel string // "" for broadcast topics
	// ChannelFilter is the channel's filter as written.
	ChannelFilter string
}

// maxShownFilter bounds how much of a client's filter a refusal repeats:
// the broker logs it, and a client's mistake is one bounded line.
const maxShownFilter = 120

func (e *SubscribeRefusal) Error() string {
	f := e.Filter
	if len(f) > maxShownFilter {
		f = f[:maxShownFilter] + "…"
	}
	if e.Channel == "" {
		return fmt.Sprintf("the filter %q reaches broadcast topics and no topic: rule granting read covers it", f)
	}
	return fmt.Sprintf("the filter %q reaches channel %s (%s) and no rule grants read on all it reaches there", f, e.Channel, e.ChannelFilter)
}

// CheckSubscribe answers a SUBSCRIBE filter (its $share/<group>/ prefix
// taken off; the structural refusals — $saguin/ forms, a filter inside a
// queue — are the broker's, asked first). It returns nil when allowed,
// else a *SubscribeRefusal.
//
// docs/configuration.md "The ACL file": a filter needs a grant on every channel it touches and,
// when it may match broadcast topics, a topic: rule covering it. Covering
// is decided so that no delivery on a granted subscription is refused for
// a reason known now: a refused record stalls an append consumer for
// good. So, conservatively (rfcs/acl.md "Subscriptions"):
//   - on each append or latest channel the filter reaches, read on the
//     whole channel, or one read rule whose (substituted) filter holds all
//     of the filter's intersection with one of the channel's filters, for
//     each of them it meets;
//   - a queue it merely crosses needs nothing: a plain filter is never
//     served queue records;
//   - if it may match a broadcast topic, one topic: read filter holding
//     the whole subscription filter.
func (g *Grants) CheckSubscribe(filter string) error {
	a := g.acl
	chans, broadcast := a.resolver.Reach(filter)
	for _, name := range chans {
		ch := a.channels[name]
		if ch.Type == "queue" || g.onChannel(name, verbRead) {
			continue
		}
		for _, cf := range ch.Filters {
			part, meets := topic.Intersect(filter, cf)
			if meets && !g.narrowedHolds(name, part) {
				return &SubscribeRefusal{Filter: filter, Channel: name, ChannelFilter: ch.FilterAsWritten}
			}
		}
	}
	if broadcast && !holdsAll(g.broadcastRead, filter) {
		return &SubscribeRefusal{Filter: filter}
	}
	return nil
}

// narrowedHolds reports whether one narrowing read filter of the channel
// holds every topic part matches.
func (g *Grants) narrowedHolds(channel, part string) bool {
	cg := g.channels[channel]
	if cg == nil {
		return false
	}
	for _, n := range cg.narrowed {
		if n.verbs&verbRead != 0 && topic.Inside(part, n.filter) {
			return true
		}
	}
	return false
}

func holdsAll(filters []string, inner string) bool {
	for _, f := range filters {
		if topic.Inside(inner, f) {
			return true
		}
	}
	return false
}
