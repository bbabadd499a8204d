package metrics

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Source is what the exporter asks for the broker's numbers: it fills s,
// copying each number under the lock that guards it and formatting
// nothing (docs/operations.md "Metrics"). Defined here, by its consumer; the broker
// implements it.
type Source interface {
	MetricsSnapshot(s *Snapshot)
}

// MinInterval is the floor and default of
// broker.operations.min_scrape_interval.
const MinInterval = 60 * time.Second

// Exporter serves the catalogue. It recomputes at most once per interval
// on the given clock: a scrape sooner is answered from the previous
// result, the same bytes, never refused (docs/operations.md "Metrics"). Nothing runs
// between scrapes: no timer, no $SYS tree.
type Exporter struct {
	source   Source
	now      func() time.Time
	interval time.Duration
	registry *prometheus.Registry
	runtime  *runtimeSamples

	// mu orders recomputes (a scrape waits for one in progress rather
	// than starting another) and guards what follows. It is the
	// exporter's own: no lock of the broker's is held while it is, other
	// than for the copying Source does.
	mu       sync.Mutex
	at       time.Time
	families []*dto.MetricFamily
	snap     Snapshot // read by the collector during a recompute only
}

// New makes an exporter of source's numbers, recomputed at most once per
// interval (raised to MinInterval) on the clock now.
func New(source Source, now func() time.Time, interval time.Duration) (*Exporter, error) {
	e := &Exporter{source: source, now: now, interval: max(interval, MinInterval),
		registry: prometheus.NewRegistry(), runtime: newRuntimeSamples()}
	if err := e.registry.Register(&collector{e: e, families: describe(Catalogue())}); err != nil {
		return nil, fmt.Errorf("metrics catalogue: %w", err)
	}
	return e, nil
}

// Gather is the catalogue as last computed, recomputed first when the
// interval has passed (prometheus.Gatherer). The families returned are
// shared by every scrape until the next recompute and must not be changed.
func (e *Exporter) Gather() ([]*dto.MetricFamily, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	// A clock stepped back is no reason to serve an old result for longer.
	if e.families != nil && !now.Before(e.at) && now.Sub(e.at) < e.interval {
		return e.families, nil
	}
	e.snap = Snapshot{}
	e.source.MetricsSnapshot(&e.snap)
	e.runtime.read(&e.snap.Runtime)
	families, err := e.registry.Gather()
	if err != nil {
		// The catalogue and its collector disagree: a bug, said as such.
		return nil, fmt.Errorf("metrics catalogue: %w", err)
	}
	e.families, e.at = families, now
	return families, nil
}

// textFormat is the Content-Type of every answer: the text exposition,
// version 0.0.4. Every name of the catalogue is a legacy Prometheus name,
// so the escaping parameter the negotiation appends says nothing, and it
// is left out.
const textFormat = expfmt.FmtText

// Handler serves the catalogue in the Prometheus text format through
// client_golang's handler, gzip-compressed when the client asks for it.
func (e *Exporter) Handler() http.Handler {
	h := promhttp.HandlerFor(e, promhttp.HandlerOpts{
		AcceptedFormats:     []expfmt.Format{textFormat},
		OfferedCompressions: []promhttp.Compression{promhttp.Identity, promhttp.Gzip},
		ErrorHandling:       promhttp.HTTPErrorOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&plainText{ResponseWriter: w}, r)
	})
}

// plainText sets the Content-Type to exactly textFormat as the answer's
// header is written (docs/operations.md "The routes").
type plainText struct {
	http.ResponseWriter
	wrote bool
}

func (p *plainText) WriteHeader(code int) {
	if !p.wrote {
		p.wrote = true
		h := p.Header()
		if strings.HasPrefix(h.Get("Content-Type"), string(textFormat)) {
			h.Set("Content-Type", string(textFormat))
		}
	}
	p.ResponseWriter.WriteHeader(code)
}

func (p *plainText) Write(b []byte) (int, error) {
	if !p.wrote {
		p.WriteHeader(http.StatusOK)
	}
	return p.ResponseWriter.Write(b)
}

// collector turns the exporter's snapshot into the catalogue's metrics.
type collector struct {
	e        *Exporter
	families []described
}

type described struct {
	Family
	desc      *prometheus.Desc
	valueType prometheus.ValueType
}

func describe(cat []Family) []described {
	out := make([]described, len(cat))
	for i, f := range cat {
		vt := prometheus.GaugeValue
		if f.Kind == Counter {
			vt = prometheus.CounterValue
		}
		out[i] = described{Family: f, desc: prometheus.NewDesc(f.Name, f.Help, f.Labels, nil), valueType: vt}
	}
	return out
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.families {
		ch <- f.desc
	}
}

// Collect runs inside Exporter.Gather, which holds e.mu: the snapshot is
// the one just filled.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := &c.e.snap
	for _, f := range c.families {
		f.read(s, func(v float64, labels ...string) {
			m, err := prometheus.NewConstMetric(f.desc, f.valueType, v, labels...)
			if err != nil {
				m = prometheus.NewInvalidMetric(f.desc, err)
			}
			ch <- m
		})
	}
}
