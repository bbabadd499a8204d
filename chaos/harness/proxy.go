package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP relay between the clients and the broker. Every client
// connects through it, which gives the harness two things: a stable address
// across restarts (the broker listens on a new port each time), and the link
// cut nemesis — every connection reset at once, new ones refused for a while,
// with the broker process untouched.
type Proxy struct {
	ln  net.Listener
	now func() int64

	mu       sync.Mutex
	upstream string
	blocked  bool
	conns    map[*proxyConn]struct{}
	// cutAt remembers, for a client connection the proxy reset, when it did:
	// the earliest moment the broker could have seen that connection end.
	// Keyed by the client's address (its local address). Bounded: the
	// oldest entries go first (invariant 13).
	cutAt    map[string]int64
	cutOrder []string
	closed   bool

	wg sync.WaitGroup
}

// maxCutMemory bounds the remembered cut times; a client looks its cut up
// within moments of it, so the bound only has to cover one cut's fan-out.
const maxCutMemory = 4096

type proxyConn struct {
	client, server net.Conn
}

// NewProxy listens on 127.0.0.1:0 and relays to upstream (which may be
// changed with SetUpstream). now is the clock cut times are stamped with.
func NewProxy(upstream string, now func() int64) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, now: now, upstream: upstream, conns: map[*proxyConn]struct{}{}, cutAt: map[string]int64{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetUpstream points new connections at addr (the broker after a restart).
func (p *Proxy) SetUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// Cut resets every relayed connection (both sides, with RST) and, while
// block is true, closes new ones at once. It returns the moment the cut
// began.
func (p *Proxy) Cut(block bool) int64 {
	p.mu.Lock()
	t := p.now()
	p.blocked = block
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
		p.rememberCut(c.client.RemoteAddr().String(), t)
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, c := range conns {
		c.reset()
	}
	return t
}

// Unblock lets new connections through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// CutTime reports when the proxy reset the connection whose client side has
// local address clientAddr, if it did.
func (p *Proxy) CutTime(clientAddr string) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.cutAt[clientAddr]
	return t, ok
}

func (p *Proxy) rememberCut(addr string, t int64) {
	if _, ok := p.cutAt[addr]; !ok {
		p.cutOrder = append(p.cutOrder, addr)
	}
	p.cutAt[addr] = t
	for len(p.cutOrder) > maxCutMemory {
		delete(p.cutAt, p.cutOrder[0])
		p.cutOrder = p.cutOrder[1:]
	}
}

// Close stops accepting, resets every connection and waits for the relays.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut(true)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (EMFILE): back off, never spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		blocked, upstream, closed := p.blocked, p.upstream, p.closed
		p.mu.Unlock()
		if blocked || closed {
			resetConn(c)
			continue
		}
		p.wg.Add(1)
		go p.relay(c, upstream)
	}
}

func (p *Proxy) relay(client net.Conn, upstream string) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		resetConn(client) // the broker is down: the client sees a refused link
		return
	}
	pc := &proxyConn{client: client, server: server}
	p.mu.Lock()
	if p.blocked || p.closed {
		p.mu.Unlock()
		pc.reset()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	// One side ended: end the other, so a broker that closes a connection
	// is seen closing it by the client, and the reverse.
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
	_ = client.Close()
	_ = server.Close()
	<-done
}

func (c *proxyConn) reset() {
	resetConn(c.client)
	resetConn(c.server)
}

// resetConn closes with SO_LINGER 0, so the peer gets an RST rather than an
// orderly FIN: the link broke, nobody said goodbye.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
