package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"saguin.dev/broker/config"
	doorpkg "saguin.dev/broker/internal/door"
	"saguin.dev/broker/internal/logging"
)

// The HTTP server's bounds (invariant 13: what a caller can make the
// listener hold). Requests carry no body and answers are at most a few
// hundred rows, so every bound is small and fixed.
const (
	// headerWithin bounds a request's headers, TLS handshake and PROXY
	// header included (all are read before the first header byte).
	headerWithin = 5 * time.Second
	// readWithin bounds the whole request; writeWithin the answer.
	readWithin  = 10 * time.Second
	writeWithin = 30 * time.Second
	// idleWithin is how long a kept-alive connection waits for its next
	// request (a Prometheus scrape every min_scrape_interval reconnects).
	idleWithin = 90 * time.Second
	// maxHeaderBytes bounds a request's line and headers.
	maxHeaderBytes = 8 << 10
	// MaxConnsPerDoor bounds each door's open connections; one past it is
	// closed at its accept.
	MaxConnsPerDoor = 32
)

// healthWithin is how long /health waits to enter the publish path
// before answering 503 (docs/operations.md "The routes": fixed, not configurable).
const healthWithin = 500 * time.Millisecond

// Paths is how the listening line names what the listener serves.
const Paths = "/health /metrics /v1/operations/"

// Server is the operations listener: every door of broker.operations, one
// HTTP server each, answering from the broker through Source. Its
// goroutines are each door's accept loop (Serve) and net/http's one per
// connection; Close ends them all and waits for every request being
// handled.
type Server struct {
	src Source
	log *slog.Logger
	doc *configDocument
	// metrics serves /metrics: the Source's handler, asked for once, when
	// the first door is served (the broker is whole by then).
	metrics http.Handler
	// minScrape is broker.operations.min_scrape_interval, for the
	// listening line.
	minScrape time.Duration
	doors     []*door
	// refusals rate-limits the lines of refused requests per remote host,
	// as the MQTT doors' refusals are.
	refusals *logging.RefusalLog

	// handling counts requests being handled, serving the doors' accept
	// loops: Close waits for both.
	handling sync.WaitGroup
	serving  sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

// door is one operations door.
type door struct {
	cfg    config.Listener
	layers *doorpkg.Layers // TLS (tcp) or the PROXY header (unix); never nil
	http   *http.Server
	ln     net.Listener
	slots  chan struct{} // MaxConnsPerDoor
}

// Options are what New needs beside the configuration.
type Options struct {
	Source Source
	Log    *slog.Logger
	Now    func() time.Time
	// ProxyHeaderWithin replaces the 5 s a unix door with proxy_protocol
	// gives a connection to send its header (tests only; 0: the fixed 5 s).
	ProxyHeaderWithin time.Duration
}

// New prepares the listener of cfg.Broker.Operations (nil: none, and New
// returns nil): each TLS door's files read and the configuration document
// rendered, before anything opens — a door that cannot be served, or a
// document that cannot be built, stops the start (docs/configuration.md "`broker.operations`"; docs/operations.md "The routes").
func New(cfg *config.Config, o Options) (*Server, error) {
	oc := cfg.Broker.Operations
	if oc == nil {
		return nil, nil
	}
	doc, err := renderConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{src: o.Source, log: o.Log, doc: doc, minScrape: oc.MinScrapeInterval,
		refusals: logging.NewRefusalLog(o.Log, o.Now)}
	var errs []error
	for _, l := range oc.Listeners {
		d := &door{cfg: l, slots: make(chan struct{}, MaxConnsPerDoor),
			layers: &doorpkg.Layers{Proxy: l.ProxyProtocol, ProxyWithin: o.ProxyHeaderWithin}}
		if l.TLS != nil {
			certs, err := doorpkg.LoadCertificates(l.ID, *l.TLS)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			d.layers.TLS = certs
		}
		d.layers.Refused = func(c *doorpkg.Conn, err error) { s.layerRefused(d, c, err) }
		s.doors = append(s.doors, d)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("the operations listener's TLS certificates cannot be served: %w", errors.Join(errs...))
	}
	return s, nil
}

// Doors are the doors to bind, in configuration order.
func (s *Server) Doors() []config.Listener {
	out := make([]config.Listener, len(s.doors))
	for i, d := range s.doors {
		out[i] = d.cfg
	}
	return out
}

// Certificates are the TLS doors' certificates, for the broker's SIGUSR1
// reload (all doors, MQTT and operations, read before any is changed).
func (s *Server) Certificates() []*doorpkg.Certificates {
	var out []*doorpkg.Certificates
	for _, d := range s.doors {
		if d.layers.TLS != nil {
			out = append(out, d.layers.TLS)
		}
	}
	return out
}

// Serve serves the door whose id is id on ln, bound by the caller (the
// broker binds operations doors as it binds MQTT doors), from now on: it
// returns at once, the door served on a goroutine of its own until Close.
func (s *Server) Serve(id string, ln net.Listener) error {
	var d *door
	for _, x := range s.doors {
		if x.cfg.ID == id {
			d = x
		}
	}
	if d == nil {
		return fmt.Errorf("the operations listener has no door %s", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("the operations listener is closed")
	}
	if s.metrics == nil {
		s.metrics = s.src.MetricsHandler()
	}
	d.ln = &doorListener{Listener: ln, d: d, s: s}
	d.http = &http.Server{
		Handler:           s.handler(d),
		ReadHeaderTimeout: headerWithin,
		ReadTimeout:       readWithin,
		WriteTimeout:      writeWithin,
		IdleTimeout:       idleWithin,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		// net/http's own complaints (a malformed request, a handshake cut
		// short) are the caller's doing: debug, one bounded line each.
		ErrorLog: slog.NewLogLogger(s.log.With("component", "operations", "listener", d.cfg.Name).Handler(), slog.LevelDebug),
	}
	s.serving.Add(1)
	go func(srv *http.Server, ln net.Listener) {
		defer s.serving.Done()
		_ = srv.Serve(ln)
	}(d.http, d.ln)
	return nil
}

// Authentication is how /metrics is authenticated on the door (the
// listening line's metrics_authentication): "basic", "client
// certificate", "basic+client certificate", or "none" — no credential
// asked, the door trusting its callers.
func (s *Server) Authentication(id string) string {
	for _, d := range s.doors {
		if d.cfg.ID == id {
			return d.authentication()
		}
	}
	return ""
}

func (d *door) authentication() string {
	basic := d.cfg.PasswordFile != ""
	certs := d.cfg.ProxyProtocol || (d.cfg.TLS != nil && d.cfg.TLS.ClientCAFile != "")
	required := d.cfg.TLS != nil && d.cfg.TLS.ClientCAFile != "" && d.cfg.TLS.RequireCertificate
	switch {
	case basic && certs:
		return "basic+client certificate"
	case basic:
		return "basic"
	case required:
		return "client certificate"
	}
	return "none"
}

// Layers are the door's TLS or PROXY layers (nil: no such door), for its
// listening line.
func (s *Server) Layers(id string) *doorpkg.Layers {
	for _, d := range s.doors {
		if d.cfg.ID == id {
			return d.layers
		}
	}
	return nil
}

// MinScrapeInterval is broker.operations.min_scrape_interval.
func (s *Server) MinScrapeInterval() time.Duration { return s.minScrape }

// Close stops every door — no new connection, every open one closed — and
// returns once each accept loop has returned and no request is being
// handled. Idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	for _, d := range s.doors {
		if d.http != nil {
			_ = d.http.Close() // closes the listener and every connection
		}
	}
	s.serving.Wait()
	s.handling.Wait()
	s.refusals.Flush(true)
}

// connKey is the request context's key for the connection it came on.
type connKey struct{}

// doorListener is a door's socket as net/http accepts from it: each
// connection takes one of the door's slots (or is closed at once when
// none is free) and is put behind the door's layers.
type doorListener struct {
	net.Listener
	d *door
	s *Server
}

func (l *doorListener) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.d.slots <- struct{}{}:
		default:
			// invariant 13: a door holds at most MaxConnsPerDoor connections.
			// The line first: it is written by the time the caller sees the close.
			l.s.refused(l.d, raw.RemoteAddr().String(), "connections",
				"operations connection refused: the door holds its most connections", "most", MaxConnsPerDoor)
			_ = raw.Close()
			continue
		}
		now := time.Now()
		setupBy := now.Add(headerWithin)
		_ = raw.SetReadDeadline(setupBy)
		c := doorpkg.Wrap(raw, l.d.layers, now, setupBy)
		return &slotConn{Conn: c, slots: l.d.slots}, nil
	}
}

// slotConn gives its door's slot back when closed (once, however often
// net/http closes it).
type slotConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}

// peerOf is what the door's layers learnt of the request's connection.
func peerOf(r *http.Request) doorpkg.Peer {
	if sc, ok := r.Context().Value(connKey{}).(*slotConn); ok {
		if dc, ok := sc.Conn.(*doorpkg.Conn); ok {
			return dc.Peer()
		}
	}
	return doorpkg.Peer{}
}

// layerRefused logs a connection whose TLS handshake or PROXY header
// failed, rate-limited per remote host; a caller that went away is not a
// refusal.
func (s *Server) layerRefused(d *door, c *doorpkg.Conn, err error) {
	var se *doorpkg.SetupError
	if !errors.As(err, &se) {
		return
	}
	remote := c.RemoteAddr().String()
	var ne net.Error
	if errors.Is(err, net.ErrClosed) || (errors.As(err, &ne) && ne.Timeout()) {
		s.log.Debug("operations connection ended during its setup", "listener", d.cfg.Name, "remote", remote, "error", err)
		return
	}
	s.refused(d, remote, se.Layer, "operations connection refused: "+se.Layer, "reason", se.Err.Error())
}

// refused is one line about a refused connection or request, rate-limited
// per remote host and kind.
func (s *Server) refused(d *door, remote, kind, msg string, args ...any) {
	source := remote
	if host, _, err := net.SplitHostPort(remote); err == nil {
		source = host
	}
	args = append([]any{"listener", d.cfg.Name, "remote", remote}, args...)
	s.refusals.Refused(logging.Refusal{Level: slog.LevelWarn, Client: source, Kind: kind, Msg: msg, Args: args})
}
