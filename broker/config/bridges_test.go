package config

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"saguin.dev/bridge"
)

// loadBridges loads baseYAML with block (YAML text, "{{dir}}" standing for
// dir) appended, and returns what the loader read and every finding and
// warning, whether or not the load would fail.
func loadBridges(t *testing.T, dir, block string) (*Config, []Finding, []Finding) {
	t.Helper()
	text := strings.ReplaceAll(baseYAML+block, "{{dir}}", dir)
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	l := newLoader(path, strconv.IntSize)
	cfg := l.load(path)
	return cfg, l.findings, l.warnings
}

// withoutOutHalf drops the refusal every out and both rule gets from this
// build (checked on its own in TestBridgesOutRulesRefusedAfterTheirChecks)
// and returns the other findings.
func withoutOutHalf(list []Finding) []Finding {
	var rest []Finding
	for _, f := range list {
		if f.Problem != OutHalfMissing {
			rest = append(rest, f)
		}
	}
	return rest
}

func TestBridgesBlockReadWhole(t *testing.T) {
	dir := t.TempDir()
	cert, key := certFiles(t, dir, "client")
	ca, _ := certFiles(t, dir, "ca")
	block := `
bridges:
  shore:
    peer: tls://hub.example.net:8883
    client_id: vessel-7
    ca_file: ` + ca + `
    cert_file: ` + cert + `
    key_file: ` + key + `
    topics:
      - {filter: "fleet/+/{telemetry,alarms}/#", direction: out, topic: "shore/$1/$#"}
      - {filter: "cmd/+", direction: in, topic: "commands/$1"}
      - {filter: "sync/#", direction: both}
  backup:
    peer: ws://10.0.0.9:8080/mqtt
    client_id: vessel-7
    session_expiry: 7d
    receive_maximum: 100
    ack_interval: 50ms
    topics:
      - {filter: "orders/#", direction: out, topic: "edge/orders/$#"}
`
	cfg, list, warnings := loadBridges(t, dir, block)
	if rest := withoutOutHalf(list); len(rest) != 0 {
		t.Fatalf("a valid block has findings: %v", rest)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	if len(cfg.Bridges) != 2 {
		t.Fatalf("%d bridges read, want 2", len(cfg.Bridges))
	}
	s := cfg.Bridges[0]
	if s.Name != "shore" || s.Scheme != "tls" || s.Host != "hub.example.net:8883" || s.ClientID != "vessel-7" || !s.Encrypted() {
		t.Errorf("shore read as %+v", s)
	}
	if s.SessionExpiry != 24*time.Hour || s.ReceiveMaximum != 20 || s.AckInterval != 5*time.Millisecond {
		t.Errorf("shore's defaults: session_expiry %v, receive_maximum %d, ack_interval %v; want 1d, 20, 5ms", s.SessionExpiry, s.ReceiveMaximum, s.AckInterval)
	}
	if s.CAFile != ca || s.CertFile != cert || s.KeyFile != key {
		t.Errorf("shore's files: %q %q %q", s.CAFile, s.CertFile, s.KeyFile)
	}
	// The braced filter is two rules; the written spelling stays with each.
	var got []string
	for _, r := range s.Rules {
		got = append(got, r.Direction.String()+" "+r.Filter+" -> "+r.Template+" #"+strconv.Itoa(r.Index))
	}
	want := []string{
		"out fleet/+/telemetry/# -> shore/$1/$# #0",
		"out fleet/+/alarms/# -> shore/$1/$# #0",
		"in cmd/+ -> commands/$1 #1",
		"both sync/# ->  #2",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("shore's rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if s.Rules[0].Written != "fleet/+/{telemetry,alarms}/#" {
		t.Errorf("written filter %q", s.Rules[0].Written)
	}
	if mapped, ok, err := s.Rules[1].Map("fleet/v7/alarms/fire/deck2"); !ok || err != nil || mapped != "shore/v7/fire/deck2" {
		t.Errorf("the second spelling maps to %q, %v, %v", mapped, ok, err)
	}
	b := cfg.Bridges[1]
	if b.Scheme != "ws" || b.SessionExpiry != 7*24*time.Hour || b.ReceiveMaximum != 100 || b.AckInterval != 50*time.Millisecond || b.Encrypted() {
		t.Errorf("backup read as %+v", b)
	}
}

// Every refusal is a finding on the key written, saying what to fix; the
// block's own refusal comes beside it, never instead of it.
func TestBridgesRefusals(t *testing.T) {
	dir := t.TempDir()
	cert, key := certFiles(t, dir, "client")
	one := func(body string) string {
		return "\nbridges:\n  up:\n" + body
	}
	okRule := "    topics:\n      - {filter: \"a/#\", direction: out, topic: \"b/$#\"}\n"
	peer := "    peer: tls://hub:8883\n    client_id: edge-1\n"
	cases := []struct {
		name, block, key, want string
	}{
		{"mqtt scheme", one("    peer: mqtt://hub:1883\n    client_id: e\n" + okRule), "bridges.up.peer", "write tcp://hub:1883"},
		{"mqtts scheme", one("    peer: mqtts://hub:8883\n    client_id: e\n" + okRule), "bridges.up.peer", "write tls://hub:8883"},
		{"other scheme", one("    peer: ftp://hub:21\n    client_id: e\n" + okRule), "bridges.up.peer", "not one of tcp, tls, ws or wss"},
		{"no port", one("    peer: tls://hub\n    client_id: e\n" + okRule), "bridges.up.peer", "tls://hub:8883"},
		{"port out of range", one("    peer: tcp://hub:70000\n    client_id: e\n" + okRule), "bridges.up.peer", "not 1 to 65535"},
		{"user in URL", one("    peer: tls://me@hub:8883\n    client_id: e\n" + okRule), "bridges.up.peer", "client certificate only"},
		{"no peer", one("    client_id: e\n" + okRule), "bridges.up.peer", "missing"},
		{"no client_id", one("    peer: tls://hub:8883\n" + okRule), "bridges.up.client_id", "missing"},
		{"empty client_id", one("    peer: tls://hub:8883\n    client_id: \"\"\n" + okRule), "bridges.up.client_id", "session it keeps for us"},
		{"session_expiry none", one(peer + "    session_expiry: none\n" + okRule), "bridges.up.session_expiry", "someone else's storage"},
		{"session_expiry zero", one(peer + "    session_expiry: 0s\n" + okRule), "bridges.up.session_expiry", "lost"},
		{"session_expiry past MQTT", one(peer + "    session_expiry: 50000d\n" + okRule), "bridges.up.session_expiry", "136 years"},
		{"receive_maximum 0", one(peer + "    receive_maximum: 0\n" + okRule), "bridges.up.receive_maximum", "holds up to 20MiB"},
		{"receive_maximum 65536", one(peer + "    receive_maximum: 65536\n" + okRule), "bridges.up.receive_maximum", "1 to 65535"},
		{"ack_interval 2s", one(peer + "    ack_interval: 2s\n" + okRule), "bridges.up.ack_interval", "records per ack_interval"},
		{"ack_interval 0", one(peer + "    ack_interval: 0s\n" + okRule), "bridges.up.ack_interval", "1ms to 1s"},
		{"ca_file on tcp", one("    peer: tcp://hub:1883\n    client_id: e\n    ca_file: " + cert + "\n" + okRule), "bridges.up.ca_file", "not encrypted"},
		{"cert without key", one(peer + "    cert_file: " + cert + "\n" + okRule), "bridges.up.cert_file", "add key_file"},
		{"key without cert", one(peer + "    key_file: " + key + "\n" + okRule), "bridges.up.key_file", "add cert_file"},
		{"cert and key not a pair", one(peer + "    cert_file: " + cert + "\n    key_file: " + cert + "\n" + okRule), "bridges.up.cert_file", "bridges.up"},
		{"relative ca_file", one(peer + "    ca_file: ca.pem\n" + okRule), "bridges.up.ca_file", "relative"},
		{"username", one(peer + "    username: me\n" + okRule), "bridges.up.username", "client certificate only"},
		{"unknown key", one(peer + "    recieve_maximum: 5\n" + okRule), "bridges.up.recieve_maximum", "receive_maximum"},
		{"no topics", one(peer), "bridges.up.topics", "carries nothing"},
		{"empty topics", one(peer + "    topics: []\n"), "bridges.up.topics", "carries nothing"},
		{"no direction", one(peer + "    topics:\n      - {filter: a/#, topic: b/$#}\n"), "bridges.up.topics[0].direction", "in (the peer's records stored here)"},
		{"bad direction", one(peer + "    topics:\n      - {filter: a/#, direction: up, topic: b/$#}\n"), "bridges.up.topics[0].direction", "in, out or both"},
		{"no filter", one(peer + "    topics:\n      - {direction: in, topic: b}\n"), "bridges.up.topics[0].filter", "missing"},
		{"no topic on in", one(peer + "    topics:\n      - {filter: a/+, direction: in}\n"), "bridges.up.topics[0].topic", "needs the name"},
		{"topic on both", one(peer + "    topics:\n      - {filter: a/+, direction: both, topic: b/$1}\n"), "bridges.up.topics[0].topic", "remove topic"},
		{"saguin filter", one(peer + "    topics:\n      - {filter: $saguin/catalogue/x, direction: in, topic: c}\n"), "bridges.up.topics[0].filter", "$saguin/"},
		{"both on $SYS", one(peer + "    topics:\n      - {filter: $SYS/#, direction: both}\n"), "bridges.up.topics[0].filter", "a both rule keeps names"},
		{"dead a+b level", one(peer + "    topics:\n      - {filter: fleet/a+b/#, direction: out, topic: x/$#}\n"), "bridges.up.topics[0].filter", "+ stands for a whole level"},
		{"hash filter without $#", one(peer + "    topics:\n      - {filter: a/#, direction: in, topic: b}\n"), "bridges.up.topics[0].topic", "must end in $#"},
		{"template names a missing level", one(peer + "    topics:\n      - {filter: a/+, direction: in, topic: b/$2}\n"), "bridges.up.topics[0].topic", "$2 names a + level"},
		{"bad brace", one(peer + "    topics:\n      - {filter: \"a/{b\", direction: in, topic: c}\n"), "bridges.up.topics[0].filter", "never closed"},
		{"too deep", one(peer + "    topics:\n      - {filter: " + strings.Repeat("a/", DefaultMaxTopicLevels) + "#, direction: out, topic: x/$#}\n"),
			"bridges.up.topics[0].filter", "limits.max_topic_levels"},
		{"duplicate out rule through braces", one(peer + "    topics:\n      - {filter: \"x/{a,b}\", direction: out, topic: y}\n      - {filter: x/a, direction: out, topic: y}\n"),
			"bridges.up.topics[1]", "already rule 0's"},
		{"duplicate client_id at one peer", "\nbridges:\n  a:\n" + peer + okRule + "  b:\n" + peer + okRule, "bridges.b.client_id", "bridge a uses client_id \"edge-1\" at hub:8883 too"},
		{"bad bridge name", "\nbridges:\n  \"up/down\":\n" + peer + okRule, "bridges.up/down", "the bridge's name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, list, _ := loadBridges(t, dir, c.block)
			expectOne(t, withoutOutHalf(list), c.key, c.want)
		})
	}
}

// Where two bridges share a client_id, they differ by peer: allowed.
func TestBridgesSameClientIDAtTwoPeers(t *testing.T) {
	dir := t.TempDir()
	block := `
bridges:
  a:
    peer: tls://hub-a:8883
    client_id: edge-1
    topics: [{filter: "x/#", direction: out, topic: "a/$#"}]
  b:
    peer: tls://hub-b:8883
    client_id: edge-1
    topics: [{filter: "x/#", direction: out, topic: "a/$#"}]
`
	cfg, list, _ := loadBridges(t, dir, block)
	if rest := withoutOutHalf(list); len(rest) != 0 {
		t.Fatalf("findings: %v", rest)
	}
	if len(cfg.Bridges) != 2 {
		t.Fatalf("%d bridges", len(cfg.Bridges))
	}
}

// A "+" level the template does not use refuses nothing: it is a warning
// on the topic, naming the level.
func TestBridgesUnusedLevelIsANote(t *testing.T) {
	dir := t.TempDir()
	block := `
bridges:
  up:
    peer: tls://hub:8883
    client_id: edge-1
    topics:
      - {filter: "site/+/+/temp", direction: out, topic: "temps/$2"}
`
	cfg, list, warnings := loadBridges(t, dir, block)
	if rest := withoutOutHalf(list); len(rest) != 0 {
		t.Fatalf("findings: %v", rest)
	}
	if len(warnings) != 1 || warnings[0].Key != "bridges.up.topics[0].topic" || !strings.Contains(warnings[0].Problem, "$1") {
		t.Fatalf("warnings %v, want one on bridges.up.topics[0].topic naming $1", warnings)
	}
	if cfg.Bridges[0].Rules[0].Direction != bridge.Out {
		t.Fatalf("rule read as %+v", cfg.Bridges[0].Rules[0])
	}
}

// A block of in rules loads: this build runs the in half of a link.
func TestBridgesInRulesLoad(t *testing.T) {
	dir := t.TempDir()
	path := build(t, dir, p("bridges", m("up", m("peer", "tcp://hub:1883", "client_id", "e",
		"topics", []any{m("filter", "cmd/+", "direction", "in", "topic", "orders/$1")}))))
	cfg := mustLoad(t, path)
	if len(cfg.Bridges) != 1 || cfg.Bridges[0].Rules[0].Filter != "cmd/+" {
		t.Fatalf("bridges %+v", cfg.Bridges)
	}
}

// An out or both rule is checked like any rule — its mistakes are
// findings of their own — and then refused once, on its direction, as
// written (a braced filter's spellings share the one finding).
func TestBridgesOutRulesRefusedAfterTheirChecks(t *testing.T) {
	dir := t.TempDir()
	block := `
bridges:
  up:
    peer: tls://hub:8883
    client_id: edge-1
    topics:
      - {filter: "a/{b,c}/#", direction: out, topic: "x/$#"}
      - {filter: "s/#", direction: both}
      - {filter: "in/+", direction: in, topic: "got/$1"}
`
	_, list, _ := loadBridges(t, dir, block)
	var keys []string
	for _, f := range list {
		if f.Problem != OutHalfMissing {
			t.Errorf("finding %s", f)
			continue
		}
		keys = append(keys, f.Key)
	}
	if strings.Join(keys, " ") != "bridges.up.topics[0].direction bridges.up.topics[1].direction" {
		t.Fatalf("out-half refusals on %q; want one on each of rules 0 and 1", keys)
	}
	// A mistake in an out rule is still its own finding.
	_, list, _ = loadBridges(t, dir, "\nbridges:\n  up:\n    peer: tls://hub:8883\n    client_id: e\n    topics:\n      - {filter: a/#, direction: out, topic: x}\n")
	expectOne(t, withoutOutHalf(list), "bridges.up.topics[0].topic", "must end in $#")
}

// An in rule landing on topics no channel claims is a warning: records are
// acknowledged once handed to the fan-out, and nothing keeps them.
func TestBridgesInRuleToBroadcastWarns(t *testing.T) {
	dir := t.TempDir()
	block := `
bridges:
  up:
    peer: tcp://hub:1883
    client_id: e
    topics:
      - {filter: "x/+", direction: in, topic: "orders/$1"}
      - {filter: "y/+", direction: in, topic: "live/$1"}
`
	_, list, warnings := loadBridges(t, dir, block)
	if len(list) != 0 {
		t.Fatalf("findings %v", list)
	}
	if len(warnings) != 1 || warnings[0].Key != "bridges.up.topics[1]" || !strings.Contains(warnings[0].Problem, "live/+") {
		t.Fatalf("warnings %v; want one on rule 1 (live/+ is broadcast; orders/+ is the orders channel)", warnings)
	}
}

// The example of docs/bridge.md "Configuration" is a block this build
// checks clean (its certificate paths pointed at files made here): only
// the block's own refusal, and the rules the page describes.
func TestBridgesDocumentedExampleChecksClean(t *testing.T) {
	doc, err := os.ReadFile("../../docs/bridge.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "```yaml\nbridges:")
	if start < 0 {
		t.Fatal("docs/bridge.md has no ```yaml block starting with bridges:")
	}
	block := text[start+len("```yaml\n"):]
	block = block[:strings.Index(block, "```")]
	dir := t.TempDir()
	cert, key := certFiles(t, dir, "client")
	ca, _ := certFiles(t, dir, "ca")
	for from, to := range map[string]string{"/etc/saguin/hub-ca.pem": ca, "/etc/saguin/vessel-7.pem": cert, "/etc/saguin/vessel-7.key": key} {
		if !strings.Contains(block, from) {
			t.Fatalf("the example no longer names %s", from)
		}
		block = strings.ReplaceAll(block, from, to)
	}
	cfg, list, warnings := loadBridges(t, dir, "\n"+block)
	if rest := withoutOutHalf(list); len(rest) != 0 || len(warnings) != 0 {
		t.Fatalf("the documented example has findings %v, warnings %v", rest, warnings)
	}
	if len(cfg.Bridges) != 1 || len(cfg.Bridges[0].Rules) != 4 {
		t.Fatalf("read %+v; want one bridge of four rules (the braced filter is two)", cfg.Bridges)
	}
	r := cfg.Bridges[0].Rules[2]
	if got, ok, err := r.Map("commands/vessel-7"); !ok || err != nil || got != "cmd" {
		t.Fatalf("commands/vessel-7 by %q -> %q maps to %q, %v, %v; the page says cmd", r.Filter, r.Template, got, ok, err)
	}
}
