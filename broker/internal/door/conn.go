package door

import (
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// ProxyHeaderWithin is how long after its accept a connection has to send
// its whole PROXY header (docs/configuration.md "`broker.mqtt`": fixed), unless the connect
// deadline comes sooner.
const ProxyHeaderWithin = 5 * time.Second

// closeCourtesy bounds what a graceful close writes before the socket is
// closed (a WebSocket close frame, TLS's close_notify): a client that does
// not read is not waited for.
const closeCourtesy = time.Second

// Layers are what one door puts between a socket and the protocol's bytes,
// in this order: a PROXY header, TLS, a WebSocket upgrade. Shared by the
// door's connections; TLS certificates and WebSocket origins can be
// replaced while it serves (Certificates.Apply, WebSocket.SetOrigins).
type Layers struct {
	Proxy bool // read a PROXY protocol v2 header first
	// ProxyWithin replaces ProxyHeaderWithin (tests; 0: the constant).
	ProxyWithin time.Duration
	TLS         *Certificates // nil: no TLS
	WS          *WebSocket    // nil: not a WebSocket door
	// Refused is told why a connection's setup failed, once, on the
	// connection's goroutine, before its Read returns the error.
	Refused func(c *Conn, err error)
	// Ready is told once a connection's layers are set up, on its
	// goroutine, before the protocol's first byte is read.
	Ready func(c *Conn)
}

// Describe is how a door's layers show in its listening line: "(tls)",
// "(ws)", "(wss)", "(proxy v2)" or "".
func (l *Layers) Describe() string {
	switch {
	case l == nil:
		return ""
	case l.WS != nil && l.TLS != nil:
		return "(wss)"
	case l.WS != nil:
		return "(ws)"
	case l.TLS != nil:
		return "(tls)"
	case l.Proxy:
		return "(proxy v2)"
	}
	return ""
}

// ClientCertificates says what the door does with client certificates:
// "required", "accepted" (verified when given, by us or by the proxy) or
// "none".
func (l *Layers) ClientCertificates() string {
	switch {
	case l == nil:
		return "none"
	case l.TLS != nil:
		return l.TLS.Held().ClientCertificates
	case l.Proxy:
		return "accepted"
	}
	return "none"
}

// SetupError is a connection whose layers could not be set up: which
// layer ("proxy", "tls", "upgrade") and why.
type SetupError struct {
	Layer string
	Err   error
}

func (e *SetupError) Error() string { return e.Layer + ": " + e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }

// Peer is what the layers learnt of the client.
type Peer struct {
	// Proxy is the PROXY header (nil: the door reads none).
	Proxy *ProxyHeader
	// TLS: the client connected to this door over TLS.
	TLS bool
	// Certificate: the client presented a certificate (to this door, or
	// to the proxy as its header says).
	Certificate bool
	// Name is the verified certificate's name (CertificateName, or the
	// CN of a proxy that verified it); "" names nobody.
	Name string
	// From is where Name came from: "certificate", "proxy", or "".
	From string
}

// errNotSetUp is a write to a connection whose layers are not set up: only
// its reader sets them up, and nothing is written to a client before it
// has been read.
var errNotSetUp = errors.New("the connection's TLS, WebSocket or PROXY layers are not set up yet")

// Conn is an accepted socket behind its door's layers. They are set up on
// its first Read, on the reader's goroutine, within the deadline the
// consumer set on the socket before Wrap (its connect deadline); writes
// before that fail.
type Conn struct {
	raw        net.Conn
	l          *Layers
	acceptedAt time.Time
	setupBy    time.Time

	// rdl is the read deadline the consumer set before the setup ended:
	// what the PROXY header's own deadline gives way to.
	rdl   time.Time
	top   net.Conn // the stream above the layers; set before ready
	ready atomic.Bool
	err   error // the setup's failure (reader only)
	peer  Peer  // set before ready
	// source is the proxied client's address, when known.
	source atomic.Pointer[net.Addr]
}

// Wrap puts l's layers over raw, accepted at acceptedAt; setupBy is the
// deadline of the whole setup (the consumer's connect deadline, already
// set as raw's read deadline).
func Wrap(raw net.Conn, l *Layers, acceptedAt, setupBy time.Time) *Conn {
	return &Conn{raw: raw, l: l, acceptedAt: acceptedAt, setupBy: setupBy, rdl: setupBy}
}

// Peer is what the layers learnt of the client (complete once the first
// Read has returned data).
func (c *Conn) Peer() Peer {
	if !c.ready.Load() {
		return Peer{}
	}
	return c.peer
}

// Raw is the accepted socket.
func (c *Conn) Raw() net.Conn { return c.raw }

func (c *Conn) Read(p []byte) (int, error) {
	if !c.ready.Load() {
		if c.err != nil {
			return 0, c.err
		}
		if err := c.setup(); err != nil {
			c.err = err
			if c.l.Refused != nil {
				c.l.Refused(c, err)
			}
			return 0, err
		}
		if c.l.Ready != nil {
			c.l.Ready(c)
		}
	}
	return c.top.Read(p)
}

func (c *Conn) Write(p []byte) (int, error) {
	if !c.ready.Load() {
		return 0, errNotSetUp
	}
	return c.top.Write(p)
}

// setup reads and answers each layer in turn, under setupBy.
func (c *Conn) setup() error {
	var under net.Conn = c.raw
	// What the setup writes (TLS's handshake, an HTTP answer) is bounded
	// by the same deadline as what it reads.
	_ = c.raw.SetWriteDeadline(c.setupBy)
	if c.l.Proxy {
		within := c.l.ProxyWithin
		if within <= 0 {
			within = ProxyHeaderWithin
		}
		_ = c.raw.SetReadDeadline(earlier(c.acceptedAt.Add(within), c.rdl))
		h, err := ReadProxyHeader(c.raw)
		if err != nil {
			return &SetupError{Layer: "proxy", Err: err}
		}
		_ = c.raw.SetReadDeadline(c.rdl)
		c.peer.Proxy = h
		if h.Source != nil {
			c.source.Store(&h.Source)
		}
		if h.SSL != nil && h.SSL.Presented() {
			c.peer.Certificate = true
			if h.SSL.Verified() && h.SSL.CN != "" {
				c.peer.Name, c.peer.From = h.SSL.CN, "proxy"
			}
		}
	}
	if c.l.TLS != nil {
		tc := tls.Server(under, c.l.TLS.serverConfig())
		if err := tc.Handshake(); err != nil {
			return &SetupError{Layer: "tls", Err: err}
		}
		c.peer.TLS = true
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			// Verified by the handshake (verifyClientChain), or it failed.
			c.peer.Certificate = true
			if name := CertificateName(certs[0]); name != "" {
				c.peer.Name, c.peer.From = name, "certificate"
			}
		}
		under = tc
	}
	if c.l.WS != nil {
		ws, err := c.l.WS.upgrade(under, c.l.TLS != nil)
		if err != nil {
			return &SetupError{Layer: "upgrade", Err: err}
		}
		under = ws
	}
	c.top = under
	c.ready.Store(true)
	return nil
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Close ends the connection: the layers' own goodbyes (a WebSocket close
// frame, TLS's close_notify) get closeCourtesy, then the socket is closed
// whatever they are doing.
func (c *Conn) Close() error {
	if !c.ready.Load() || c.top == c.raw {
		return c.raw.Close()
	}
	cut := time.AfterFunc(closeCourtesy, func() { _ = c.raw.Close() })
	err := c.top.Close()
	if !cut.Stop() {
		err = nil // cut short: the socket is closed all the same
	}
	_ = c.raw.Close()
	return err
}

// Abort closes the socket at once, with no goodbye: the connection failed
// or is being cut.
func (c *Conn) Abort() error { return c.raw.Close() }

// RemoteAddr is the client's address: the proxied one when a PROXY header
// gave it, else the socket's peer.
func (c *Conn) RemoteAddr() net.Addr {
	if a := c.source.Load(); a != nil {
		return *a
	}
	return c.raw.RemoteAddr()
}

func (c *Conn) LocalAddr() net.Addr { return c.raw.LocalAddr() }

// The deadlines reach the socket through every layer (TLS passes them
// down; the WebSocket layer keeps the write one for its control frames).
func (c *Conn) SetDeadline(t time.Time) error {
	if c.ready.Load() {
		return c.top.SetDeadline(t)
	}
	return c.raw.SetDeadline(t)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.ready.Load() {
		return c.top.SetReadDeadline(t)
	}
	c.rdl = t // the reader's own call: the setup runs on its goroutine
	return c.raw.SetReadDeadline(t)
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.ready.Load() {
		return c.top.SetWriteDeadline(t)
	}
	return c.raw.SetWriteDeadline(t)
}
