package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"saguin.dev/broker/config"
	doorpkg "saguin.dev/broker/internal/door"
	"saguin.dev/broker/internal/logging"
)

// The doors' layers (rfcs/doors.md): TLS, WebSocket and the PROXY header in
// front of an MQTT door's clientConn. The layers themselves are
// broker/internal/door's; this file builds them from the configuration,
// logs what they refuse, reloads them (SIGUSR1) and tells the CONNECT what
// they learnt of the client.

// mqttSubprotocol is the WebSocket subprotocol of MQTT (MQTT 5 §6).
const mqttSubprotocol = "mqtt"

// The kinds of refusal a door's layers give (logging.RefusalLog keys).
const (
	refuseTLS     = "tls"     // a TLS handshake that failed
	refuseUpgrade = "upgrade" // a WebSocket upgrade answered with an HTTP error (403 for an origin)
	refuseProxy   = "proxy"   // a connection refused by proxy_protocol
	// refuseProxyV1 is its own kind: the line that tells the operator the
	// proxy speaks version 1 must not be held back behind other refusals
	// (a unix door's clients all share one remote address).
	refuseProxyV1     = "proxy v1"
	noteProxiedCert   = "proxied certificate"
	noteNamelessCert  = "client certificate"
	proxiedCertNotice = "proxied client certificate not believed: the proxy did not verify it; the client is treated as having none"
)

// doorLayers builds the layers of every MQTT door that has any, reading
// every TLS door's files (docs/configuration.md "`broker.mqtt`": a bad certificate stops the
// start, naming the door, before any port opens; every door's problem is
// reported at once).
func (b *Broker) doorLayers() (map[string]*doorpkg.Layers, error) {
	out := make(map[string]*doorpkg.Layers)
	var errs []error
	for i := range b.cfg.Broker.Listeners {
		l := &b.cfg.Broker.Listeners[i]
		if l.TLS == nil && l.Kind != "ws" && !l.ProxyProtocol {
			continue
		}
		ly := &doorpkg.Layers{Proxy: l.ProxyProtocol, ProxyWithin: b.proxyWithin}
		if l.TLS != nil {
			certs, err := doorpkg.LoadCertificates(l.ID, *l.TLS)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			ly.TLS = certs
		}
		if l.Kind == "ws" {
			ly.WS = doorpkg.NewWebSocket(mqttSubprotocol, doorpkg.Origins{SameOrigin: l.SameOrigin, Allowed: l.AllowedOrigins})
		}
		ly.Refused = func(c *doorpkg.Conn, err error) { b.layerRefused(l, c, err) }
		ly.Ready = func(c *doorpkg.Conn) { b.layerReady(l, c) }
		out[l.ID] = ly
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("TLS certificates cannot be served: %w", errors.Join(errs...))
	}
	return out, nil
}

// doorStatement is how a door shows in its listening line (docs/operations.md "A start"): its name when it has one of its own, its kind, its address and
// its layers — "tcp 0.0.0.0:1883", "fleet tcp 0.0.0.0:8883 (tls)".
func doorStatement(l config.Listener, addr string, ly *doorpkg.Layers) string {
	s := l.Kind + " " + addr
	if l.Name != l.Kind {
		s = l.Name + " " + s
	}
	if d := ly.Describe(); d != "" {
		s += " " + d
	}
	return s
}

// logListening is a door's listening line.
func (b *Broker) logListening(l config.Listener, addr string, ly *doorpkg.Layers) {
	attrs := []any{"listener", l.Name, "door", doorStatement(l, addr, ly), "client_certificates", ly.ClientCertificates()}
	if ly != nil && ly.TLS != nil {
		h := ly.TLS.Held()
		attrs = append(attrs, "not_after", h.NotAfter.UTC().Format(time.RFC3339), "client_ca", h.ClientCA)
	}
	b.log.Info("listening", append(attrs, "address", addr)...)
}

// layerRefused logs a connection whose layers refused it: one bounded
// line, rate-limited per remote host like every refusal at the door (a
// client retrying in a loop is not a line per attempt). A client that
// went away or ran out of connect_timeout mid-handshake is only a debug
// line: nothing was wrong with the door.
func (b *Broker) layerRefused(l *config.Listener, c *doorpkg.Conn, err error) {
	remote := c.RemoteAddr().String()
	var se *doorpkg.SetupError
	if !errors.As(err, &se) {
		return
	}
	var ur *doorpkg.UpgradeRefusal
	switch {
	case errors.As(err, &ur):
		args := []any{"listener", l.Name, "status", ur.Status, "reason", ur.Reason, "remote", remote}
		if ur.Origin != "" {
			args = append(args, "origin", ur.Origin)
		}
		b.doorRefusal(remote, refuseUpgrade, "WebSocket upgrade refused: HTTP "+fmt.Sprint(ur.Status), args...)
	case se.Layer == "proxy":
		kind := refuseProxy
		if errors.Is(err, doorpkg.ErrProxyV1) {
			kind = refuseProxyV1
		}
		b.doorRefusal(remote, kind, "connection refused by proxy_protocol", "listener", l.Name,
			"setting", l.ID+".proxy_protocol", "reason", se.Err.Error(), "remote", remote)
	case gone(err):
		b.log.Debug("connection ended during its "+layerName(se.Layer), "listener", l.Name, "remote", remote, "error", err)
	case se.Layer == "tls":
		b.doorRefusal(remote, refuseTLS, "TLS handshake failed", "listener", l.Name, "error", se.Err.Error(), "remote", remote)
	default:
		b.doorRefusal(remote, refuseUpgrade, "WebSocket upgrade failed", "listener", l.Name, "error", se.Err.Error(), "remote", remote)
	}
}

func layerName(layer string) string {
	switch layer {
	case "tls":
		return "TLS handshake"
	case "upgrade":
		return "WebSocket upgrade"
	}
	return "PROXY header"
}

// gone reports whether err is the client leaving or its time running out,
// not a refusal.
func gone(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) || strings.HasSuffix(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "connection reset by peer")
}

// layerReady notes what a connection's layers learnt that the operator
// must hear of: a certificate that names nobody, or a proxied one the
// proxy did not verify (docs/configuration.md "`broker.mqtt`"; docs/security.md "1. Certificates"). Rate-limited per remote
// host: one client reconnecting is not a line per attempt.
func (b *Broker) layerReady(l *config.Listener, c *doorpkg.Conn) {
	p := c.Peer()
	remote := c.RemoteAddr().String()
	switch {
	case p.Proxy != nil && p.Proxy.SSL != nil && p.Proxy.SSL.Presented() && !p.Proxy.SSL.Verified():
		b.doorRefusal(remote, noteProxiedCert, proxiedCertNotice, "listener", l.Name,
			"verify_result", p.Proxy.SSL.Verify, "remote", remote)
	case p.Certificate && p.Name == "":
		what := "its certificate has no Common Name and no DNS name"
		if p.Proxy != nil {
			what = "the proxy sent no Common Name for its certificate"
		}
		b.doorRefusal(remote, noteNamelessCert, "client certificate names nobody: "+what+"; the client is treated as having none",
			"listener", l.Name, "remote", remote)
	}
}

// doorRefusal is one line about a connection at a door's layers, keyed by
// the remote host: a refusal, or a note about a connection that goes on.
func (b *Broker) doorRefusal(remote, kind, msg string, args ...any) {
	notice := kind == noteProxiedCert || kind == noteNamelessCert // the connection goes on
	b.refusals.Refused(logging.Refusal{Level: slog.LevelWarn, Client: remoteSource(remote), Kind: kind, Msg: msg, Args: args,
		Ends: !notice})
}

// remoteSource keys a connection's lines before it has a client id: its
// host (a client reconnecting uses a new port each time).
func remoteSource(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return "remote " + host
	}
	return "remote " + remote
}

// ReloadCertificates re-reads every TLS door's certificate, key and client
// CA from the files the door was started with (docs/operations.md "Signals" item 4), all
// or nothing: if any file of any door is bad, each is logged naming its
// door and file, nothing is applied, and every door serves what it had.
// Otherwise every connection accepted from now on is served the new files
// (a connected client keeps its connection), and each door's line says
// what it now holds.
//
// The operations listener's TLS doors are read in the same pass (docs/operations.md "Who the caller is"): a bad file on any door, MQTT or operations, changes none.
// A bridge's files are read too, and its link connects again with them at
// once (docs/bridge.md "The link").
func (b *Broker) ReloadCertificates() error {
	// The bridges' files are their own: a bad one leaves its link as it
	// is and changes no door (bridges.go).
	bridgeErr := b.reloadBridgeCertificates()
	type reload struct {
		name  string
		certs *doorpkg.Certificates
		next  *doorpkg.Loaded
	}
	var todo []reload
	var errs []error
	for _, d := range b.tlsDoors() {
		next, err := d.certs.Load()
		if err != nil {
			errs = append(errs, err)
			b.log.Error("TLS certificates not reloaded: a file is bad", "listener", d.name, "error", err)
			continue
		}
		todo = append(todo, reload{d.name, d.certs, next})
	}
	if len(errs) > 0 {
		b.log.Error("TLS certificates not reloaded: nothing applied, every door serves what it had; fix the files and send SIGUSR1 again",
			"doors_failed", len(errs))
		return errors.Join(append(errs, bridgeErr)...)
	}
	for _, r := range todo {
		r.certs.Apply(r.next)
		h := r.next.Held()
		b.log.Info("TLS certificates reloaded", "listener", r.name, "not_after", h.NotAfter.UTC().Format(time.RFC3339),
			"serial", h.Serial, "client_ca", h.ClientCA)
	}
	return bridgeErr
}

// tlsDoor is a door serving TLS, by the name its lines give it: an MQTT
// door's name, or an operations door's id (broker.operations.listen.tcp),
// since the two sets of names may meet.
type tlsDoor struct {
	name  string
	certs *doorpkg.Certificates
}

// tlsDoors are the MQTT doors' and the operations doors' TLS files.
func (b *Broker) tlsDoors() []tlsDoor {
	var out []tlsDoor
	for _, l := range b.cfg.Broker.Listeners {
		if ly := b.layers[l.ID]; ly != nil && ly.TLS != nil {
			out = append(out, tlsDoor{l.Name, ly.TLS})
		}
	}
	if b.operations.srv != nil {
		for _, c := range b.operations.srv.Certificates() {
			out = append(out, tlsDoor{c.Door(), c})
		}
	}
	return out
}

// ReloadOrigins applies each ws door's same_origin and allowed_origins
// from a re-read configuration (docs/operations.md "Signals" item 2) to the upgrades from
// now on. A door is matched by its id; one the file no longer has keeps
// its origins (doors are opened and closed only at start).
func (b *Broker) ReloadOrigins(cfg *config.Config) {
	for i := range b.cfg.Broker.Listeners {
		l := &b.cfg.Broker.Listeners[i]
		ly := b.layers[l.ID]
		if ly == nil || ly.WS == nil {
			continue
		}
		var next *config.Listener
		for j := range cfg.Broker.Listeners {
			if n := &cfg.Broker.Listeners[j]; n.ID == l.ID && n.Kind == "ws" {
				next = n
			}
		}
		if next == nil {
			b.log.Warn("ws origins not re-read: the door is not in the re-read configuration; it keeps its origins until a restart",
				"listener", l.Name)
			continue
		}
		ly.WS.SetOrigins(doorpkg.Origins{SameOrigin: next.SameOrigin, Allowed: next.AllowedOrigins})
		allowed := "any"
		if len(next.AllowedOrigins) > 0 {
			allowed = strings.Join(next.AllowedOrigins, ",")
		}
		b.log.Info("ws origins re-read", "listener", l.Name, "same_origin", next.SameOrigin, "allowed_origins", allowed)
	}
}

// peerIdentity is what a connection's door knows of its client, for the
// CONNECT's authentication (docs/configuration.md "`broker.mqtt`"; docs/security.md "1. Certificates").
type peerIdentity struct {
	// door is the door the client came through.
	door *config.Listener
	// name is the verified certificate's name — its Common Name, else its
	// first DNS name, or the CN a PROXY header vouched for — as presented
	// (the CONNECT refuses control characters, 0x86); "" names nobody.
	name string
	// from is where name came from: "certificate", "proxy", or "".
	from string
	// certificate: the client presented a certificate, to this door or to
	// the proxy (a certificate client is never looked up in a password
	// file, docs/security.md "1. Certificates").
	certificate bool
	// proxied: the door read a PROXY header for this connection; then
	// verifyResult is its SSL TLV's verify result (0: verified, or no TLV)
	// and client the address the header gave (nil: LOCAL or unspecified).
	proxied      bool
	verifyResult uint32
	client       net.Addr
}

// peer is what the door knows of the client. Valid from the CONNECT on.
func (c *clientConn) peer() peerIdentity {
	id := peerIdentity{door: c.l.door, client: c.RemoteAddr()}
	dc, ok := c.Conn.(*doorpkg.Conn)
	if !ok {
		return id
	}
	p := dc.Peer()
	id.name, id.from, id.certificate = p.Name, p.From, p.Certificate
	if p.Proxy != nil {
		id.proxied = true
		id.client = p.Proxy.Source
		if p.Proxy.SSL != nil {
			id.verifyResult = p.Proxy.SSL.Verify
		}
	}
	return id
}

// ListenerAddr is the address of the door named name (tests bind port 0).
func (b *Broker) ListenerAddr(name string) net.Addr {
	for _, d := range b.doors {
		if d.id == name {
			return d.ln.Addr()
		}
	}
	return nil
}
