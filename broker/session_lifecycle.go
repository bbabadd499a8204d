package broker

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/metrics"
	"saguin.dev/storage"
)

// The session lifecycle: a CONNECT claims its client id's session
// (establishSession, claimSession: resumed, taken over or ended), the
// session's senders start for the connection once its CONNACK is written
// (sessionEstablished), a DISCONNECT stores what it changed
// (disconnecting), and the connection's end stops them (connectionGone,
// connectionEnded). A session ends in one place, endSessionKeeping. The
// substrate's hooks call these (hooks.go); the id's claim that orders them
// against each other is ownership.go's.

// establishSession runs after CONNECT passed every check and before the
// substrate looks at the session: the moment the new connection claims it.
func (b *Broker) establishSession(cl *mqtt.Client, pk packets.Packet) {
	b.claimForConnect(cl)
	asked := pk.Connect.Clean
	if ca := authOf(cl); ca != nil && ca.notPersistent {
		// docs/security.md "A feature the ACL denies": a client denied persistent gets a session that
		// ends with the connection, whatever it asked for.
		pk.Connect.Clean = true
	}
	if b.claimSession(cl, pk) && !asked {
		// The session ended at this takeover although the CONNECT asked
		// to resume it: the substrate would carry it over (ownership.go).
		b.endAtTakeover(cl)
	}
}

// sessionExpiry is what the client was granted: the Session Expiry Interval
// capped by limits.max_session_expiry; a 3.1.1 cleanSession=0 client gets the
// cap (docs/channels.md "`append`").
func (b *Broker) sessionExpiry(cl *mqtt.Client) time.Duration {
	max := b.cfg.Broker.Limits.MaxSessionExpiry
	if cl.Properties.ProtocolVersion < 5 {
		if cl.Properties.Clean {
			return 0
		}
		return max
	}
	d := time.Duration(cl.Properties.Props.SessionExpiryInterval) * time.Second
	if d > max {
		d = max
		b.events.expiryShortened.Add(1) // called once per CONNECT (claimSession)
	}
	return d
}

// claimSession makes cl the owner of its client id's session. A Clean Start
// ends the old session first (its positions go with it), and so does a
// takeover of a session that ends with its connection; otherwise the old
// connection's pumps stop and the session carries over. It reports whether
// the connection starts a new session (one held for the id ended here, or
// none was held).
func (b *Broker) claimSession(cl *mqtt.Client, pk packets.Packet) (ended bool) {
	b.mu.Lock()
	s := b.sessions[cl.ID]
	b.mu.Unlock()
	if s != nil {
		old := b.takeFromOldConnection(s)
		ends, passed := b.endsAtConnect(s, cl, pk)
		b.settleWill(s, ends, old != nil)
		if ends {
			b.endClaimedSession(s, cl, passed)
			s = nil
			ended = true
		}
	} else {
		// No session held (stored sessions were restored at start), so this
		// CONNECT is answered Session Present 0 whatever its Clean Start:
		// positions left without a session — a crash between the two
		// writes — are not served to a session told it is new (invariant 18).
		b.dropPositions(cl.ID)
		// The substrate may still hold a connection of this id whose
		// session already ended (its teardown waits for this CONNECT's
		// claim): it must not carry that over either (ownership.go).
		ended = true
	}
	if s == nil {
		s = newSession(cl.ID)
		b.mu.Lock()
		b.sessions[cl.ID] = s
		b.mu.Unlock()
	}
	exp := b.sessionExpiry(cl)
	wasDurable := b.giveSessionTo(s, cl, pk, exp)
	if exp == 0 {
		if wasDurable {
			// The session now ends with this connection: a restart must
			// not bring it back (docs/channels.md "`append`").
			b.forgetSession(cl.ID)
		}
		return ended
	}
	b.storeClaimedSession(s, cl, pk, ended)
	return ended
}

// takeFromOldConnection is claimSession's first phase: the pumps of the
// connection that held session s stopped and their deliveries taken back,
// its queue jobs returned, its positions and window stored. It returns
// that connection (nil when the session was away).
func (b *Broker) takeFromOldConnection(s *session) (old *mqtt.Client) {
	old = s.owner()
	// The pumps' deliveries are taken back here, whether or not the
	// old connection's end has run yet: they are the session's, not
	// the connection's, so nothing of them is carried or resent by the
	// substrate (the chaos harness's append-duplicate finding was one
	// it resent next to the pump's own copy from the position).
	s.stopPumps()
	if old != nil {
		b.returnJobs(s, old)
	}
	s.logHandOver("connect")
	b.flushSession(s, true)
	return old
}

// endsAtConnect is claimSession's second phase: whether the CONNECT ends
// session s, and the positions retention passed that make it end.
func (b *Broker) endsAtConnect(s *session, cl *mqtt.Client, pk packets.Packet) (ends bool, passed []passedPosition) {
	// A Clean Start ends the session, and so does any CONNECT for a
	// session that ends with its connection (rfcs/sessions-ownership.md), or
	// for one whose expiry passed while it was away: expiry and
	// reconnect never interleave, whenever the sweep runs.
	ends = pk.Connect.Clean || !s.isDurable() || b.expiredAway(s)
	if ends {
		return true, nil
	}
	// invariant 1: checked here, at CONNECT and before anything
	// resumes. A position retention passed is the one loss a
	// consumer can be told of, and Session Present 0 is how
	// (docs/channels.md "Sessions and Session Present").
	var err error
	if passed, err = b.passedPositions(s); err != nil {
		// A failed read writes nothing (rfcs/sessions-ownership.md): the
		// CONNECT is refused 0x83 and the session stays as it was.
		b.log.Error("CONNECT refused: reading the session's stored positions failed", "client", cl.ID, "error", err)
		b.events.sessionStoreFailed.Add(1)
		b.claims.mark(cl.ID, cl, func(c *idClaim) { c.refusal = codeSessionStore.Code })
	}
	return len(passed) > 0, passed
}

// endClaimedSession is claimSession's phase for a session the CONNECT
// ends. rfcs/sessions-ownership.md: a session that ends with its connection ends
// at takeover; the new CONNECT is answered Session Present 0 whatever its
// Clean Start. So does one retention passed a position of: it is
// discarded — subscriptions, owed broadcast, held QoS 2 publishes —
// except the positions retention did not pass (rfcs/sessions-ownership.md
// "Session ends when"), and the discard is stored before the CONNACK
// (invariant 18). Each passed position goes with it, so the channel is
// served from where a reader with no position starts.
func (b *Broker) endClaimedSession(s *session, cl *mqtt.Client, passed []passedPosition) {
	keep := map[string]bool{}
	if len(passed) > 0 {
		for name, ch := range b.channels {
			keep[name] = ch.log != nil
		}
		for _, p := range passed {
			keep[p.ch.name] = false
			b.positionPassed(resumePassed, cl.ID, p.ch, p.position, p.floor)
		}
	}
	b.endSessionKeeping(cl.ID, s, keep)
}

// giveSessionTo is claimSession's phase that makes cl the owner of s, with
// the connection's Will, expiry and protocol, in one critical section. It
// reports whether the session was durable before.
func (b *Broker) giveSessionTo(s *session, cl *mqtt.Client, pk packets.Packet, exp time.Duration) (wasDurable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The connection's Will is the session's now; Sagüin sends it, not the
	// substrate (wills.go).
	s.will = willOf(pk)
	if s.will != nil {
		// A Will fired later is judged as the identity that armed it
		// (rfcs/wills.md), which is kept with it across a restart.
		s.will.username = ""
		if ca := authOf(cl); ca != nil {
			s.will.username = ca.user
		}
	}
	cl.Properties.Will = mqtt.Will{}
	s.cl = cl
	s.expiry = exp
	s.protocol = cl.Properties.ProtocolVersion
	s.lastSeen = time.Time{}
	wasDurable = s.durable
	s.durable = exp > 0
	return wasDurable
}

// storeClaimedSession is claimSession's last phase. invariant 18: the
// session this CONNACK describes is stored first — its expiry, and the
// subscriptions it resumes with, which the substrate copies into the new
// connection only after this hook.
func (b *Broker) storeClaimedSession(s *session, cl *mqtt.Client, pk packets.Packet, ended bool) {
	var subs []packets.Subscription
	if !pk.Connect.Clean && !ended {
		if existing, ok := b.mqtt.Clients.Get(cl.ID); ok && existing != cl {
			subs = subscriptionsOf(existing)
		}
	}
	if err := b.storeSession(s, subs); err != nil {
		// invariant 18: the CONNACK may not describe a session the store
		// does not hold; it is turned into a refusal (ownership.go).
		b.sessionNotStored(cl, s, err)
	}
}

// sessionEstablished runs after the CONNACK is written: the session's
// consumers start serving the new connection only now, so nothing reaches
// it before its CONNACK.
func (b *Broker) sessionEstablished(cl *mqtt.Client) {
	// The substrate has registered this connection: a late teardown of an
	// earlier one can now see it (ownership.go). The claim is given back
	// only once the session's senders run for this connection: a CONNECT
	// for the same id waiting on it may end the session (Clean Start, or a
	// session that ends with its connection), and senders started after
	// that ending would serve a session nobody holds and never stop.
	defer b.claims.release(cl.ID, cl)
	if b.claims.storeFailed(cl) {
		// Its CONNACK was a refusal (0x83): nothing is served, its Will is
		// not armed, and the connection ends as MQTT requires after a
		// refusing CONNACK.
		if s := b.sessionOf(cl.ID); s != nil {
			s.mu.Lock()
			if s.cl == cl {
				s.will = nil
			}
			s.mu.Unlock()
		}
		cl.Stop(codeSessionStore)
		return
	}
	// Its CONNACK accepted it (saguin_connections_total).
	b.events.connectionsAccepted.Add(1)
	s := b.sessionOf(cl.ID)
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.cl != cl {
		s.mu.Unlock()
		return
	}
	cons := s.channelConsumers()
	queues := s.queueEngines(b)
	latest := s.latestConsumers()
	s.mu.Unlock()
	// What the session's last connection left unacknowledged goes first,
	// in the order first sent; then the pumps start.
	s.deliv.resume(b, cl)
	sink := s.sink(b, cl)
	for _, c := range cons {
		c.start(sink)
	}
	for _, c := range latest {
		c.start(sink) // a resume: the changes since the mark (latest_consumer.go)
	}
	for _, q := range queues {
		q.addWorker(s, sink)
	}
	// Broadcast owed to the session, written by this connection's sender
	// (fanout_send.go).
	b.outboxOf(s).start(b, cl)
}

// queueEngines lists the engines of the queues the session consumes.
// Caller holds s.mu.
func (s *session) queueEngines(b *Broker) []*queueEngine {
	out := make([]*queueEngine, 0, len(s.queues))
	for name := range s.queues {
		if q := b.engines[name]; q != nil {
			out = append(out, q)
		}
	}
	return out
}

// returnJobs takes the session's worker registrations off connection cl and
// returns every job that connection held (docs/channels.md: returned whenever the
// connection ends, whatever becomes of the session).
func (b *Broker) returnJobs(s *session, cl *mqtt.Client) {
	s.mu.Lock()
	queues := s.queueEngines(b)
	s.mu.Unlock()
	for _, q := range queues {
		q.removeWorker(s, s.sink(b, cl))
	}
}

// connectionGone: the substrate has ended connection cl. Every publish the
// connection handed over is stored or refused before its end is acted on
// (inbound.go); then its session is left (connectionEnded) and the
// substrate's registration of it undone.
func (b *Broker) connectionGone(cl *mqtt.Client, expire bool) {
	b.inboundEnded(cl)
	b.connectionEnded(cl, expire)
	// invariant 17: the substrate's teardown works by client id and would
	// unregister a newer connection of the same id; Sagüin does it, under
	// the id's claim.
	b.teardown(cl, expire)
}

// connectionEnded: the connection is gone. Its pumps stop and its positions
// are stored; a session that ends with its connection is ended.
func (b *Broker) connectionEnded(cl *mqtt.Client, expire bool) {
	// invariant 17: under the id's claim, so a CONNECT taking the session
	// over runs wholly before this (and this finds it owned by another
	// and changes nothing) or wholly after. Without it, an end that had
	// already passed the owner check went on to stop the new connection's
	// pumps and drop the packet ids they had just taken: the new
	// connection's PUBACKs for those were ignored and its position stayed
	// at the first of them, served again at the next takeover.
	b.claims.acquire(cl.ID, cl)
	defer b.claims.release(cl.ID, cl)
	s := b.sessionOf(cl.ID)
	if s == nil {
		return
	}
	s.mu.Lock()
	owner := s.cl == cl
	if owner {
		s.cl = nil
	}
	s.mu.Unlock()
	if !owner {
		// invariant 17: a connection that was taken over changes nothing.
		return
	}
	s.stopPumps()
	b.returnJobs(s, cl)
	b.flushSession(s, true)
	if expire {
		// Its Will goes as the connection ends: at once, whatever delay it
		// asked for (no session is left to wait in).
		b.willAtSessionEnd(s, metrics.WillImmediate)
		b.endSession(cl.ID, s)
		return
	}
	b.willAtConnectionEnd(s)
	// The session is away from now — or from its DISCONNECT, which set
	// the moment already: its expiry runs from there, and a restart counts
	// it from there too — its Will's due moment with it.
	s.mu.Lock()
	if s.lastSeen.IsZero() {
		s.lastSeen = b.clock.Now()
	}
	s.mu.Unlock()
	b.storeSessionOrRetry(s, cl, "connection end")
}

// disconnecting handles a DISCONNECT before the substrate closes the
// connection: a changed Session Expiry is applied and positions are stored.
func (b *Broker) disconnecting(cl *mqtt.Client, pk packets.Packet) {
	// invariant 17: under the id's claim, as connectionEnded: a takeover
	// cannot start the new connection's pumps between the owner check
	// below and stopPumps.
	b.claims.acquire(cl.ID, cl)
	defer b.claims.release(cl.ID, cl)
	s := b.sessionOf(cl.ID)
	if s == nil || s.owner() != cl {
		return
	}
	if pk.Properties.SessionExpiryIntervalFlag && cl.Properties.ProtocolVersion == 5 {
		d := time.Duration(pk.Properties.SessionExpiryInterval) * time.Second
		if d > b.cfg.Broker.Limits.MaxSessionExpiry {
			d = b.cfg.Broker.Limits.MaxSessionExpiry
		}
		s.mu.Lock()
		if s.durable || d == 0 {
			s.expiry = d
		}
		s.mu.Unlock()
	}
	b.discardWill(s, pk)
	now := b.clock.Now()
	s.mu.Lock()
	s.lastSeen = now
	if w := s.will; w != nil && w.delay > 0 && s.expiry > 0 && w.due.IsZero() {
		// A DISCONNECT that keeps its Will (0x04) starts the wait now: its
		// due moment is part of what is stored before the close, so a
		// crash after the client saw the close still publishes it
		// (invariant 18; rfcs/wills.md: at least once).
		w.due = now.Add(min(w.delay, s.expiry))
	}
	s.mu.Unlock()
	// invariant 18: what the DISCONNECT changed (its expiry, its Will
	// withdrawn) is stored before the close that answers it.
	b.storeSessionOrRetry(s, cl, "DISCONNECT")
	// The pumps' unacknowledged deliveries are taken back here, with the
	// pumps: what stayed would be sent again (DUP) on resume next to the
	// pump's own copy from the position.
	s.stopPumps()
	b.flushSession(s, true)
}

// endSession removes a session and every position it stored.
func (b *Broker) endSession(id string, s *session) { b.endSessionKeeping(id, s, nil) }

// endSessionKeeping ends a session like endSession, but the positions on the
// channels keep names stay stored: a session retention passed one position
// of keeps the others (rfcs/sessions-ownership.md).
func (b *Broker) endSessionKeeping(id string, s *session, keep map[string]bool) {
	b.mu.Lock()
	if s == nil {
		s = b.sessions[id]
	}
	if s != nil && b.sessions[id] == s {
		delete(b.sessions, id)
	}
	b.mu.Unlock()
	if s != nil {
		// Ending happens in one place, all parts together, and a pending
		// Will is published first (rfcs/sessions-ownership.md).
		b.willAtSessionEnd(s, metrics.WillSessionEnded)
		s.mu.Lock()
		for f := range s.declared {
			b.spaces.Forget(f, id) // invariant 13: the spaces hold live subscriptions only
		}
		s.mu.Unlock()
		s.stopPumps()
		b.returnJobs(s, nil)
		b.memberEnded(s) // shared groups take back what they handed it (share.go)
	}
	b.dropPositionsExcept(id, keep)
	b.dropHoldsOf(id) // unreleased QoS 2 publishes end with the session, counted abandoned (qos2.go)
	b.forgetSession(id)
}

func (b *Broker) dropPositions(id string) { b.dropPositionsExcept(id, nil) }

// dropPositionsExcept removes the client's stored positions on every append
// channel but those keep names.
func (b *Broker) dropPositionsExcept(id string, keep map[string]bool) {
	reader := "mqtt:" + id
	for name, ch := range b.channels {
		if ch.log == nil || keep[name] {
			continue
		}
		// A read first: a clean CONNECT usually has nothing stored, and a
		// write per channel per connection would put every reconnect storm
		// on the provider's one writer.
		if _, ok, err := ch.log.Position(reader); err == nil && !ok {
			continue
		}
		if _, err := ch.log.DropPosition(reader); err != nil {
			b.log.Error("dropping a position", "client", id, "channel", ch.name, "error", err)
		}
	}
}

// savePosition stores one consumer's position if it moved (or always, with
// force). Only durable sessions store positions.
func (b *Broker) savePosition(s *session, c *consumer, force bool) {
	s.mu.Lock()
	durable, expiry := s.durable, s.expiry
	s.mu.Unlock()
	if !durable {
		return
	}
	c.mu.Lock()
	pos := c.positionLocked()
	if !c.dirty && !force {
		c.mu.Unlock()
		return
	}
	c.dirty = false
	c.mu.Unlock()
	err := c.ch.log.SavePosition(storage.Position{Reader: s.reader(), Offset: pos, LastSeen: b.clock.Now(), Expiry: expiry})
	c.mu.Lock()
	if err != nil {
		c.dirty = true // written again at the next flush
		b.log.Error("storing a position", "client", s.id, "channel", c.ch.name, "error", err)
	} else if pos > c.stored || force {
		c.stored = pos
	}
	c.mu.Unlock()
}

func (b *Broker) flushSession(s *session, force bool) {
	s.mu.Lock()
	cons := s.channelConsumers()
	s.mu.Unlock()
	for _, c := range cons {
		b.savePosition(s, c, force)
	}
	b.flushBroadcast(s, force) // its broadcast-log cursor and window (bcastlog.go)
}
