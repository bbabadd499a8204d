package broker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/metrics"
	"saguin.dev/storage"
)

// claimTimeout bounds how long a CONNECT can hold its client id's claim
// without reaching OnSessionEstablished: the CONNACK write is bounded by
// limits.write_timeout, so past this the write has failed and the claim is
// released for it.
const claimTimeout = 15 * time.Second

// idClaims serialises, per client id, a CONNECT taking the session over and
// the teardown of an earlier connection of that id (invariant 17). The
// substrate tears a connection down by client id — it unsubscribes "the
// client" and deletes the id's entry from its table — so a teardown running
// late, after a new connection of the same id registered, would unregister
// the new one: it stays connected and is served nothing. With the claim, a
// teardown either finishes before the new connection registers, or sees the
// new connection in the table and leaves everything alone.
type idClaims struct {
	mu sync.Mutex
	m  map[string]*idClaim // bounded by concurrent CONNECTs and teardowns
	// unstored holds, per client id, a session whose record the session
	// store refused and which is written again every second until it lands
	// (ownership_retry.go). Bounded by the sessions held: one entry each.
	unstored map[string]*session
	// turns numbers every holding of every claim, never reused.
	turns uint64
}

type idClaim struct {
	sem     chan struct{}
	waiters int
	holder  *mqtt.Client
	// turn numbers this holding (idClaims.turns), so a release meant for
	// one holding (claimForConnect's timeout) cannot end a later one the
	// same connection holds (its teardown).
	turn uint64
	// ended: the holder's CONNECT ended the session it took over although
	// it asked to resume it, so its CONNACK says Session Present 0.
	ended bool
	// refusal: the session store refused the session the holder's CONNACK
	// would describe, so the CONNACK refuses with this code (0x83 a
	// failure; 0x97 no room for its Will).
	refusal byte
	// brief: the store had no room for the session, so it was made one
	// that ends with its connection; the CONNACK says Session Expiry 0.
	brief bool
	// timeout releases a CONNECT's holding if OnSessionEstablished never
	// comes (claimForConnect); stopped when the holding is released, and
	// by the broker's Close, so no timer of a stopped broker fires.
	timeout *time.Timer
}

func (c *idClaims) acquire(id string, holder *mqtt.Client) (turn uint64) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]*idClaim)
	}
	cl := c.m[id]
	if cl == nil {
		cl = &idClaim{sem: make(chan struct{}, 1)}
		c.m[id] = cl
	}
	cl.waiters++
	c.mu.Unlock()
	cl.sem <- struct{}{}
	c.mu.Lock()
	cl.holder = holder
	c.turns++
	cl.turn = c.turns
	turn = cl.turn
	c.mu.Unlock()
	return turn
}

// release gives the claim back if holder still holds it; it reports whether
// it did (a timed-out claim may already have been released).
func (c *idClaims) release(id string, holder *mqtt.Client) bool {
	return c.releaseTurn(id, holder, 0)
}

// releaseTurn is release of one holding only (0: whichever holder holds).
func (c *idClaims) releaseTurn(id string, holder *mqtt.Client, turn uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.m[id]
	if cl == nil || cl.holder != holder || turn != 0 && cl.turn != turn {
		return false
	}
	if cl.timeout != nil {
		cl.timeout.Stop()
		cl.timeout = nil
	}
	cl.holder = nil
	cl.ended, cl.refusal, cl.brief = false, 0, false
	cl.waiters--
	if cl.waiters == 0 {
		delete(c.m, id)
	}
	<-cl.sem
	return true
}

// claimForConnect takes the id's claim for a connection passing CONNECT; it
// is given back in OnSessionEstablished, after the substrate registered the
// connection and wrote the CONNACK, or after claimTimeout if that never
// comes (a failed CONNACK write ends the connection without that hook).
func (b *Broker) claimForConnect(cl *mqtt.Client) {
	turn := b.claims.acquire(cl.ID, cl)
	t := time.AfterFunc(claimTimeout, func() { b.claims.releaseTurn(cl.ID, cl, turn) })
	b.claims.mu.Lock()
	if c := b.claims.m[cl.ID]; c != nil && c.holder == cl && c.turn == turn {
		c.timeout = t
	} else {
		t.Stop() // released already: nothing for it to release
	}
	b.claims.mu.Unlock()
}

// stopTimeouts stops every CONNECT claim's timeout still pending: the
// broker is stopping, and a timer may not fire into it afterwards.
func (c *idClaims) stopTimeouts() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cl := range c.m {
		if cl.timeout != nil {
			cl.timeout.Stop()
			cl.timeout = nil
		}
	}
}

// teardown replaces the substrate's own end-of-connection cleanup for a
// session that ends with its connection. It runs under the id's claim and
// touches the substrate's table only while the entry is still this
// connection.
//
// The substrate's cleanup still runs after OnDisconnect returns (mochi
// decides it before OnDisconnect, from the connection's own fields), and it
// works by client id: it deletes the id's entry from its client table and
// its filters from the topic index. So the claim is held until the
// substrate's goroutine for the connection has returned (listener.go), and
// a new connection of the id, which registers only under the claim, cannot
// register in between and be unregistered by that cleanup. By then the
// entry is gone (deleted here) or another connection's that took this one
// over (and the substrate leaves a taken-over connection's table alone).
func (b *Broker) teardown(cl *mqtt.Client, expire bool) {
	if !expire {
		return
	}
	b.claims.acquire(cl.ID, cl)
	release := func() { b.claims.release(cl.ID, cl) }
	if cc, ok := cl.Net.Conn.(*clientConn); !ok || !cc.holdUntilServed(release) {
		defer release()
	}
	// invariant 17: the substrate's table is touched only while its entry is still this connection.
	if cur, ok := b.mqtt.Clients.Get(cl.ID); ok && cur == cl && !cl.IsTakenOver() {
		cl.ClearInflights()
		b.mqtt.UnsubscribeClient(cl)
		b.mqtt.Clients.Delete(cl.ID)
	}
}

// mark sets what holder's CONNECT found, while it holds its id's claim.
func (c *idClaims) mark(id string, holder *mqtt.Client, f func(*idClaim)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.m[id]; cl != nil && cl.holder == holder {
		f(cl)
	}
}

// held returns a copy of the claim holder holds on its id, if it holds it
// (from OnSessionEstablish until its CONNACK is written and its senders
// started).
func (c *idClaims) held(holder *mqtt.Client) (idClaim, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.m[holder.ID]
	if cl == nil || cl.holder != holder {
		return idClaim{}, false
	}
	return idClaim{ended: cl.ended, refusal: cl.refusal, brief: cl.brief}, true
}

// storeFailed reports whether the session store refused holder's session.
func (c *idClaims) storeFailed(holder *mqtt.Client) bool {
	h, ok := c.held(holder)
	return ok && h.refusal != 0
}

// codeSessionStore refuses a CONNECT whose session the store refused
// (docs/security.md "Every refusal, and its code": 0x83; 3.1.1 0x03).
var codeSessionStore = packets.Code{Code: 0x83,
	Reason: "the session store refused this session; nothing was kept: connect again"}

// codeNoRoomForWill refuses a CONNECT whose Will the session store has no
// room for (docs/security.md "Every refusal, and its code": 0x97; 3.1.1 0x05).
var codeNoRoomForWill = packets.Code{Code: 0x97,
	Reason: "the session store has no room for this Will"}

// sessionNotStored decides a CONNECT whose session the store refused
// (docs/security.md "Every refusal, and its code"): no room and no Will — accepted with Session Expiry
// 0 (3.1.1: made clean), a session that ends with its connection and needs
// no record; no room for its Will — refused 0x97; any other failure —
// refused 0x83. Called by claimSession, before the CONNACK is written.
func (b *Broker) sessionNotStored(cl *mqtt.Client, s *session, err error) {
	hasWill := s.hasWill()
	switch {
	case errors.Is(err, storage.ErrFull) && !hasWill:
		b.log.Warn("the session store has no room: the session ends with its connection (Session Expiry 0)",
			"client", cl.ID, "error", err)
		s.endWithConnection()
		// The substrate ends it with the connection by these fields.
		if cl.Properties.ProtocolVersion < 5 {
			cl.Properties.Clean = true
		} else {
			cl.Properties.Props.SessionExpiryInterval = 0
		}
		// A record an earlier connection left must not bring it back at a
		// restart.
		b.forgetSession(cl.ID)
		b.events.sessionsDropped[metrics.SessionStorageFull].Add(1)
		b.claims.mark(cl.ID, cl, func(c *idClaim) { c.brief = true })
	case errors.Is(err, storage.ErrFull):
		b.log.Error("CONNECT refused: the session store has no room for its Will", "client", cl.ID, "error", err)
		b.events.sessionStoreFull.Add(1)
		b.claims.mark(cl.ID, cl, func(c *idClaim) { c.refusal = codeNoRoomForWill.Code })
	default:
		b.log.Error("CONNECT refused: the session store refused its session", "client", cl.ID, "error", err)
		b.events.sessionStoreFailed.Add(1)
		b.claims.mark(cl.ID, cl, func(c *idClaim) { c.refusal = codeSessionStore.Code })
	}
}

// correctConnack makes an accepting CONNACK say what is stored (invariant
// 18): Session Present 0 for a session that ended at this takeover, and a
// refusal (0x83; 3.1.1 0x03) when the store refused the session it would
// describe — a device told its session is kept must find it after a crash.
func (b *Broker) correctConnack(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	h, ok := b.claims.held(cl)
	if !ok || pk.ReasonCode != 0 {
		return pk
	}
	// invariant 18: the CONNACK says only what the store holds.
	if h.ended || h.refusal != 0 {
		pk.SessionPresent = false
	}
	v5 := cl.Properties.ProtocolVersion == 5
	switch {
	case h.refusal == codeNoRoomForWill.Code && v5:
		pk.ReasonCode, pk.Properties.ReasonString = codeNoRoomForWill.Code, codeNoRoomForWill.Reason
	case h.refusal == codeNoRoomForWill.Code:
		pk.ReasonCode = 0x05 // 3.1.1: not authorized
	case h.refusal != 0 && v5:
		pk.ReasonCode, pk.Properties.ReasonString = codeSessionStore.Code, codeSessionStore.Reason
	case h.refusal != 0:
		pk.ReasonCode = 0x03 // 3.1.1: server unavailable, the storage failure code
	case h.brief && v5:
		// The server's answer overrides the client's interval (MQTT 5
		// §3.2.2.3.2).
		pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = 0, true
	}
	return pk
}

// endAtTakeover makes the substrate's takeover agree that the session ended
// (rfcs/sessions-ownership.md: a session that ends with its connection — no Session
// Expiry Interval — ends at takeover, and the new CONNECT is answered
// Session Present 0 whatever its Clean Start). For an MQTT 5 connection the
// substrate carries such a session over to a CONNECT with Clean Start 0: it
// copies the live connection's subscriptions and in-flight deliveries and
// answers Session Present 1. Here, under the id's claim and before the
// substrate looks, the replaced connection is left with nothing to copy —
// its filters leave the topic index (they belong to the ended session) and
// its in-flight table is emptied — and the CONNACK is corrected as it is
// encoded (OnPacketEncode). The substrate still sends the replaced
// connection DISCONNECT 0x8E and marks it taken over, so its teardown
// touches nothing of the new connection's.
func (b *Broker) endAtTakeover(cl *mqtt.Client) {
	old, ok := b.mqtt.Clients.Get(cl.ID)
	if !ok || old == cl {
		return
	}
	for f := range old.State.Subscriptions.GetAll() {
		old.State.Subscriptions.Delete(f)
		if b.mqtt.Topics.Unsubscribe(f, cl.ID) {
			atomic.AddInt64(&b.mqtt.Info.Subscriptions, -1)
		}
	}
	old.ClearInflights()
	b.claims.mark(cl.ID, cl, func(c *idClaim) { c.ended = true })
}

// owns reports whether cl owns its client id's session now: the substrate's
// registered connection for the id, not taken over, and the session's
// owner.
func (b *Broker) owns(cl *mqtt.Client) bool {
	if cl.IsTakenOver() {
		return false
	}
	if cur, ok := b.mqtt.Clients.Get(cl.ID); !ok || cur != cl {
		return false
	}
	s := b.sessionOf(cl.ID)
	return s != nil && s.owner() == cl
}

// ownerTurn takes the id's claim for a packet that changes the session (a
// SUBSCRIBE) and reports whether cl owns the session; the caller runs the
// packet and then release. Under the claim a takeover cannot begin halfway
// through: a SUBSCRIBE either finishes — SUBACK written, consumers started —
// before a CONNECT for the id claims the session (which then carries them
// over, or ends them), or finds its connection replaced and changes nothing
// (invariant 17). A replaced connection's packet is rejected, which ends
// that connection: it has been told 0x8E.
func (b *Broker) ownerTurn(cl *mqtt.Client) (release func(), owner bool) {
	b.claims.acquire(cl.ID, cl)
	// invariant 17: a replaced connection's packet changes nothing.
	if !b.owns(cl) {
		b.claims.release(cl.ID, cl)
		return nil, false
	}
	return func() { b.claims.release(cl.ID, cl) }, true
}

// expiredAway reports whether session s, away, has passed its expiry on
// the broker's clock (rfcs/sessions-ownership.md: an expired session is ended before
// a CONNECT for its id is answered, regardless of the substrate's sweep,
// which runs on its own timer).
func (b *Broker) expiredAway(s *session) bool {
	return s.expiredAt(b.clock.Now())
}
