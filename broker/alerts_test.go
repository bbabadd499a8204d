package broker_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"gopkg.in/yaml.v3"

	"saguin.dev/broker/brokertest"
)

// The example Grafana dashboard and Prometheus rules (examples/grafana,
// examples/prometheus) are only worth shipping if every series they name
// exists and every alert fires on what a real broker reports. These tests
// hold them to that (issue 15 item 6).

const (
	alertsFile    = "../examples/prometheus/alerts.yml"
	dashboardFile = "../examples/grafana/saguin.json"
)

// alertsConfig: one sqlite provider small enough to fill, an append channel
// with an hour's retention, a queue whose third attempt dead-letters, and a
// channel to fill the provider with.
const alertsConfig = `
broker:
  id: alerts-test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 16KiB
    max_header_bytes: 8KiB
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
        max_bytes: 1MiB
channels:
  events:
    type: append
    filter: "events/#"
    retention_period: 1h
  fill:
    type: append
    filter: "fill/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    retry:
      max_attempts: 3
`

var metricName = regexp.MustCompile(`\bsaguin_[a-z0-9_]+\b`)

// referencedMetrics are the saguin_ names in the dashboard's queries and
// the rules' expressions.
func referencedMetrics(t *testing.T) []string {
	t.Helper()
	var exprs []string
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	rules, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(rules), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(l), "expr:"); ok {
			exprs = append(exprs, e)
		}
	}
	var names []string
	for _, e := range exprs {
		names = append(names, metricName.FindAllString(e, -1)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// alertsRun drives a real broker into every condition an alert is about
// and scrapes it: a durable consumer's stored position passed by
// retention, a queue dead-lettering, the provider past 90% of its
// max_bytes, and a publish, a connection and a subscription refused (so
// the refusal families have series, and a storage error). It returns the
// scrape taken while retention had passed the stored position (the consumer
// then comes back, and the position goes) and the last one.
func alertsRun(t *testing.T) (passed, last families) {
	t.Helper()
	failCommits, faults := commitFaults()
	m := newMetricsRig(t, alertsConfig, faults)
	addr := m.b.Address()

	// A queue dead-letters (return, timeout, return on the last attempt).
	queueFullCycle(t, &queueRig{t: t, b: m.b, clk: m.clk})

	// A durable consumer reads nothing and goes away; retention passes
	// its stored position; it comes back and is told.
	reader := brokertest.Connect(t, addr, "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 86400})
	reader.Subscribe("events/#", 1)
	reader.Close()
	pub := brokertest.Connect(t, addr, "pub", brokertest.ClientOptions{CleanStart: true})
	for _, p := range []string{"a", "b", "c"} {
		mustPublish(t, pub, "events/"+p, p)
	}
	m.clk.Advance(2 * time.Hour)
	passed = m.until("retention past the stored position", func(f families) bool {
		floor, _ := f.value("saguin_channel_floor_offset", "channel=events")
		low, ok := f.value("saguin_channel_consumer_position_min", "channel=events")
		return ok && floor > low
	})
	brokertest.Connect(t, addr, "reader", brokertest.ClientOptions{SessionExpiry: 86400})
	m.until("a lost position", atLeast(1, "saguin_channel_position_lost_total", "channel=events"))

	// The provider fills: publishes until it refuses one (0x97).
	big := make([]byte, 8<<10)
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("a 1MiB provider took 8MiB without refusing a publish")
		}
		if code := publish1(t, pub, &paho.Publish{Topic: "fill/x", Payload: big}); code == 0x97 {
			break
		} else if code != 0 {
			t.Fatalf("filling: PUBACK 0x%02x", code)
		}
	}
	// Refusals of each kind: a connection, a subscription.
	if _, err := brokertest.Dial(t, addr, "bad\x01id", brokertest.ClientOptions{CleanStart: true}); err == nil {
		t.Fatal("a client id with a control character was admitted")
	}
	pub.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$SYS/#", QoS: 1}}})
	// A storage error (the error family has no series before one).
	failCommits.Store(true)
	if code := publish1(t, pub, &paho.Publish{Topic: "events/z", Payload: []byte("z")}); code != 0x83 && code != 0x97 {
		t.Fatalf("a publish whose commit fails answered 0x%02x", code)
	}
	failCommits.Store(false)
	last = m.until("every condition at once", func(f families) bool {
		held, _ := f.value("saguin_provider_bytes", "provider=main")
		max, _ := f.value("saguin_provider_max_bytes", "provider=main")
		return held > 0.9*max && atLeast(1, "saguin_queue_dead_lettered_total", "channel=jobs")(f) &&
			atLeast(1, "saguin_publish_refused_total")(f) && atLeast(1, "saguin_connections_refused_total")(f) &&
			atLeast(1, "saguin_subscriptions_refused_total")(f) && atLeast(1, "saguin_storage_errors_total")(f)
	})
	return passed, last
}

// Every saguin_ series the dashboard and the rules name is in a live scrape
// of a broker that went through every condition they watch, and promtool
// accepts the rules.
func TestExampleDashboardAndRulesNameLiveSeries(t *testing.T) {
	passed, last := alertsRun(t)
	names := referencedMetrics(t)
	if len(names) < 20 {
		t.Fatalf("only %d metric names found in the examples: %v", len(names), names)
	}
	for _, n := range names {
		if passed[n] == nil && last[n] == nil {
			t.Errorf("the examples name %s, which the broker's scrape does not have", n)
		}
	}
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	if out, err := exec.Command("promtool", "check", "rules", alertsFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// Each alert of examples/prometheus/alerts.yml fires, in promtool test
// rules, on series whose values were scraped from a real broker in that
// condition (retention passed a durable consumer's stored position; a
// queue dead-lettered; a provider past 90% of max_bytes).
func TestExampleAlertsFireOnScrapedSeries(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	passed, last := alertsRun(t)
	val := func(name string, labels ...string) float64 {
		v, ok := last.value(name, labels...)
		if !ok {
			v, ok = passed.value(name, labels...)
		}
		if !ok {
			t.Fatalf("the scrape has no %s{%s}", name, strings.Join(labels, ","))
		}
		return v
	}
	const target = `instance="gw-7:9090",job="saguin"`
	series := func(name, labels string, values string) string {
		return fmt.Sprintf("      - series: '%s{%s,%s}'\n        values: '%s'\n", name, labels, target, values)
	}
	// A gauge as scraped, held for half an hour; a counter as it was
	// before the condition (0), then as scraped.
	gauge := func(v float64) string { return fmt.Sprintf("%gx30", v) }
	counter := func(v float64) string { return fmt.Sprintf("0 %gx30", v) }
	var in strings.Builder
	// The floor and the lowest stored position as they stood together,
	// before the consumer came back.
	floor, _ := passed.value("saguin_channel_floor_offset", "channel=events")
	low, ok := passed.value("saguin_channel_consumer_position_min", "channel=events")
	if !ok {
		t.Fatal("the scrape at the condition has no lowest position")
	}
	in.WriteString(series("saguin_channel_floor_offset", `channel="events"`, gauge(floor)))
	in.WriteString(series("saguin_channel_consumer_position_min", `channel="events"`, gauge(low)))
	in.WriteString(series("saguin_channel_position_lost_total", `channel="events"`, counter(val("saguin_channel_position_lost_total", "channel=events"))))
	// The dead-letter counter moving: the scraped count, then one more
	// per minute, as a queue that goes on failing would.
	dl := val("saguin_queue_dead_lettered_total", "channel=jobs")
	in.WriteString(series("saguin_queue_dead_lettered_total", `channel="jobs"`, fmt.Sprintf("0 %g+1x30", dl)))
	in.WriteString(series("saguin_provider_bytes", `provider="main"`, gauge(val("saguin_provider_bytes", "provider=main"))))
	in.WriteString(series("saguin_provider_max_bytes", `provider="main"`, gauge(val("saguin_provider_max_bytes", "provider=main"))))

	// The rules as shipped, less their annotations: promtool compares an
	// alert's annotations too, and theirs render the scraped value; what
	// this proves is that each expression fires (promtool check rules,
	// above, checks the templates).
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string           `yaml:"name"`
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
		}
	}
	stripped, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	abs := filepath.Join(t.TempDir(), "alerts.yml")
	if err := os.WriteFile(abs, stripped, 0o600); err != nil {
		t.Fatal(err)
	}
	alert := func(name, labels string, at time.Duration) string {
		return fmt.Sprintf(`      - eval_time: %s
        alertname: %s
        exp_alerts:
          - exp_labels: {%s}
`, at, name, labels)
	}
	test := fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
%s    alert_rule_test:
%s%s%s%s`, abs, in.String(),
		alert("SaguinConsumerPositionPassed", `severity: page, channel: events, instance: "gw-7:9090", job: saguin`, 5*time.Minute),
		alert("SaguinPositionLost", `severity: page, channel: events, instance: "gw-7:9090", job: saguin`, 5*time.Minute),
		alert("SaguinQueueDeadLettering", `severity: warn, channel: jobs, instance: "gw-7:9090", job: saguin`, 15*time.Minute),
		alert("SaguinProviderNearlyFull", `severity: warn, provider: main, instance: "gw-7:9090", job: saguin`, 15*time.Minute))
	path := filepath.Join(t.TempDir(), "alerts_test.yml")
	if err := os.WriteFile(path, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "test", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\n--- the test, from the scrape:\n%s", err, out, test)
	}
}

// SaguinDown fires on the up series a scraper records of a real broker:
// scrapes of its operations listener's /metrics succeed (1) while it runs,
// and fail (0) once it has stopped.
func TestExampleAlertBrokerDownFiresOnRecordedScrapes(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Skip("promtool is not installed (Debian package prometheus; .ci/run installs it)")
	}
	b := brokertest.Start(t, opsConfig(t, t.TempDir(), "", loopbackOps))
	url := "http://" + b.OperationsAddr("tcp").String() + "/metrics"
	client := &http.Client{Timeout: 5 * time.Second}
	scrape := func() string {
		resp, err := client.Get(url)
		if err != nil {
			return "0"
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "0"
		}
		return "1"
	}
	// One scrape a minute in the test's time: five while it runs, then
	// ten after it stopped.
	var ups []string
	for range 5 {
		ups = append(ups, scrape())
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		ups = append(ups, scrape())
	}
	if strings.Join(ups[:5], "") != "11111" || strings.Join(ups[5:], "") != strings.Repeat("0", 10) {
		t.Fatalf("recorded up %v: want five successes, then ten failures", ups)
	}
	abs, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	// The rule's annotations are compared too: SaguinDown's render only
	// the instance, so they are written out here.
	test := fmt.Sprintf(`rule_files: [%q]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{instance="gw-7:9090",job="saguin"}'
        values: '%s'
    alert_rule_test:
      - eval_time: 4m
        alertname: SaguinDown
        exp_alerts: []
      - eval_time: 9m
        alertname: SaguinDown
        exp_alerts:
          - exp_labels: {severity: page, instance: "gw-7:9090", job: saguin}
            exp_annotations:
              summary: "Sagüin gw-7:9090 is not answering its scrape"
`, abs, strings.Join(ups, " "))
	path := filepath.Join(t.TempDir(), "down_test.yml")
	if err := os.WriteFile(path, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "test", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s\n--- the test, from the recorded scrapes:\n%s", err, out, test)
	}
}
