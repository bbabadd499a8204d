package metrics

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// source is a Source whose snapshot the test sets, counting recomputes.
type source struct {
	snap  Snapshot
	calls int
}

func (s *source) MetricsSnapshot(out *Snapshot) {
	s.calls++
	*out = s.snap
}

// clockAt is a clock the test moves.
type clockAt struct{ now time.Time }

func (c *clockAt) Now() time.Time { return c.now }

func newExporter(t *testing.T, src Source, interval time.Duration) (*Exporter, *clockAt) {
	t.Helper()
	clk := &clockAt{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e, err := New(src, clk.Now, interval)
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

func scrape(t *testing.T, e *Exporter) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// The catalogue is closed and well formed: its 82 names and the one we
// added (saguin_bridge_oldest_unacknowledged_seconds, rfcs/metrics.md),
// each prefixed saguin_, with help text and valid label names, none twice.
func TestCatalogueIsClosed(t *testing.T) {
	cat := Catalogue()
	if len(cat) != 82+1 {
		t.Fatalf("%d families, want 83", len(cat))
	}
	seen := map[string]bool{}
	for _, f := range cat {
		if seen[f.Name] {
			t.Errorf("%s twice", f.Name)
		}
		seen[f.Name] = true
		if !strings.HasPrefix(f.Name, "saguin_") || !model.LegacyValidation.IsValidMetricName(f.Name) {
			t.Errorf("%s: not a saguin_ metric name", f.Name)
		}
		if f.Help == "" || f.read == nil {
			t.Errorf("%s: no help text or no reader", f.Name)
		}
		if f.Kind == Counter && !strings.HasSuffix(f.Name, "_total") {
			t.Errorf("%s: a counter's name ends in _total", f.Name)
		}
		for _, l := range f.Labels {
			if !model.LegacyValidation.IsValidLabelName(l) {
				t.Errorf("%s: label %q", f.Name, l)
			}
		}
	}
}

// min_scrape_interval has a floor of 60 s: an interval asked below it is
// raised, so a scrape 30 s after the last is answered from it.
func TestExporterIntervalFloor(t *testing.T) {
	src := &source{}
	e, clk := newExporter(t, src, time.Second)
	scrape(t, e)
	clk.now = clk.now.Add(30 * time.Second)
	scrape(t, e)
	if src.calls != 1 {
		t.Fatalf("%d recomputes within 60 s, want 1", src.calls)
	}
	clk.now = clk.now.Add(30 * time.Second)
	scrape(t, e)
	if src.calls != 2 {
		t.Fatalf("%d recomputes once 60 s passed, want 2", src.calls)
	}
}

// A clock stepped back is no reason to go on serving an old result.
func TestExporterClockSteppedBack(t *testing.T) {
	src := &source{}
	e, clk := newExporter(t, src, MinInterval)
	scrape(t, e)
	clk.now = clk.now.Add(-time.Hour)
	scrape(t, e)
	if src.calls != 2 {
		t.Fatalf("%d recomputes after the clock stepped back, want 2", src.calls)
	}
}

// A family with nothing to show is absent, not zero: no refusal yet, no
// stored position, no storage failure, no transactions on a memory
// provider. A reason listed twice is one series, summed.
func TestSeriesOnlyWhereTheNumberExists(t *testing.T) {
	src := &source{snap: Snapshot{
		Channels:  []ChannelFigures{{Name: "events", Type: TypeAppend, Filter: "events/#", Provider: "mem"}},
		Providers: []ProviderFigures{{Name: "mem", Type: "memory"}},
		Refusals: RefusalFigures{Publishes: []ReasonCount{
			{Reason: CodeName(0x97), Count: 2}, {Reason: ReasonPublishRate, Count: 1}, {Reason: CodeName(0x97), Count: 3}}},
	}}
	e, _ := newExporter(t, src, MinInterval)
	body := scrape(t, e)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"saguin_channel_consumer_position_min", "saguin_storage_errors_total",
		"saguin_connections_refused_total", "saguin_subscriptions_refused_total", "saguin_storage_commits_total",
		"saguin_storage_committed_records_total", "saguin_provider_publish_commit_max_records", "saguin_queue_depth",
		"saguin_latest_superseded_total"} {
		if fams[absent] != nil {
			t.Errorf("%s present with nothing behind it: %v", absent, fams[absent])
		}
	}
	refused := fams["saguin_publish_refused_total"]
	if refused == nil || len(refused.GetMetric()) != 2 {
		t.Fatalf("publish refusals: %v, want two series", refused)
	}
	for _, m := range refused.GetMetric() {
		if m.GetLabel()[0].GetValue() == "quota exceeded" && m.GetCounter().GetValue() != 5 {
			t.Errorf("quota exceeded = %v, want 2+3", m.GetCounter().GetValue())
		}
	}
	if n := fams["saguin_channel_consumers"]; n == nil || n.GetMetric()[0].GetGauge().GetValue() != 0 {
		t.Errorf("consumers of an append channel with none: %v, want a 0", n)
	}
	if !bytes.Contains([]byte(body), []byte("# TYPE saguin_publish_refused_total counter")) {
		t.Errorf("no # TYPE line:\n%s", body)
	}
}

// The reason vocabulary is MQTT 5's names; a code it does not name keeps
// its number, so the label still has at most 256 values.
func TestCodeNames(t *testing.T) {
	for code, want := range map[byte]string{0x00: ReasonRejected, 0x87: "not authorized", 0x89: "server busy",
		0x8F: "topic filter invalid", 0x9E: "shared subscriptions not supported", 0x7A: "code 0x7a"} {
		if got := CodeName(code); got != want {
			t.Errorf("CodeName(0x%02x) = %q, want %q", code, got, want)
		}
	}
}
