package acl

import (
	"strconv"
	"strings"
	"testing"

	"saguin.dev/broker/config"
)

// Each startup check of docs/configuration.md "The ACL file" is a finding at the ACL file's line,
// on the key at fault, saying what to write instead; and nothing else is
// reported beside it.

func TestRuleFilterMustBeWellFormed(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "a/#/b"
      allow: [read]
    - topic: "a/b+"
      allow: [read]
    - channel: events
      filter: "events/{x,y"
      allow: [read]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(3, "roles.r[0].topic", "# may only be the last level"),
		w(5, "roles.r[1].topic", "mixes + with other characters"),
		w(8, "roles.r[2].filter", "never closed"))
}

func TestChannelRuleFilterMustMatchSomeOfTheChannelsTopics(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: events
      filter: "other/%u/#"
      allow: [read]
    - channel: events
      filter: "events/alarms/#"
      allow: [read]
    - channel: events
      filter: "events/{%u,alarms}/#"
      allow: [read]
    - channel: iot
      filter: "iot/%u/events/%c"
      allow: [read]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(4, "roles.r[0].filter", "matches none of the topics of channel events (filter events/#)", "write a filter inside the channel's"),
		w(7, "roles.r[1].filter", "matches none of the topics of channel events", "held by alarms"),
		w(10, "roles.r[2].filter", `its expansion "events/alarms/#"`, "held by alarms"))
}

func TestTopicRuleWhollyInsideAChannelIsRefusedNamingBoth(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "events/%u/#"
      allow: [read]
    - topic: "+/x"
      allow: [read, write]
    - topic: "#"
      allow: [read]
    - topic: "jobs/{a,b}"
      allow: [publish]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(3, "roles.r[0].topic", "lies wholly inside the filter of channel events (filter events/#, ",
			"saguin.yaml:"+strconv.Itoa(eventsLine)+")", `write it as channel: events with filter: "events/%u/#"`),
		// Each finding of a rule, not only its first.
		w(9, "roles.r[3].topic", `its expansion "jobs/a" lies wholly inside the filter of channel jobs`),
		w(9, "roles.r[3].topic", `its expansion "jobs/b" lies wholly inside`),
		w(10, "roles.r[3].allow[0]", "unknown verb"))
}

func TestFilterDeeperThanMaxTopicLevelsIsRefused(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "a/b/c/d/e/f/g/h/i"
      allow: [write]
    - topic: "a/b/c/d/e/f/g/#"
      allow: [write]
users:
  alice: [r]
`)
	expect(t, list, path, w(3, "roles.r[0].topic", "9 levels, more than broker.limits.max_topic_levels (8)"))
}

func TestDenyAndAllowAreEachInTheirPlace(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: events
      allow: [read]
      deny: [write]
    - topic: "x/#"
      allow: [read]
      deny: [write]
    - broker: sessions
      allow: [disconnect]
      deny: [disconnect]
    - broker: features
      allow: [will]
      deny: [qos2]
    - broker: features
users:
  alice: [r]
`)
	expect(t, list, path,
		w(5, "roles.r[0].deny", "deny: is for broker: features only"),
		w(8, "roles.r[1].deny", "deny: is for broker: features only"),
		w(11, "roles.r[2].deny", "deny: is for broker: features only"),
		w(13, "roles.r[3].allow", "broker: features only denies", "write deny:"),
		w(15, "roles.r[4].deny", "missing", "persistent, will, share, retained, qos2"))
}

func TestFeaturesUnknownDuplicateAndRetain(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - broker: features
      deny: [will, retain, shared, will]
    - broker: features
      deny: []
users:
  alice: [r]
`)
	expect(t, list, path,
		w(4, "roles.r[0].deny[1]", "spelled retained; write retained"),
		w(4, "roles.r[0].deny[2]", "unknown feature; the features are persistent, will, share, retained, qos2"),
		w(4, "roles.r[0].deny[3]", "listed twice"),
		w(6, "roles.r[1].deny", "names no feature"))
}

func TestVerbsPerSubjectType(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: jobs
      allow: [write, read]
    - channel: state
      allow: [read, seek, delete, write]
    - channel: events
      allow: [delete, consume, write, read, seek]
    - channel: jobs__dlq
      allow: [read, seek]
    - topic: "x/#"
      allow: [seek, publish, read, read]
    - broker: sessions
      allow: [write, disconnect]
    - channel: events
      allow: [disconnect]
    - channel: events
      allow: []
    - channel: events
users:
  alice: [r]
`)
	expect(t, list, path,
		w(4, "roles.r[0].allow[1]", "a queue is not read", "write consume"),
		w(6, "roles.r[1].allow[1]", "no position to move", "write, read, delete"),
		w(8, "roles.r[2].allow[0]", "not deleted by clients", "write, read, seek"),
		w(8, "roles.r[2].allow[1]", "only a queue is consumed"),
		w(12, "roles.r[4].allow[0]", "seek is not a verb of a topic: rule", "write, read"),
		w(12, "roles.r[4].allow[1]", "unknown verb (publishing is write); here the verbs are write, read"),
		w(12, "roles.r[4].allow[3]", "listed twice"),
		w(14, "roles.r[5].allow[0]", "write is not a verb of a broker: sessions rule", "disconnect"),
		w(16, "roles.r[6].allow[0]", "granted by a broker: sessions rule"),
		w(18, "roles.r[7].allow", "names no verb"),
		w(19, "roles.r[8].allow", "missing; a rule grants the verbs allow: lists (here write, read, seek)"))
}

func TestChannelNames(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: evnets
      allow: [read]
    - channel: "%u"
      filter: "events/%u/#"
      allow: [read]
    - channel: "x/#"
      allow: [read]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(3, "roles.r[0].channel", "no channel of the configuration has this name; did you mean events?"),
		w(5, "roles.r[1].channel", "never substituted", "narrow it with filter:"),
		w(8, "roles.r[2].channel", "no channel of the configuration has this name", "grant it with a topic: rule"))
}

func TestPlaceholdersOtherThanUserAndClientAreRefused(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "home/%U/#"
      allow: [read]
    - topic: "home/50%"
      allow: [read]
    - topic: "home/%u-%c/#"
      allow: [read]
users:
  alice:
    roles: [r]
    client_ids: ["%u-*", "%c", "%i-*"]
`)
	expect(t, list, path,
		w(3, "roles.r[0].topic", `"%U" is not substituted: only %u (the user name) and %c (the client id) are`),
		w(5, "roles.r[1].topic", "a % at the end is not substituted"),
		w(12, `users.alice.client_ids[1]`, "%c would admit every id"),
		w(12, `users.alice.client_ids[2]`, `"%i" is not substituted: only %u (the user name) is`))
}

func TestSeekAndConsumeCannotBeNarrowed(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: events
      filter: "events/%u/#"
      allow: [read, seek]
    - channel: jobs
      filter: "jobs/resize/#"
      allow: [consume]
    - channel: jobs
      filter: "jobs/resize/#"
      allow: [write]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(4, "roles.r[0].filter", "seek acts on the whole channel", "put seek in a rule of its own without filter:"),
		w(7, "roles.r[1].filter", "consume acts on the whole channel"))
}

func TestRuleShapes(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - channel: events
      topic: "x/#"
      allow: [read]
    - allow: [read]
    - chanel: events
      allow: [read]
    - topic: "x/#"
      filter: "x/y"
      allow: [read]
    - broker: sessions
      filter: "x"
      allow: [disconnect]
    - broker: everything
      allow: [disconnect]
  "bad role":
    - topic: "y/#"
      allow: [read]
users:
  alice: [r]
`)
	expect(t, list, path,
		w(3, "roles.r[0]", "one subject, and this one names channel and topic"),
		w(6, "roles.r[1]", "a rule names what it grants on"),
		w(7, "roles.r[2].chanel", "unknown key; did you mean channel?"),
		w(10, "roles.r[3].filter", "a topic: rule is its own filter"),
		w(13, "roles.r[4].filter", "a broker: rule has no filter"),
		w(15, "roles.r[5].broker", "it is sessions (allow: [disconnect]) or features"),
		w(17, "roles.bad role", `role name "bad role": ' ' is not allowed`))
}

func TestUsersEntriesNeedRolesThatExist(t *testing.T) {
	list, path := findingsOf(t, `roles:
  readers:
    - topic: "x/#"
      allow: [read]
users:
  alice: [readres]
  bob: []
  carol:
  dave:
    limits: {publish_rate: 5}
  erin:
    roles: []
  frank:
    roles: [readers, readers]
  grace: readers
  "h\u0007": [readers]
`)
	expect(t, list, path,
		w(6, "users.alice[0]", "no role of roles: has this name; did you mean readers?"),
		w(7, "users.bob", "names no role"),
		w(8, "users.carol", "names no role"),
		w(9, "users.dave.roles", "missing; an entry gives at least one role"),
		w(12, "users.erin.roles", "names no role"),
		w(14, "users.frank.roles[1]", "listed twice"),
		w(15, "users.grace", "an entry is a list of roles"),
		w(16, `users["h\a"]`, "never holds a control character"))
}

func TestClientIDsMayNotBeEmpty(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "x/#"
      allow: [read]
users:
  a:
    roles: [r]
    client_ids: ""
  b:
    roles: [r]
    client_ids: []
  c:
    roles: [r]
    client_ids:
  d:
    roles: [r]
    client_ids: ["%u-1", ""]
`)
	expect(t, list, path,
		w(8, "users.a.client_ids", "an empty pattern admits no client id"),
		w(11, "users.b.client_ids", "names no client id"),
		w(14, "users.c.client_ids", "names no client id"),
		w(17, "users.d.client_ids[1]", "an empty pattern admits no client id"))
}

func TestLimitsFigures(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "x/#"
      allow: [write]
users:
  a:
    roles: [r]
    limits: {publish_rate: 0, publish_bytes: 0}
  b:
    roles: [r]
    limits: {publish_rate: 1.5, publish_bytes: 64MB}
  c:
    roles: [r]
    limits: {}
  d:
    roles: [r]
    limits: {publish_rates: 5}
    client_id: "x"
`)
	expect(t, list, path,
		w(8, "users.a.limits.publish_rate", "a zero rate admits nothing"),
		w(8, "users.a.limits.publish_bytes", "a zero byte rate admits nothing"),
		w(11, "users.b.limits.publish_rate", "whole number of messages per second"),
		w(11, "users.b.limits.publish_bytes", "write 64MiB"),
		w(14, "users.c.limits", "names no figure"),
		w(17, "users.d.limits.publish_rates", "did you mean publish_rate?"),
		w(18, "users.d.client_id", "did you mean client_ids?"))
}

func TestTopLevelKeys(t *testing.T) {
	list, path := findingsOf(t, `rolse:
  r: []
clients:
  sensor-1: [r]
`)
	expect(t, list, path,
		w(1, "rolse", "unknown key; did you mean roles?"),
		w(3, "clients", "never client ids", "client_ids:"),
		w(1, "users", "missing"))
}

// docs/configuration.md "The ACL file": two patterns with as many literal characters that one
// name matches are refused, the finding naming both and such a name.
func TestEquallyExactPatternsMatchingOneNameAreRefused(t *testing.T) {
	list, path := findingsOf(t, `roles:
  r:
    - topic: "x/#"
      allow: [read]
users:
  "a*": [r]
  "*b": [r]
  alice: [r]
  "alice*": [r]
  "x*y": [r]
  "*xy": [r]
  "*": [r]
  "": [r]
  "dev-*": [r]
  "*-01": [r]
  "abcde*": [r]
`)
	expect(t, list, path,
		w(7, `users["*b"]`, `and "a*" (line 6) both match the name "ab" with 1 literal character each`, "make one more exact"),
		w(9, `users["alice*"]`, `and "alice" (line 8) both match the name "alice" with 5 literal characters`),
		w(11, `users["*xy"]`, `and "x*y" (line 10) both match the name "xy"`),
		w(13, `users[""]`, `and "*" (line 12) both match the name ""`))
}

// Every finding of a file comes in one pass, in line order.
func TestEveryFindingAtOnceInLineOrder(t *testing.T) {
	list, _ := findingsOf(t, `roles:
  r:
    - channel: jobs
      allow: [read]
    - topic: "events/#"
      allow: [read]
    - broker: features
      deny: [retain]
users:
  alice: [nobody]
  "*": []
`)
	if len(list) != 5 {
		t.Fatalf("%d findings, want 5:\n%s", len(list), render(list))
	}
	for i := 1; i < len(list); i++ {
		if list[i].Line < list[i-1].Line {
			t.Errorf("findings out of line order:\n%s", render(list))
		}
	}
}

func TestYAMLLevelFindings(t *testing.T) {
	list, path := findingsOf(t, "roles:\n  r: [\nusers: {}\n")
	if len(list) != 1 || list[0].Key != "(yaml)" || !strings.Contains(list[0].Problem, "not valid YAML") || !strings.HasPrefix(list[0].String(), path+":") {
		t.Errorf("an unparsable file: %s", render(list))
	}
	list, path = findingsOf(t, "roles:\n  r: []\n  r: []\nusers:\n  alice: [r]\n---\nusers: {}\n")
	expect(t, list, path,
		w(3, "roles.r", "written twice (lines 2 and 3)"),
		w(6, "(yaml)", "a second YAML document (after ---); an ACL file is one document"))
	list, path = findingsOf(t, "roles: !include roles.yaml\nusers:\n  alice: !!str x\n  bob: [!custom r]\n")
	expect(t, list, path,
		w(1, "roles", "!include is read in the configuration only; write an ACL file out whole"),
		w(3, "users.alice", "an entry is a list of roles"),
		w(4, "users.bob[0]", "unknown tag !custom"))
}

// Invariant 13: the file is read through a bound, and aliases cannot make
// the reader walk more than a bounded number of values.
func TestInvariant13_ACLFileReadingIsBounded(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	big := write(t, dir, "big.yaml", "users: {}\n#"+strings.Repeat("x", config.MaxFileSize)+"\n")
	_, err := Load(big, cfg)
	if err == nil || !strings.Contains(err.Error(), "larger than 4MiB, the most an ACL file may be") {
		t.Errorf("a file past %d bytes: %v", config.MaxFileSize, err)
	}

	// One list of 1,000 rules, and 2,000 roles each an alias of it:
	// about 8,000,000 values if walked.
	var b strings.Builder
	b.WriteString("roles:\n  r0: &rules\n")
	for i := 0; i < 1000; i++ {
		b.WriteString("    - {topic: \"x/#\", allow: [read]}\n")
	}
	for i := 1; i <= 2000; i++ {
		b.WriteString("  r" + strconv.Itoa(i) + ": *rules\n")
	}
	b.WriteString("users:\n  alice: [r0]\n")
	list, _ := findingsOf(t, b.String())
	found := false
	for _, f := range list {
		found = found || strings.Contains(f.Problem, "expands to more than 1000000 values through aliases")
	}
	if !found {
		t.Errorf("an alias bomb was not refused by the node bound:\n%s", render(list))
	}

	// One rule of 1,000 brace alternatives, used by 1,500 roles: the
	// expansions count against the same bound.
	b.Reset()
	alts := make([]string, 1000)
	for i := range alts {
		alts[i] = "a" + strconv.Itoa(i)
	}
	b.WriteString("roles:\n  r0: &rules\n    - {topic: \"{" + strings.Join(alts, ",") + "}/x\", allow: [read]}\n")
	for i := 1; i <= 1500; i++ {
		b.WriteString("  r" + strconv.Itoa(i) + ": *rules\n")
	}
	b.WriteString("users:\n  alice: [r0]\n")
	list, _ = findingsOf(t, b.String())
	if len(list) != 1 || !strings.Contains(list[0].Problem, "expands to more than 1000000 values") {
		t.Errorf("brace expansions multiplied by aliases were not bounded:\n%s", render(list))
	}
}

// A valid file with every kind of rule loads, and its stats count it.
func TestAValidFileLoads(t *testing.T) {
	a := mustLoad(t, `roles:
  base: &common
    - topic: "status/#"
      allow: [read]
  shared: *common
  devices:
    - channel: iot
      filter: "iot/%u/events/+"
      allow: [write]
    - channel: state
      filter: "site/%u/state"
      allow: [write, read, delete]
    - channel: jobs
      allow: [write, consume]
    - channel: events
      allow: [read, seek]
    - topic: "devices/%u/#"
      allow: [write, read]
  admin:
    - broker: sessions
      allow: [disconnect]
    - broker: features
      deny: [qos2]
users:
  "dev-*": [base, devices]
  root:
    roles: [admin, base]
    limits: {publish_rate: none, publish_bytes: 64KiB}
    client_ids: ["%u-console", "ops-*"]
`)
	if s := a.Stats(); s != (Stats{Roles: 4, Rules: 9, Patterns: 2}) {
		t.Errorf("stats %+v", s)
	}
}
