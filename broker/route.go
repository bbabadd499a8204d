package broker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/bridge"
	"saguin.dev/broker/config"
	"saguin.dev/broker/topic"
)

// routing is what the configuration alone decides about topics and
// filters: which channel a topic lands in (invariant 12, the resolver) and
// what a subscription filter is granted and served (docs/configuration.md "`channels`"; docs/security.md "Every refusal, and its code").
// The broker asks it for every SUBSCRIBE and every session it restores;
// saguin --route asks it with no broker running (Route), so an operator's
// "where does this go" is answered by the code that decides it.
type routing struct {
	cfg      *config.Config
	resolver *topic.Resolver
}

func newRouting(cfg *config.Config) routing {
	return routing{cfg: cfg, resolver: cfg.Resolver()}
}

// channel returns the named channel's configuration.
func (r routing) channel(name string) (config.Channel, bool) { return r.cfg.Channel(name) }

// isQueue: a configured queue (never its dead-letter channel, an append
// channel).
func (r routing) isQueue(name string) bool {
	ch, ok := r.channel(name)
	return ok && ch.Type == "queue"
}

// filterCode decides one filter: the granted QoS, or the refusal docs/security.md "Every refusal, and its code" names for it and why.
func (r routing) filterCode(f packets.Subscription, v5 bool) (byte, string) {
	filter := f.Filter
	lim := r.cfg.Broker.Limits
	inner := filter
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		group, in, ok := strings.Cut(rest, "/")
		if !ok || group == "" || strings.ContainsAny(group, "+#") || in == "" ||
			strings.HasPrefix(strings.ToLower(in), "$share/") {
			return subackFilterInvalid, "a shared subscription is $share/<group>/<filter>, the group named without wildcards"
		}
		if !v5 {
			return subackFilterInvalid, "shared subscriptions need MQTT 5"
		}
		inner = in
	} else if strings.HasPrefix(strings.ToLower(filter), "$share/") {
		return subackFilterInvalid, "$share is written in lower case"
	}
	if err := topic.ValidFilter(inner); err != nil {
		return subackFilterInvalid, err.Error()
	}
	if n := strings.Count(inner, "/") + 1; n > lim.MaxTopicLevels {
		return subackFilterInvalid, fmt.Sprintf("filter has %d levels; limits.max_topic_levels is %d", n, lim.MaxTopicLevels)
	}
	if inner == "$SYS" || strings.HasPrefix(inner, "$SYS/") {
		// $SYS exactly: topics are case-sensitive (MQTT 5 §4.7.3), and
		// $SYSTEM/x or $sys/x are ordinary, as they are to publish.
		return subackNotAuthorized, "$SYS is the broker's"
	}
	if strings.HasPrefix(inner, "$saguin/") {
		if inner != filter {
			return subackNotAuthorized, "$saguin/ subscriptions cannot be shared"
		}
		if name, ok := strings.CutPrefix(inner, "$saguin/queue/"); ok {
			return r.queueFormCode(f, name, v5)
		}
		if name, ok := seekReplyChannel(inner); ok {
			if ch, ok := r.channel(name); ok && ch.Type == "append" {
				return min(f.Qos, 2), ""
			}
			return subackNotAuthorized, fmt.Sprintf("%s is not an append channel, which seek replies come from", name)
		}
		return subackNotAuthorized, "no such $saguin/ subscription: the forms are $saguin/queue/<queue> and $saguin/consumer/<channel>/seek/reply"
	}
	if q, inside := r.insideQueue(inner); inside {
		return subackFilterInvalid, fmt.Sprintf("the filter lies inside queue %s; a queue is consumed by subscribing to $saguin/queue/%s", q, q)
	}
	return min(f.Qos, 2), ""
}

// insideQueue names the queue a filter lies wholly inside of.
//
// invariant 11: a filter lying wholly inside a queue's filter, and reaching
// that queue, would be granted and then served none of what it asked for:
// refused, naming the one form that consumes a queue. (A filter inside the
// queue's filter that reaches only its dead-letter channel, jobs/__dlq/#, is
// an ordinary append subscription.)
func (r routing) insideQueue(filter string) (string, bool) {
	for _, name := range r.resolver.Reaching(filter) {
		ch, _ := r.channel(name)
		if ch.Type != "queue" {
			continue
		}
		for _, qf := range ch.Filters {
			if topic.Inside(filter, qf) {
				return name, true
			}
		}
	}
	return "", false
}

// queueFormCode decides a subscription to $saguin/queue/<name>: the one form
// that consumes a queue (invariant 4). The last level is compared as a name,
// not as a filter, so no wildcard or deeper form can stand in for it.
func (r routing) queueFormCode(f packets.Subscription, name string, v5 bool) (byte, string) {
	// invariant 4: the one form that consumes a queue; its name is compared whole, never matched as a filter.
	if !r.isQueue(name) {
		return subackFilterInvalid, fmt.Sprintf("%s is not a queue", name) // a __dlq name included
	}
	if !v5 {
		// A worker needs Correlation Data and a Response Topic to answer.
		return subackFilterInvalid, "a queue worker needs MQTT 5: it answers with Correlation Data and a Response Topic"
	}
	if f.NoLocal {
		// A job withheld from the one worker that published it would never
		// move again (docs/channels.md "`queue`").
		return subackFilterInvalid, "a queue is consumed without No Local"
	}
	if f.Qos == 0 {
		return subackImplementation, "a queue is consumed at QoS 1: a job is leased at its PUBACK" // a job needs a PUBACK to lease
	}
	return 1, "" // QoS 2 is granted as 1
}

func seekReplyChannel(filter string) (string, bool) {
	rest, ok := strings.CutPrefix(filter, "$saguin/consumer/")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "/seek/reply")
	if !ok || strings.ContainsAny(name, "/+#") {
		return "", false
	}
	return name, true
}

// RouteRow is one line of saguin --route (docs/operations.md "The command line"): where a topic
// lands, or how a subscription filter is served by one channel (or by
// broadcast). Channel and Type are "" where nothing applies (printed "-").
type RouteRow struct {
	Subject string // the topic or filter asked about
	Channel string // "" for broadcast, or for nothing reached
	Type    string // append, latest, queue, broadcast; "" when nothing is reached
	// Why: for a topic, the channel filter that claims it ("" for
	// broadcast); for a filter, how the channel serves it — replayed (an
	// append channel, from the stored position), current (a latest
	// channel's current values first), excluded (a queue it crosses: its
	// records are not served), live-shared (a $share/ group: only what is
	// published after it began), live (broadcast), worker (the queue form),
	// seek-reply, or refused-0xNN with the code a SUBSCRIBE gets.
	Why string
	// Reason says why a refusal is refused.
	Reason string
}

// isFilter: the subject is read as a subscription filter rather than a
// topic when it could only be one (a wildcard, a $share/ or $saguin/queue/
// form, a seek reply).
func isFilter(s string) bool {
	return strings.ContainsAny(s, "+#") || strings.HasPrefix(s, "$share/") ||
		strings.HasPrefix(s, "$saguin/queue/") || strings.HasSuffix(s, "/seek/reply")
}

// Route answers saguin --route for one topic or filter, from the
// configuration alone: the rows a SUBSCRIBE of it (or a PUBLISH to it)
// would meet, decided by the same code the broker runs.
func Route(cfg *config.Config, subject string) []RouteRow {
	r := newRouting(cfg)
	if !isFilter(subject) {
		return append([]RouteRow{r.topicRow(subject)}, r.bridgeRows(cfg.Bridges, subject)...)
	}
	return r.filterRows(subject)
}

// bridgeRows are how a topic published at a bridge's peer crosses to us:
// for each bridge, the first in rule whose filter matches it (rules are
// tried in written order, docs/bridge.md "What crosses, inbound"), the name
// it takes here and where that name lands. Why says which bridge and rule;
// a name that cannot be made is refused-unmappable.
func (r routing) bridgeRows(bridges []config.Bridge, t string) []RouteRow {
	var rows []RouteRow
	for _, b := range bridges {
		for _, rule := range b.Rules {
			if rule.Direction == bridge.Out {
				continue
			}
			mapped, ok, err := rule.Map(t)
			if !ok {
				continue
			}
			why := fmt.Sprintf("from bridge %s, rule %d (%s -> %s)", b.Name, rule.Index, rule.Filter, rule.Template)
			if err != nil {
				rows = append(rows, RouteRow{Subject: t, Why: "refused-unmappable", Reason: why + ": " + err.Error()})
				break
			}
			row := r.topicRow(mapped)
			row.Subject = t
			row.Why = why + " as " + mapped
			if row.Reason == "" && row.Type == "broadcast" {
				row.Reason = "no channel claims " + mapped + ": acknowledged to the peer once handed to the broadcast fan-out"
			}
			rows = append(rows, row)
			break
		}
	}
	return rows
}

func (r routing) topicRow(t string) RouteRow {
	row := RouteRow{Subject: t}
	if err := topic.ValidTopic(t); err != nil {
		row.Why, row.Reason = "refused-0x90", err.Error()
		return row
	}
	name, ok := r.resolver.Resolve(t)
	if !ok {
		row.Type = "broadcast"
		return row
	}
	ch, _ := r.channel(name)
	row.Channel, row.Type = name, ch.Type
	for _, f := range ch.Filters {
		// The most exact of the channel's filters that matches: the one
		// the resolver chose among all channels' filters.
		if topic.Match(f, t) && (row.Why == "" || topic.MoreExact(f, row.Why)) {
			row.Why = f
		}
	}
	return row
}

func (r routing) filterRows(filter string) []RouteRow {
	// The form a SUBSCRIBE would be judged by: MQTT 5, QoS 1, no No Local
	// (a queue form's QoS 0 and No Local refusals are about the packet,
	// not the filter).
	code, why := r.filterCode(packets.Subscription{Filter: filter, Qos: 1}, true)
	if code >= 0x80 {
		return []RouteRow{{Subject: filter, Why: fmt.Sprintf("refused-0x%02X", code), Reason: why}}
	}
	if name, ok := strings.CutPrefix(filter, "$saguin/queue/"); ok {
		return []RouteRow{{Subject: filter, Channel: name, Type: "queue", Why: "worker"}}
	}
	if name, ok := seekReplyChannel(filter); ok {
		return []RouteRow{{Subject: filter, Channel: name, Type: "append", Why: "seek-reply"}}
	}
	inner, shared := filter, false
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		_, inner, _ = strings.Cut(rest, "/")
		shared = true
	}
	chans, broadcast := r.resolver.Reach(inner)
	var rows []RouteRow
	for _, name := range chans {
		ch, _ := r.channel(name)
		row := RouteRow{Subject: filter, Channel: name, Type: ch.Type}
		switch {
		case ch.Type == "queue":
			row.Why = "excluded"
		case shared:
			row.Why = "live-shared"
		case ch.Type == "latest":
			row.Why = "current"
		default:
			row.Why = "replayed"
		}
		rows = append(rows, row)
	}
	if broadcast {
		why := "live"
		if shared {
			why = "live-shared"
		}
		rows = append(rows, RouteRow{Subject: filter, Type: "broadcast", Why: why})
	}
	if len(rows) == 0 {
		rows = append(rows, RouteRow{Subject: filter})
	}
	return rows
}

// RoutingTable lists every channel filter, most exact first: the order in
// which they claim topics (docs/configuration.md "`channels`").
func RoutingTable(cfg *config.Config) []RouteRow {
	var rows []RouteRow
	for _, ch := range cfg.Channels {
		for _, f := range ch.Filters {
			rows = append(rows, RouteRow{Subject: f, Channel: ch.Name, Type: ch.Type})
		}
	}
	slices.SortStableFunc(rows, func(a, b RouteRow) int {
		switch {
		case topic.MoreExact(a.Subject, b.Subject):
			return -1
		case topic.MoreExact(b.Subject, a.Subject):
			return 1
		}
		return strings.Compare(a.Subject, b.Subject)
	})
	return rows
}
