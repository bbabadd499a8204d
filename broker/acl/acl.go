// Package acl reads the ACL file (broker.mqtt.acl_file, docs/configuration.md "The ACL file"),
// checks it against the configuration it sits beside, and answers, for one
// connection's identity, what the broker asks at CONNECT, PUBLISH,
// SUBSCRIBE and on every delivery.
//
// The file grants only: what no rule of the one applying users: entry
// grants is refused, and the only denial is broker: features. Load reads
// and checks the whole file and reports every finding at once; For
// compiles, once per connection (and again after a reload), the grants of
// that user and client id with %u and %c substituted, into tables the
// per-delivery questions read without allocating. With no acl_file there
// is no *ACL at all: the broker asks nothing.
//
// The decisions this package takes on the open points of §1.12 are in
// rfcs/acl.md.
package acl

import (
	"fmt"

	"saguin.dev/broker/config"
	"saguin.dev/broker/topic"
)

// ACL is a loaded, checked ACL file. It is immutable and safe for
// concurrent use; a reload builds a new one.
type ACL struct {
	path     string
	roles    map[string]*role
	entries  []*entry          // in file order
	exact    map[string]*entry // patterns without '*', by the name they are
	globs    []*entry          // patterns with '*', most exact first
	channels map[string]config.Channel
	resolver *topic.Resolver
	// The broker-wide publish figures (broker.limits), which an entry
	// without limits: leaves in force.
	brokerRate  int
	brokerBytes int64
}

// Path is the file the ACL was read from.
func (a *ACL) Path() string { return a.path }

// Stats counts what the file holds, for the line a start or a reload logs.
type Stats struct {
	Roles, Rules, Patterns int
}

// Stats counts the ACL's roles, rules and user patterns.
func (a *ACL) Stats() Stats {
	s := Stats{Roles: len(a.roles), Patterns: len(a.entries)}
	for _, r := range a.roles {
		s.Rules += len(r.rules)
	}
	return s
}

// Patterns lists the keys of users:, in file order.
func (a *ACL) Patterns() []string {
	out := make([]string, len(a.entries))
	for i, e := range a.entries {
		out[i] = e.pattern
	}
	return out
}

// Load reads the ACL file at path and checks it against cfg, a
// configuration that loaded without findings. The error is a
// *config.Findings listing every finding of the file at once, each with
// the file, line, key, value and fix.
func Load(path string, cfg *config.Config) (*ACL, error) {
	if cfg.Resolver() == nil {
		return nil, fmt.Errorf("acl: the configuration %s did not load; an ACL is checked against a configuration without findings", cfg.Source)
	}
	a, findings := read(path, envOf(cfg))
	if len(findings) > 0 {
		return nil, &config.Findings{Source: path, List: findings}
	}
	return a, nil
}

// Check is a config.Check: it reads the ACL file the configuration names,
// so that --check-config and a start report its findings in the loader's
// pass, in the loader's format. On a configuration with findings of its
// own the checks that need the channels are left out (one mistake, one
// finding); they run once the configuration loads.
func Check(cfg *config.Config) []config.Finding {
	path := cfg.Broker.ACLFile
	if path == "" {
		return nil
	}
	_, findings := read(path, envOf(cfg))
	for i, f := range findings {
		// A file that cannot be read is a mistake of the configuration's
		// key naming it: placed there, as the loader places its own.
		if f.Key == "(file)" {
			findings[i] = cfg.At("broker.mqtt.acl_file", f.Problem)
		}
	}
	return findings
}

// env is what the checks need of the configuration.
type env struct {
	// channels by name; nil when the configuration has findings, and the
	// checks against channels are skipped.
	channels     map[string]config.Channel
	channelNames []string
	resolver     *topic.Resolver
	maxLevels    int
	limits       config.Limits
}

func envOf(cfg *config.Config) env {
	e := env{resolver: cfg.Resolver(), maxLevels: cfg.Broker.Limits.MaxTopicLevels, limits: cfg.Broker.Limits}
	if e.maxLevels <= 0 {
		e.maxLevels = config.DefaultMaxTopicLevels
	}
	if e.resolver == nil {
		return e
	}
	e.channels = make(map[string]config.Channel, len(cfg.Channels))
	for _, c := range cfg.Channels {
		e.channels[c.Name] = c
		e.channelNames = append(e.channelNames, c.Name)
	}
	return e
}

// ruleKind is what a rule grants on.
type ruleKind uint8

const (
	kindChannel  ruleKind = iota // topics resolving to one channel
	kindTopic                    // broadcast topics
	kindSessions                 // broker: sessions
	kindFeatures                 // broker: features (denies only)
)

// rule is one entry of a role, checked.
type rule struct {
	kind    ruleKind
	channel string // kindChannel
	// written is the filter as written: a channel rule's filter: ("" when
	// it grants on the whole channel) or a topic rule's topic:.
	written string
	// filters are written's brace expansions, %u and %c not substituted.
	filters              []string
	usesUser, usesClient bool
	verbs                verbSet
	denies               Feature
	line                 int
}

// role is a named list of rules.
type role struct {
	name  string
	rules []rule
}

// entry is one key of users:.
type entry struct {
	pattern  string
	literals int
	glob     bool
	roles    []string
	limits   entryLimits
	// clientIDs are the client_ids: patterns; nil when the entry has none
	// (any client id may use the name).
	clientIDs []string
	line      int
}

// entryLimits is an entry's limits: block. A figure written replaces the
// broker-wide one (0 then means none: no bound); one not written keeps it.
type entryLimits struct {
	set               bool
	rate              int
	bytes             int64
	rateSet, bytesSet bool
}
