package config

import (
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"saguin.dev/broker/topic"
)

// Channel constants (docs/configuration.md "`broker.limits`" "Fixed", §1.7).
const (
	MaxChannelName                  = 128
	DeadLetterSuffix                = "__dlq"
	DefaultDeletionRetentionPeriod  = Day
	DefaultVisibilityTimeout        = 30 * time.Second
	DefaultMaxAttempts              = 5
	snapshotSuffix                  = ".snapshot"
	maxFileName                     = 255
	maxQueueName                    = MaxChannelName - len(DeadLetterSuffix)
	channelTypeHint                 = "append keeps every record in order, latest keeps the current value per topic, queue hands each job to one worker"
	queueNoRetention                = "a queue takes no retention: a record leaves when a worker resolves it, and unresolved work is never deleted for age or size (invariant 2); remove it"
	defaultFilterTemplate           = "%s/#"
	deletionRetentionOnlyLatestHint = "only a latest channel keeps deletion tombstones; remove it"
)

var channelKeys = map[string][]string{
	"append": {"type", "filter", "storage", "retention_period", "retention_bytes", "max_bytes", "start"},
	"latest": {"type", "filter", "storage", "retention_period", "deletion_retention_period"},
	"queue":  {"type", "filter", "storage", "max_bytes", "visibility_timeout", "job_expires_after", "retry", "dlq_retention_period", "dlq_retention_bytes"},
}

var allChannelKeys = []string{"type", "filter", "storage", "retention_period", "retention_bytes", "max_bytes", "start",
	"deletion_retention_period", "visibility_timeout", "job_expires_after", "retry", "dlq_retention_period", "dlq_retention_bytes"}

// wrongType explains, per key, why a channel type refuses it (docs/configuration.md "`channels`").
func wrongType(key, typ string) string {
	switch key {
	case "retention_period", "retention_bytes":
		if typ == "queue" {
			return queueNoRetention + " (dlq_" + key + " sets the dead-letter channel's)"
		}
		return "a latest channel keeps one value per topic and takes no retention_bytes; its values count against the provider's max_bytes, and retention_period expires quiet topics"
	case "max_bytes":
		return "a latest channel has no max_bytes of its own; its values count against its provider's max_bytes"
	case "start":
		return "start is where a reader of an append channel begins; a latest reader is given the current values and a queue worker the next job; remove it"
	case "deletion_retention_period":
		return deletionRetentionOnlyLatestHint
	case "visibility_timeout", "job_expires_after", "retry":
		return fmt.Sprintf("%s is a queue setting and this channel is %s; remove it, or make the channel type: queue", key, typ)
	case "dlq_retention_period", "dlq_retention_bytes":
		return fmt.Sprintf("only a queue has a dead-letter channel, and this channel is %s; remove it", typ)
	}
	return "not a " + typ + " channel key"
}

// nameProblem checks a channel, provider or door name: letters, digits,
// '-', '_' and '.', 1..max bytes, not "." or "..".
func nameProblem(name string, maxLen int) string {
	switch {
	case name == "":
		return fmt.Sprintf("a name is 1 to %d bytes", maxLen)
	case len(name) > maxLen:
		return fmt.Sprintf("the name is %d bytes; a name is at most %d", len(name), maxLen)
	case name == "." || name == "..":
		return "a name is not . or .."
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Sprintf("%q is not allowed; a name uses only letters a-z and A-Z, digits, -, _ and .", c)
		}
	}
	return ""
}

// channelNameProblem adds the channel-only rules to nameProblem.
func channelNameProblem(name, typ string) string {
	if prob := nameProblem(name, MaxChannelName); prob != "" {
		return prob
	}
	if strings.HasSuffix(name, DeadLetterSuffix) {
		return "a name ending in __dlq is reserved for the dead-letter channel every queue derives; choose another name"
	}
	// rfcs/storage-memory.md: the snapshot file name percent-encodes every dot (three
	// bytes each) and must fit a file name.
	if n := len(name) + 2*strings.Count(name, ".") + len(snapshotSuffix); n > maxFileName {
		return fmt.Sprintf("its snapshot file name would be %d bytes (each . is written %%2E), more than the %d a file name holds; shorten it or use fewer dots", n, maxFileName)
	}
	if typ == "queue" && len(name) > maxQueueName {
		return fmt.Sprintf("a queue name is at most %d bytes, so that its dead-letter channel %s__dlq fits the %d-byte limit", maxQueueName, "<name>", MaxChannelName)
	}
	return ""
}

// channels reads channels: (docs/configuration.md "`channels`"; docs/configuration.md "How values are written").
func (l *loader) channels(v val, p *parsed) []Channel {
	var out []Channel
	seen := map[string]Channel{}
	for _, g := range l.groups(v, "channel") {
		key := "channels." + g.name
		if prev, dup := seen[g.name]; dup {
			l.addKey(g.v.file, g.keyLine, key, "channel %s is defined twice: %s and %s; a name is one channel", g.name, where(prev.File, prev.Line), where(g.v.file, g.keyLine))
			continue
		}
		c, ok := l.channel(g, p)
		seen[g.name] = c
		if ok {
			out = append(out, c)
		}
	}
	return out
}

func (l *loader) channel(g group, p *parsed) (Channel, bool) {
	key := "channels." + g.name
	v := g.v
	v.key = key
	c := Channel{Name: g.name, File: v.file, Line: g.keyLine}
	m, ok := l.mapOf(v)
	if !ok {
		return c, false
	}
	good := true
	tv, has := m.get("type")
	if !has {
		m.missing("type", "write type: append, latest or queue (%s)", channelTypeHint)
		good = false
	} else if t, ok := l.enum(tv, []string{"append", "latest", "queue"}, channelTypeHint+"; broadcast is what no channel claims and is never configured"); ok {
		c.Type = t
	} else {
		good = false
	}
	if prob := channelNameProblem(g.name, c.Type); prob != "" {
		l.addKey(v.file, g.keyLine, key, "channel name %q: %s", g.name, prob)
		good = false
	}

	// Keys this type refuses, each with its reason; unknown keys after.
	if c.Type != "" {
		allowed := map[string]bool{}
		for _, k := range channelKeys[c.Type] {
			allowed[k] = true
		}
		for _, k := range allChannelKeys {
			if !allowed[k] {
				if m.has(k) {
					good = false
				}
				m.refuse(k, "%s", wrongType(k, c.Type))
			}
		}
	}

	c.FilterAsWritten = fmt.Sprintf(defaultFilterTemplate, g.name)
	if fv, has := m.get("filter"); has {
		if s, ok := l.str(fv, "an MQTT filter like sensors/+/temperature"); ok {
			c.FilterAsWritten = s
			l.filterAt[g.name] = fv
			if c.Filters, ok = l.channelFilters(fv, s, c.Type, p); !ok {
				good = false
			}
		} else {
			good = false
		}
	} else if good {
		// docs/configuration.md: no filter means <name>/#.
		def := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: c.FilterAsWritten, Line: g.keyLine}
		c.Filters, good = l.channelFilters(val{n: def, file: v.file, key: key + ".filter (default)"}, c.FilterAsWritten, c.Type, p)
	}

	c.Storage = p.DefaultProvider
	if sv, has := m.get("storage"); has {
		if s, ok := l.providerRef(sv, p); ok {
			c.Storage = s
		} else {
			good = false
		}
	}
	p.named[c.Storage] = true

	retention := func(k string, dst *time.Duration, def time.Duration) {
		*dst = def
		if rv, has := m.get(k); has {
			d, none, ok := l.duration(rv, durKey{none: true, zeroFix: zeroRetention})
			switch {
			case !ok:
				good = false
			case none:
				*dst = 0
			default:
				*dst = d
			}
		}
	}
	bytesKey := func(k string, dst *int64, def int64, zeroFix string, none bool) {
		*dst = def
		if rv, has := m.get(k); has {
			n, isNone, ok := l.size(rv, sizeKey{none: none, zeroFix: zeroFix})
			switch {
			case !ok:
				good = false
			case isNone:
				*dst = 0
			default:
				*dst = n
			}
		}
	}
	const zeroMax = "a channel bounded at zero bytes refuses every publish; write a size like 64MiB, or omit the key for no bound"
	switch c.Type {
	case "append":
		retention("retention_period", &c.RetentionPeriod, p.DefaultRetentionPeriod)
		bytesKey("retention_bytes", &c.RetentionBytes, p.DefaultRetentionBytes, zeroRetention, true)
		bytesKey("max_bytes", &c.MaxBytes, 0, zeroMax, true)
		if sv, has := m.get("start"); has {
			if s, ok := l.enum(sv, []string{"floor", "tail"}, "floor (the default) starts a new reader at the oldest record kept, tail at the next one published"); ok {
				c.StartTail = s == "tail"
			} else {
				good = false
			}
		}
	case "latest":
		retention("retention_period", &c.RetentionPeriod, p.DefaultRetentionPeriod)
		retention("deletion_retention_period", &c.DeletionRetentionPeriod, DefaultDeletionRetentionPeriod)
	case "queue":
		bytesKey("max_bytes", &c.MaxBytes, 0, zeroMax, true)
		if !l.queueSettings(m, &c) {
			good = false
		}
		// Copied onto <name>__dlq when it is derived (docs/channels.md "The dead-letter channel").
		var r dlqRetention
		r.periodSet, r.bytesSet = m.has("dlq_retention_period"), m.has("dlq_retention_bytes")
		retention("dlq_retention_period", &r.period, 0)
		bytesKey("dlq_retention_bytes", &r.bytes, 0, zeroRetention, true)
		l.dlqRetention[c.Name] = r
	}
	if c.Type != "" {
		m.finish(channelKeys[c.Type]...)
	} else {
		m.finish(allChannelKeys...)
	}
	return c, good
}

// dlqRetention is what a queue says about its dead-letter channel's retention.
type dlqRetention struct {
	period              time.Duration
	bytes               int64
	periodSet, bytesSet bool
}

// queueSettings reads the queue-only keys.
func (l *loader) queueSettings(m *mapping, c *Channel) bool {
	good := true
	c.VisibilityTimeout, c.MaxAttempts, c.Backoff = DefaultVisibilityTimeout, DefaultMaxAttempts, "none"
	visV, visSet := m.get("visibility_timeout")
	if visSet {
		d, _, ok := l.duration(visV, durKey{
			noneFix: "a job's lease always ends (invariant 7 starts it at the PUBACK); write a duration like 30s",
			zeroFix: "a zero lease would return every job at once; write a duration like 30s",
		})
		if ok {
			c.VisibilityTimeout = d
		} else {
			good, visSet = false, false
		}
	}
	if jv, has := m.get("job_expires_after"); has {
		d, none, ok := l.duration(jv, durKey{
			none:    true,
			zeroFix: "zero would expire every job on arrival; write a duration like 1d, or none (or omit the key) for work that never expires",
		})
		switch {
		case !ok:
			good = false
		case none:
			c.JobExpiresAfter = 0
		default:
			c.JobExpiresAfter = d
			if c.VisibilityTimeout >= d && (visSet || !m.has("visibility_timeout")) {
				if visSet {
					l.add(visV, "it must be shorter than job_expires_after (%s), or a job would expire inside its first lease; lower it or raise job_expires_after", FormatDuration(d))
				} else {
					l.add(jv, "it must be longer than visibility_timeout (default %s), or a job would expire inside its first lease; raise it or set a shorter visibility_timeout", FormatDuration(c.VisibilityTimeout))
				}
				good = false
			}
		}
	}
	if rv, has := m.get("retry"); has {
		rm, ok := l.mapOf(rv)
		if !ok {
			return false
		}
		if av, has := rm.get("max_attempts"); has {
			if n, ok := l.integer(av, 1, 1<<31-1, "it is 1 or more: how many deliveries a job gets before it is dead-lettered (default 5)"); ok {
				c.MaxAttempts = int(n)
			} else {
				good = false
			}
		}
		bv, hasBackoff := rm.get("backoff")
		baseV, hasBase := rm.get("backoff_base")
		if hasBackoff {
			if s, ok := l.enum(bv, []string{"none", "linear", "exponential"}, "none (the default) offers a returned job again at once"); ok {
				c.Backoff = s
			} else {
				// The pairing cannot be judged against a value that is itself wrong.
				rm.finish("max_attempts", "backoff", "backoff_base")
				return false
			}
		}
		// Decided (open point): backoff and backoff_base are written together
		// or neither; "backoff: none" alone spells out the default and takes
		// no base, since there is nothing for one to scale.
		switch {
		case hasBase && !hasBackoff:
			l.add(baseV, "backoff_base scales retry.backoff, which is not set; add backoff: linear or backoff: exponential, or remove backoff_base")
			good = false
		case hasBackoff && c.Backoff == "none" && hasBase:
			l.add(baseV, "retry.backoff is none, which waits for nothing; remove backoff_base, or choose backoff: linear or exponential")
			good = false
		case hasBackoff && c.Backoff != "none" && !hasBase:
			rm.missing("backoff_base", "backoff: %s needs the delay it scales; write backoff_base: like 5s", c.Backoff)
			good = false
		case hasBase:
			d, _, ok := l.duration(baseV, durKey{
				noneFix: "write the first retry's delay, like 5s",
				zeroFix: "a zero base delays nothing; write a duration like 5s, or use backoff: none",
			})
			if ok {
				c.BackoffBase = d
			} else {
				good = false
			}
		}
		rm.finish("max_attempts", "backoff", "backoff_base")
	}
	return good
}

// channelFilters expands and checks a channel's filter (docs/configuration.md "`channels`").
func (l *loader) channelFilters(v val, written, typ string, p *parsed) ([]string, bool) {
	if typ == "queue" && topic.HasBraces(written) {
		l.add(v, "a queue's filter takes no {a,b}: a queue has one filter so that its dead-letter channel has one too; write one filter, or one queue per alternative")
		return nil, false
	}
	filters, err := topic.ExpandBraces(written)
	if err != nil {
		l.add(v, "%v", err)
		return nil, false
	}
	for _, f := range filters {
		if prob := l.filterProblem(f, p); prob != "" {
			if len(filters) > 1 || f != written {
				prob = fmt.Sprintf("its expansion %q: %s", f, prob)
			}
			l.add(v, "%s", prob)
			return nil, false
		}
	}
	return filters, true
}

// filterProblem applies the rules for one expanded channel filter.
func (l *loader) filterProblem(f string, p *parsed) string {
	if err := topic.ValidFilter(f); err != nil {
		return err.Error()
	}
	levels := topic.Split(f)
	switch first := levels[0]; {
	case first == topic.SingleLevel || first == topic.MultiLevel:
		return "the first level must be spelled out: a channel claims a named part of the topic space, and a leading wildcard would take everything; write e.g. sensors/" + f
	case strings.HasPrefix(first, "$"):
		return "the first level begins with $, which is MQTT's and the broker's own space ($SYS, $share, $saguin); choose a plain first level"
	}
	for i, lvl := range levels {
		if lvl == topic.DeadLetterLevel {
			return fmt.Sprintf("level %d is __dlq, which is reserved for dead-letter channels; choose another level name", i+1)
		}
	}
	if p.limitsOK.topicLevels && len(levels) > p.Limits.MaxTopicLevels {
		return fmt.Sprintf("it has %d levels, more than broker.limits.max_topic_levels (%d); shorten it or raise the limit", len(levels), p.Limits.MaxTopicLevels)
	}
	// The filter's length is the shortest topic filling each wildcard with
	// one byte: it must fit, so some topic under it can be published.
	if p.limitsOK.topicLength && len(f) > p.Limits.MaxTopicLength {
		return fmt.Sprintf("it is %d bytes, so no topic under it fits broker.limits.max_topic_length (%d); shorten it or raise the limit", len(f), p.Limits.MaxTopicLength)
	}
	return ""
}

// checkChannelSet applies the rules across channels and derives every
// queue's dead-letter channel (docs/configuration.md "`channels`"; docs/channels.md "The dead-letter channel").
func (l *loader) checkChannelSet(cfg *Config, p *parsed) {
	byFilter := map[string]Channel{}
	for _, c := range cfg.Channels {
		for _, f := range c.Filters {
			prev, dup := byFilter[f]
			if !dup {
				byFilter[f] = c
				continue
			}
			// Invariant 12: the configuration, never the broker, decides
			// where a topic lives; two channels on one filter would leave
			// the broker a tie to break.
			spelled := fmt.Sprintf("the filter %q", f)
			if f != c.FilterAsWritten || f != prev.FilterAsWritten {
				spelled = fmt.Sprintf("the expansion %q", f)
			}
			fv, written := l.filterAt[c.Name]
			if !written {
				fv = val{n: &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: c.FilterAsWritten, Line: c.Line},
					file: c.File, key: "channels." + c.Name + ".filter (default)"}
			}
			pf, pl := prev.File, prev.Line
			if pv, ok := l.filterAt[prev.Name]; ok {
				pf, pl = pv.file, pv.line()
			}
			l.add(fv, "channels %s (%s) and %s (%s) both have %s; a topic belongs to exactly one channel (invariant 12), so change one of the filters",
				prev.Name, where(pf, pl), c.Name, where(fv.file, fv.line()), spelled)
		}
	}
	var dlqs []Channel
	for i := range cfg.Channels {
		q := &cfg.Channels[i]
		if q.Type != "queue" || len(q.Filters) != 1 {
			continue
		}
		q.DeadLetter = q.Name + DeadLetterSuffix
		d := topic.DeadLetterFilter(q.Filters[0])
		dlq := Channel{
			Name: q.DeadLetter, Type: "append", FilterAsWritten: d, Filters: []string{d},
			Storage:      q.Storage, // the move is one transaction (invariant 5)
			DeadLetterOf: q.Name, File: q.File, Line: q.Line,
			RetentionPeriod: p.DefaultRetentionPeriod, RetentionBytes: p.DefaultRetentionBytes,
		}
		dlqs = append(dlqs, dlq)
	}
	// dlq_retention_* were read with the queue; apply them now.
	for i := range dlqs {
		if r, ok := l.dlqRetention[dlqs[i].DeadLetterOf]; ok {
			if r.periodSet {
				dlqs[i].RetentionPeriod = r.period
			}
			if r.bytesSet {
				dlqs[i].RetentionBytes = r.bytes
			}
		}
	}
	cfg.Channels = append(cfg.Channels, dlqs...)
	if len(l.findings) > 0 {
		return
	}
	var routes []topic.Route
	for _, c := range cfg.Channels {
		for _, f := range c.Filters {
			routes = append(routes, topic.Route{Channel: c.Name, Filter: f})
		}
	}
	r, err := topic.NewResolver(routes)
	if err != nil {
		// Unreachable after the checks above; reported rather than hidden.
		l.addKey(l.source, 0, "channels", "%v", err)
		return
	}
	cfg.resolver = r
}

// warnInert notes providers nothing uses (docs/configuration.md "`broker.storage`": logged, not an error).
func (l *loader) warnInert(cfg *Config, p *parsed) {
	for _, name := range p.providerOrder {
		if !p.named[name] {
			pr := p.providers[name]
			l.warn(pr.File, pr.Line, "broker.storage.providers."+name, "no channel, broker.session.storage or broker.retained.storage names this provider; it is inert")
		}
	}
}
