package broker_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
	"saguin.dev/storage/sqlite"
)

// specCatalogue is the metric catalogue as docs/operations.md "Metrics" writes it — name,
// type, label names — typed in from the specification, not from the
// implementation's table, so that a family missing, renamed, mistyped or
// labelled differently there fails the comparison. The saguin_bridge_*
// families are checked by TestBridgeMetrics (bridges_test.go), whose
// broker has a bridge; this one has none, so its scrape shows none.
const specCatalogue = `
saguin_build_info gauge version,broker_id
saguin_uptime_seconds gauge
saguin_connections gauge
saguin_connections_by_protocol gauge protocol
saguin_connections_total counter
saguin_sessions_offline gauge
saguin_wills_published_total counter cause
saguin_wills_cancelled_total counter
saguin_wills_waiting gauge
saguin_sessions_restored_total counter
saguin_sessions_dropped_total counter cause
saguin_session_queue_messages gauge
saguin_session_queue_bytes gauge
saguin_retained_messages gauge
saguin_qos2_held gauge
saguin_qos2_abandoned_total counter
saguin_qos2_max_inflight_per_client gauge
saguin_subscriptions gauge
saguin_session_expiry_shortened_total counter
saguin_max_session_expiry_seconds gauge
saguin_bytes_received_total counter
saguin_bytes_sent_total counter
saguin_publishes_received_total counter
saguin_deliveries_sent_total counter
saguin_deliveries_refused_total counter
saguin_published_total counter channel
saguin_connections_refused_total counter reason
saguin_publish_refused_total counter reason
saguin_subscriptions_refused_total counter reason
saguin_broadcast_unmatched_total counter
saguin_deliveries_dropped_total counter
saguin_deliveries_expired_total counter
saguin_shares_held_total counter
saguin_shares_drained_total counter
saguin_shares_dropped_total counter cause
saguin_session_deliveries_dropped_total counter cause
saguin_channel_info gauge channel,filter,type,provider
saguin_channel_records gauge channel
saguin_channel_bytes gauge channel
saguin_channel_next_offset gauge channel
saguin_channel_floor_offset gauge channel
saguin_channel_retention_removed_total counter channel
saguin_channel_consumer_position_min gauge channel
saguin_channel_consumers gauge channel
saguin_channel_partitioned_consumers gauge channel
saguin_channel_position_lost_total counter channel
saguin_latest_superseded_total counter channel
saguin_queue_depth gauge channel
saguin_queue_inflight gauge channel
saguin_queue_delivered_total counter channel
saguin_queue_acknowledged_total counter channel
saguin_queue_returned_total counter channel
saguin_queue_redelivered_total counter channel
saguin_queue_dead_lettered_total counter channel
saguin_queue_expired_total counter channel
saguin_queue_retain_ignored_total counter channel
saguin_provider_info gauge provider,type
saguin_provider_bytes gauge provider
saguin_provider_max_bytes gauge provider
saguin_storage_errors_total counter provider
saguin_storage_commits_total counter provider,closed_by
saguin_storage_committed_records_total counter provider
saguin_provider_publish_commit_max_records gauge provider
saguin_go_heap_live_bytes gauge
saguin_go_heap_goal_bytes gauge
saguin_go_gc_cycles_total counter
saguin_go_gc_cpu_seconds_total counter
saguin_go_gc_assist_cpu_seconds_total counter
saguin_go_stack_bytes gauge
saguin_go_allocated_bytes_total counter
saguin_go_allocated_objects_total counter
saguin_go_gogc_percent gauge
saguin_go_memory_limit_bytes gauge
`

type specFamily struct {
	typ    dto.MetricType
	labels []string // sorted
}

func specFamilies(t *testing.T) map[string]specFamily {
	t.Helper()
	out := make(map[string]specFamily)
	for _, line := range strings.Split(strings.TrimSpace(specCatalogue), "\n") {
		f := strings.Fields(line)
		sf := specFamily{typ: dto.MetricType_GAUGE}
		if f[1] == "counter" {
			sf.typ = dto.MetricType_COUNTER
		}
		if len(f) == 3 {
			sf.labels = strings.Split(f[2], ",")
			sort.Strings(sf.labels)
		}
		out[f[0]] = sf
	}
	return out
}

// families is one scrape, parsed.
type families map[string]*dto.MetricFamily

// value is the value of the series of name whose labels include every
// "label=value" given; ok false when there is no such series.
func (f families) value(name string, labels ...string) (float64, bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, labels) {
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func hasLabels(m *dto.Metric, want []string) bool {
	for _, w := range want {
		k, v, _ := strings.Cut(w, "=")
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// series counts the series of every family.
func (f families) series() int {
	n := 0
	for _, mf := range f {
		n += len(mf.GetMetric())
	}
	return n
}

// metricsRig is a broker on a fake clock, scraped through its
// MetricsHandler exactly as the operations listener serves it.
type metricsRig struct {
	t   *testing.T
	b   *brokertest.Broker
	clk *clock.Fake
	// moved lists the families seen to change between two scrapes.
	moved map[string]bool
	last  families
}

// scrapeInterval is broker.operations.min_scrape_interval's default.
const scrapeInterval = 60 * time.Second

// commitFaults makes the sqlite provider fail every publish commit while
// the returned flag is set: how a test causes a storage error.
func commitFaults() (*atomic.Bool, brokertest.Option) {
	failCommits := new(atomic.Bool)
	return failCommits, func(o *broker.Options) {
		o.SQLiteFaults = &sqlite.Faults{BeforePublishCommit: func(int) error {
			if failCommits.Load() {
				return errors.New("injected commit failure")
			}
			return nil
		}}
	}
}

func newMetricsRig(t *testing.T, cfg string, opts ...brokertest.Option) *metricsRig {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	opts = append(opts, brokertest.WithClock(clk))
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), cfg), opts...)
	return &metricsRig{t: t, b: b, clk: clk, moved: make(map[string]bool)}
}

// get is one GET /metrics with the headers given.
func (m *metricsRig) get(header ...string) *httptest.ResponseRecorder {
	m.t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	m.b.MetricsHandler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		m.t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec
}

// scrape is one scrape, whatever the clock says, parsed with the
// Prometheus text parser (legacy names: every character checked).
func (m *metricsRig) scrape() ([]byte, families) {
	m.t.Helper()
	rec := m.get()
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		m.t.Fatalf("Content-Type %q", ct)
	}
	body := rec.Body.Bytes()
	return body, parseExposition(m.t, body)
}

func parseExposition(t *testing.T, body []byte) families {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, body)
	}
	return fams
}

// fresh moves the clock past min_scrape_interval and scrapes: numbers
// recomputed. Families that changed since the last fresh scrape are noted.
func (m *metricsRig) fresh() families {
	m.t.Helper()
	m.clk.Advance(scrapeInterval + time.Second)
	_, f := m.scrape()
	if m.last != nil {
		for name, mf := range f {
			if old := m.last[name]; old == nil || old.String() != mf.String() {
				m.moved[name] = true
			}
		}
	}
	m.last = f
	return f
}

// until scrapes fresh until cond holds, failing after wait of wall time.
func (m *metricsRig) until(what string, cond func(f families) bool) families {
	m.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		f := m.fresh()
		if cond(f) {
			return f
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("metrics never showed %s; last scrape:\n%s", what, exposition(f))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// atLeast is a condition: the series of name with labels is at least v.
func atLeast(v float64, name string, labels ...string) func(families) bool {
	return func(f families) bool {
		got, ok := f.value(name, labels...)
		return ok && got >= v
	}
}

func exposition(f families) string {
	names := make([]string, 0, len(f))
	for n := range f {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		for _, mt := range f[n].GetMetric() {
			fmt.Fprintf(&b, "%s %v\n", n, mt)
		}
	}
	return b.String()
}

// checkCatalogue compares a scrape with the specification's table: the same
// names, each with its type and exactly its label names on every series,
// and a # HELP and # TYPE line before every name.
func checkCatalogue(t *testing.T, body []byte, f families) {
	t.Helper()
	spec := specFamilies(t)
	for name, sf := range spec {
		mf := f[name]
		if mf == nil {
			t.Errorf("%s: in the catalogue, not in the scrape", name)
			continue
		}
		if mf.GetType() != sf.typ {
			t.Errorf("%s: type %v, the catalogue says %v", name, mf.GetType(), sf.typ)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help text", name)
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetName())
			}
			sort.Strings(got)
			if !slices.Equal(got, sf.labels) {
				t.Errorf("%s: labels %v, the catalogue says %v", name, got, sf.labels)
			}
		}
		if !bytes.Contains(body, []byte("# HELP "+name+" ")) || !bytes.Contains(body, []byte("# TYPE "+name+" ")) {
			t.Errorf("%s: no # HELP or # TYPE line", name)
		}
	}
	for name := range f {
		if _, ok := spec[name]; !ok {
			t.Errorf("%s: in the scrape, not in the catalogue", name)
		}
	}
}
