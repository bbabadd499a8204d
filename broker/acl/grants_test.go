package acl

import (
	"reflect"
	"strings"
	"testing"
)

// docs/configuration.md "The ACL file": of the patterns matching a name, the one with the most
// literal characters applies, alone: its roles and its limits; the others
// are ignored, even where they would grant more.
func TestTheMostExactPatternAloneApplies(t *testing.T) {
	a := mustLoad(t, `roles:
  everyone:
    - topic: "public/#"
      allow: [read]
  devices:
    - topic: "devices/#"
      allow: [write]
  root:
    - topic: "#"
      allow: [read, write]
users:
  "*": [everyone]
  "dev-*": [devices]
  "dev-0*": [everyone]
  "dev-007": [root]
`)
	for _, tc := range []struct {
		user, pattern string
		matched       bool
		public, dev   bool
	}{
		{"", "*", true, true, false}, // the anonymous identity: "*" matches it
		{"carol", "*", true, true, false},
		{"dev-42", "dev-*", true, false, true},
		{"dev-01", "dev-0*", true, true, false},  // more exact than dev-*: everyone only
		{"dev-007", "dev-007", true, true, true}, // written out: root
	} {
		g := a.For(tc.user, "c1")
		p, ok := g.Pattern()
		if p != tc.pattern || ok != tc.matched {
			t.Errorf("%q: pattern %q %v, want %q", tc.user, p, ok, tc.pattern)
		}
		if got := g.MayRead("public/news", ""); got != tc.public {
			t.Errorf("%q (%s): read public/news = %v, want %v", tc.user, p, got, tc.public)
		}
		if got := g.MayWrite("devices/x", ""); got != tc.dev {
			t.Errorf("%q (%s): write devices/x = %v, want %v", tc.user, p, got, tc.dev)
		}
	}
}

// A name no pattern matches is granted nothing (default deny) and may
// still connect: the ACL grants, the password file admits.
func TestANameMatchingNothingIsGrantedNothing(t *testing.T) {
	a := mustLoad(t, `roles:
  r:
    - topic: "#"
      allow: [read, write]
    - broker: sessions
      allow: [disconnect]
users:
  alice: [r]
`)
	g := a.For("bob", "bob-1")
	if _, ok := g.Pattern(); ok {
		t.Fatal("bob matched a pattern")
	}
	if !g.ClientIDAllowed() || g.MayRead("x", "") || g.MayWrite("x", "") || g.MayDisconnect() || g.Denies(Will) {
		t.Errorf("an unmatched name: client id allowed %v, read %v, write %v, disconnect %v, will denied %v",
			g.ClientIDAllowed(), g.MayRead("x", ""), g.MayWrite("x", ""), g.MayDisconnect(), g.Denies(Will))
	}
	if l := g.PublishLimits(); l != (PublishLimits{Rate: 50}) {
		t.Errorf("an unmatched name's limits %+v, want broker.limits' (rate 50, bytes no bound)", l)
	}
}

// Each verb governs its own question, per channel type; roles add up.
func TestVerbsAnswerTheirQuestions(t *testing.T) {
	a := mustLoad(t, `roles:
  reader:
    - channel: events
      allow: [read]
    - channel: state
      allow: [read]
  writer:
    - channel: events
      allow: [write, seek]
    - channel: state
      allow: [write]
    - channel: jobs
      allow: [write]
  worker:
    - channel: jobs
      allow: [consume]
    - channel: state
      filter: "site/+/state"
      allow: [delete]
  admin:
    - broker: sessions
      allow: [disconnect]
    - broker: features
      deny: [will, qos2]
  strict:
    - broker: features
      deny: [persistent]
users:
  r: [reader]
  w: [writer]
  rw: [reader, writer, worker, admin, strict]
`)
	r, wr, all := a.For("r", "1"), a.For("w", "2"), a.For("rw", "3")
	checks := []struct {
		name string
		got  bool
		want bool
	}{
		{"r reads events", r.MayRead("events/a", "events"), true},
		{"r does not write events", r.MayWrite("events/a", "events"), false},
		{"r does not seek events", r.MaySeek("events"), false},
		{"w writes events", wr.MayWrite("events/a", "events"), true},
		{"w does not read events", wr.MayRead("events/a", "events"), false},
		{"w seeks events", wr.MaySeek("events"), true},
		{"w writes a latest value", wr.MayWrite("site/1/state", "state"), true},
		// rfcs/acl.md: a delete needs delete; write alone does not delete.
		{"w does not delete a latest value", wr.MayDelete("site/1/state", "state"), false},
		{"w writes a job", wr.MayWrite("jobs/a", "jobs"), true},
		{"w does not consume", wr.MayConsume("jobs"), false},
		{"rw consumes", all.MayConsume("jobs"), true},
		{"rw deletes", all.MayDelete("site/1/state", "state"), true},
		{"rw disconnects", all.MayDisconnect(), true},
		{"rw is denied will", all.Denies(Will), true},
		{"rw is denied qos2", all.Denies(QoS2), true},
		{"rw is denied persistent (another role)", all.Denies(Persistent), true},
		{"rw is not denied share", all.Denies(Share), false},
		{"rw is not denied retained", all.Denies(Retained), false},
		{"r may not disconnect", r.MayDisconnect(), false},
		{"nobody reads another channel", all.MayRead("events/alarms/x", "alarms"), false},
		{"nobody reads broadcast", all.MayRead("x", ""), false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if v := all.Verbs("state"); !reflect.DeepEqual(v, []string{"write", "read", "delete"}) {
		t.Errorf("the catalogue's verbs on state: %v", v)
	}
	if v := r.Verbs("jobs"); len(v) != 0 || v == nil {
		t.Errorf("verbs on a channel with no grant: %#v, want an empty list", v)
	}
}

// %u and %c are substituted in filter: and topic:, once: a %u inside the
// user name stays as it is. {a,b} is expanded first.
func TestSubstitutionIsSinglePassAfterBraces(t *testing.T) {
	a := mustLoad(t, `roles:
  own:
    - channel: events
      filter: "events/{%u,shared}/%c/#"
      allow: [read]
    - topic: "home/%u/#"
      allow: [write]
users:
  "*": [own]
`)
	// Each value holds both placeholders: a second pass, in either order,
	// would replace one inside the other.
	g := a.For("u%c%u", "c%u%c")
	for topicName, want := range map[string]bool{
		"events/u%c%u/c%u%c/x":   true,
		"events/shared/c%u%c/x":  true,
		"events/u%c%u/c%u%c":     true,
		"events/uc%u%cu/c%u%c/x": false,
		"events/u%c%u/other/x":   false,
		"events/shared/other/x":  false,
		"events/bob/c%u%c/x":     false,
		"events/{u%c%u}/c%u%c/x": false,
		"events/u%c%u/cc%u%c/x":  false,
	} {
		if got := g.MayRead(topicName, "events"); got != want {
			t.Errorf("read %s = %v, want %v", topicName, got, want)
		}
	}
	if !g.MayWrite("home/u%c%u/lamp", "") || g.MayWrite("home/uc%u%cu/lamp", "") {
		t.Error("topic: home/%u/# did not substitute the user name exactly once")
	}
	if len(g.Withheld()) != 0 {
		t.Errorf("withheld: %+v", g.Withheld())
	}
}

// A rule whose %u or %c would substitute '+', '#' or '/' (or nothing: an
// anonymous client) grants nothing, and is returned for the broker to log;
// the entry's other rules still grant.
func TestRulesWhoseSubstitutionWouldWidenThemAreWithheld(t *testing.T) {
	a := mustLoad(t, `roles:
  own:
    - topic: "home/%u/#"
      allow: [read, write]
    - channel: events
      filter: "events/%c/#"
      allow: [read]
    - topic: "public/#"
      allow: [read]
users:
  "*": [own]
`)
	for _, tc := range []struct {
		user, client string
		withheld     []string // reasons
	}{
		{"al/ice", "c1", []string{`%u is the user name, which holds "/"`}},
		{"+", "c1", []string{`%u is the user name, which holds "+"`}},
		{"alice", "dev#1", []string{`%c is the client id, which holds "#"`}},
		{"", "c1", []string{"%u is the user name, which is empty"}},
		{"alice", "c1", nil},
	} {
		g := a.For(tc.user, tc.client)
		var reasons []string
		for _, wh := range g.Withheld() {
			reasons = append(reasons, wh.Reason)
			if wh.Role != "own" || wh.Subject == "" {
				t.Errorf("%q/%q: withheld grant without its role or subject: %+v", tc.user, tc.client, wh)
			}
		}
		if !reflect.DeepEqual(reasons, tc.withheld) {
			t.Errorf("%q/%q: withheld %q, want %q", tc.user, tc.client, reasons, tc.withheld)
		}
		if !g.MayRead("public/x", "") {
			t.Errorf("%q/%q: a rule without placeholders was withheld too", tc.user, tc.client)
		}
	}
	// "al/ice" must not read home/al/ice/... nor, through "+", anyone's.
	if g := a.For("al/ice", "c1"); g.MayRead("home/al/ice/x", "") || g.MayWrite("home/al/ice/x", "") {
		t.Error("a user name holding / was substituted")
	}
	if g := a.For("+", "c1"); g.MayRead("home/bob/x", "") {
		t.Error("a user name + read another user's topics")
	}
	if g := a.For("alice", "dev#1"); g.MayRead("events/x/y", "events") {
		t.Error("a client id # read the whole channel")
	}
}

// client_ids: binds a user name to the client ids it may connect with;
// %u is substituted, except for a user name holding '*'.
func TestClientIDsBindTheName(t *testing.T) {
	a := mustLoad(t, `roles:
  r:
    - topic: "x/#"
      allow: [read]
users:
  "sensor-*":
    roles: [r]
    client_ids: "%u"
  "op*":
    roles: [r]
    client_ids: ["%u-console", "ops-*"]
  free: [r]
`)
	for _, tc := range []struct {
		user, client string
		want         bool
	}{
		{"sensor-7", "sensor-7", true},
		{"sensor-7", "sensor-8", false},
		{"operator", "operator-console", true},
		{"operator", "ops-laptop", true},
		{"operator", "console", false},
		{"op*", "op*-console", false}, // '*' in the name: %u is never substituted
		{"op*", "opX-console", false},
		{"op*", "ops-1", true}, // a pattern without %u still admits
		{"free", "anything", true},
		{"nobody", "anything", true}, // no entry, no restriction
	} {
		if got := a.For(tc.user, tc.client).ClientIDAllowed(); got != tc.want {
			t.Errorf("user %q client %q: allowed %v, want %v", tc.user, tc.client, got, tc.want)
		}
	}
}

// An entry with limits: replaces broker.limits' figures it writes, up or
// down (none: no bound); one without keeps broker.limits' (rate 50, bytes
// no bound in the test configuration).
func TestLimitsFollowTheApplyingEntry(t *testing.T) {
	a := mustLoad(t, `roles:
  r:
    - topic: "x/#"
      allow: [write]
users:
  slow:
    roles: [r]
    limits: {publish_rate: 5, publish_bytes: 8KiB}
  fast:
    roles: [r]
    limits: {publish_rate: none}
  bytes:
    roles: [r]
    limits: {publish_bytes: 1MiB}
  plain: [r]
`)
	for user, want := range map[string]PublishLimits{
		"slow":  {Rate: 5, Bytes: 8 << 10, FromEntry: true},
		"fast":  {Rate: 0, Bytes: 0, FromEntry: true},
		"bytes": {Rate: 50, Bytes: 1 << 20, FromEntry: true},
		"plain": {Rate: 50},
	} {
		if got := a.For(user, "c").PublishLimits(); got != want {
			t.Errorf("%s: %+v, want %+v", user, got, want)
		}
	}
}

// docs/configuration.md "The ACL file" subscriptions, decided conservatively (rfcs/acl.md): a
// filter is granted only when no delivery on it would be refused for a
// reason known now.
func TestSubscriptionsAreGrantedOnlyWhenProvablyCovered(t *testing.T) {
	a := mustLoad(t, `roles:
  own:
    - channel: events
      filter: "events/%u/#"
      allow: [read]
    - channel: iot
      allow: [read]
    - channel: state
      filter: "site/{a,b}/state"
      allow: [read]
    - topic: "news/#"
      allow: [read]
    - topic: "+/weather"
      allow: [read]
  all:
    - topic: "#"
      allow: [read]
    - channel: events
      allow: [read]
    - channel: alarms
      allow: [read]
    - channel: jobs__dlq
      allow: [read]
users:
  alice: [own]
  root: [all]
`)
	alice, root := a.For("alice", "c"), a.For("root", "c")
	for _, tc := range []struct {
		g       *Grants
		filter  string
		channel string // the channel refused on; "" for broadcast
		refused bool
	}{
		{alice, "events/alice/#", "", false},
		{alice, "events/alice/door", "", false},
		{alice, "events/bob/#", "events", true},  // the narrowing holds alice's topics only
		{alice, "events/+/door", "alarms", true}, // alarms first (sorted); events/bob/door too
		{alice, "events/#", "alarms", true},      // the brief's example
		{alice, "iot/+/events/+", "", false},     // read on the whole channel
		{alice, "iot/#", "", true},               // also matches broadcast iot/x, which no topic: rule covers
		{alice, "site/a/state", "", false},
		{alice, "site/+/state", "state", true}, // braces grant a and b, not every site
		{alice, "news/#", "", false},
		{alice, "#", "alarms", true},
		{alice, "sports/weather", "", false},
		{alice, "sports/#", "", true},
		// A filter crossing the queue is never served its records: no
		// queue verb is needed; but it reaches jobs__dlq, which needs read.
		{alice, "jobs/#", "jobs__dlq", true},
		{root, "jobs/#", "", false},
		{root, "jobs/+", "", false},
		{root, "#", "iot", true},
		{root, "events/#", "", false},
	} {
		err := tc.g.CheckSubscribe(tc.filter)
		if (err != nil) != tc.refused {
			t.Errorf("%s subscribing %q: %v, want refused %v", tc.g.User(), tc.filter, err, tc.refused)
			continue
		}
		if err == nil {
			continue
		}
		ref, ok := err.(*SubscribeRefusal)
		if !ok {
			t.Fatalf("%T is not a *SubscribeRefusal", err)
		}
		if ref.Channel != tc.channel {
			t.Errorf("%s subscribing %q: refused on %q, want %q (%v)", tc.g.User(), tc.filter, ref.Channel, tc.channel, err)
		}
		if !strings.Contains(err.Error(), tc.filter) {
			t.Errorf("the refusal does not name the filter: %v", err)
		}
	}
}
