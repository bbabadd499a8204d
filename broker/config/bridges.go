package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"saguin.dev/bridge"
	"saguin.dev/broker/topic"
)

// Bridge defaults and bounds (docs/bridge.md "Configuration").
const (
	DefaultBridgeSessionExpiry  = Day
	DefaultBridgeReceiveMaximum = 20
	DefaultBridgeAckInterval    = 5 * time.Millisecond
	// MaxBridgeSessionExpiry is MQTT's own ceiling: the Session Expiry
	// Interval is a four-byte number of seconds (about 136 years).
	MaxBridgeSessionExpiry = time.Duration(1<<32-1) * time.Second
	// maxBridgeRules bounds the rules of one bridge after brace expansion
	// (invariant 13: every rule is a subscription at the peer or a reader
	// here).
	maxBridgeRules = 1024
)

// Bridge is one bridges.<name> block: a link to a peer broker, on which
// this broker is a client.
type Bridge struct {
	Name string
	// Peer is the URL as written; Scheme is tcp, tls, ws or wss and Host
	// its host:port.
	Peer, Scheme, Host string
	ClientID           string
	SessionExpiry      time.Duration
	ReceiveMaximum     uint16
	AckInterval        time.Duration
	// CAFile, CertFile and KeyFile are absolute paths, on tls and wss
	// peers only; "" is the system roots and no client certificate.
	CAFile, CertFile, KeyFile string
	// Rules in written order, each brace spelling its own rule.
	Rules []BridgeRule

	File string
	Line int
}

// Encrypted reports whether the link runs over TLS.
func (b Bridge) Encrypted() bool { return b.Scheme == "tls" || b.Scheme == "wss" }

// BridgeRule is one rule of a bridge's topics list, braces expanded.
type BridgeRule struct {
	*bridge.Rule
	// Written is the filter as the file writes it (braces and all).
	Written string
	// Index is the rule's place in the topics list, from 0.
	Index int
	Line  int
}

var bridgeKeys = []string{"peer", "client_id", "session_expiry", "receive_maximum", "ack_interval", "ca_file", "cert_file", "key_file", "topics"}

// bridges reads the top-level bridges: block (docs/bridge.md
// "Configuration"): a block of links, each named by its key.
func (l *loader) bridges(v val, p *parsed) []Bridge {
	m, ok := l.mapOf(v)
	if !ok {
		return nil
	}
	var out []Bridge
	for _, name := range m.keys {
		bv, _ := m.get(name)
		if prob := nameProblem(name, MaxChannelName); prob != "" {
			l.addKey(bv.file, m.keyLine[name], "bridges."+name, "the bridge's name: %s", prob)
			continue
		}
		if b, good := l.bridge(name, m.keyLine[name], bv, p); good {
			l.refuseOutHalf(b)
			out = append(out, b)
		}
	}
	l.checkBridgeSet(out)
	return out
}

func (l *loader) bridge(name string, keyLine int, v val, p *parsed) (Bridge, bool) {
	b := Bridge{Name: name, SessionExpiry: DefaultBridgeSessionExpiry, ReceiveMaximum: DefaultBridgeReceiveMaximum,
		AckInterval: DefaultBridgeAckInterval, File: v.file, Line: keyLine}
	m, ok := l.mapOf(v)
	if !ok {
		return b, false
	}
	good := true
	if pv, has := m.get("peer"); has {
		good = l.bridgePeer(pv, &b) && good
	} else {
		m.missing("peer", "write the broker to link to, like peer: tls://hub.example.net:8883 (tcp, tls, ws or wss)")
		good = false
	}
	if cv, has := m.get("client_id"); has {
		if s, ok := l.str(cv, "the client identifier this broker uses at the peer"); ok && s != "" {
			b.ClientID = s
		} else {
			if ok {
				l.add(cv, "an empty client_id would let the peer pick one, and the session it keeps for us would be lost at each connection; write a name like vessel-7")
			}
			good = false
		}
	} else {
		m.missing("client_id", "write the client identifier this broker uses at the peer, like client_id: vessel-7; it names the session the peer keeps for us")
		good = false
	}
	if sv, has := m.get("session_expiry"); has {
		d, _, ok := l.duration(sv, durKey{
			noneFix: "a session that never expires would hold records for us on someone else's storage forever; write a duration like 1d",
			zeroFix: "0 ends the peer's session at each disconnection, so every record published while the link is down is lost; write a duration like 1d (the peer keeps that long what it queues for us, on its storage)",
			min:     time.Second, max: MaxBridgeSessionExpiry,
			rangeFix: "it is at most MQTT's ceiling of 4294967295s (about 136 years); the peer keeps what it queues for us that long, on its storage",
		})
		if ok {
			b.SessionExpiry = d
		}
		good = ok && good
	}
	if rv, has := m.get("receive_maximum"); has {
		n, ok := l.integer(rv, 1, 65535, fmt.Sprintf("it is 1 to 65535 (default %d): the records the peer may send before we acknowledge, and our own window of publishes to it; each may be up to limits.max_message_size (%s), so %d holds up to %s",
			DefaultBridgeReceiveMaximum, FormatBytes(p.Limits.MaxMessageSize), DefaultBridgeReceiveMaximum, FormatBytes(int64(DefaultBridgeReceiveMaximum)*p.Limits.MaxMessageSize)))
		if ok {
			b.ReceiveMaximum = uint16(n)
		}
		good = ok && good
	}
	if av, has := m.get("ack_interval"); has {
		d, _, ok := l.duration(av, durKey{
			noneFix:   "acknowledgements are batched for at most this long; write a duration from 1ms to 1s, like 5ms",
			subSecond: true,
			zeroFix:   "it is 1ms to 1s: acknowledgements are batched for this long, and the link carries at most receive_maximum records per ack_interval",
			min:       time.Millisecond, max: time.Second,
			rangeFix: fmt.Sprintf("it is 1ms to 1s: the link carries at most receive_maximum records per ack_interval (%d / 1s is %d records a second; %d / 5ms is %d)",
				DefaultBridgeReceiveMaximum, DefaultBridgeReceiveMaximum, DefaultBridgeReceiveMaximum, DefaultBridgeReceiveMaximum*200),
		})
		if ok {
			b.AckInterval = d
		}
		good = ok && good
	}
	good = l.bridgeTLS(m, &b) && good
	if tv, has := m.get("topics"); has {
		rules, ok := l.bridgeRules(tv, p)
		b.Rules = rules
		good = ok && good
	} else {
		m.missing("topics", "a bridge with no rule carries nothing; add topics: with at least one {filter, direction, topic}")
		good = false
	}
	m.refuse("username", "a bridge authenticates with a client certificate only (cert_file and key_file on a tls or wss peer); remove username")
	m.refuse("password", "a bridge authenticates with a client certificate only (cert_file and key_file on a tls or wss peer); remove password")
	m.finish(bridgeKeys...)
	return b, good
}

// bridgePeer reads peer: a URL with scheme tcp, tls, ws or wss, a host and
// a port.
func (l *loader) bridgePeer(v val, b *Bridge) bool {
	s, ok := l.str(v, "the peer's URL, like tls://hub.example.net:8883")
	if !ok {
		return false
	}
	b.Peer = s
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		l.add(v, "%q is not a URL with a scheme, host and port; write it like tls://hub.example.net:8883", s)
		return false
	}
	switch u.Scheme {
	case "tcp", "tls", "ws", "wss":
	case "mqtt", "mqtts", "ssl":
		want := "tcp"
		if u.Scheme != "mqtt" {
			want = "tls"
		}
		l.add(v, "the scheme %s: is ambiguous between tools; write %s://%s", u.Scheme, want, u.Host+u.Path)
		return false
	default:
		l.add(v, "the scheme %s: is not one of tcp, tls, ws or wss", u.Scheme)
		return false
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" || port == "" {
		l.add(v, "%q names no port; write the host and port, like %s://%s:%s", s, u.Scheme, strings.Trim(u.Host, ":"), defaultPort(u.Scheme))
		return false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		l.add(v, "port %q is not 1 to 65535", port)
		return false
	}
	if u.User != nil {
		l.add(v, "a bridge authenticates with a client certificate only; remove the user name from the URL")
		return false
	}
	if (u.Scheme == "tcp" || u.Scheme == "tls") && u.Path != "" {
		l.add(v, "a %s peer has no path; remove %q", u.Scheme, u.Path)
		return false
	}
	b.Scheme, b.Host = u.Scheme, u.Host
	return true
}

func defaultPort(scheme string) string {
	switch scheme {
	case "tls":
		return "8883"
	case "ws":
		return "80"
	case "wss":
		return "443"
	}
	return "1883"
}

// bridgeTLS reads ca_file, cert_file and key_file: absolute, readable, on
// an encrypted peer only, certificate and key together.
func (l *loader) bridgeTLS(m *mapping, b *Bridge) bool {
	good := true
	id := "bridges." + b.Name
	files := map[string]*string{"ca_file": &b.CAFile, "cert_file": &b.CertFile, "key_file": &b.KeyFile}
	vals := map[string]val{}
	for _, key := range []string{"ca_file", "cert_file", "key_file"} {
		v, has := m.get(key)
		if !has {
			continue
		}
		vals[key] = v
		if b.Scheme != "" && !b.Encrypted() {
			l.add(v, "a %s peer is not encrypted, so there is no certificate to check or present; use tls:// or wss://, or remove %s", b.Scheme, key)
			good = false
			continue
		}
		s, ok := l.absPath(v, "a PEM file")
		if !ok {
			good = false
			continue
		}
		*files[key] = s
	}
	cv, hasCert := vals["cert_file"]
	kv, hasKey := vals["key_file"]
	switch {
	case hasCert && !hasKey:
		l.add(cv, "a certificate needs its private key; add key_file")
		return false
	case hasKey && !hasCert:
		l.add(kv, "a private key needs its certificate; add cert_file")
		return false
	}
	if !good {
		return false
	}
	before := len(l.findings)
	if b.CertFile != "" {
		l.checkKeyPair(cv, kv, b.CertFile, b.KeyFile, id)
	}
	if b.CAFile != "" {
		l.checkCAFile(vals["ca_file"], b.CAFile, id)
	}
	return len(l.findings) == before
}

// bridgeRules reads a bridge's topics list.
func (l *loader) bridgeRules(v val, p *parsed) ([]BridgeRule, bool) {
	entries, ok := l.items(v)
	if !ok {
		return nil, false
	}
	if len(entries) == 0 {
		l.add(v, "a bridge with no rule carries nothing; add at least one {filter, direction, topic}")
		return nil, false
	}
	var out []BridgeRule
	good := true
	for i, e := range entries {
		e.key = fmt.Sprintf("%s[%d]", v.key, i)
		rules, ok := l.bridgeRule(e, i, p)
		good = ok && good
		if len(out)+len(rules) > maxBridgeRules {
			l.add(e, "the rules expand to more than %d; a bridge is at most %d rules, each a subscription at the peer or a reader here", maxBridgeRules, maxBridgeRules)
			return out, false
		}
		out = append(out, rules...)
	}
	good = l.checkDuplicateOutRules(v, out) && good
	return out, good
}

func (l *loader) bridgeRule(v val, index int, p *parsed) ([]BridgeRule, bool) {
	m, ok := l.mapOf(v)
	if !ok {
		return nil, false
	}
	defer m.finish("filter", "direction", "topic")
	var dir bridge.Direction
	dv, hasDir := m.get("direction")
	if !hasDir {
		m.missing("direction", "write direction: in (the peer's records stored here), out (ours published there) or both (each way, under the same names)")
	} else if s, ok := l.str(dv, "in, out or both"); ok {
		d, err := bridge.ParseDirection(s)
		if err != nil {
			l.add(dv, "%v: in stores the peer's records here, out publishes ours there, both does each under the same names", err)
		} else {
			dir = d
		}
	}
	fv, hasFilter := m.get("filter")
	if !hasFilter {
		m.missing("filter", "write the topics this rule carries, like filter: fleet/+/telemetry/#")
		return nil, false
	}
	written, ok := l.str(fv, "an MQTT topic filter")
	if !ok {
		return nil, false
	}
	tmpl := ""
	tv, hasTmpl := m.get("topic")
	if hasTmpl {
		if s, ok := l.str(tv, "a topic template"); ok {
			tmpl = s
		} else {
			return nil, false
		}
	}
	if dir == 0 {
		return nil, false
	}
	spellings, err := topic.ExpandBraces(written)
	if err != nil {
		l.add(fv, "%v", err)
		return nil, false
	}
	var out []BridgeRule
	for _, f := range spellings {
		if err := topic.ValidFilter(f); err != nil {
			if f != written {
				l.add(fv, "its spelling %q: %v", f, err)
			} else {
				l.add(fv, "%v", err)
			}
			return nil, false
		}
		if n := topic.Levels(f); n > p.Limits.MaxTopicLevels {
			l.add(fv, "%q has %d levels, deeper than limits.max_topic_levels (%d); no topic it matches could be stored here", f, n, p.Limits.MaxTopicLevels)
			return nil, false
		}
		r, notes, err := bridge.NewRule(f, dir, tmpl)
		var re *bridge.RuleError
		switch {
		case err == nil:
		case !errors.As(err, &re):
			l.add(fv, "%v", err)
			return nil, false
		case re.Key == "topic" && !hasTmpl:
			m.missing("topic", "%v", re.Err)
			return nil, false
		case re.Key == "topic":
			l.add(tv, "%v", re.Err)
			return nil, false
		case f != written:
			l.add(fv, "its spelling %q: %v", f, re.Err)
			return nil, false
		default:
			l.add(fv, "%v", re.Err)
			return nil, false
		}
		for _, n := range notes {
			l.warn(tv.file, tv.line(), tv.key, "%s", n)
		}
		out = append(out, BridgeRule{Rule: r, Written: written, Index: index, Line: v.line()})
	}
	return out, true
}

// OutHalfMissing is the finding on an out or both rule: checked like any
// rule, then refused, since this build runs the link's in half only.
const OutHalfMissing = "this build carries in rules only: out and both rules need the link's out half (a durable reader of our channels), which it does not have yet; remove the rule or make it in"

// refuseOutHalf refuses each out and both rule of b, once per rule as
// written (its brace spellings share it).
func (l *loader) refuseOutHalf(b Bridge) {
	last := -1
	for _, r := range b.Rules {
		if r.Direction == bridge.In || r.Index == last {
			continue
		}
		last = r.Index
		l.addKey(b.File, r.Line, fmt.Sprintf("bridges.%s.topics[%d].direction", b.Name, r.Index), "%s", OutHalfMissing)
	}
}

// warnBridgesToBroadcast warns of an in rule that can land records on a
// topic no channel claims: such a record is acknowledged to the peer once
// handed to the fan-out, and only subscribers connected then receive it —
// nothing here keeps it (docs/bridge.md "What crosses, inbound").
func (l *loader) warnBridgesToBroadcast(cfg *Config) {
	if cfg.resolver == nil {
		return
	}
	for _, b := range cfg.Bridges {
		for _, r := range b.Rules {
			if r.Direction == bridge.Out {
				continue
			}
			if _, broadcast := cfg.resolver.Reach(r.Reach()); broadcast {
				l.warn(b.File, r.Line, fmt.Sprintf("bridges.%s.topics[%d]", b.Name, r.Index),
					"records of %s land on topics no channel claims (%s): each is acknowledged to the peer once handed to the broadcast fan-out, and only subscribers connected then get it; give it a channel to keep it", r.Filter, r.Reach())
			}
		}
	}
}

// checkDuplicateOutRules refuses two out rules (both rules included, which
// read here too) with the same filter and topic: the same records would go
// out twice, under two positions.
func (l *loader) checkDuplicateOutRules(v val, rules []BridgeRule) bool {
	seen := map[[2]string]BridgeRule{}
	good := true
	for _, r := range rules {
		if r.Direction == bridge.In {
			continue
		}
		k := [2]string{r.Filter, r.Template}
		if prev, dup := seen[k]; dup {
			l.addKey(v.file, r.Line, fmt.Sprintf("%s[%d]", v.key, r.Index),
				"the filter %q and topic %q are already rule %d's (line %d): each record would be published twice; remove one", r.Filter, r.Template, prev.Index, prev.Line)
			good = false
			continue
		}
		seen[k] = r
	}
	return good
}

// checkBridgeSet refuses two bridges with one client_id at one peer: each
// connection would take the other's session over, in turn, for ever.
func (l *loader) checkBridgeSet(bridges []Bridge) {
	seen := map[[2]string]Bridge{}
	for _, b := range bridges {
		k := [2]string{strings.ToLower(b.Host), b.ClientID}
		if prev, dup := seen[k]; dup {
			l.addKey(b.File, b.Line, "bridges."+b.Name+".client_id",
				"bridge %s uses client_id %q at %s too (%s): the peer would hand one session back and forth between them; give each its own", prev.Name, b.ClientID, b.Host, where(prev.File, prev.Line))
			continue
		}
		seen[k] = b
	}
}
