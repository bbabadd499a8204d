package config

import (
	"strings"
	"testing"
)

type ruleCase struct {
	name    string
	patches []patch
	key     string // the finding's key
	want    string // a substring of the rendered finding
}

func runRules(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			expectOne(t, findings(t, build(t, dir, tc.patches...)), tc.key, tc.want)
		})
	}
}

func m(kv ...any) map[string]any {
	out := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func TestBaseConfigurationIsValid(t *testing.T) {
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir))
	if len(cfg.Channels) != 4 {
		t.Fatalf("channels = %d, want 4 (orders, state, jobs, jobs__dlq)", len(cfg.Channels))
	}
}

func TestRulesBroker(t *testing.T) {
	runRules(t, []ruleCase{
		{"id missing", []patch{p("broker.id", del)}, "broker.id", "missing; write the broker's name"},
		{"id empty", []patch{p("broker.id", " ")}, "broker.id", "it is empty"},
		{"log level", []patch{p("broker.log_level", "verbose")}, "broker.log_level",
			`broker.log_level "verbose": it is one of debug, info, warn or error; omit the key for info`},
		{"pid file relative", []patch{p("broker.pid_file", "run/saguin.pid")}, "broker.pid_file", "the path is relative"},
		{"log_file", []patch{p("broker.log_file", "/var/log/saguin.log")}, "broker.log_file", "stdout only"},
		{"limits at top level", []patch{p("limits", m("max_message_size", "1MiB"))}, "limits", "limits live under broker.limits; move this block under broker:"},
		{"bridges out rule", []patch{p("bridges", m("up", m("peer", "tls://x:8883", "client_id", "e", "topics", []any{m("filter", "a/#", "direction", "out", "topic", "b/$#")})))}, "bridges.up.topics[0].direction", "in rules only"},
		{"unknown top-level key", []patch{p("chanels", m())}, "chanels", "unknown key; did you mean channels?"},
		{"unknown broker key", []patch{p("broker.log_levle", "info")}, "broker.log_levle", "did you mean log_level?"},
		{"broker not a block", []patch{p("broker", "edge")}, "broker", "this is a block of keys"},
		{"broker missing", []patch{p("broker", del)}, "broker", "missing"},
	})
}

func TestRulesMQTT(t *testing.T) {
	runRules(t, []ruleCase{
		{"protocol 3.1", []patch{p("broker.mqtt.min_protocol_version", "3.1")}, "broker.mqtt.min_protocol_version", "never admitted"},
		{"protocol 4", []patch{p("broker.mqtt.min_protocol_version", 4)}, "broker.mqtt.min_protocol_version", `it is "3.1.1" (the default) or "5"`},
		{"password file relative", []patch{p("broker.mqtt.password_file", "passwd")}, "broker.mqtt.password_file", "relative"},
		{"acl file relative", []patch{p("broker.mqtt.acl_file", "acl.yaml"), p("broker.mqtt.password_file", "/etc/saguin/passwd")},
			"broker.mqtt.acl_file", "relative"},
		{"acl without authenticator", []patch{p("broker.mqtt.acl_file", "/etc/saguin/acl.yaml")}, "broker.mqtt.acl_file", "an ACL needs someone to name"},
		{"anonymous true beside acl", []patch{p("broker.mqtt.acl_file", "/etc/saguin/acl.yaml"),
			p("broker.mqtt.password_file", "/etc/saguin/passwd"), p("broker.mqtt.allow_anonymous", true)},
			"broker.mqtt.allow_anonymous", "true beside broker.mqtt.acl_file is refused"},
		{"anonymous false without password file", []patch{p("broker.mqtt.allow_anonymous", false)},
			"broker.mqtt.allow_anonymous", "admits nobody"},
		{"door anonymous false without password file", []patch{p("broker.mqtt.listen.tcp", m("address", ":1883", "allow_anonymous", false))},
			"broker.mqtt.listen.tcp.allow_anonymous", "admits nobody"},
		{"allow_anonymous not bool", []patch{p("broker.mqtt.allow_anonymous", "yes")}, "broker.mqtt.allow_anonymous", "it is true or false"},
		{"tcp without address", []patch{p("broker.mqtt.listen.tcp", m("password_file", "/etc/p"))}, "broker.mqtt.listen.tcp.address", "missing"},
		{"address without port", []patch{p("broker.mqtt.listen.tcp", m("address", "localhost"))}, "broker.mqtt.listen.tcp.address", "it is host:port"},
		{"port out of range", []patch{p("broker.mqtt.listen.tcp", m("address", ":70000"))}, "broker.mqtt.listen.tcp.address", "out of range"},
		{"link-local without zone", []patch{p("broker.mqtt.listen.tcp", m("address", "[fe80::1]:1883"))}, "broker.mqtt.listen.tcp.address", "needs its interface"},
		{"empty zone", []patch{p("broker.mqtt.listen.tcp", m("address", "[fe80::1%]:1883"))}, "broker.mqtt.listen.tcp.address", "not an IP address"},
		{"multicast", []patch{p("broker.mqtt.listen.tcp", m("address", "[ff02::1]:1883"))}, "broker.mqtt.listen.tcp.address", "multicast"},
		{"bad host name", []patch{p("broker.mqtt.listen.tcp", m("address", "bad_host:1883"))}, "broker.mqtt.listen.tcp.address", "neither an IP address nor a host name"},
		{"unknown service", []patch{p("broker.mqtt.listen.tcp", m("address", ":no-such-service-x"))}, "broker.mqtt.listen.tcp.address", "service name"},
		{"port clash tcp ws", []patch{p("broker.mqtt.listen.tcp", m("address", "0.0.0.0:1883")), p("broker.mqtt.listen.ws", m("address", "127.0.0.1:1883"))},
			"broker.mqtt.listen.ws.address", `would bind the port of broker.mqtt.listen.tcp "0.0.0.0:1883"`},
		{"port clash mapped v4", []patch{p("broker.mqtt.listen.tcp", m("address", "127.0.0.1:1883")), p("broker.mqtt.listen.ws", m("address", "[::ffff:127.0.0.1]:01883"))},
			"broker.mqtt.listen.ws.address", "would bind the port"},
		{"port clash with default door", []patch{p("broker.operations.listen.tcp", m("address", "127.0.0.1:1883"))},
			"broker.operations.listen.tcp.address", "the default"},
		{"name clash across kinds", []patch{p("broker.mqtt.listen.tcp", []any{m("name", "ws", "address", ":1883"), m("name", "lan", "address", ":1884")}),
			p("broker.mqtt.listen.ws", m("address", ":8080"))}, "broker.mqtt.listen.ws", `door name "ws" is also broker.mqtt.listen.tcp[ws]`},
		{"second door unnamed", []patch{p("broker.mqtt.listen.tcp", []any{m("name", "a", "address", ":1883"), m("address", ":1884")})},
			"broker.mqtt.listen.tcp[1]", "needs a name on every entry"},
		{"name on a single door", []patch{p("broker.mqtt.listen.tcp", m("name", "lan", "address", ":1883"))},
			"broker.mqtt.listen.tcp.name", "a single door is named after its kind"},
		{"bad door name", []patch{p("broker.mqtt.listen.tcp", []any{m("name", "a b", "address", ":1883")})},
			"broker.mqtt.listen.tcp[a b].name", "is not allowed"},
		{"unix relative", []patch{p("broker.mqtt.listen.unix", m("path", "mqtt.sock"))}, "broker.mqtt.listen.unix.path", "relative"},
		{"unix too long", []patch{p("broker.mqtt.listen.unix", m("path", "/"+strings.Repeat("s", 120)))}, "broker.mqtt.listen.unix.path", "at most 107"},
		{"unix dot", []patch{p("broker.mqtt.listen.unix", m("path", "/run/.."))}, "broker.mqtt.listen.unix.path", "file name"},
		{"unix path clash", []patch{p("broker.mqtt.listen.unix", m("path", "/run/s/mqtt.sock")),
			p("broker.operations.listen.unix", m("path", "/run/s/../s/mqtt.sock"))}, "broker.operations.listen.unix.path", "is also the socket of broker.mqtt.listen.unix"},
		{"unix path is a directory", []patch{p("broker.mqtt.listen.unix", m("path", "{{dir}}"))}, "broker.mqtt.listen.unix.path", "not a socket"},
		{"unix tls", []patch{p("broker.mqtt.listen.unix", m("path", "/run/s.sock", "tls", m("cert_file", "/c")))}, "broker.mqtt.listen.unix.tls", "takes no tls"},
		{"proxy_protocol on tcp", []patch{p("broker.mqtt.listen.tcp", m("address", ":1883", "proxy_protocol", true))}, "broker.mqtt.listen.tcp.proxy_protocol", "unix doors only"},
		{"bad mode", []patch{p("broker.mqtt.listen.unix", m("path", "/run/s.sock", "mode", "0999"))}, "broker.mqtt.listen.unix.mode", "octal"},
		{"origin with path", []patch{p("broker.mqtt.listen.ws", m("address", ":8080", "allowed_origins", []any{"https://a.example/app"}))},
			"broker.mqtt.listen.ws.allowed_origins[0]", "no path, query or fragment; write https://a.example"},
		{"origin null", []patch{p("broker.mqtt.listen.ws", m("address", ":8080", "allowed_origins", []any{"null"}))},
			"broker.mqtt.listen.ws.allowed_origins[0]", "cannot be listed"},
		{"origin wildcard", []patch{p("broker.mqtt.listen.ws", m("address", ":8080", "allowed_origins", []any{"https://*.example"}))},
			"broker.mqtt.listen.ws.allowed_origins[0]", "without wildcards"},
		{"origin userinfo", []patch{p("broker.mqtt.listen.ws", m("address", ":8080", "allowed_origins", []any{"https://u@a.example"}))},
			"broker.mqtt.listen.ws.allowed_origins[0]", "no user name"},
		{"same_origin on tcp", []patch{p("broker.mqtt.listen.tcp", m("address", ":1883", "same_origin", false))}, "broker.mqtt.listen.tcp.same_origin", "only ws doors"},
		{"unknown door key", []patch{p("broker.mqtt.listen.tcp", m("address", ":1883", "adress", "x"))}, "broker.mqtt.listen.tcp.adress", "did you mean address?"},
		{"unknown listen kind", []patch{p("broker.mqtt.listen.udp", m("address", ":1883"))}, "broker.mqtt.listen.udp", "unknown key"},
	})
}

func TestRulesOperations(t *testing.T) {
	runRules(t, []ruleCase{
		{"no listen", []patch{p("broker.operations", m("password_file", "/etc/saguin/ops"))}, "broker.operations.listen", "at least one door"},
		{"empty listen", []patch{p("broker.operations.listen", m())}, "broker.operations.listen", "names no door"},
		{"non-loopback without auth", []patch{p("broker.operations.listen.tcp", m("address", "0.0.0.0:9090"))},
			"broker.operations.listen.tcp.address", "not a loopback address"},
		{"tls without required certs is not auth", []patch{p("broker.operations.listen.tcp", m("address", ":9090"))},
			"broker.operations.listen.tcp.address", "callers must authenticate"},
		{"allow_anonymous on door", []patch{p("broker.operations.listen.tcp", m("address", "127.0.0.1:9090", "allow_anonymous", true))},
			"broker.operations.listen.tcp.allow_anonymous", "never admits anonymous"},
		{"allow_anonymous on block", []patch{p("broker.operations", m("allow_anonymous", false, "listen", m("tcp", m("address", "127.0.0.1:9090"))))},
			"broker.operations.allow_anonymous", "never admits anonymous"},
		{"ws door", []patch{p("broker.operations.listen.ws", m("address", "127.0.0.1:9091"))}, "broker.operations.listen.ws", "tcp and unix doors only"},
		{"scrape interval low", []patch{p("broker.operations", m("min_scrape_interval", "30s", "listen", m("tcp", m("address", "127.0.0.1:9090"))))},
			"broker.operations.min_scrape_interval", "60s or more"},
		{"scrape interval sub-second", []patch{p("broker.operations", m("min_scrape_interval", "60500ms", "listen", m("tcp", m("address", "127.0.0.1:9090"))))},
			"broker.operations.min_scrape_interval", "held in whole seconds; write 60s or 61s"},
		{"ops names clash among themselves", []patch{p("broker.operations.listen.tcp", []any{m("name", "a", "address", "127.0.0.1:9090"), m("name", "a", "address", "127.0.0.1:9091")})},
			"broker.operations.listen.tcp[a]", `door name "a" is also`},
	})
	// Names are separate spaces: an MQTT door and an operations door may share one.
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir, p("broker.mqtt.listen.tcp", m("address", ":1883")), p("broker.operations.listen.tcp", m("address", "127.0.0.1:9090"))))
	if cfg.Broker.Operations == nil || cfg.Broker.Operations.Listeners[0].Name != "tcp" || cfg.Broker.Listeners[0].Name != "tcp" {
		t.Fatalf("doors = %+v / %+v", cfg.Broker.Listeners, cfg.Broker.Operations)
	}
	// A password file on the block satisfies the loopback rule for a public door.
	mustLoad(t, build(t, dir, p("broker.operations", m("password_file", "/etc/saguin/ops", "listen", m("tcp", m("address", ":9090"))))))
}

func TestRulesLimits(t *testing.T) {
	runRules(t, []ruleCase{
		{"client id length", []patch{p("broker.limits.max_client_id_length", 22)}, "broker.limits.max_client_id_length", "23 bytes"},
		{"session expiry none", []patch{p("broker.limits.max_session_expiry", "none")}, "broker.limits.max_session_expiry", "never expires is not bounded"},
		{"keepalive too long", []patch{p("broker.limits.max_keepalive", "65536s")}, "broker.limits.max_keepalive",
			"longer than MQTT can express, which is 65535 seconds or about 18 hours; write `none` for no ceiling"},
		{"keepalive sub-second", []patch{p("broker.limits.max_keepalive", "1500ms")}, "broker.limits.max_keepalive", "held in whole seconds; write 1s or 2s"},
		{"connect timeout none", []patch{p("broker.limits.connect_timeout", "none")}, "broker.limits.connect_timeout", "always bounded"},
		{"connect timeout sub-second", []patch{p("broker.limits.connect_timeout", "500ms")}, "broker.limits.connect_timeout", "held in whole seconds; write 1s"},
		{"connect size over message size", []patch{p("broker.limits.max_message_size", "64KiB"), p("broker.limits.max_connect_size", "100KiB")},
			"broker.limits.max_connect_size", "may not exceed broker.limits.max_message_size (64KiB)"},
		{"session queue none", []patch{p("broker.limits.session_queue_bytes", "none")}, "broker.limits.session_queue_bytes", "always bounded"},
		{"session queue below message size", []patch{p("broker.limits.session_queue_bytes", "512KiB")}, "broker.limits.session_queue_bytes", "below broker.limits.max_message_size (1MiB)"},
		{"subscriptions zero", []patch{p("broker.limits.max_subscriptions", 0)}, "broker.limits.max_subscriptions", "1 or more"},
		{"topic levels zero", []patch{p("broker.limits.max_topic_levels", 0)}, "broker.limits.max_topic_levels", "from 1"},
		{"topic levels none", []patch{p("broker.limits.max_topic_levels", "none")}, "broker.limits.max_topic_levels", "always bounded"},
		{"publish rate zero", []patch{p("broker.limits.publish_rate", 0)}, "broker.limits.publish_rate", "1 or more"},
		{"publish bytes zero", []patch{p("broker.limits.publish_bytes", 0)}, "broker.limits.publish_bytes", "admits nothing"},
		{"message size beyond MQTT", []patch{p("broker.limits.max_message_size", "1GiB")}, "broker.limits.max_message_size", "268435455"},
		{"message size decimal unit", []patch{p("broker.limits.max_message_size", "1MB")}, "broker.limits.max_message_size", "binary units; write 1MiB"},
		{"write timeout zero", []patch{p("broker.limits.write_timeout", "0s")}, "broker.limits.write_timeout", "or none for no ceiling"},
		{"topic length beyond MQTT", []patch{p("broker.limits.max_topic_length", 70000)}, "broker.limits.max_topic_length", "1 to 65535"},
		{"unknown limit", []patch{p("broker.limits.max_mesage_size", "1MiB")}, "broker.limits.max_mesage_size", "did you mean max_message_size?"},
	})
}

func TestRulesStorage(t *testing.T) {
	dir0 := "{{dir}}"
	runRules(t, []ruleCase{
		{"storage missing", []patch{p("broker.storage", del), p("channels", del)}, "broker.storage", "missing"},
		{"default unknown", []patch{p("broker.storage.default", "disk")}, "broker.storage.default", "the providers are main or mem"},
		{"default missing", []patch{p("broker.storage.default", del)}, "broker.storage.default", "missing"},
		{"retention period missing", []patch{p("broker.storage.default_retention_period", del)}, "broker.storage.default_retention_period", "missing"},
		{"retention bytes zero", []patch{p("broker.storage.default_retention_bytes", 0)}, "broker.storage.default_retention_bytes", "zero is refused"},
		{"retention period zero", []patch{p("broker.storage.default_retention_period", "0d")}, "broker.storage.default_retention_period", "write none to keep everything"},
		{"sqlite without file_path", []patch{p("broker.storage.providers.main", m("type", "sqlite"))}, "broker.storage.providers.main.file_path", "missing"},
		{"memory without snapshot_dir", []patch{p("broker.storage.providers.mem", m("type", "memory"))}, "broker.storage.providers.mem.snapshot_dir", "missing"},
		{"snapshot_dir relative", []patch{p("broker.storage.providers.mem.snapshot_dir", "snap")}, "broker.storage.providers.mem.snapshot_dir", "relative"},
		{"file_path on memory", []patch{p("broker.storage.providers.mem.file_path", dir0+"/x.db")}, "broker.storage.providers.mem.file_path", "is a sqlite key"},
		{"snapshot_dir on sqlite", []patch{p("broker.storage.providers.main.snapshot_dir", dir0+"/s")}, "broker.storage.providers.main.snapshot_dir", "is a memory key"},
		{"flush_interval on memory", []patch{p("broker.storage.providers.mem.flush_interval", "100ms")}, "broker.storage.providers.mem.flush_interval", "is a sqlite key"},
		{"same file", []patch{p("broker.storage.providers.other", m("type", "sqlite", "file_path", dir0+"/x/../main.db"))},
			"broker.storage.providers.other", "which provider main"},
		{"same snapshot dir", []patch{p("broker.storage.providers.mem2", m("type", "memory", "snapshot_dir", dir0+"/snap/"))},
			"broker.storage.providers.mem2", "which provider mem"},
		{"file_path is a directory", []patch{p("broker.storage.providers.main.file_path", dir0)}, "broker.storage.providers.main.file_path", "is a directory"},
		{"memory below reserve", []patch{p("broker.storage.providers.mem.max_bytes", "2MiB")}, "broker.storage.providers.mem.max_bytes",
			"at least 2064KiB: twice the reserve of broker.limits.max_message_size (1MiB) + broker.limits.max_header_bytes (8KiB)"},
		{"sqlite needs the empty database too", []patch{p("broker.storage.providers.main.max_bytes", "2100KiB")}, "broker.storage.providers.main.max_bytes",
			"more than 2152KiB"},
		{"max_bytes zero", []patch{p("broker.storage.providers.mem.max_bytes", 0)}, "broker.storage.providers.mem.max_bytes", "holds nothing"},
		{"flush too fast", []patch{p("broker.storage.providers.main.flush_interval", "5ms")}, "broker.storage.providers.main.flush_interval", "from 10ms to 1s"},
		{"flush none", []patch{p("broker.storage.providers.main.flush_interval", "none")}, "broker.storage.providers.main.flush_interval", "always synced"},
		{"flush too slow", []patch{p("broker.storage.providers.main.flush_interval", "2s")}, "broker.storage.providers.main.flush_interval", "from 10ms to 1s"},
		{"read connections", []patch{p("broker.storage.providers.main.read_connections", 9)}, "broker.storage.providers.main.read_connections", "from 0 to 8"},
		{"commit interval too long", []patch{p("broker.storage.providers.main.publish_commit_interval", "2s"), p("broker.storage.providers.main.publish_commit_max_records", 8)},
			"broker.storage.providers.main.publish_commit_interval", "from 1ms to 1s"},
		{"max records without interval", []patch{p("broker.storage.providers.main.publish_commit_max_records", 8)},
			"broker.storage.providers.main.publish_commit_max_records", "set publish_commit_interval too"},
		{"max records with none", []patch{p("broker.storage.providers.main.publish_commit_interval", "none"), p("broker.storage.providers.main.publish_commit_max_records", 8)},
			"broker.storage.providers.main.publish_commit_max_records", "a transaction per publish"},
		{"interval without max records", []patch{p("broker.storage.providers.main.publish_commit_interval", "5ms")},
			"broker.storage.providers.main.publish_commit_max_records", "missing"},
		{"max records one", []patch{p("broker.storage.providers.main.publish_commit_interval", "5ms"), p("broker.storage.providers.main.publish_commit_max_records", 1)},
			"broker.storage.providers.main.publish_commit_max_records", "from 2 to broker.limits.max_connections (10000)"},
		{"max records over connections", []patch{p("broker.limits.max_connections", 50), p("broker.storage.providers.main.publish_commit_interval", "5ms"),
			p("broker.storage.providers.main.publish_commit_max_records", 51)}, "broker.storage.providers.main.publish_commit_max_records", "(50)"},
		{"retired key", []patch{p("broker.storage.providers.main.commit_interval", "5ms")}, "broker.storage.providers.main.commit_interval", "renamed to publish_commit_interval"},
		{"type missing", []patch{p("broker.storage.providers.main", m("file_path", dir0+"/m.db"))}, "broker.storage.providers.main.type", "missing"},
		{"type wrong", []patch{p("broker.storage.providers.main.type", "postgres")}, "broker.storage.providers.main.type", "one of sqlite or memory"},
		{"bad provider name", []patch{p("broker.storage.providers.bad name", m("type", "memory", "snapshot_dir", "none"))},
			"broker.storage.providers.bad name", "is not allowed"},
		{"no providers", []patch{p("broker.storage.providers", m())}, "broker.storage.providers", "names no provider"},
	})
}

func TestRulesOtherBlocks(t *testing.T) {
	runRules(t, []ruleCase{
		{"retained max_bytes", []patch{p("broker.retained.max_bytes", "1MiB")}, "broker.retained.max_bytes", "bounded by its provider's max_bytes"},
		{"retained retention_bytes", []patch{p("broker.retained.retention_bytes", "1MiB")}, "broker.retained.retention_bytes", "bounded by its provider's max_bytes"},
		{"retained storage unknown", []patch{p("broker.retained.storage", "disk")}, "broker.retained.storage", "no provider has this name"},
		{"retained retention zero", []patch{p("broker.retained.retention_period", "0s")}, "broker.retained.retention_period", "zero is refused"},
		{"qos2 max_bytes", []patch{p("broker.qos2.max_bytes", "1MiB")}, "broker.qos2.max_bytes", "no way to switch QoS 2 off"},
		{"qos2 inflight zero", []patch{p("broker.qos2.max_inflight_per_client", 0)}, "broker.qos2.max_inflight_per_client", "from 1 to 65535"},
		{"qos2 expires none", []patch{p("broker.qos2.expires_after", "none")}, "broker.qos2.expires_after", "must expire"},
		{"session max_bytes", []patch{p("broker.session.max_bytes", "1MiB")}, "broker.session.max_bytes", "no separate bound"},
		{"session storage unknown", []patch{p("broker.session.storage", "disk")}, "broker.session.storage", "no provider has this name"},
		{"ack interval too short", []patch{p("broker.session.ack_commit_interval", "5ms")}, "broker.session.ack_commit_interval", "from 10ms to 1s"},
		{"ack interval zero", []patch{p("broker.session.ack_commit_interval", "0ms")}, "broker.session.ack_commit_interval", "from 10ms to 1s"},
		{"ack interval none", []patch{p("broker.session.ack_commit_interval", "none")}, "broker.session.ack_commit_interval", "10ms to 1s"},
		{"ack interval unparseable", []patch{p("broker.session.ack_commit_interval", "fast")}, "broker.session.ack_commit_interval", "a duration is a whole number and one unit"},
		{"share sub-second", []patch{p("broker.share.expires_after", "1500ms")}, "broker.share.expires_after", "held in whole seconds"},
		{"share zero", []patch{p("broker.share.expires_after", "0s")}, "broker.share.expires_after", "or none"},
	})
}

func TestRulesChannels(t *testing.T) {
	long := strings.Repeat("n", 129)
	dots := strings.Repeat("a.", 62) + "a" // 125 bytes, 62 dots: 125+124+9 = 258 > 255
	queue124 := strings.Repeat("q", 124)
	runRules(t, []ruleCase{
		{"name charset", []patch{p("channels.my channel", m("type", "append"))}, "channels.my channel", `' ' is not allowed`},
		{"name dotdot", []patch{p("channels|..", m("type", "append", "filter", "x/#"))}, "channels...", "not . or .."},
		{"name dlq", []patch{p("channels.x__dlq", m("type", "append"))}, "channels.x__dlq", "reserved for the dead-letter channel"},
		{"name too long", []patch{p("channels."+long, m("type", "append", "filter", "x/#"))}, "channels." + long, "at most 128"},
		{"name too long once encoded", []patch{p("channels|"+dots, m("type", "append", "filter", "x/#"))}, "channels." + dots, "snapshot file name would be 258 bytes"},
		{"queue name leaves no room for its dlq", []patch{p("channels."+queue124, m("type", "queue", "filter", "q/#"))}, "channels." + queue124, "at most 123 bytes"},
		{"type missing", []patch{p("channels.x", m("filter", "x/#"))}, "channels.x.type", "missing"},
		{"type broadcast", []patch{p("channels.x", m("type", "broadcast"))}, "channels.x.type", "broadcast is what no channel claims"},
		{"filter hash not last", []patch{p("channels.x", m("type", "append", "filter", "x/#/y"))}, "channels.x.filter", "# may only be the last level"},
		{"filter partial wildcard", []patch{p("channels.x", m("type", "append", "filter", "x/a+b"))}, "channels.x.filter", "mixes + with other characters"},
		{"filter NUL", []patch{p("channels.x", m("type", "append", "filter", "x/a\x00"))}, "channels.x.filter", "control character"},
		{"filter first level wildcard", []patch{p("channels.x", m("type", "append", "filter", "+/temp"))}, "channels.x.filter", "first level must be spelled out"},
		{"filter first level dollar", []patch{p("channels.x", m("type", "append", "filter", "$SYS/#"))}, "channels.x.filter", "begins with $"},
		{"filter dlq level", []patch{p("channels.x", m("type", "append", "filter", "x/__dlq/#"))}, "channels.x.filter", "level 2 is __dlq"},
		{"brace with slash", []patch{p("channels.x", m("type", "append", "filter", "x/{a/b,c}"))}, "channels.x.filter", "contains /"},
		{"empty brace", []patch{p("channels.x", m("type", "append", "filter", "x/{}"))}, "channels.x.filter", "is empty"},
		{"empty alternative", []patch{p("channels.x", m("type", "append", "filter", "x/{a,}"))}, "channels.x.filter", "empty alternative"},
		{"brace expansion invalid", []patch{p("channels.x", m("type", "append", "filter", "{x,$y}/#"))}, "channels.x.filter", `its expansion "$y/#"`},
		{"braces on a queue", []patch{p("channels.jobs.filter", "jobs/{a,b}")}, "channels.jobs.filter", "a queue's filter takes no {a,b}"},
		{"filter too long", []patch{p("broker.limits.max_topic_length", 10), p("channels.state", del), p("channels.x", m("type", "append", "filter", "abcdefghi/#"))},
			"channels.x.filter", "no topic under it fits broker.limits.max_topic_length (10)"},
		{"default filter too long", []patch{p("broker.limits.max_topic_length", 7), p("channels.state", del)}, "channels.orders.filter (default)", "it is 8 bytes"},
		{"filter too deep", []patch{p("broker.limits.max_topic_levels", 3), p("channels.x", m("type", "append", "filter", "a/b/c/d"))},
			"channels.x.filter", "4 levels, more than broker.limits.max_topic_levels (3)"},
		{"storage unknown", []patch{p("channels.orders.storage", "disk")}, "channels.orders.storage", "no provider has this name"},
		{"retention zero", []patch{p("channels.orders.retention_period", "0h")}, "channels.orders.retention_period", "zero is refused"},
		{"retention bytes zero", []patch{p("channels.orders.retention_bytes", "0KiB")}, "channels.orders.retention_bytes", "zero is refused"},
		{"max_bytes zero", []patch{p("channels.orders.max_bytes", 0)}, "channels.orders.max_bytes", "refuses every publish"},
		{"retention_bytes on latest", []patch{p("channels.state.retention_bytes", "1GiB")}, "channels.state.retention_bytes", "takes no retention_bytes"},
		{"max_bytes on latest", []patch{p("channels.state.max_bytes", "1GiB")}, "channels.state.max_bytes", "no max_bytes of its own"},
		{"retention on queue", []patch{p("channels.jobs.retention_period", "1d")}, "channels.jobs.retention_period", "a queue takes no retention"},
		{"retention bytes on queue", []patch{p("channels.jobs.retention_bytes", "1GiB")}, "channels.jobs.retention_bytes", "dlq_retention_bytes sets"},
		{"start on queue", []patch{p("channels.jobs.start", "tail")}, "channels.jobs.start", "where a reader of an append channel begins"},
		{"start bad", []patch{p("channels.orders.start", "end")}, "channels.orders.start", "one of floor or tail"},
		{"deletion retention on append", []patch{p("channels.orders.deletion_retention_period", "1d")}, "channels.orders.deletion_retention_period", "only a latest channel"},
		{"deletion retention zero", []patch{p("channels.state.deletion_retention_period", "0d")}, "channels.state.deletion_retention_period", "zero is refused"},
		{"visibility on append", []patch{p("channels.orders.visibility_timeout", "30s")}, "channels.orders.visibility_timeout", "a queue setting and this channel is append"},
		{"job expiry on latest", []patch{p("channels.state.job_expires_after", "1d")}, "channels.state.job_expires_after", "a queue setting"},
		{"retry on latest", []patch{p("channels.state.retry", m("max_attempts", 3))}, "channels.state.retry", "a queue setting"},
		{"dlq retention on append", []patch{p("channels.orders.dlq_retention_period", "1d")}, "channels.orders.dlq_retention_period", "only a queue has a dead-letter channel"},
		{"dlq retention zero", []patch{p("channels.jobs.dlq_retention_bytes", 0)}, "channels.jobs.dlq_retention_bytes", "zero is refused"},
		{"visibility zero", []patch{p("channels.jobs.visibility_timeout", "0s")}, "channels.jobs.visibility_timeout", "zero lease"},
		{"visibility not below expiry", []patch{p("channels.jobs.visibility_timeout", "1m"), p("channels.jobs.job_expires_after", "1m")},
			"channels.jobs.visibility_timeout", "shorter than job_expires_after (1m)"},
		{"default visibility not below expiry", []patch{p("channels.jobs.job_expires_after", "20s")},
			"channels.jobs.job_expires_after", "longer than visibility_timeout (default 30s)"},
		{"visibility sub-second", []patch{p("channels.jobs.visibility_timeout", "2500ms")}, "channels.jobs.visibility_timeout", "held in whole seconds; write 2s or 3s"},
		{"max attempts zero", []patch{p("channels.jobs.retry", m("max_attempts", 0))}, "channels.jobs.retry.max_attempts", "1 or more"},
		{"backoff without base", []patch{p("channels.jobs.retry", m("backoff", "linear"))}, "channels.jobs.retry.backoff_base", "missing; backoff: linear needs"},
		{"base without backoff", []patch{p("channels.jobs.retry", m("backoff_base", "5s"))}, "channels.jobs.retry.backoff_base", "retry.backoff, which is not set"},
		{"none backoff with base", []patch{p("channels.jobs.retry", m("backoff", "none", "backoff_base", "5s"))}, "channels.jobs.retry.backoff_base", "waits for nothing"},
		{"backoff bad", []patch{p("channels.jobs.retry", m("backoff", "random", "backoff_base", "5s"))}, "channels.jobs.retry.backoff", "one of none, linear or exponential"},
		{"backoff base sub-second", []patch{p("channels.jobs.retry", m("backoff", "linear", "backoff_base", "500ms"))}, "channels.jobs.retry.backoff_base", "held in whole seconds"},
		{"retry unknown key", []patch{p("channels.jobs.retry", m("attempts", 3))}, "channels.jobs.retry.attempts", "unknown key"},
		{"unknown channel key", []patch{p("channels.orders.colour", "red")}, "channels.orders.colour", "channels.orders takes filter, max_bytes, retention_bytes, retention_period, start, storage and type"},
		{"channel not a block", []patch{p("channels.orders", "append")}, "channels.orders", "this is a block of keys"},
	})
}
