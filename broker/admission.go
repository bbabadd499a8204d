package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/config"
	doorpkg "saguin.dev/broker/internal/door"
	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/wire"
)

// Connection admission (docs/configuration.md "`broker.limits`", invariant 13). Fixed, not
// configurable: the overflow budget is min(max_connections, 32), an
// overflow socket waits up to 50 ms for a slot, and one that got none is
// closed within 100 ms of that (or connect_timeout if sooner).
const (
	overflowBudgetMax = 32
	overflowWait      = 50 * time.Millisecond
	unadmittedWithin  = 100 * time.Millisecond
)

var (
	errServerBusy     = errors.New("no connection slot (limits.max_connections): answered server busy")
	errPacketTooLarge = errors.New("packet over its size limit: refused before it was read")
)

// gate is the broker-wide admission state: one count of connections
// across every MQTT door (limits.max_connections) and the per-client
// publish budgets (ratelimit.go).
type gate struct {
	maxConns int
	budget   int // overflow places: min(max_connections, 32)

	mu       sync.Mutex
	used     int       // slots held, including those handed to a waiter
	overflow int       // overflow places held
	queue    []*waiter // overflow sockets still waiting, oldest first

	// closedAtAccept counts sockets closed at accept, the overflow budget
	// full: refused "server busy" with nothing said.
	closedAtAccept atomic.Uint64

	pub         publishBudgets
	refusedRate atomic.Int64 // publishes refused for rate (saguin_publish_refused_total{reason="publish rate exceeded"})

	writes writerCounts // what the connection writers did (conn_writer.go)
	// wire is every connection's per-packet counts (metrics_counters.go).
	wire wireShards
}

type waiter struct{ granted chan struct{} } // closed when a slot is handed over

func newGate(lim config.Limits) *gate {
	return &gate{
		maxConns: lim.MaxConnections,
		budget:   min(lim.MaxConnections, overflowBudgetMax),
		pub:      publishBudgets{rate: lim.PublishRate, bytes: lim.PublishBytes},
	}
}

// admit places a socket just accepted: a slot, an overflow place (w set),
// or nothing (ok false: the budget is full).
func (g *gate) admit() (w *waiter, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.used < g.maxConns {
		g.used++
		return nil, true
	}
	if g.overflow < g.budget {
		g.overflow++
		w = &waiter{granted: make(chan struct{})}
		g.queue = append(g.queue, w)
		return w, true
	}
	return nil, false
}

// release lets a slot go: to the oldest overflow socket still waiting
// (FIFO), else back to the pool.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) > 0 {
		w := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		g.overflow--
		close(w.granted)
		return
	}
	g.used--
}

// giveUp takes w out of the queue. True if a slot reached it first (it then
// holds that slot); false if it did not (it still holds its overflow place).
func (g *gate) giveUp(w *waiter) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.granted:
		return true
	default:
	}
	for i, q := range g.queue {
		if q == w {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	return false
}

func (g *gate) leaveOverflow() {
	g.mu.Lock()
	g.overflow--
	g.mu.Unlock()
}

// held reports slots and overflow places in use (tests).
func (g *gate) held() (slots, places int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used, g.overflow
}

// admitListener is one MQTT door: it paces accepts (max_connect_rate),
// takes a slot for each socket at accept, and hands out clientConns.
type admitListener struct {
	net.Listener
	g   *gate
	lim config.Limits
	log *slog.Logger
	// refusals counts what the door refuses and rate-limits its lines (a
	// client reconnecting in a loop is not a line per attempt).
	refusals *logging.RefusalLog
	pace     *tokenBucket // nil: max_connect_rate none
	// now is the broker's clock; the writer's hold on answers is timed by
	// it (conn_writer.go corkLinger). nil: the wall clock.
	now func() time.Time
	// door is the door's configuration; layers its TLS, WebSocket and PROXY
	// layers (nil: none), set up on each connection's first read (doors.go).
	door   *config.Listener
	layers *doorpkg.Layers

	mu      sync.Mutex
	pending map[*clientConn]struct{} // sockets that have not finished their CONNECT
	done    chan struct{}
	closed  bool
}

// admitListener wraps a listener with the limits of broker.limits. The gate
// is the broker's, shared by every door.
func (b *Broker) admitListener(ln net.Listener, d *config.Listener, layers *doorpkg.Layers) net.Listener {
	if b.gate == nil {
		b.gate = newGate(b.cfg.Broker.Limits)
	}
	lim := b.cfg.Broker.Limits
	l := &admitListener{Listener: ln, g: b.gate, lim: lim, log: b.log, refusals: b.refusals, now: b.clock.Now,
		door: d, layers: layers, pending: make(map[*clientConn]struct{}), done: make(chan struct{})}
	if lim.MaxConnectRate > 0 {
		// Bursts up to twice the rate (docs/configuration.md "`broker.limits`").
		l.pace = newTokenBucket(float64(lim.MaxConnectRate), 2*float64(lim.MaxConnectRate), time.Now())
	}
	return l
}

// connSendBuffer is the kernel send buffer of each client connection.
// Linux grows an unset one to megabytes, and a client that stops reading
// then swallows that much before any write blocks: its write deadline
// never fires, and with it invariant 16's "disconnected after
// write_timeout". A fixed buffer makes a deaf client's writes block within
// a quarter megabyte (and bounds what the kernel holds per connection).
const connSendBuffer = 256 << 10

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		if err := l.wait(); err != nil {
			return nil, err
		}
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		switch tc := c.(type) {
		case *net.TCPConn:
			_ = tc.SetWriteBuffer(connSendBuffer)
		case *net.UnixConn:
			_ = tc.SetWriteBuffer(connSendBuffer)
		}
		w, ok := l.g.admit()
		if !ok {
			l.g.closedAtAccept.Add(1)
			// Overflow budget full: closed at once, nothing read or
			// written (docs/configuration.md "`broker.limits`").
			l.log.Debug("connection closed at accept: limits.max_connections reached and the overflow budget is full",
				"remote", c.RemoteAddr().String())
			_ = c.Close()
			continue
		}
		now := time.Now()
		cc := &clientConn{Conn: c, l: l, connectBy: now.Add(l.lim.ConnectTimeout),
			writeTimeout: l.lim.WriteTimeout, closedCh: make(chan struct{}), waiter: w, wire: l.g.wire.assign(),
			fr: wire.NewFramer(l.lim.MaxConnectSize, l.lim.MaxMessageSize)}
		cc.state = stateSlot
		if w != nil {
			cc.state, cc.mustWait = stateWaiting, true
		}
		// connect_timeout runs from accept (docs/configuration.md "`broker.limits`"): the CONNECT's
		// reads all fall before it, whatever deadline the substrate sets
		// (clientConn.SetDeadline).
		_ = c.SetReadDeadline(cc.connectBy)
		if l.layers != nil {
			// The PROXY header, the TLS handshake and the HTTP upgrade are
			// read on the connection's first read, on its own goroutine,
			// within connect_timeout (doors.go, rfcs/doors.md).
			cc.Conn = doorpkg.Wrap(c, l.layers, now, cc.connectBy)
		}
		if !l.track(cc) {
			_ = cc.Close()
			return nil, net.ErrClosed
		}
		return cc, nil
	}
}

// wait holds the next accept until max_connect_rate allows it: the excess
// waits in the kernel's accept queue, not refused (docs/configuration.md "`broker.limits`").
func (l *admitListener) wait() error {
	if l.pace == nil {
		return nil
	}
	for {
		d := l.pace.wait(time.Now())
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return net.ErrClosed
		}
	}
}

func (l *admitListener) track(c *clientConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

func (l *admitListener) untrack(c *clientConn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
}

// Close stops accepting and closes every socket that has not finished its
// CONNECT (docs/configuration.md "`broker.limits`": shutdown closes pre-CONNECT sockets at once; the
// substrate's shutdown would otherwise wait out their connect_timeout).
func (l *admitListener) Close() error {
	l.mu.Lock()
	var pending []*clientConn
	if !l.closed {
		l.closed = true
		close(l.done)
		for c := range l.pending {
			pending = append(pending, c)
		}
		clear(l.pending)
	}
	l.mu.Unlock()
	err := l.Listener.Close()
	for _, c := range pending {
		_ = c.Close()
	}
	return err
}

// What a connection holds of the gate.
const (
	stateNone    = iota // nothing (its end is decided)
	stateSlot           // a connection slot
	stateWaiting        // an overflow place, queued for a slot
	statePlace          // an overflow place, no longer waiting
)

// clientConn is one client socket: it follows the client's framing to
// refuse oversized packets before they are read (broker/internal/wire),
// bounds the CONNECT by connect_timeout, writes what every writer hands it
// through one combining writer bounded by write_timeout (conn_writer.go),
// and holds the socket's slot until its end is decided.
type clientConn struct {
	net.Conn
	l            *admitListener
	connectBy    time.Time
	writeTimeout time.Duration // 0: write_timeout none
	waiter       *waiter       // the overflow place's turn in line; set at accept, never changed
	// wire is the connection's shard of the per-packet counters
	// (metrics_counters.go); set at accept, never changed.
	wire *wireShard

	smu   sync.Mutex
	state int

	// w is the writing half (conn_writer.go): every byte to the client,
	// the door's refusals too, goes through it, so a refusal lands between
	// whole packets.
	w connWriter
	// span is the keep-alive read span the substrate last set: with
	// write_timeout none it bounds each write instead (rfcs/limits.md).
	span atomic.Int64
	// readAhead: the client's next bytes are already read, so the
	// substrate's read loop handles them without waiting on the socket
	// (the writer then holds its answers: conn_writer.go).
	readAhead atomic.Bool

	connected atomic.Bool // the whole CONNECT has been read
	closeOnce sync.Once
	// ending: the substrate began this connection's end (OnDisconnect).
	// (Beside closeOnce, whose padding it fills: every connection carries
	// these fields.)
	ending   atomic.Bool
	closedCh chan struct{}

	// Read side: only the substrate's reader calls Read.
	fr       wire.Framer
	mustWait bool // an overflow socket that has not yet waited its turn

	// client is the substrate's client of this connection, from its
	// CONNECT hook on: what a panic on this connection's goroutine
	// (listener.go) must leave consistent.
	client atomic.Pointer[mqtt.Client]
	// auth is who the connection authenticated as at its CONNECT, and its
	// grants (auth.go); nil before.
	auth atomic.Pointer[connAuth]
	// connect is who its CONNECT said the client is, as soon as it is
	// read (refused_record.go): a refusal before the CONNECT hook (a
	// protocol version refused) still names the client.
	connect atomic.Pointer[connectNote]
	// afterServed is what must wait until the substrate has done with the
	// connection — its goroutine has returned (listener.go): the release of
	// the client id's claim a teardown took (ownership.go).
	afterServed atomic.Pointer[func()]
}

// holdUntilServed defers f until the substrate's goroutine for this
// connection has returned. It reports false (f is the caller's to run) if
// something is already waiting there.
func (c *clientConn) holdUntilServed(f func()) bool {
	return c.afterServed.CompareAndSwap(nil, &f)
}

// served runs what waited for the substrate to be done with the
// connection.
func (c *clientConn) served() {
	if f := c.afterServed.Swap(nil); f != nil {
		(*f)()
	}
}

// letGo gives back whatever the connection holds of the gate: its end is
// decided.
func (c *clientConn) letGo() {
	c.smu.Lock()
	defer c.smu.Unlock()
	switch c.state {
	case stateSlot:
		c.l.g.release()
	case stateWaiting:
		if c.l.g.giveUp(c.waiter) {
			c.l.g.release()
		} else {
			c.l.g.leaveOverflow()
		}
	case statePlace:
		c.l.g.leaveOverflow()
	}
	c.state = stateNone
}

// Close ends the connection: what writers were told is accepted (a
// DISCONNECT behind a running flush, answers held for the read side) is
// written first, within the connection's write bound (conn_writer.go
// drain), then the socket is closed. A background flusher has ended when
// Close returns.
func (c *clientConn) Close() error {
	c.drain()
	err := c.shut()
	c.w.mu.Lock()
	for c.w.background {
		// Its socket is closed: its write returns at once.
		ch := c.w.wakeCh()
		c.w.mu.Unlock()
		<-ch
		c.w.mu.Lock()
	}
	c.w.mu.Unlock()
	return err
}

// shut closes the socket and gives back the gate's slot, once; from here no
// Write is accepted.
func (c *clientConn) shut() error {
	c.w.mu.Lock()
	c.w.closing = true
	c.w.broadcast()
	abort := c.w.failed
	c.w.mu.Unlock()
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		close(c.closedCh)
		c.letGo()
		c.l.untrack(c)
		if dc, ok := c.Conn.(*doorpkg.Conn); ok && abort {
			// A failed or cut connection gets no TLS or WebSocket goodbye:
			// it is what could not be written.
			err = dc.Abort()
			return
		}
		err = c.Conn.Close()
	})
	return err
}

// Read hands the substrate the client's bytes one judged packet at a time
// (broker/internal/wire: the Framer reads the socket through ReadSocket and
// hands its verdicts to Judged): a refused packet is answered here and
// never handed on.
func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.read(p)
	// What the framer still holds is the client's next packet (or part of
	// it): the substrate handles it without waiting on the socket, so its
	// answer to this one may wait for the answer to that one.
	c.readAhead.Store(err == nil && c.fr.Holds())
	return n, err
}

func (c *clientConn) read(p []byte) (int, error) {
	if c.mustWait {
		c.mustWait = false
		if err := c.awaitSlot(); err != nil {
			return 0, err
		}
	}
	return c.fr.Read(p, c)
}

// ReadSocket is one read from the socket, its bytes counted
// (saguin_bytes_received_total): the framer's only way to the socket
// (wire.Conn).
func (c *clientConn) ReadSocket(p []byte) (int, error) {
	c.toSocket()
	n, err := c.Conn.Read(p)
	c.shard().bytesIn.Add(uint64(n))
	return n, err
}

// Judged acts on the framer's verdict on a packet about to be handed on
// (wire.Conn): a refusal is answered and ends the connection here.
func (c *clientConn) Judged(v wire.Verdict) error {
	if v.Type == packets.Publish {
		// Every PUBLISH that arrives, refused here or later
		// (saguin_publishes_received_total).
		c.shard().publishesIn.Add(1)
	}
	switch {
	case v.Over != nil:
		// Nothing more is read or handed on: the connection is over.
		return c.refuseOversize(v.Over)
	case v.Refused != nil:
		return c.refuse(v.Type, v.Refused)
	}
	if v.First && !c.connected.Load() {
		c.connected.Store(true)
		c.l.untrack(c)
	}
	return nil
}

// errRefused ends a connection whose packet the framer refused.
var errRefused = errors.New("packet refused before the substrate read it")

// refuse answers a packet the check refused (docs/security.md "Every refusal, and its code"):
// MQTT 5 gets a CONNACK (for the CONNECT) or DISCONNECT with the code, then
// the close; MQTT 3.1.1, and a connection whose protocol is not known, is
// closed with nothing. One bounded line is logged.
func (c *clientConn) refuse(t byte, r *wire.Refusal) error {
	connect := c.fr.Version() == 0
	answer := c.fr.Answer(r)
	c.letGo()
	if answer != nil {
		_, _ = c.write(answer, c.boundOr(5*time.Second))
	}
	answered := "closed"
	switch {
	case answer != nil && connect:
		answered = fmt.Sprintf("CONNACK 0x%02X", r.Code)
	case answer != nil:
		answered = fmt.Sprintf("DISCONNECT 0x%02X", r.Code)
	}
	c.refused(refusePacket, r.Code, wire.PacketName(t)+" refused",
		"packet", wire.PacketName(t), "answer", answered, "reason", r.Reason, "remote", c.RemoteAddr().String())
	_ = c.Close()
	return fmt.Errorf("%w: %s: %s", errRefused, wire.PacketName(t), r.Reason)
}

// awaitSlot is an overflow socket's first read: up to 50 ms in line for a
// slot; without one, its CONNECT's opening bytes are read and answered
// server busy, credentials unchecked (docs/configuration.md "`broker.limits`").
func (c *clientConn) awaitSlot() error {
	w := c.waiter
	t := time.NewTimer(overflowWait)
	defer t.Stop()
	select {
	case <-w.granted:
	case <-t.C:
	case <-c.closedCh:
		return net.ErrClosed
	}
	c.smu.Lock()
	if c.state == stateWaiting {
		if c.l.g.giveUp(w) {
			c.state = stateSlot
		} else {
			c.state = statePlace
		}
	}
	got := c.state == stateSlot
	c.smu.Unlock()
	if got {
		return nil
	}
	if c.l.door != nil && c.l.door.Kind == "ws" {
		// docs/configuration.md "`broker.limits`": a ws socket is never answered 0x89 — before its
		// upgrade it cannot be — so it is closed with nothing written.
		c.letGo()
		c.refused(refuseConnect, 0x89, "connection closed before its WebSocket upgrade: limits.max_connections reached", "remote", c.RemoteAddr().String())
		_ = c.Close()
		return errServerBusy
	}
	// Unadmitted from here: closed within 100 ms, or at connect_timeout if
	// that comes sooner (rfcs/limits.md: the 100 ms run from the end of the
	// wait).
	by := time.Now().Add(unadmittedWithin)
	if c.connectBy.Before(by) {
		by = c.connectBy
	}
	_ = c.Conn.SetReadDeadline(by)
	version := wire.ReadConnectOpening(c.Conn)
	c.letGo()
	switch version {
	case 5:
		_, _ = c.write([]byte{0x20, 3, 0, 0x89, 0}, unadmittedWithin) // CONNACK 0x89 Server busy
	case 3, 4:
		_, _ = c.write([]byte{0x20, 2, 0, 0x03}, unadmittedWithin) // CONNACK 0x03 Server unavailable
	}
	c.refused(refuseConnect, 0x89, "connection refused: limits.max_connections reached", "remote", c.RemoteAddr().String())
	_ = c.Close()
	return errServerBusy
}

// refuseOversize answers a packet past its limit without reading it: an
// MQTT 5 CONNECT gets CONNACK 0x95 (3.1.1: closed silently), any later
// packet DISCONNECT 0x95 (3.1.1: closed) — docs/security.md "Every refusal, and its code".
func (c *clientConn) refuseOversize(over *wire.Oversize) error {
	var answer []byte
	version := c.fr.Version()
	what := "packet"
	if over.Connect {
		what = "CONNECT"
		version = wire.ReadVersion(c.Conn, over.Opening)
		if version == 5 {
			answer = []byte{0x20, 3, 0, 0x95, 0}
		}
	} else if version == 5 {
		answer = []byte{0xE0, 2, 0x95, 0}
	}
	c.letGo()
	if answer != nil {
		_, _ = c.write(answer, c.boundOr(5*time.Second))
	}
	key := "limits.max_message_size"
	if over.Connect {
		key = "limits.max_connect_size"
	}
	c.refused(refusePacket, 0x95, what+" refused: over "+key, "remote", c.RemoteAddr().String(),
		"bytes", over.Size, "limit", over.Limit)
	_ = c.Close()
	return fmt.Errorf("%w: %s of %d bytes, %s is %d", errPacketTooLarge, what, over.Size, key, over.Limit)
}

// refused counts a refusal this connection was given and logs it at warn,
// rate-limited (docs/operations.md "Logs") by its client id or, before one is
// known, by the host it came from: a client reconnecting in a loop uses a
// new port each time.
//
// Every refusal given here ends the connection: a CONNECT refused, or a
// packet the framer refused.
func (c *clientConn) refused(kind string, code byte, msg string, args ...any) {
	source := ""
	id, user := c.connectedAs()
	if cl := c.client.Load(); cl != nil {
		source = cl.ID
	} else if host, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
		source = "remote " + host
	} else {
		source = "remote " + c.RemoteAddr().String()
	}
	c.l.refusals.Refused(logging.Refusal{Level: slog.LevelWarn, Client: source, Kind: kind, Code: code, Msg: msg, Args: args,
		ClientID: id, User: user, Ends: true})
}

func (c *clientConn) boundOr(d time.Duration) time.Duration {
	if c.writeTimeout > 0 {
		return c.writeTimeout
	}
	return d
}

// SetDeadline is called by the substrate to arm the keepalive read
// deadline; it would also clear the write deadline, which Write arms each
// time, so only the read half is passed on. Until the CONNECT has been
// read, connect_timeout caps it.
func (c *clientConn) SetDeadline(t time.Time) error {
	if t.IsZero() {
		c.span.Store(0)
	} else {
		c.span.Store(int64(time.Until(t)))
	}
	return c.SetReadDeadline(t)
}

func (c *clientConn) SetReadDeadline(t time.Time) error {
	if !c.connected.Load() && (t.IsZero() || t.After(c.connectBy)) {
		t = c.connectBy
	}
	return c.Conn.SetReadDeadline(t)
}

// connackPromises adds to an accepting MQTT 5 CONNACK what the substrate
// leaves out (docs/security.md "Every refusal, and its code"): Maximum Packet Size = max_message_size, so a
// client knows the bound before it meets it, and Topic Alias Maximum 16.
func (b *Broker) connackPromises(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode >= 0x80 || cl.Properties.ProtocolVersion < 5 {
		return pk
	}
	pk.Properties.MaximumPacketSize = uint32(b.cfg.Broker.Limits.MaxMessageSize)
	pk.Properties.TopicAliasMaximum = wire.TopicAliasMaximum // fixed (docs/configuration.md "`broker.limits`"): the alias table is bounded (invariant 13)
	if g, all := b.grantsOf(cl); !all && g != nil {
		// docs/security.md "A feature the ACL denies"; docs/security.md "Every refusal, and its code": what the ACL denies this client, said on its
		// CONNACK; Retain Available stays 1 (channel topics still retain).
		if g.Denies(acl.QoS2) {
			pk.Properties.MaximumQos, pk.Properties.MaximumQosFlag = 1, true
		}
		if g.Denies(acl.Share) {
			pk.Properties.SharedSubAvailable, pk.Properties.SharedSubAvailableFlag = 0, true
		}
		if g.Denies(acl.Persistent) {
			pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = 0, true
		}
	}
	return pk
}

// AdmissionStats is what broker.limits holds at the door, for the
// operations listener and tests.
type AdmissionStats struct {
	Slots          int // connection slots held (limits.max_connections)
	OverflowPlaces int // overflow sockets waiting or being answered busy
	// PublishRateRefused counts publishes refused for publish_rate or
	// publish_bytes (saguin_publish_refused_total{reason="publish rate exceeded"}).
	PublishRateRefused int64
	// PublishBudgetsHeld is how many client ids have a publish budget not
	// yet refilled.
	PublishBudgetsHeld int
}

// AdmissionStats reports the admission state.
func (b *Broker) AdmissionStats() AdmissionStats {
	if b.gate == nil {
		return AdmissionStats{}
	}
	slots, places := b.gate.held()
	return AdmissionStats{Slots: slots, OverflowPlaces: places,
		PublishRateRefused: b.gate.refusedRate.Load(), PublishBudgetsHeld: b.gate.pub.held()}
}

// gateView is what the metric catalogue reads of the gate, copied: the
// per-packet counts summed over the shards, and the sockets closed at
// accept.
type gateView struct {
	wire           wireTotals
	closedAtAccept uint64
}

// view copies the gate's counters for the metric catalogue. They are
// atomics, so it takes no lock, gate.mu included (rfcs/metrics.md "Where
// each number comes from").
func (g *gate) view() gateView {
	return gateView{wire: g.wire.sum(), closedAtAccept: g.closedAtAccept.Load()}
}
