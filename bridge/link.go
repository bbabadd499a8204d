package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// Config is one link, as the broker's configuration gives it
// (docs/bridge.md "Configuration").
type Config struct {
	Name     string
	Peer     *url.URL // tcp://, tls://, ws:// or wss://
	ClientID string
	// SessionExpiry is how long the peer keeps our session (and what it
	// queues for us) while the link is down.
	SessionExpiry  time.Duration
	ReceiveMaximum uint16
	// AckInterval is how long acknowledgements are batched for at most.
	AckInterval time.Duration
	// KeepAlive is the MQTT keep-alive; 0 is 30s.
	KeepAlive time.Duration
	// MaximumPacketSize, when not 0, is sent on CONNECT: the peer sends
	// nothing larger (MQTT 5 §3.1.2.11.4), so a record over the broker's
	// own limit is never read off the wire here.
	MaximumPacketSize uint32
	// TLS, on a tls peer, gives the TLS configuration for one handshake:
	// it is called at every connection attempt, so certificates renewed
	// on disk are picked up.
	TLS   func() (*tls.Config, error)
	Rules []*Rule
	Log   *slog.Logger
	// Backoff is the wait before connection attempt n (0 the first):
	// nil is a jittered doubling from 100ms to 30s.
	Backoff func(n int) time.Duration
}

// Link is one bridge to a peer broker, with this broker as the client.
// Run owns its goroutines: paho's (through autopaho), and the inbound
// goroutine that stores records and acknowledges them.
type Link struct {
	cfg     Config
	local   Local
	log     *slog.Logger
	inRules []*Rule

	inbox       chan received
	qos0Waiting atomic.Int64
	stop        chan struct{} // closed when Run returns: the callback stops handing off

	current   atomic.Pointer[paho.Client] // the connection records arrive on; nil while down
	ended     atomic.Pointer[paho.Client] // the connection that was current when the link last went down
	connected atomic.Bool
	conn      atomic.Pointer[net.Conn] // the current connection, closed to rebuild the link
	hadSess   atomic.Bool              // a connection of this process was accepted before
	downAt    atomic.Int64             // unix nanos the link went down, 0 while up
	settling  atomic.Int64             // unix nanos the record being stored arrived, 0 when none
	upAt      atomic.Int64             // unix nanos the current connection was accepted
	failing   atomic.Bool              // an attempt failed since the last accepted connection
	flaps     atomic.Int64             // connections in a row the peer ended soon after accepting them

	stats linkStats
}

// linkStats are a link's counters (the saguin_bridge_* families).
type linkStats struct {
	received, stored, duplicates, retries atomic.Int64
	connects, sessionsLost, takeovers     atomic.Int64
	mu                                    sync.Mutex
	unstored                              map[string]int64
}

// Stats is a copy of a link's counters.
type Stats struct {
	Name, Peer                   string
	Connected                    bool
	Received, Stored, Duplicates int64
	Retries                      int64
	Connects, SessionsLost       int64
	// Takeovers counts the peer ending our connection because another one
	// connected with our client_id (DISCONNECT 0x8E).
	Takeovers int64
	// Flaps is how many connections in a row the peer ended within
	// seconds of accepting them (0 once one lasts).
	Flaps    int64
	Unstored map[string]int64 // by cause
	// OldestUnacknowledged is how long the oldest record received from
	// the peer has waited to be stored and acknowledged (0: none waits):
	// progress an operator can see, where Connected alone says nothing.
	OldestUnacknowledged time.Duration
}

// New checks cfg and makes a link; Run starts it.
func New(cfg Config, local Local) (*Link, error) {
	switch {
	case cfg.Name == "":
		return nil, errors.New("bridge: a link needs a name")
	case cfg.Peer == nil || cfg.Peer.Host == "":
		return nil, fmt.Errorf("bridge %s: no peer", cfg.Name)
	case cfg.Peer.Scheme != "tcp" && cfg.Peer.Scheme != "tls" && cfg.Peer.Scheme != "ws" && cfg.Peer.Scheme != "wss":
		return nil, fmt.Errorf("bridge %s: peer scheme %q: a link is tcp, tls, ws or wss", cfg.Name, cfg.Peer.Scheme)
	case (cfg.Peer.Scheme == "tls" || cfg.Peer.Scheme == "wss") && cfg.TLS == nil:
		return nil, fmt.Errorf("bridge %s: a tls peer needs its TLS configuration", cfg.Name)
	case cfg.ClientID == "":
		return nil, fmt.Errorf("bridge %s: no client_id", cfg.Name)
	case cfg.ReceiveMaximum == 0:
		return nil, fmt.Errorf("bridge %s: receive_maximum 0", cfg.Name)
	case cfg.AckInterval <= 0:
		return nil, fmt.Errorf("bridge %s: ack_interval %v", cfg.Name, cfg.AckInterval)
	case cfg.SessionExpiry < time.Second || cfg.SessionExpiry > time.Duration(1<<32-1)*time.Second:
		return nil, fmt.Errorf("bridge %s: session_expiry %v is not 1s to 4294967295s", cfg.Name, cfg.SessionExpiry)
	case len(cfg.Rules) == 0:
		return nil, fmt.Errorf("bridge %s: no rule", cfg.Name)
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 30 * time.Second
	}
	if cfg.Backoff == nil {
		cfg.Backoff = jitteredBackoff
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Link{cfg: cfg, local: local, log: log.With("bridge", cfg.Name), stop: make(chan struct{})}
	for _, r := range cfg.Rules {
		if inRule(r) {
			l.inRules = append(l.inRules, r)
		}
	}
	// QoS 1/2: at most a Receive Maximum unacknowledged; QoS 0: at most
	// one more Receive Maximum waiting (onPublish). Invariant 13.
	l.inbox = make(chan received, 2*int(cfg.ReceiveMaximum))
	l.stats.unstored = map[string]int64{}
	return l, nil
}

// shortLived is how soon after being accepted a connection that ends
// counts as a flap: the peer accepting us and then closing on us, as
// mosquitto does when another connection takes our client_id.
const shortLived = 5 * time.Second

// backoff is autopaho's wait before connection attempt n. autopaho counts
// attempts from 0 again after every accepted connection, so a peer that
// accepts and then closes on us (two bridges with one client_id taking the
// session from each other) would be dialled again at once, for ever: from
// the third flap in a row, the wait is at least flapWait. A link a flaky
// network cuts now and then is not slowed by it (two short-lived
// connections in a row are not a storm), and it never grows past
// flapWait, so a link that works again is back within a second.
func (l *Link) backoff(n int) time.Duration {
	d := l.cfg.Backoff(n)
	if l.flaps.Load() >= 3 {
		d = max(d, flapWait)
	}
	return d
}

// flapWait is the least wait before dialling a peer that closed our last
// three connections within shortLived of accepting them.
const flapWait = time.Second

// jitteredBackoff waits 100ms before the second attempt, doubling to 30s,
// each wait between half and all of its step so links that fell together
// do not all return together.
func jitteredBackoff(n int) time.Duration {
	if n == 0 {
		return 0
	}
	step := 100 * time.Millisecond << min(n-1, 9)
	step = min(step, 30*time.Second)
	return step/2 + rand.N(step/2+1)
}

// Stats copies the link's counters.
func (l *Link) Stats() Stats {
	s := Stats{
		Name: l.cfg.Name, Peer: l.cfg.Peer.Redacted(),
		Connected: l.connected.Load(), Received: l.stats.received.Load(), Stored: l.stats.stored.Load(),
		Duplicates: l.stats.duplicates.Load(), Retries: l.stats.retries.Load(),
		Connects: l.stats.connects.Load(), SessionsLost: l.stats.sessionsLost.Load(), Takeovers: l.stats.takeovers.Load(), Flaps: l.flaps.Load(),
		Unstored: map[string]int64{},
	}
	if at := l.settling.Load(); at != 0 {
		s.OldestUnacknowledged = max(time.Since(time.Unix(0, at)), 0)
	}
	l.stats.mu.Lock()
	for k, v := range l.stats.unstored {
		s.Unstored[k] = v
	}
	l.stats.mu.Unlock()
	return s
}

// Run connects to the peer and keeps the link until ctx ends; then it
// closes the connection without UNSUBSCRIBE and without ending the session
// at the peer (a DISCONNECT with reason 0x00 and the session kept), so the
// peer keeps what it queues for us.
func (l *Link) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(l.stop)

	keepAlive := uint16(min(l.cfg.KeepAlive/time.Second, 65535))
	expiry := uint32(l.cfg.SessionExpiry / time.Second)
	rm := l.cfg.ReceiveMaximum
	cc := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{l.cfg.Peer},
		KeepAlive:                     keepAlive,
		CleanStartOnInitialConnection: false, // the peer keeps our session across our restarts
		SessionExpiryInterval:         expiry,
		ConnectTimeout:                10 * time.Second,
		ReconnectBackoff:              l.backoff,
		AttemptConnection:             l.dial,
		ConnectPacketBuilder: func(c *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			if c.Properties == nil {
				c.Properties = &paho.ConnectProperties{}
			}
			c.Properties.ReceiveMaximum = &rm
			if max := l.cfg.MaximumPacketSize; max > 0 {
				c.Properties.MaximumPacketSize = &max
			}
			return c, nil
		},
		OnConnectionUp:   l.up,
		OnConnectionDown: l.down,
		OnConnectError:   l.attemptFailed,
		ClientConfig: paho.ClientConfig{
			ClientID:                   l.cfg.ClientID,
			EnableManualAcknowledgment: true,
			PingHandler:                newKeepAlivePinger(),
			SendAcksInterval:           l.cfg.AckInterval,
			OnPublishReceived:          []func(paho.PublishReceived) (bool, error){l.onPublish},
			OnServerDisconnect:         l.peerDisconnected,
		},
	}
	cm, err := autopaho.NewConnection(ctx, cc)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", l.cfg.Name, err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.storeInbound(ctx)
	}()
	<-ctx.Done()
	<-cm.Done()
	return nil
}

// dial makes one connection to the peer (autopaho calls it for each
// attempt): its own timeout, the TLS configuration read afresh, and the
// connection kept so the link can be rebuilt by closing it — never through
// ConnectionManager.Disconnect, which ends autopaho for good.
func (l *Link) dial(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var conn net.Conn
	var err error
	var tc *tls.Config
	if u.Scheme == "tls" || u.Scheme == "wss" {
		if tc, err = l.cfg.TLS(); err != nil {
			return nil, fmt.Errorf("reading the TLS files: %w", err)
		}
	}
	switch u.Scheme {
	case "tls":
		d := tls.Dialer{Config: tc}
		conn, err = d.DialContext(ctx, "tcp", u.Host)
	case "ws", "wss":
		conn, err = dialWebSocket(ctx, u, tc)
	default:
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", u.Host)
	}
	if err != nil {
		return nil, err
	}
	// paho writes a packet in several writes, from several goroutines: the
	// lock it finds on the connection keeps each packet whole.
	conn = packets.NewThreadSafeConn(conn)
	l.conn.Store(&conn)
	return conn, nil
}

// up: a connection was accepted. A session the peer no longer has, where
// this process had one, is warned and counted, and every in rule is
// subscribed again (the peer's state is gone with it); with the session
// present, nothing is subscribed again — the peer kept our
// subscriptions, and a resubscribe flood is what we avoid.
func (l *Link) up(cm *autopaho.ConnectionManager, ack *paho.Connack) {
	l.upAt.Store(time.Now().UnixNano())
	l.failing.Store(false)
	l.connected.Store(true)
	l.stats.connects.Add(1)
	if at := l.downAt.Swap(0); at != 0 {
		l.log.Warn("bridge: link back", "peer", l.cfg.Peer.Redacted(), "down_for", time.Since(time.Unix(0, at)).Round(time.Millisecond), "session_present", ack.SessionPresent)
	} else {
		l.log.Info("bridge: link up", "peer", l.cfg.Peer.Redacted(), "session_present", ack.SessionPresent)
	}
	if ack.SessionPresent {
		l.hadSess.Store(true)
		return
	}
	if l.hadSess.Swap(true) {
		l.stats.sessionsLost.Add(1)
		l.log.Warn("bridge: the peer no longer has our session; what it held for us while the link was down is lost there, and the in rules are subscribed again", "peer", l.cfg.Peer.Redacted())
	}
	if len(l.inRules) == 0 {
		return
	}
	sub := &paho.Subscribe{}
	for _, r := range l.inRules {
		sub.Subscriptions = append(sub.Subscriptions, subscription(r))
	}
	// The callback must not block: the SUBSCRIBE is answered on another
	// goroutine, which ends with the connection.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sa, err := cm.Subscribe(ctx, sub)
		if err != nil {
			l.log.Warn("bridge: subscribing to the in rules failed; the link is rebuilt", "error", err)
			l.rebuild()
			return
		}
		l.log.Debug("bridge: in rules subscribed", "rules", len(sub.Subscriptions))
		for i, code := range sa.Reasons {
			if i >= len(sub.Subscriptions) {
				break
			}
			switch {
			case code >= 0x80:
				l.log.Warn("bridge: the peer refused an in rule's subscription", "filter", sub.Subscriptions[i].Topic, "code", fmt.Sprintf("0x%02X", code))
			case code < 2:
				l.log.Warn("bridge: the peer granted a lower QoS; records of this rule cross at most once (QoS 0) or at least once (QoS 1)", "filter", sub.Subscriptions[i].Topic, "granted_qos", code)
			}
		}
	}()
}

// attemptFailed: one connection attempt failed. The first of a run of
// failures is a warning, so a link that never comes up (a wrong CA, a
// refused identity) is seen at the default level; the attempts after it
// are debug lines, until a connection is accepted.
func (l *Link) attemptFailed(err error) {
	level := slog.LevelDebug
	if !l.failing.Swap(true) {
		level = slog.LevelWarn
	}
	l.log.Log(context.Background(), level, "bridge: connection attempt failed", "peer", l.cfg.Peer.Redacted(), "why", classify(err), "error", err)
}

// peerDisconnected: the peer ended the connection with a DISCONNECT. A
// takeover (0x8E: another connection with our client_id — a second bridge
// configured with it, here or elsewhere) is counted and warned: the two
// would take the session from each other for as long as both run.
func (l *Link) peerDisconnected(d *paho.Disconnect) {
	reason := ""
	if d.Properties != nil {
		reason = d.Properties.ReasonString
	}
	if d.ReasonCode == 0x8E {
		l.stats.takeovers.Add(1)
		l.log.Warn("bridge: the peer gave our session to another connection with our client_id; give each bridge its own", "peer", l.cfg.Peer.Redacted(), "client_id", l.cfg.ClientID)
		return
	}
	l.log.Warn("bridge: the peer disconnected the link", "peer", l.cfg.Peer.Redacted(), "code", fmt.Sprintf("0x%02X", d.ReasonCode), "reason", reason)
}

// down: the connection ended; autopaho dials again (true).
func (l *Link) down() bool {
	// Nothing is acknowledged on a connection that ended.
	if c := l.current.Swap(nil); c != nil {
		l.ended.Store(c)
	}
	l.connected.Store(false)
	if lived := time.Since(time.Unix(0, l.upAt.Load())); lived < shortLived {
		if n := l.flaps.Add(1); n == 3 || n%20 == 0 {
			l.log.Warn("bridge: the peer keeps closing the link soon after accepting it; another connection with our client_id may be taking the session (give each bridge its own), or the peer refuses what we send",
				"peer", l.cfg.Peer.Redacted(), "client_id", l.cfg.ClientID, "in_a_row", n)
		}
	} else {
		l.flaps.Store(0)
	}
	l.downAt.CompareAndSwap(0, time.Now().UnixNano())
	l.log.Warn("bridge: link down", "peer", l.cfg.Peer.Redacted())
	return true
}

// Rebuild closes the current connection, as rebuild does: the broker
// calls it when an operator asks for the TLS files to be read again
// (SIGUSR1), so the next handshake uses them now.
func (l *Link) Rebuild() { l.rebuild() }

// rebuild closes the current connection: autopaho sees it end and dials
// again, the session kept at the peer.
func (l *Link) rebuild() {
	if c := l.conn.Load(); c != nil {
		_ = (*c).Close()
	}
}

// classify names why a connection attempt failed, for operators: not
// authorised, peer gone, protocol error or quota.
func classify(err error) string {
	var ce *autopaho.ConnackError
	if errors.As(err, &ce) {
		switch ce.ReasonCode {
		case 0x86, 0x87, 0x8C:
			return "not_authorised"
		case 0x89, 0x97, 0x9F:
			return "quota"
		case 0x88, 0x8A, 0x8B, 0x9C, 0x9D:
			return "peer_gone"
		}
		return "protocol_error"
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
		return "peer_gone"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return "peer_gone"
	}
	return "protocol_error"
}
