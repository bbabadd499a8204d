package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paholog "github.com/eclipse/paho.golang/paho/log"

	"saguin.dev/linearizability"
)

// env is what every actor of a campaign shares: the history and notes it
// records into, the proxy it dials, and the campaign's timing.
type env struct {
	hist      *linearizability.Writer
	notes     *noteWriter
	proxy     *Proxy
	vt        time.Duration // the queue's visibility timeout
	opTimeout time.Duration // bound on every client operation

	nextConn atomic.Int64
	// wills lets the campaign's end wait for the Wills that are due.
	wills *willTracker

	// draining: workers acknowledge everything from now on (the drain the
	// queue resolution check presumes).
	draining atomic.Bool
	// lastDelivery is when a worker last received a queue offer;
	// outstanding counts offers a worker is still handling.
	lastDelivery atomic.Int64
	outstanding  atomic.Int64
	// The ticks channel's trap (invariant 9): when a tick publish last
	// began, how many are in flight, and when a probe that began with none
	// in flight found the channel empty (floor = next).
	lastTickCall  atomic.Int64
	ticksInFlight atomic.Int64
	ticksEmptyAt  atomic.Int64
	// stops counts the broker's stops begun and ended (a kill, a SIGTERM,
	// a power cut, an exit of its own: each adds one as it begins and one
	// when the broker is back), so it is odd while one is in progress.
	stops atomic.Int64

	mu       sync.Mutex
	failure  error     // first harness failure (a history write error...)
	protocol []Finding // wire-level surprises seen while running
	cancel   context.CancelFunc
}

func (e *env) now() int64 { return e.hist.Now() }

// ticksEmpty reports whether the ticks channel was last seen empty with no
// tick published since: a restart now finds no surviving row.
func (e *env) ticksEmpty() bool {
	return e.ticksInFlight.Load() == 0 && e.ticksEmptyAt.Load() > e.lastTickCall.Load()
}

// fail records a harness failure and stops the campaign: a history that
// could not be written cannot be checked.
func (e *env) fail(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	if e.failure == nil {
		e.failure = err
	}
	cancel := e.cancel
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (e *env) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.failure
}

// maxProtocolFindings bounds the wire-level findings kept (invariant 13).
const maxProtocolFindings = 100

// protocolFinding records something a client was told that no correct broker
// tells it (a queue offer without a Delivery ID, a seek refused for a durable
// session...).
func (e *env) protocolFinding(inv int, check, channel, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.protocol) < maxProtocolFindings {
		e.protocol = append(e.protocol, Finding{Check: check, Invariant: inv, Channel: channel, Msg: msg})
	}
}

func (e *env) write(op linearizability.Op) {
	if err := e.hist.Write(op); err != nil {
		e.fail(fmt.Errorf("history: %w", err))
	}
}

func (e *env) note(n Note) {
	if n.T == 0 {
		n.T = e.now()
	}
	if err := e.notes.write(n); err != nil {
		e.fail(fmt.Errorf("notes: %w", err))
	}
}

// mconn is one MQTT connection of a stock paho.golang client. Its id is the
// history's client number: one per connection, because a queue lease belongs
// to a connection (linearizability README).
type mconn struct {
	env      *env
	id       int
	clientID string
	pc       *paho.Client
	raw      net.Conn
	local    string
	connack  *paho.Connack

	lastHeard atomic.Int64 // last moment the broker was heard on this connection
	acked     atomic.Int64 // a reader's highest offset acknowledged on this connection
	closedAt  atomic.Int64 // when the harness itself closed it (0: it did not)
	// received is a takeover client's highest offset received on it;
	// discReason the reason code of a DISCONNECT the broker sent (-1: none).
	received   atomic.Int64
	discReason atomic.Int32
	tsc        net.Conn // paho's writer: a DISCONNECT of our own goes through it
	dead       chan struct{}
	deadOnce   sync.Once
	dropAt     int64 // earliest moment the broker may have seen it end; valid once dead
}

type dialOpts struct {
	clientID      string
	cleanStart    bool
	sessionExpiry uint32
	receiveMax    uint16
	// will, when set, is the connection's Will (wills.go, takeover.go).
	will *paho.WillMessage
	// willDelay is its Will Delay Interval, in seconds.
	willDelay uint32
	// onPublish runs on paho's delivery goroutine for every PUBLISH; it
	// must not block (the PUBACK of an automatic acknowledgement waits for
	// it, and a queue's visibility clock starts at that PUBACK, invariant 7).
	//
	// Every harness client acknowledges automatically: paho writes the
	// PUBACK as onPublish returns, so a record is in the history before the
	// broker can be told it was read. paho.golang v0.23.0's manual
	// acknowledgements are not used: its Connect starts the goroutines that
	// read and route PUBLISHes before it resets its acknowledgement tracker,
	// so records a resumed session is sent together with its CONNACK can be
	// acknowledged (Ack returns nil) and then wiped from the tracker, and
	// their PUBACKs never leave. The broker then rightly keeps them
	// unacknowledged, and the takeover and resume checks judged it on
	// acknowledgements that were never sent (acks_test.go).
	onPublish func(c *mconn, p *paho.Publish)
	// pahoDebug, when set, is paho's debug logger (tests: a logger that
	// stalls at one of paho's steps opens the window above).
	pahoDebug paholog.Logger
}

// dial connects through the proxy. Everything is time-bounded by opTimeout.
func (e *env) dial(ctx context.Context, o dialOpts) (*mconn, error) {
	c := &mconn{env: e, id: int(e.nextConn.Add(1)), clientID: o.clientID, dead: make(chan struct{})}
	c.discReason.Store(-1)
	d := net.Dialer{Timeout: e.opTimeout}
	raw, err := d.DialContext(ctx, "tcp", e.proxy.Addr())
	if err != nil {
		return nil, fmt.Errorf("dial proxy: %w", err)
	}
	c.raw = raw
	c.local = raw.LocalAddr().String()
	handlers := []func(paho.PublishReceived) (bool, error){
		func(pr paho.PublishReceived) (bool, error) {
			c.heard()
			if o.onPublish != nil {
				o.onPublish(c, pr.Packet)
			}
			return true, nil
		},
	}
	c.tsc = packets.NewThreadSafeConn(raw)
	c.pc = paho.NewClient(paho.ClientConfig{
		ClientID:          o.clientID,
		Conn:              c.tsc,
		PacketTimeout:     e.opTimeout,
		OnPublishReceived: handlers,
		OnServerDisconnect: func(d *paho.Disconnect) {
			c.discReason.CompareAndSwap(-1, int32(d.ReasonCode))
			c.markDead()
		},
		OnClientError: func(error) { c.markDead() },
	})
	if o.pahoDebug != nil {
		c.pc.SetDebugLogger(o.pahoDebug)
	}
	cp := &paho.Connect{ClientID: o.clientID, CleanStart: o.cleanStart, KeepAlive: 20,
		Properties: &paho.ConnectProperties{}}
	if o.sessionExpiry > 0 {
		se := o.sessionExpiry
		cp.Properties.SessionExpiryInterval = &se
	}
	if o.receiveMax > 0 {
		rm := o.receiveMax
		cp.Properties.ReceiveMaximum = &rm
	}
	if o.will != nil {
		cp.WillMessage = o.will
		if o.willDelay > 0 {
			d := o.willDelay
			cp.WillProperties = &paho.WillProperties{WillDelayInterval: &d}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	ca, err := c.pc.Connect(cctx, cp)
	if err != nil {
		_ = raw.Close()
		if ca != nil && ca.ReasonCode >= 0x80 {
			return nil, &refusedError{clientID: o.clientID, code: ca.ReasonCode, at: e.now()}
		}
		return nil, fmt.Errorf("connect %s: %w", o.clientID, err)
	}
	c.connack = ca
	c.heard()
	go func() {
		<-c.pc.Done()
		c.markDead()
	}()
	return c, nil
}

// refusedError is a CONNECT the broker answered with a CONNACK refusing it.
type refusedError struct {
	clientID string
	code     byte
	at       int64 // when the CONNACK was received
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("connect %s: refused 0x%02x", e.clientID, e.code)
}

func (c *mconn) heard() { c.lastHeard.Store(c.env.now()) }

func (c *mconn) sessionPresent() bool { return c.connack != nil && c.connack.SessionPresent }

// markDead notes that the connection ended and estimates the earliest moment
// the broker could have seen it end: when the harness closed it, when the
// proxy cut it, or else the last moment the broker was heard on it. Any of
// these is no later than the real moment, so a lease recorded as ending
// then is never reported ending too late.
func (c *mconn) markDead() {
	c.deadOnce.Do(func() {
		// The earliest of what is known: the harness closing it, the proxy
		// cutting it (if that came after the broker was last heard).
		at := int64(math.MaxInt64)
		if t := c.closedAt.Load(); t != 0 {
			at = t
		}
		if t, ok := c.env.proxy.CutTime(c.local); ok && t >= c.lastHeard.Load() && t < at {
			at = t
		}
		if at == math.MaxInt64 {
			at = c.lastHeard.Load()
		}
		c.dropAt = at
		close(c.dead)
	})
}

func (c *mconn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// close ends the connection cleanly (DISCONNECT 0x00), bounded in time.
func (c *mconn) close() {
	c.closedAt.CompareAndSwap(0, c.env.now())
	_ = c.raw.SetDeadline(time.Now().Add(2 * time.Second))
	_ = c.pc.Disconnect(&paho.Disconnect{ReasonCode: 0})
	c.markDead()
}

// disconnectAnswered sends DISCONNECT with reason rc and waits, bounded,
// for the broker to close the connection. answered is true when it did so
// itself: the link was not cut and no stop of the broker began meanwhile —
// so what the DISCONNECT changes is stored (invariant 18: the close that
// answers a DISCONNECT comes after it). sent is when the packet left.
func (c *mconn) disconnectAnswered(rc byte) (sent int64, answered bool) {
	stops := c.env.stops.Load()
	sent = c.env.now()
	c.closedAt.CompareAndSwap(0, sent)
	_ = c.raw.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := (&paho.Disconnect{ReasonCode: rc}).Packet().WriteTo(c.tsc); err != nil {
		resetConn(c.raw)
		<-c.pc.Done()
		c.markDead()
		return sent, false
	}
	timer := time.NewTimer(c.env.opTimeout)
	defer timer.Stop()
	select {
	case <-c.pc.Done():
	case <-timer.C:
	}
	done := false
	select {
	case <-c.pc.Done():
		done = true
	default:
	}
	_, cut := c.env.proxy.CutTime(c.local)
	answered = done && !cut && stops%2 == 0 && c.env.stops.Load() == stops
	resetConn(c.raw)
	<-c.pc.Done()
	c.markDead()
	return sent, answered
}

// abort drops the connection without a DISCONNECT, as a crashing client does.
func (c *mconn) abort() {
	c.closedAt.CompareAndSwap(0, c.env.now())
	resetConn(c.raw)
	<-c.pc.Done()
	c.markDead()
}

// publish sends a QoS 1 PUBLISH and waits, bounded, for its PUBACK. A nil
// response means none came: the outcome is unknown (pending).
func (c *mconn) publish(ctx context.Context, p *paho.Publish) *paho.PublishResponse {
	pctx, cancel := context.WithTimeout(ctx, c.env.opTimeout)
	defer cancel()
	resp, _ := c.pc.Publish(pctx, p)
	if resp != nil {
		c.heard()
	}
	// paho returns the response with an error for a refusal (reason >=
	// 0x80); the reason code is what the history records.
	return resp
}

// subscribe sends one SUBSCRIBE, bounded, and returns the granted code.
func (c *mconn) subscribe(ctx context.Context, filter string, qos byte) (byte, error) {
	sctx, cancel := context.WithTimeout(ctx, c.env.opTimeout)
	defer cancel()
	sa, err := c.pc.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	if sa != nil && len(sa.Reasons) == 1 {
		c.heard()
		return sa.Reasons[0], nil
	}
	if err == nil {
		err = errors.New("SUBACK without one reason code")
	}
	return 0, fmt.Errorf("subscribe %s: %w", filter, err)
}

// userInt reads a decimal User Property.
func userInt(p *paho.Publish, key string) (int64, bool) {
	if p.Properties == nil {
		return 0, false
	}
	v := p.Properties.User.Get(key)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

func userString(p *paho.Publish, key string) string {
	if p.Properties == nil {
		return ""
	}
	return p.Properties.User.Get(key)
}

// sleepCtx sleeps for d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
