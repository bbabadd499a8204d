package acl

import (
	"encoding/json"
	"strings"
)

// Explanation is what one user (and client id) may do and why, as
// saguin --acl --json prints it and the operations listener's
// /v1/operations/acl answers it (docs/operations.md): one JSON object.
type Explanation struct {
	User string
	// ACLFile is the file explained; nil when the configuration names
	// none, and every client may do everything (the object is then
	// {"acl_file":null,"everything_allowed":true}).
	ACLFile *string
	// PatternApplied is the users: key that decides; nil when none
	// matches the name (and Grants is empty).
	PatternApplied *string
	// PatternsMatched are every key matching the name, the applying one
	// first, then the shadowed ones, most exact first.
	PatternsMatched []string
	// PatternsInFile are all keys of users:, in file order.
	PatternsInFile []string
	// ClientIDAllowed is nil when no client id was asked about.
	ClientIDAllowed *bool
	Grants          []Grant
	GrantsWithheld  []WithheldGrant
	// Limits are the publish figures that apply; not part of the JSON
	// object (docs/operations.md serves them with the configuration), but --acl's
	// TSV columns.
	Limits PublishLimits
}

// Grant is one rule of one role as it applies to the identity explained.
type Grant struct {
	Role string `json:"role"`
	// Kind is "channel", "topic" or "broker".
	Kind string `json:"kind"`
	// Subject is what the rule grants on: "events (events/#)" — a channel
	// and the filter the grant covers (the channel's own, or the rule's
	// narrowing with %u and %c substituted) — a topic: filter, or
	// "sessions" / "features".
	Subject string   `json:"subject"`
	Verbs   []string `json:"verbs"`
	// Denies is filled by a broker: features rule only; never nil.
	Denies []string `json:"denies"`
}

// WithheldGrant is a rule that grants nothing to this identity, and why.
type WithheldGrant struct {
	Grant
	Reason string `json:"reason"`
}

// NoACL is the explanation when the configuration names no acl_file.
func NoACL(user string) Explanation { return Explanation{User: user} }

// Explain says what user may do, and with clientID (nil: not asked)
// whether that client id may use the name. It reads the rules through the
// same path For does.
func (a *ACL) Explain(user string, clientID *string) Explanation {
	path := a.path
	x := Explanation{User: user, ACLFile: &path, PatternsMatched: []string{},
		PatternsInFile: a.Patterns(), Grants: []Grant{}, GrantsWithheld: []WithheldGrant{}}
	id, withClientID := "", clientID != nil
	if withClientID {
		id = *clientID
	}
	g := a.grants(user, id, withClientID)
	x.Limits = g.limits
	if withClientID {
		allowed := g.clientIDAllowed
		x.ClientIDAllowed = &allowed
	}
	if g.entry == nil {
		return x
	}
	applied := g.entry.pattern
	x.PatternApplied = &applied
	x.PatternsMatched = append(x.PatternsMatched, applied)
	for _, e := range a.globs { // most exact first
		if e != g.entry && globMatch(e.pattern, user) {
			x.PatternsMatched = append(x.PatternsMatched, e.pattern)
		}
	}
	x.GrantsWithheld = append(x.GrantsWithheld, g.withheld...)
	a.eachRule(g.entry, user, id, withClientID, func(ro *role, ru *rule, _ []string, withheld string) {
		if withheld == "" {
			x.Grants = append(x.Grants, a.describe(ro, ru, user, id, withClientID))
		}
	})
	return x
}

// describe renders one rule of a role for this identity. A withheld rule
// is described for the identity ("%u", "%c"), which keeps the filter as
// written: its substituted form is exactly what it must not grant.
func (a *ACL) describe(ro *role, ru *rule, user, clientID string, withClientID bool) Grant {
	gr := Grant{Role: ro.name, Verbs: ru.verbs.names(), Denies: ru.denies.Names()}
	switch ru.kind {
	case kindChannel:
		gr.Kind = "channel"
		covers := a.channels[ru.channel].FilterAsWritten
		if ru.filters != nil {
			covers = substitute(ru.written, user, clientID, withClientID)
		}
		gr.Subject = ru.channel + " (" + covers + ")"
	case kindTopic:
		gr.Kind = "topic"
		gr.Subject = substitute(ru.written, user, clientID, withClientID)
	case kindSessions:
		gr.Kind, gr.Subject = "broker", "sessions"
	case kindFeatures:
		gr.Kind, gr.Subject = "broker", "features"
	}
	return gr
}

// explanationJSON fixes the object's fields and their order.
type explanationJSON struct {
	User            string          `json:"user"`
	ACLFile         string          `json:"acl_file"`
	PatternApplied  *string         `json:"pattern_applied"`
	PatternsMatched []string        `json:"patterns_matched"`
	PatternsInFile  []string        `json:"patterns_in_file"`
	ClientIDAllowed *bool           `json:"client_id_allowed"`
	Grants          []Grant         `json:"grants"`
	GrantsWithheld  []WithheldGrant `json:"grants_withheld"`
}

// MarshalJSON writes the object docs/operations.md specifies; without an ACL file,
// exactly {"acl_file":null,"everything_allowed":true}.
func (x Explanation) MarshalJSON() ([]byte, error) {
	if x.ACLFile == nil {
		return []byte(`{"acl_file":null,"everything_allowed":true}`), nil
	}
	return json.Marshal(explanationJSON{
		User: x.User, ACLFile: *x.ACLFile, PatternApplied: x.PatternApplied,
		PatternsMatched: nonNil(x.PatternsMatched), PatternsInFile: nonNil(x.PatternsInFile),
		ClientIDAllowed: x.ClientIDAllowed, Grants: nonNil(x.Grants), GrantsWithheld: nonNil(x.GrantsWithheld),
	})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// VerbsText renders a grant's verbs, or for broker: features its denials
// ("deny:will,qos2"): the verbs column of --acl's TSV.
func (gr Grant) VerbsText() string {
	if len(gr.Denies) > 0 {
		return "deny:" + strings.Join(gr.Denies, ",")
	}
	return strings.Join(gr.Verbs, ",")
}
