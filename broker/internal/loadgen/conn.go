// Package loadgen drives an MQTT 5 broker and checks what comes back: QoS 1
// publishers (stock paho.golang clients) that count PUBACKs, a subscriber
// that accounts for every published message, and a channel reader that
// times a replay and checks its saguin-offset sequence; for current state
// (latest.go, fanout.go, pointread.go), a topic set's values published and
// read back whole by a new subscriber, one publish fanned out to many
// subscribers, and point reads matched to their answers. The receiving side
// is a small MQTT 5 client of its own, because paho's receive path is
// slower than the replay rate the benchmark has to measure (subscriber.go
// says by how much). Nothing here knows Sagüin beyond the User Properties a
// channel delivery carries, so the same load runs against any broker
// (invariant 10: the broker is the enforcement point, so the load generator
// must be an ordinary client).
//
// Every check fails loudly: a PUBACK with any reason code other than 0x00,
// a message lost, delivered twice, out of order, or never published, or a
// gap or repeat in a replay's offsets is an error, never a footnote beside
// a throughput figure.
package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// readBufferSize is the per-connection read buffer. paho reads a packet's
// fixed header a byte at a time; without a buffer every small PUBACK costs
// three or four read system calls, and on a two-core machine the load
// generator would then measure itself rather than the broker.
const readBufferSize = 64 << 10

// maxPendingWrite bounds the coalescing buffer kept between writes
// (invariant 13): one packet is the most it ever holds, and a buffer that
// grew for a large packet is dropped rather than kept.
const maxPendingWrite = 1 << 20

// bufConn is a net.Conn for one paho client: reads go through a buffer, and
// each packet paho writes leaves in one write system call.
//
// paho writes every packet through packets.ControlPacket.WriteTo, which takes
// the connection's sync.Locker (when it has one) around the whole packet and
// then writes its parts one by one. bufConn collects those parts while the
// lock is held and sends them together on Unlock, so concurrent publishers on
// one connection never interleave and a packet costs one system call. A Write
// outside the lock is written through at once, under the same mutex.
type bufConn struct {
	net.Conn
	r *bufio.Reader

	mu       sync.Mutex
	batching bool   // a WriteTo holds mu; guarded by mu
	pending  []byte // parts of the packet being written; guarded by mu
	werr     error  // first write failure; guarded by mu
}

func newBufConn(c net.Conn) *bufConn {
	return &bufConn{Conn: c, r: bufio.NewReaderSize(c, readBufferSize)}
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Lock is taken by paho around each packet it writes.
func (c *bufConn) Lock() {
	c.mu.Lock()
	c.batching = true
}

// Unlock sends the packet collected since Lock in one write.
func (c *bufConn) Unlock() {
	if len(c.pending) > 0 && c.werr == nil {
		if _, err := c.Conn.Write(c.pending); err != nil {
			// paho was told the parts were written; closing the socket makes
			// its reader fail, which fails every publish still waiting, so
			// the error surfaces rather than a PUBACK that never comes.
			c.werr = fmt.Errorf("write: %w", err)
			_ = c.Conn.Close()
		}
	}
	if cap(c.pending) > maxPendingWrite {
		c.pending = nil
	} else {
		c.pending = c.pending[:0]
	}
	c.batching = false
	c.mu.Unlock()
}

// Write collects p when called inside Lock/Unlock (paho's only way of
// writing) and writes it through otherwise.
func (c *bufConn) Write(p []byte) (int, error) {
	if !c.batchingLocked() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.werr != nil {
			return 0, c.werr
		}
		return c.Conn.Write(p)
	}
	if c.werr != nil {
		return 0, c.werr
	}
	c.pending = append(c.pending, p...)
	return len(p), nil
}

// batchingLocked reports whether the caller is inside Lock. It may only be
// read without mu by the goroutine holding mu: paho calls Write solely from
// within WriteTo, which holds it, so the field is never read concurrently
// with a change to it.
func (c *bufConn) batchingLocked() bool { return c.batching }

// ClientOptions are the CONNECT settings of a publishing client. (Receiving
// goes through subscriber, which is not paho; see there.)
type ClientOptions struct {
	ClientID  string
	KeepAlive uint16 // seconds; 0 = 30
	// PacketTimeout bounds CONNECT and each PUBLISH's wait for
	// its acknowledgement; 0 = 10s.
	PacketTimeout time.Duration
}

// Dial connects to addr with Clean Start and no session expiry (a publisher
// keeps nothing across connections) and completes the MQTT 5 handshake. The
// returned client is closed by Disconnect or by its connection dropping.
func Dial(ctx context.Context, addr string, o ClientOptions) (*paho.Client, *paho.Connack, error) {
	if o.PacketTimeout <= 0 {
		o.PacketTimeout = 10 * time.Second
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 30
	}
	d := net.Dialer{Timeout: o.PacketTimeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		// Nagle would hold a lone PUBACK back waiting for company.
		_ = tc.SetNoDelay(true)
	}
	cfg := paho.ClientConfig{
		ClientID:      o.ClientID,
		Conn:          newBufConn(raw),
		PacketTimeout: o.PacketTimeout,
	}
	c := paho.NewClient(cfg)
	cp := &paho.Connect{
		ClientID:   o.ClientID,
		CleanStart: true,
		KeepAlive:  o.KeepAlive,
		// paho sends Request Problem Information 0 unless told otherwise;
		// ask for the protocol default, so a refusal's reason string comes
		// back for the error message.
		Properties: &paho.ConnectProperties{RequestProblemInfo: true},
	}
	ca, err := c.Connect(ctx, cp)
	if err != nil {
		_ = raw.Close()
		if ca != nil {
			return nil, ca, fmt.Errorf("connect %s as %q: CONNACK reason 0x%02x: %w", addr, o.ClientID, ca.ReasonCode, err)
		}
		return nil, nil, fmt.Errorf("connect %s as %q: %w", addr, o.ClientID, err)
	}
	return c, ca, nil
}

// disconnect sends a normal DISCONNECT and waits (bounded) for the client's
// goroutines to finish, so no client outlives the run that made it.
func disconnect(c *paho.Client) {
	_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
	}
}

// errFirst keeps the first error of many goroutines and counts the rest.
type errFirst struct {
	mu    sync.Mutex
	first error
	n     int
}

func (e *errFirst) add(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		e.first = err
	}
	e.n++
}

func (e *errFirst) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.first == nil:
		return nil
	case e.n == 1:
		return e.first
	default:
		return fmt.Errorf("%w (and %d more errors)", e.first, e.n-1)
	}
}
