package broker

import (
	"net/http"

	"saguin.dev/broker/internal/metrics"
)

// MetricsHandler serves the metric catalogue (docs/operations.md "The routes"; docs/operations.md "Metrics") in the
// Prometheus text format, gzip-compressed when the client asks: what the
// operations listener mounts at /metrics. It is pull only: the numbers are
// recomputed at most once per broker.operations.min_scrape_interval (60 s
// when there is no operations block) on the broker's clock, and a scrape
// sooner is answered with the previous result, never refused (docs/operations.md "Metrics"). The handler holds no lock of the broker's while it formats. Serve
// it between Start and Close: the operations listener stops before the
// broker closes its stores.
func (b *Broker) MetricsHandler() http.Handler { return b.metrics.Handler() }

// newMetrics makes the broker's exporter (New).
func (b *Broker) newMetrics() error {
	interval := metrics.MinInterval
	if ops := b.cfg.Broker.Operations; ops != nil {
		interval = ops.MinScrapeInterval
	}
	e, err := metrics.New(metricsSource{b}, b.clock.Now, interval)
	if err != nil {
		return err
	}
	b.metrics = e
	return nil
}
