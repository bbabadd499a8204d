package config

import (
	"errors"
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// docs/configuration.md "How values are written": the whole file is validated and ALL findings reported.
func TestCheckConfigReportsEveryMistake(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", `broker:
  id: edge-1
  log_level: verbose
  storage:
    default: main
    default_retention_period: 7d
    default_retention_bytes: 1GiB
    providers:
      main:
        type: memory
        snapshot_dir: none
channels:
  orders:
    type: append
    retention_period: 90x
  jobs:
    type: queue
    start: tail
`)
	list := findings(t, path)
	want := []struct {
		line int
		text string
	}{
		{3, `broker.log_level "verbose": it is one of debug, info, warn or error; omit the key for info`},
		{15, `channels.orders.retention_period "90x": unknown unit "x"; the units are ms, s, m, h and d (or none)`},
		{18, `channels.jobs.start "tail": start is where a reader of an append channel begins`},
	}
	if len(list) != len(want) {
		t.Fatalf("%d findings, want %d: %v", len(list), len(want), list)
	}
	for i, w := range want {
		if list[i].Line != w.line || !strings.Contains(list[i].String(), w.text) || list[i].File != path {
			t.Errorf("finding %d = %q (line %d); want line %d containing %q", i, list[i], list[i].Line, w.line, w.text)
		}
	}
	_, err := Load(path)
	if msg := err.Error(); !strings.HasPrefix(msg, path+": 3 findings:") {
		t.Errorf("error text starts %q", msg[:min(len(msg), 80)])
	}
}

func TestInvariant12_TwoChannelsWithTheSameFilterAreRefusedNamingBoth(t *testing.T) {
	for _, tc := range []struct {
		name     string
		channels map[string]any
		want     []string
	}{
		{"same filter written twice", map[string]any{
			"left":  m("type", "append", "filter", "plant/+/pressure"),
			"right": m("type", "latest", "filter", "plant/+/pressure"),
		}, []string{"channels left (", "and right (", `both have the filter "plant/+/pressure"`}},
		{"a collision only brace expansion shows", map[string]any{
			"left":  m("type", "append", "filter", "plant/{north,south}/pressure"),
			"right": m("type", "latest", "filter", "plant/{east,south}/pressure"),
		}, []string{"channels left (", "and right (", `both have the expansion "plant/south/pressure"`}},
		{"an expansion equal to a plain filter", map[string]any{
			"left":  m("type", "append", "filter", "plant/{a,b}/#"),
			"right": m("type", "append", "filter", "plant/b/#"),
		}, []string{"channels left (", "and right (", `both have the expansion "plant/b/#"`}},
		{"a written filter equal to a default one", map[string]any{
			"left":  m("type", "append"),
			"right": m("type", "latest", "filter", "left/#"),
		}, []string{"channels left (", "and right (", `both have the filter "left/#"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			list := findings(t, build(t, dir, p("channels", tc.channels)))
			if len(list) != 1 {
				t.Fatalf("%d findings, want 1: %v", len(list), list)
			}
			for _, w := range tc.want {
				if !strings.Contains(list[0].String(), w) {
					t.Errorf("finding %q does not contain %q", list[0], w)
				}
			}
		})
	}
	// The outcome is the same whichever order the file lists them in.
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		dir := t.TempDir()
		path := writeFile(t, dir, "c.yaml", strings.ReplaceAll(baseYAML, "{{dir}}", dir)+
			"  "+order[0]+":\n    type: append\n    filter: x/{1,2}\n  "+order[1]+":\n    type: append\n    filter: x/2\n")
		list := findings(t, path)
		if len(list) != 1 || !strings.Contains(list[0].String(), `"x/2"`) {
			t.Fatalf("order %v: %v", order, list)
		}
	}
}

func TestDefaultsAreResolved(t *testing.T) {
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir))
	b := cfg.Broker
	if b.ID != "edge-1" || b.LogLevel != "info" || b.PIDFile != "" || b.MinProtocolVersion != 4 || b.ACLFile != "" || b.Operations != nil {
		t.Errorf("broker scalars = %+v", b)
	}
	wantDoor := Listener{ID: "broker.mqtt.listen.tcp", Name: "tcp", Kind: "tcp", Address: ":1883", AllowAnonymous: true, Default: true}
	if len(b.Listeners) != 1 || !reflect.DeepEqual(b.Listeners[0], wantDoor) {
		t.Errorf("listeners = %+v, want the default door %+v", b.Listeners, wantDoor)
	}
	wantLimits := Limits{
		MaxMessageSize: 1 << 20, MaxTopicLength: 1024, MaxTopicLevels: 200, MaxClientIDLength: 256,
		MaxHeaderCount: 32, MaxHeaderBytes: 8 << 10, MaxConnections: 10000, MaxSubscriptions: 10000,
		MaxSessionExpiry: 30 * 24 * time.Hour, WriteTimeout: 5 * time.Second, ConnectTimeout: 10 * time.Second,
		MaxConnectSize: 100 << 10, MaxConnectRate: 500, SessionQueueBytes: 1 << 20,
	}
	if b.Limits != wantLimits {
		t.Errorf("limits = %+v\nwant     %+v", b.Limits, wantLimits)
	}
	if b.Limits.Reserve() != 1<<20+8<<10 {
		t.Errorf("reserve = %d", b.Limits.Reserve())
	}
	if b.DefaultProvider != "main" || b.DefaultRetentionPeriod != 7*Day || b.DefaultRetentionBytes != 1<<30 {
		t.Errorf("storage defaults = %q %v %d", b.DefaultProvider, b.DefaultRetentionPeriod, b.DefaultRetentionBytes)
	}
	if b.Retained != (Retained{Storage: "main"}) || b.QoS2 != (QoS2{20, 5 * time.Minute}) ||
		b.Share != (Share{}) || b.Session != (Session{"main", 200 * time.Millisecond}) {
		t.Errorf("blocks = %+v %+v %+v %+v", b.Retained, b.QoS2, b.Share, b.Session)
	}
	main := cfg.Providers["main"]
	if main.Type != "sqlite" || main.FlushInterval != 150*time.Millisecond || main.ReadConnections != 2 ||
		main.PublishCommitInterval != 0 || main.PublishCommitNone || main.PublishCommitMaxRecords != 0 || main.MaxBytes != 0 {
		t.Errorf("sqlite provider = %+v", main)
	}
	if mem := cfg.Providers["mem"]; mem.Type != "memory" || mem.SnapshotDir != dir+"/snap" {
		t.Errorf("memory provider = %+v", mem)
	}

	orders, _ := cfg.Channel("orders")
	if orders.FilterAsWritten != "orders/#" || !slices.Equal(orders.Filters, []string{"orders/#"}) || orders.Storage != "main" ||
		orders.RetentionPeriod != 7*Day || orders.RetentionBytes != 1<<30 || orders.MaxBytes != 0 || orders.StartTail {
		t.Errorf("append channel = %+v", orders)
	}
	state, _ := cfg.Channel("state")
	if state.RetentionPeriod != 7*Day || state.RetentionBytes != 0 || state.DeletionRetentionPeriod != Day {
		t.Errorf("latest channel = %+v", state)
	}
	jobs, _ := cfg.Channel("jobs")
	if jobs.VisibilityTimeout != 30*time.Second || jobs.JobExpiresAfter != 0 || jobs.MaxAttempts != 5 || jobs.Backoff != "none" ||
		jobs.BackoffBase != 0 || jobs.RetentionPeriod != 0 || jobs.DeadLetter != "jobs__dlq" || jobs.Storage != "mem" {
		t.Errorf("queue channel = %+v", jobs)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("warnings = %v", cfg.Warnings)
	}
}

func TestDerivedValuesFollowTheLimits(t *testing.T) {
	dir := t.TempDir()
	small := mustLoad(t, build(t, dir, p("broker.limits.max_message_size", "64KiB"))).Broker.Limits
	if small.MaxConnectSize != 64<<10 || small.SessionQueueBytes != 1<<20 {
		t.Errorf("64KiB messages: connect size %d, queue %d; want 64KiB and 1MiB", small.MaxConnectSize, small.SessionQueueBytes)
	}
	big := mustLoad(t, build(t, dir, p("broker.limits.max_message_size", "4MiB"))).Broker.Limits
	if big.MaxConnectSize != 100<<10 || big.SessionQueueBytes != 4<<20 {
		t.Errorf("4MiB messages: connect size %d, queue %d; want 100KiB and 4MiB", big.MaxConnectSize, big.SessionQueueBytes)
	}
}

func TestExplicitValuesAreRead(t *testing.T) {
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir,
		p("broker.log_level", "warn"),
		p("broker.pid_file", "/run/saguin//saguin.pid"),
		p("broker.mqtt.min_protocol_version", 5),
		p("broker.mqtt.password_file", "/etc/saguin/passwd"),
		p("broker.mqtt.listen.ws", m("address", "[::1]:8080", "same_origin", false, "allowed_origins", []any{"HTTPS://App.Example:8443", "https://app.example:8443"})),
		p("broker.mqtt.listen.unix", m("path", "@saguin", "mode", "0600", "proxy_protocol", true, "allow_anonymous", true)),
		p("broker.limits.max_keepalive", "none"),
		p("broker.limits.write_timeout", "250ms"),
		p("broker.limits.max_connect_rate", "none"),
		p("broker.limits.publish_rate", 100),
		p("broker.limits.publish_bytes", "64KiB"),
		p("broker.limits.max_session_expiry", "0s"),
		p("broker.storage.default_retention_period", "none"),
		p("broker.storage.default_retention_bytes", "none"),
		p("broker.storage.providers.main", m("type", "sqlite", "file_path", dir+"/main.db", "max_bytes", "64MiB",
			"publish_commit_interval", "5ms", "publish_commit_max_records", 64, "read_connections", 0, "flush_interval", "1s")),
		p("broker.storage.providers.mem.snapshot_dir", "none"),
		p("broker.retained", m("storage", "mem", "retention_period", "30d")),
		p("broker.qos2", m("max_inflight_per_client", 5, "expires_after", "1h")),
		p("broker.share.expires_after", "2h"),
		p("broker.session", m("storage", "mem", "ack_commit_interval", "1s")),
		p("channels.orders", m("type", "append", "filter", "shop/{eu,us}/orders/#", "retention_period", "none", "retention_bytes", "none", "max_bytes", "10GiB", "start", "tail")),
		p("channels.state.deletion_retention_period", "none"),
		p("channels.jobs", m("type", "queue", "filter", "work/+/todo", "max_bytes", "1GiB", "visibility_timeout", "2m", "job_expires_after", "1d",
			"retry", m("max_attempts", 3, "backoff", "exponential", "backoff_base", "10s"), "dlq_retention_period", "none", "dlq_retention_bytes", "5GiB")),
	))
	b := cfg.Broker
	if b.LogLevel != "warn" || b.PIDFile != "/run/saguin/saguin.pid" || b.MinProtocolVersion != 5 {
		t.Errorf("broker = %q %q %d", b.LogLevel, b.PIDFile, b.MinProtocolVersion)
	}
	if len(b.Listeners) != 2 {
		t.Fatalf("listeners = %+v", b.Listeners)
	}
	ws, unix := b.Listeners[0], b.Listeners[1]
	if ws.Kind != "ws" || ws.SameOrigin || !slices.Equal(ws.AllowedOrigins, []string{"https://app.example:8443"}) ||
		ws.PasswordFile != "/etc/saguin/passwd" || ws.AllowAnonymous {
		t.Errorf("ws door = %+v", ws)
	}
	if unix.Kind != "unix" || unix.Path != "@saguin" || unix.Mode != fs.FileMode(0o600) || !unix.ProxyProtocol || !unix.AllowAnonymous {
		t.Errorf("unix door = %+v", unix)
	}
	l := b.Limits
	if l.MaxKeepalive != 0 || l.WriteTimeout != 250*time.Millisecond || l.MaxConnectRate != 0 || l.PublishRate != 100 ||
		l.PublishBytes != 64<<10 || l.MaxSessionExpiry != 0 {
		t.Errorf("limits = %+v", l)
	}
	if b.DefaultRetentionPeriod != 0 || b.DefaultRetentionBytes != 0 {
		t.Errorf("none retention defaults = %v %d", b.DefaultRetentionPeriod, b.DefaultRetentionBytes)
	}
	if pr := cfg.Providers["main"]; pr.MaxBytes != 64<<20 || pr.PublishCommitInterval != 5*time.Millisecond ||
		pr.PublishCommitMaxRecords != 64 || pr.ReadConnections != 0 || pr.FlushInterval != time.Second {
		t.Errorf("sqlite = %+v", pr)
	}
	if pr := cfg.Providers["mem"]; pr.SnapshotDir != "" {
		t.Errorf("memory snapshot_dir none = %q", pr.SnapshotDir)
	}
	if b.Retained != (Retained{"mem", 30 * Day}) || b.QoS2 != (QoS2{5, time.Hour}) || b.Share != (Share{2 * time.Hour}) ||
		b.Session != (Session{"mem", time.Second}) {
		t.Errorf("blocks = %+v %+v %+v %+v", b.Retained, b.QoS2, b.Share, b.Session)
	}
	orders, _ := cfg.Channel("orders")
	if !slices.Equal(orders.Filters, []string{"shop/eu/orders/#", "shop/us/orders/#"}) || orders.FilterAsWritten != "shop/{eu,us}/orders/#" ||
		orders.RetentionPeriod != 0 || orders.RetentionBytes != 0 || orders.MaxBytes != 10<<30 || !orders.StartTail {
		t.Errorf("append = %+v", orders)
	}
	if state, _ := cfg.Channel("state"); state.DeletionRetentionPeriod != 0 {
		t.Errorf("latest deletion retention none = %v", state.DeletionRetentionPeriod)
	}
	jobs, _ := cfg.Channel("jobs")
	if jobs.MaxBytes != 1<<30 || jobs.VisibilityTimeout != 2*time.Minute || jobs.JobExpiresAfter != Day || jobs.MaxAttempts != 3 ||
		jobs.Backoff != "exponential" || jobs.BackoffBase != 10*time.Second {
		t.Errorf("queue = %+v", jobs)
	}
	dlq, ok := cfg.Channel("jobs__dlq")
	if !ok || dlq.RetentionPeriod != 0 || dlq.RetentionBytes != 5<<30 || dlq.FilterAsWritten != "work/+/todo/__dlq" {
		t.Errorf("dlq = %+v", dlq)
	}
}

func TestProtocolVersionSpellings(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want byte
	}{{"3.1.1", 4}, {"5", 5}, {5, 5}} {
		dir := t.TempDir()
		if got := mustLoad(t, build(t, dir, p("broker.mqtt.min_protocol_version", tc.v))).Broker.MinProtocolVersion; got != tc.want {
			t.Errorf("min_protocol_version %v = %d, want %d", tc.v, got, tc.want)
		}
	}
}

// docs/channels.md "The dead-letter channel": every queue derives <name>__dlq, an append channel on the
// queue's provider with the filter rewritten and retention from dlq_*.
func TestDeadLetterChannelsAreDerived(t *testing.T) {
	for _, tc := range []struct{ filter, dlq string }{
		{"iot/water/+/inspect", "iot/water/+/inspect/__dlq"},
		{"iot/water/+/+", "iot/water/+/+/__dlq"},
		{"iot/water/+/inspect/#", "iot/water/+/inspect/__dlq/#"},
		{"", "jobs/__dlq/#"}, // the default filter jobs/#
	} {
		dir := t.TempDir()
		patches := []patch{p("channels.jobs.dlq_retention_period", "14d")}
		if tc.filter != "" {
			patches = append(patches, p("channels.jobs.filter", tc.filter))
		}
		cfg := mustLoad(t, build(t, dir, patches...))
		d, ok := cfg.Channel("jobs__dlq")
		if !ok {
			t.Fatalf("no jobs__dlq among %v", cfg.Channels)
		}
		want := Channel{Name: "jobs__dlq", Type: "append", FilterAsWritten: tc.dlq, Filters: []string{tc.dlq}, Storage: "mem",
			RetentionPeriod: 14 * Day, RetentionBytes: 1 << 30, DeadLetterOf: "jobs", File: d.File, Line: d.Line}
		if !reflect.DeepEqual(d, want) {
			t.Errorf("filter %q: dlq = %+v\nwant %+v", tc.filter, d, want)
		}
		// The dead-letter channel holds its topics (more exact than the queue's #).
		if ch, _ := cfg.Resolver().Resolve(strings.NewReplacer("+", "w-7", "#", "x").Replace(tc.dlq)); ch != "jobs__dlq" {
			t.Errorf("a dead-letter topic of %q resolves to %q", tc.dlq, ch)
		}
	}
}

func TestChannelsAreSortedAndResolvable(t *testing.T) {
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir, p("channels.alerts", m("type", "append", "filter", "site/+/state/alarm"))))
	var names []string
	for _, c := range cfg.Channels {
		names = append(names, c.Name)
	}
	if !slices.IsSorted(names) {
		t.Errorf("channels not sorted: %v", names)
	}
	for topic, want := range map[string]string{
		"site/7/state":        "state",
		"site/7/state/alarm":  "alerts",
		"orders/1":            "orders",
		"jobs/resize":         "jobs",
		"jobs/__dlq/resize":   "jobs__dlq",
		"weather/now":         "",
		"site/7/state/other":  "",
		"orders":              "orders",
		"$SYS/broker/uptime":  "",
		"site/7/state/alarm/": "",
	} {
		if got, _ := cfg.Resolver().Resolve(topic); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", topic, got, want)
		}
	}
}

func TestWarnings(t *testing.T) {
	dir := t.TempDir()
	cfg := mustLoad(t, build(t, dir,
		p("broker.storage.providers.spare", m("type", "memory", "snapshot_dir", "none")),
		p("broker.mqtt.password_file", "/etc/saguin/passwd"),
		p("broker.mqtt.acl_file", "/etc/saguin/acl.yaml"),
		p("broker.mqtt.listen.tcp", []any{m("name", "lan", "address", ":1883"), m("name", "open", "address", ":1884", "password_file", "/etc/saguin/other")}),
		p("broker.mqtt.listen.unix", m("path", "/run/saguin.sock")),
	))
	if len(cfg.Warnings) != 1 || cfg.Warnings[0].Key != "broker.storage.providers.spare" || !strings.Contains(cfg.Warnings[0].Problem, "inert") {
		t.Errorf("warnings = %v; want the inert provider only (every door has a password file)", cfg.Warnings)
	}

	// A door admitting anonymous clients beside an acl_file is worth a warning.
	cfg = mustLoad(t, build(t, dir,
		p("broker.mqtt.acl_file", "/etc/saguin/acl.yaml"),
		p("broker.mqtt.listen.tcp", []any{m("name", "lan", "address", ":1883", "password_file", "/etc/saguin/passwd"), m("name", "plain", "address", ":1884")}),
	))
	if len(cfg.Warnings) != 1 || cfg.Warnings[0].Key != "broker.mqtt.listen.tcp[plain]" {
		t.Errorf("warnings = %v; want one on the plain door", cfg.Warnings)
	}
}

func TestYAMLLevelFindings(t *testing.T) {
	base := strings.ReplaceAll(baseYAML, "{{dir}}", "/tmp/x")
	for _, tc := range []struct {
		name, content, key, want string
	}{
		{"invalid yaml", "broker:\n  id: [unclosed\n", "(yaml)", "not valid YAML"},
		{"duplicate key", strings.Replace(base, "  id: edge-1\n", "  id: edge-1\n  id: edge-2\n", 1), "broker.id", "written twice (lines 3 and 4)"},
		{"two documents", base + "---\nbroker: {}\n", "(yaml)", "second YAML document"},
		{"top level is a list", "- a\n- b\n", "(top level)", "this is a block of keys"},
		{"unknown tag", strings.Replace(base, "id: edge-1", "id: !secret edge-1", 1), "broker.id", "unknown tag !secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			expectOne(t, findings(t, writeFile(t, dir, "c.yaml", tc.content)), tc.key, tc.want)
		})
	}
	t.Run("file too large", func(t *testing.T) {
		dir := t.TempDir()
		list := findings(t, writeFile(t, dir, "c.yaml", "# "+strings.Repeat("x", MaxFileSize)+"\n"))
		expectOne(t, list, "(file)", "larger than 4MiB")
	})
	t.Run("missing file", func(t *testing.T) {
		list := findings(t, t.TempDir()+"/absent.yaml")
		expectOne(t, list, "(file)", "no such file or directory")
	})
	t.Run("anchors and merge keys", func(t *testing.T) {
		dir := t.TempDir()
		content := strings.ReplaceAll(baseYAML, "{{dir}}", dir) +
			"  a1:\n    <<: &common {type: append, retention_period: 1d}\n    filter: a1/#\n  a2:\n    <<: *common\n    retention_period: 2d\n"
		cfg := mustLoad(t, writeFile(t, dir, "c.yaml", content))
		a1, _ := cfg.Channel("a1")
		a2, _ := cfg.Channel("a2")
		if a1.Type != "append" || a1.RetentionPeriod != Day || a2.Type != "append" || a2.RetentionPeriod != 2*Day {
			t.Fatalf("a1 = %+v, a2 = %+v", a1, a2)
		}
	})
	t.Run("merge keys cannot multiply without bound", func(t *testing.T) {
		dir := t.TempDir()
		var b strings.Builder
		b.WriteString("x: &big {")
		for i := 0; i < 2000; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("k" + itoa(int64(i)) + ": v")
		}
		b.WriteString("}\n")
		content := strings.ReplaceAll(baseYAML, "{{dir}}", dir)
		for i := 0; i < 600; i++ {
			content += "  c" + itoa(int64(i)) + ": {<<: *big, type: append}\n"
		}
		list := findings(t, writeFile(t, dir, "c.yaml", b.String()+content))
		found := false
		for _, f := range list {
			found = found || strings.Contains(f.Problem, "expands to more than 1000000 values")
		}
		if !found || len(list) > maxFindings+2 {
			t.Fatalf("expansion finding present: %v; %d findings (bound %d)", found, len(list), maxFindings)
		}
		if last := list[len(list)-1]; last.Key != "(more)" {
			t.Errorf("last finding %q; want the count of findings not shown", last)
		}
	})
}

func TestStartupErrorsNameTheirFile(t *testing.T) {
	dir := t.TempDir()
	path := build(t, dir, p("broker.log_level", "loud"))
	list := findings(t, path)
	if list[0].File != path || list[0].Line == 0 {
		t.Fatalf("finding at %q:%d, want %q and a line", list[0].File, list[0].Line, path)
	}
}

// Whatever the file holds, Load answers with a configuration or with
// findings that each name a key and a problem; it never panics.
func FuzzLoad(f *testing.F) {
	f.Add(strings.ReplaceAll(baseYAML, "{{dir}}", "/tmp/fuzz"))
	f.Add("broker: {id: x, storage: {default: m, default_retention_period: none, default_retention_bytes: none, providers: {m: {type: memory, snapshot_dir: none}}}}\nchannels: {a: {type: queue, filter: 'a/{x,y}'}}\n")
	f.Add("broker:\n  mqtt:\n    listen:\n      tcp: [{name: a, address: ':1'}, {address: ':1'}]\n")
	f.Add("a: &a {b: *a}\n")
	f.Add("channels: [!include x.yaml, {a: {type: append, filter: '#'}}]\n")
	f.Fuzz(func(t *testing.T, content string) {
		dir := t.TempDir()
		path := writeFile(t, dir, "c.yaml", content)
		cfg, err := Load(path)
		if err == nil {
			if cfg.Resolver() == nil || cfg.Broker.ID == "" {
				t.Fatalf("accepted configuration lacks its resolver or id: %+v", cfg.Broker)
			}
			return
		}
		var fs *Findings
		if !errors.As(err, &fs) || len(fs.List) == 0 {
			t.Fatalf("error %v is not a non-empty *Findings", err)
		}
		for _, x := range fs.List {
			if x.Key == "" || x.Problem == "" {
				t.Fatalf("finding without key or problem: %#v", x)
			}
		}
	})
}

// A Check runs in the loader's own pass, on the configuration as far as it
// was read — here beside a finding of the loader's — and its findings,
// placed with At, come sorted among the loader's in the one format.
func TestChecksRunInTheSamePassPlacedWhereTheKeyIsWritten(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", `broker:
  id: edge-1
  log_level: loud
  pid_file: /run/saguin.pid
  storage:
    default: main
    default_retention_period: 7d
    default_retention_bytes: 1GiB
    providers:
      main:
        type: memory
        snapshot_dir: none
`)
	check := func(c *Config) []Finding {
		return []Finding{c.At("broker.pid_file", "checked"), c.At("broker.operations", "not written")}
	}
	_, err := Load(path, check)
	var fs *Findings
	if !errors.As(err, &fs) || len(fs.List) != 3 {
		t.Fatalf("want the loader's finding and the check's two: %v", err)
	}
	want := []string{
		path + `: broker.operations: not written`,
		path + `:3: broker.log_level "loud": it is one of debug, info, warn or error; omit the key for info`,
		path + `:4: broker.pid_file "/run/saguin.pid": checked`,
	}
	for i, w := range want {
		if got := fs.List[i].String(); got != w {
			t.Errorf("finding %d = %q, want %q", i, got, w)
		}
	}
}
