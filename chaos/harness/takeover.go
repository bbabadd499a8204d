package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// The session-takeover workload (invariants 17 and 18). A takeover client
// is a durable consumer of the events channel (Clean Start 0 after its
// first connection, Session Expiry 3600, each record acknowledged as it
// is recorded) whose client id is
// claimed, mid-stream, by a second connection of its own: the new
// connection owns the session from its CONNACK and must be served from
// where the old one left it — no gap, and nothing the broker certainly had
// acknowledged served again. Sometimes a CONNECT for the live id is one
// the broker must refuse (a Will topic holding a wildcard, with Clean
// Start 1): it must change nothing, so the owner keeps its connection and
// its session. And sometimes the owner simply drops, and comes back.
//
// Its reads are ordinary append.read operations of the events channel, so
// the append model and resume-skip / resume-new-session judge them with the
// readers'; the notes (NoteTakeover, NoteConnEnd, NoteRefused, and the
// CONNACKs with Detail "clean", "resume" or "takeover") feed the checks of
// takeover_check.go.

const (
	// takeoverClients is how many client ids are taken over.
	takeoverClients = 2
	// takeoverReceiveMax is their Receive Maximum: with acknowledgements in
	// order, a broker that sent offset Y had received the acks of every
	// offset up to Y-takeoverReceiveMax (MQTT 5 §4.9 flow control), which
	// is what "certainly acknowledged" means to the takeover-replay check.
	takeoverReceiveMax = 8
)

type takeoverClient struct {
	env  *env
	name string
	rng  *lockedRand
	// rd records the reads and acknowledges them, as a reader does.
	rd      *reader
	started bool // a CONNACK was received once: Clean Start 0 from then on
}

func newTakeoverClient(e *env, name string, seed uint64) *takeoverClient {
	return &takeoverClient{env: e, name: name, rng: newLockedRand(seed),
		rd: &reader{env: e, name: name, filter: filterEvents, channel: chanEvents, topic: topicEvents}}
}

func (t *takeoverClient) opts(clean bool) dialOpts {
	return dialOpts{clientID: t.name, cleanStart: clean, sessionExpiry: 3600,
		receiveMax: takeoverReceiveMax, onPublish: t.onPublish}
}

func (t *takeoverClient) onPublish(c *mconn, p *paho.Publish) {
	t.rd.onPublish(c, p)
	if off, ok := userInt(p, "saguin-offset"); ok && off > c.received.Load() {
		c.received.Store(off) // only paho's delivery goroutine writes it
	}
}

// connect dials a connection for the id and notes its CONNACK; how says
// why ("clean", "resume" or "takeover").
func (t *takeoverClient) connect(ctx context.Context, how string) (*mconn, error) {
	clean := !t.started
	if clean {
		how = "clean"
	}
	c, err := t.env.dial(ctx, t.opts(clean))
	if err != nil {
		return nil, err
	}
	t.started = true
	t.env.note(Note{Kind: NoteConnack, Conn: c.id, ClientID: t.name, Channel: chanEvents,
		SessionPresent: c.sessionPresent(), Detail: how})
	return c, nil
}

// subscribe makes a connection told Session Present 0 a consumer again.
func (t *takeoverClient) subscribe(ctx context.Context, c *mconn) bool {
	if c.sessionPresent() {
		return true
	}
	code, err := c.subscribe(ctx, filterEvents, 1)
	if err != nil {
		c.abort()
		return false
	}
	if code >= 0x80 {
		t.env.protocolFinding(0, "subscribe-refused", chanEvents, fmt.Sprintf("%s: SUBSCRIBE %s refused 0x%02x", t.name, filterEvents, code))
		c.abort()
		return false
	}
	return true
}

// finish waits for a connection's end (it is dead, or being closed) and
// notes what it acknowledged and how it ended. paho closes the connection
// before it hands a server's DISCONNECT to its callback, on a goroutine of
// its own, so the reason is waited for a moment (bounded: a connection
// that ended without one notes -1).
func (t *takeoverClient) finish(c *mconn) {
	<-c.pc.Done()
	t.env.note(Note{Kind: NoteAcked, Conn: c.id, ClientID: t.name, Channel: chanEvents, Value: c.acked.Load()})
	reason := c.discReason.Load()
	for i := 0; i < 20 && reason < 0 && c.closedAt.Load() == 0; i++ {
		time.Sleep(10 * time.Millisecond)
		reason = c.discReason.Load()
	}
	t.env.note(Note{Kind: NoteConnEnd, Conn: c.id, ClientID: t.name, Value: int64(reason)})
}

func (t *takeoverClient) run(ctx context.Context) {
	var owner *mconn
	backoff := 50 * time.Millisecond
	defer func() {
		if owner != nil {
			if !owner.isDead() {
				owner.close()
			}
			t.finish(owner)
		}
	}()
	for ctx.Err() == nil {
		if owner == nil || owner.isDead() {
			if owner != nil {
				t.finish(owner)
				owner = nil
			}
			c, err := t.connect(ctx, "resume")
			if err != nil {
				sleepCtx(ctx, backoff)
				backoff = min(2*backoff, 500*time.Millisecond)
				continue
			}
			backoff = 50 * time.Millisecond
			owner = c
			if !t.subscribe(ctx, c) {
				continue
			}
		}
		hold := time.NewTimer(t.rng.between(300*time.Millisecond, 1200*time.Millisecond))
		select {
		case <-ctx.Done():
		case <-owner.dead:
		case <-hold.C:
		}
		hold.Stop()
		if ctx.Err() != nil || owner.isDead() {
			continue
		}
		switch n := t.rng.intN(8); {
		case n < 4:
			owner = t.takeOver(ctx, owner)
		case n < 6:
			t.refused(ctx, owner)
		case n < 7:
			owner.abort()
		default:
			owner.close()
		}
	}
}

// takeOver claims the id with a second connection while owner holds it,
// and returns the connection that owns it afterwards.
func (t *takeoverClient) takeOver(ctx context.Context, owner *mconn) *mconn {
	receivedAt := t.env.now()
	received := owner.received.Load()
	sent := t.env.now()
	nc, err := t.connect(ctx, "takeover")
	if err != nil {
		// The broker is away, frozen or the link cut — or it accepted the
		// CONNECT and its CONNACK was lost: the owner may be taken over
		// all the same. Told with no connection (Conn 0), so an 0x8E the
		// owner gets is not blamed on a refused CONNECT.
		t.env.note(Note{Kind: NoteTakeover, Peer: owner.id, ClientID: t.name, Sent: sent, End: receivedAt})
		return owner
	}
	t.env.note(Note{Kind: NoteTakeover, Conn: nc.id, Peer: owner.id, ClientID: t.name, Sent: sent,
		End: receivedAt, Received: received, SessionPresent: nc.sessionPresent()})
	// MQTT-3.1.4-3: the broker closes the existing connection, after a
	// DISCONNECT 0x8E. Bounded; the check judges what the notes say.
	timer := time.NewTimer(t.env.opTimeout)
	select {
	case <-owner.dead:
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	if !owner.isDead() {
		t.env.note(Note{Kind: NoteConnEnd, Conn: owner.id, ClientID: t.name, Value: -2, Detail: "still open"})
		owner.abort()
	}
	t.finish(owner)
	if !t.subscribe(ctx, nc) {
		return nc // aborted: dead, and reconnected by the loop
	}
	return nc
}

// refused sends a CONNECT for the live id that the broker must refuse: a
// Will topic holding a wildcard (rfcs/wills.md:
// 0x90), with Clean Start 1 so that a broker acting on it before refusing
// would end the owner's session (invariant 17).
func (t *takeoverClient) refused(ctx context.Context, owner *mconn) {
	sent := t.env.now()
	o := dialOpts{clientID: t.name, cleanStart: true, sessionExpiry: 3600,
		will: &paho.WillMessage{Topic: badWillTopic, QoS: 1, Payload: []byte(t.name + " refused")}}
	c, err := t.env.dial(ctx, o)
	var ref *refusedError
	switch {
	case errors.As(err, &ref):
		t.env.note(Note{Kind: NoteRefused, ClientID: t.name, Peer: owner.id, Sent: sent, T: ref.at, Value: int64(ref.code)})
	case err == nil:
		// Accepted: it took the id over, and its Clean Start ended the
		// session. Told as what it was, then closed; the owner, taken
		// over, reconnects.
		t.env.protocolFinding(0, "will-topic-accepted", chanEvents,
			fmt.Sprintf("%s: a CONNECT with Will topic %q (a wildcard in a topic name) was accepted (CONNACK 0x00; docs/protocol.md: refused 0x90, a Will topic is a topic name)", t.name, badWillTopic))
		t.env.note(Note{Kind: NoteConnack, Conn: c.id, ClientID: t.name, Channel: chanEvents, SessionPresent: c.sessionPresent(), Detail: "clean"})
		t.env.note(Note{Kind: NoteTakeover, Conn: c.id, Peer: owner.id, ClientID: t.name, Sent: sent, End: sent, Received: 0})
		c.close()
		t.env.note(Note{Kind: NoteAcked, Conn: c.id, ClientID: t.name, Channel: chanEvents})
	}
}
