package broker

import (
	"fmt"
	"net"

	"saguin.dev/broker/internal/ops"
)

// The operations listener (docs/operations.md "The operations listener"): broker/internal/ops serves it;
// this file builds it with the broker (New), binds its doors with the MQTT
// doors (Start), stops it first at Close, and says where it listens.
// ops_views.go answers its routes.

// operations is the listener as the broker keeps it.
type operations struct {
	srv *ops.Server // nil: no broker.operations block
	// addrs are the bound doors' addresses, by door name (tests bind
	// port 0).
	addrs map[string]net.Addr
}

// newOperations prepares the listener: its TLS doors' files read and the
// configuration document rendered, before anything opens.
func (b *Broker) newOperations() error {
	srv, err := ops.New(b.cfg, ops.Options{Source: opsSource{b}, Log: b.log, Now: b.clock.Now,
		ProxyHeaderWithin: b.proxyWithin})
	if err != nil {
		return err
	}
	b.operations.srv = srv
	return nil
}

// startOperations binds every operations door as an MQTT door is bound
// (listen.go openListener: a unix socket under its lock, its mode set
// before anyone can connect) and serves it at once: the broker's state
// is loaded by now (docs/configuration.md "`broker.operations`"). A door that cannot be bound stops the
// start, naming it. Each door says where it listens.
func (b *Broker) startOperations() error {
	srv := b.operations.srv
	if srv == nil {
		return nil
	}
	b.operations.addrs = make(map[string]net.Addr)
	for _, l := range srv.Doors() {
		ln, err := openListener(l)
		if err != nil {
			return fmt.Errorf("operations listener %s: %w", l.Name, err)
		}
		b.listeners = append(b.listeners, ln) // closed (and a socket file removed) with the MQTT doors
		if err := srv.Serve(l.ID, ln); err != nil {
			return fmt.Errorf("operations listener %s: %w", l.Name, err)
		}
		addr := ln.Addr().String()
		b.operations.addrs[l.Name] = ln.Addr()
		b.log.Info("operations listening", "listener", l.Name, "door", doorStatement(l, addr, srv.Layers(l.ID)),
			"address", addr, "paths", ops.Paths, "min_scrape_interval", ops.Seconds(srv.MinScrapeInterval()),
			"metrics_authentication", srv.Authentication(l.ID))
	}
	return nil
}

// stopOperations ends the listener: no door accepts, every request being
// answered has been. Safe to call more than once, and with none.
func (b *Broker) stopOperations() {
	if b.operations.srv != nil {
		b.operations.srv.Close()
	}
}

// opsSource is the broker as the operations listener asks it (ops.Source):
// MetricsHandler is the broker's own; every other answer is in
// ops_views.go.
type opsSource struct{ *Broker }

var _ ops.Source = opsSource{}
