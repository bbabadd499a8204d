package broker

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsHandler serves /metrics: a registry of its own holding the Go
// runtime's collectors, in the Prometheus text exposition, gzipped when
// the scraper asks. It stands in for the broker's metric catalogue, which
// is built beside this listener and replaces this file when the two meet:
// the operations listener only needs an http.Handler.
func (b *Broker) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
