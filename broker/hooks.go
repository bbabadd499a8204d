package broker

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// hook connects the substrate's events to the broker.
type hook struct {
	mqtt.HookBase
	b *Broker
}

func (h *hook) ID() string { return "saguin" }

func (h *hook) Provides(e byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPacketRead, mqtt.OnPublish,
		mqtt.OnSessionEstablish, mqtt.OnSessionEstablished,
		mqtt.OnDisconnect, mqtt.OnUnsubscribed, mqtt.OnClientExpired, mqtt.OnPacketEncode,
		mqtt.OnRetainMessage, mqtt.OnPacketSent,
	}, []byte{e})
}

// OnPacketEncode corrects one substrate behaviour: with Request Problem
// Information 0 it drops User Properties from every packet, PUBLISH
// included. MQTT-3.1.2-29 forbids Reason Strings and User Properties only on
// packets other than PUBLISH, CONNACK and DISCONNECT; on a PUBLISH they are
// the publisher's headers and Sagüin's saguin-* labels, and must arrive.
func (h *hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Publish {
		pk.Mods.DisallowProblemInfo = false
		pk.Properties.ReasonString = ""
	}
	if pk.FixedHeader.Type == packets.Connack {
		pk = h.b.correctConnack(cl, pk) // ownership.go: Session Present as stored and as ended
	}
	pk = h.b.connackPromises(cl, pk) // admission.go: Maximum Packet Size, Topic Alias Maximum
	return pk
}

// OnConnect refuses, before anything of the session is touched, a CONNECT
// whose Will could never be delivered (RFC 0003 "Last Will").
func (h *hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		// From here a panic on this connection's goroutine has broker
		// state to leave consistent (listener.go).
		cc.client.Store(cl)
	}
	if reason, bad := h.b.clientIDRefusal(pk); bad {
		// configuration.md §3: 0x85 (3.1.1: 0x02, which the substrate maps).
		h.b.refused(slog.LevelWarn, cl, refuseConnect, packets.ErrClientIdentifierNotValid.Code,
			"CONNECT refused: client identifier", "reason", reason)
		code := withReason(packets.ErrClientIdentifierNotValid, reason)
		if cl.Properties.ProtocolVersion < 5 {
			code = packets.ErrClientIdentifierNotValid // mapped to 0x02 by its code alone
		}
		_ = h.b.mqtt.SendConnack(cl, code, false, nil)
		return code
	}
	if code, refused := h.b.willRefusal(pk); refused {
		return h.b.refuseWill(cl, code)
	}
	if pk.Connect.WillFlag && !h.b.willAllowed(cl, pk.Connect.WillTopic) {
		// A Will is a publish the client asks the broker to make for it:
		// it meets the client's own rules (RFC 0003, CONNACK 0x87).
		return h.b.refuseWill(cl, withReason(codeNotAuthorized, "Will topic is not one this client may publish to"))
	}
	h.b.capKeepalive(cl, pk)
	return nil
}

// capKeepalive applies limits.max_keepalive (configuration.md §1.5): an MQTT
// 5 client asking for more, or for none (0), is given the ceiling as Server
// Keep Alive on its CONNACK, and the substrate arms the read deadline from
// it. A silent client is then found within the ceiling, not never. MQTT
// 3.1.1 has no Server Keep Alive, so it is not applied there.
func (b *Broker) capKeepalive(cl *mqtt.Client, pk packets.Packet) {
	max := b.cfg.Broker.Limits.MaxKeepalive
	if max <= 0 || cl.Properties.ProtocolVersion < 5 {
		return
	}
	secs := uint16(max / time.Second)
	if pk.Connect.Keepalive == 0 || pk.Connect.Keepalive > secs {
		cl.State.Keepalive = secs
		cl.State.ServerKeepalive = true
	}
}

// clientIDRefusal decides a CONNECT's client identifier (configuration.md
// §3, 0x85): longer than limits.max_client_id_length (checked on the
// declared bytes, invariant 13), empty while asking to resume a session, or
// holding a control character (U+0001–U+001F, U+007F–U+009F) that would
// corrupt every log line naming the client.
func (b *Broker) clientIDRefusal(pk packets.Packet) (string, bool) {
	id := pk.Connect.ClientIdentifier
	if max := b.cfg.Broker.Limits.MaxClientIDLength; len(id) > max {
		return fmt.Sprintf("client identifier is %d bytes; limits.max_client_id_length is %d", len(id), max), true
	}
	if id == "" && !pk.Connect.Clean {
		return "an empty client identifier cannot resume a session: send one, or set Clean Start", true
	}
	for _, r := range id {
		if (r >= 0x01 && r <= 0x1F) || (r >= 0x7F && r <= 0x9F) {
			return fmt.Sprintf("client identifier holds the control character U+%04X", r), true
		}
	}
	return "", false
}

// Authentication and the ACL file land in a later step; until then every
// client is admitted, as RFC 0002 §1.3 says for a broker with no password file.
// The topic of a PUBLISH may reach OnACLCheck marked (substrate_topics.go):
// a check written here judges unmarked(topic).
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool { return true }
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool     { return true }

// OnPacketRead takes the packets Sagüin answers itself before the substrate
// sees them.
func (h *hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.b.panicTopic != "" {
		h.b.panicIfNamed(pk) // a fault-injection build only (Options.PanicTopic)
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if pk.FixedHeader.Qos == 2 {
			// Its PUBREC, a repeat's included, leaves after the PUBACKs
			// owed before it (inbound.go).
			if in, busy := h.b.busyInbound(cl); busy {
				in.settle()
			}
		}
		if h.b.answerRepeat(cl, pk) {
			return noopPacket, nil // a QoS 2 PUBLISH sent again (substrate_topics.go)
		}
		// Past the substrate's silent drop of $SYS-like and short $share
		// topics, so publish answers them (substrate_topics.go).
		return markForSubstrate(pk), nil
	case packets.Subscribe, packets.Unsubscribe, packets.Pubrel, packets.Disconnect:
		// These act after the connection's earlier publishes: a SUBSCRIBE
		// sees them stored, a PUBREL's release and PUBCOMP come after
		// their PUBACKs, a DISCONNECT closes after them (inbound.go).
		// PINGREQ and the acknowledgements of the broker's deliveries are
		// never held behind a commit.
		if in, busy := h.b.busyInbound(cl); busy {
			in.settle()
		}
	}
	switch pk.FixedHeader.Type {
	case packets.Subscribe:
		// invariant 17: only the owner changes the session, and a takeover
		// waits for a SUBSCRIBE in progress (ownership.go).
		release, owner := h.b.ownerTurn(cl)
		if !owner {
			return pk, packets.ErrRejectPacket
		}
		defer release()
		out, err := h.b.subscribe(cl, pk)
		if err != nil {
			// A refused SUBSCRIBE (Retain Handling 3, a shared filter with
			// No Local, no filter: already answered DISCONNECT 0x82) must go
			// no further: the substrate acts on the packet after any other
			// hook error — it subscribed the packet's valid filters, a state
			// change the refusal was to prevent — and ends the connection
			// only on ErrRejectPacket.
			return out, errors.Join(packets.ErrRejectPacket, err)
		}
		return out, nil
	case packets.Unsubscribe:
		// The substrate removes filters by client id: a replaced
		// connection's UNSUBSCRIBE would take the new owner's.
		if !h.b.owns(cl) {
			return pk, packets.ErrRejectPacket
		}
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		// Each answers an exchange the broker started (MQTT 5 §4.3): the
		// session's deliveries end it, write the PUBREL a PUBREC asks for,
		// and free its window slot (deliveries.go). The substrate never
		// sees them: its in-flight table holds only the client's own QoS 2
		// exchanges, which these would have reached under the same number.
		// invariant 17: only the owner's acknowledgements change the
		// session.
		if s := h.b.sessionOf(cl.ID); s != nil && s.owner() == cl {
			s.deliv.ack(h.b, s, cl, pk)
		}
		return noopPacket, nil
	case packets.Pubrel:
		// A held channel publish is released and PUBCOMP'd here (qos2.go).
		out, err := h.b.pubrel(cl, pk)
		if err != nil {
			// invariant 18: a PUBREL refused here (a release refused for
			// room or failed by the store, already answered DISCONNECT;
			// a connection taken over; a PUBCOMP that could not be
			// written) must go no further. The substrate acts on the
			// packet after any other hook error: its processPubrel
			// records a PUBCOMP 0x00 for the packet id and writes it,
			// now or to the resumed session, though nothing was
			// released. Only ErrRejectPacket stops it (and ends the
			// connection).
			return out, errors.Join(packets.ErrRejectPacket, err)
		}
		return out, nil
	case packets.Disconnect:
		// invariant 18: a clean DISCONNECT's positions are stored before the
		// connection is closed, so a consumer that acknowledged and left is
		// not sent the same records again.
		h.b.disconnecting(cl, pk)
	}
	return pk, nil
}

// OnPacketSent closes a connection once a DISCONNECT has been written to
// it. Passive disconnect (rfcs/0006) keeps the substrate from closing the
// socket before the client could read the reason code, but it then never
// closes it at all — a session taken over (0x8E) or a client past a limit
// (0x93) would stay connected. The bytes are written by now, so closing
// loses nothing.
func (h *hook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, b []byte) {
	if pk.FixedHeader.Type == packets.Disconnect {
		cl.Stop(packets.Code{Code: pk.ReasonCode, Reason: "disconnected by the broker"})
	}
}

// OnRetainMessage discards the substrate's in-memory copy of a retained
// value: Sagüin keeps retained values on a provider (publish stored it before
// this runs), and a second, unbounded copy in memory would be invariant 13
// broken quietly.
func (h *hook) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	if r > 0 {
		h.b.mqtt.Topics.RetainMessage(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true},
			TopicName:   pk.TopicName,
		})
	}
}

func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	// Before anything reads the topic (substrate_topics.go). The substrate
	// goes on with its own copy, still marked, only to acknowledge it: every
	// answer below marks it ignored or refused, so it fans out and retains
	// nothing of it.
	pk.TopicName = unmarked(pk.TopicName)
	if in := h.b.inboundOf(cl); in != nil {
		// A connection's QoS 0/1 publish is taken in and answered when
		// stored, while the read loop goes on (inbound.go).
		if out, err, taken := in.publish(pk); taken {
			return out, err
		}
		// Answered here, as before, once every publish the connection
		// sent before it is answered.
		in.settle()
	}
	if h.b.retainedBroadcast(cl, pk) {
		// Stored and fanned out as one step among new subscriptions
		// (retained_order.go).
		h.b.retainedOrder.RLock()
		defer h.b.retainedOrder.RUnlock()
	}
	out, err := h.b.publish(cl, pk)
	if err != nil {
		return out, err
	}
	// Broadcast (a Will injected in-process included): handed to each
	// subscriber's outbox and written by that connection's own sender, never
	// by the substrate's publishToClient on this goroutine (invariant 16,
	// fanout.go). Marked ignored, the substrate acknowledges it and fans
	// nothing out.
	h.b.fanOut(cl.ID, out)
	return out, packets.CodeSuccessIgnore
}

// OnSessionEstablish runs after CONNECT passed every check and before the
// substrate looks at the session: the moment the new connection claims it.
func (h *hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.b.claimForConnect(cl)
	if h.b.claimSession(cl, pk) && !pk.Connect.Clean {
		// The session ended at this takeover although the CONNECT asked
		// to resume it: the substrate would carry it over (ownership.go).
		h.b.endAtTakeover(cl)
	}
}

// OnSessionEstablished runs after the CONNACK is written: the session's
// consumers start serving the new connection only now, so nothing reaches
// it before its CONNACK.
func (h *hook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	// The substrate's send quota defers deliveries and later sends them from
	// the read loop through Inflight.NextImmediate, which takes the table's
	// read lock twice: a write to the table from any other goroutine in
	// between (a QoS 2 hold dropped by the expiry sweep is one) deadlocks
	// the read loop. A zero maximum turns the machinery off; the substrate
	// makes no deliveries, and Sagüin's keep the client's Receive Maximum
	// themselves (deliveries.go). This runs before the read loop starts.
	cl.State.Inflight.ResetSendQuota(0)
	// The substrate has registered this connection: a late teardown of an
	// earlier one can now see it (ownership.go). The claim is given back
	// only once the session's senders run for this connection: a CONNECT
	// for the same id waiting on it may end the session (Clean Start, or a
	// session that ends with its connection), and senders started after
	// that ending would serve a session nobody holds and never stop.
	defer h.b.claims.release(cl.ID, cl)
	if h.b.claims.storeFailed(cl) {
		// Its CONNACK was a refusal (0x83): nothing is served, its Will is
		// not armed, and the connection ends as MQTT requires after a
		// refusing CONNACK.
		if s := h.b.sessionOf(cl.ID); s != nil {
			s.mu.Lock()
			if s.cl == cl {
				s.will = nil
			}
			s.mu.Unlock()
		}
		cl.Stop(codeSessionStore)
		return
	}
	s := h.b.sessionOf(cl.ID)
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.cl != cl {
		s.mu.Unlock()
		return
	}
	cons := make([]*consumer, 0, len(s.consumers))
	for _, c := range s.consumers {
		cons = append(cons, c)
	}
	queues := s.queueEngines(h.b)
	latest := s.latestConsumers()
	s.mu.Unlock()
	// What the session's last connection left unacknowledged goes first,
	// in the order first sent; then the pumps start.
	s.deliv.resume(h.b, cl)
	for _, c := range cons {
		c.start(cl)
	}
	for _, c := range latest {
		c.start(cl) // a resume: the changes since the mark (latest_consumer.go)
	}
	for _, q := range queues {
		q.addWorker(s, cl)
	}
	// Broadcast owed to the session, written by this connection's sender
	// (fanout_send.go).
	h.b.outboxOf(s).start(h.b, cl)
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
// returns every job that connection held (RFC 0003: returned whenever the
// connection ends, whatever becomes of the session).
func (b *Broker) returnJobs(s *session, cl *mqtt.Client) {
	s.mu.Lock()
	queues := s.queueEngines(b)
	s.mu.Unlock()
	for _, q := range queues {
		q.removeWorker(s, cl)
	}
}

func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		cc.ending.Store(true) // a panic from here on does not run this again (listener.go)
	}
	// Every publish the connection handed over is stored or refused
	// before its end is acted on (inbound.go).
	h.b.inboundEnded(cl)
	h.b.connectionEnded(cl, expire)
	// invariant 17: the substrate's teardown works by client id and would
	// unregister a newer connection of the same id; Sagüin does it, under
	// the id's claim.
	h.b.teardown(cl, expire)
	if f := h.b.afterTeardown.Load(); f != nil {
		(*f)(cl) // a test's pause where the substrate's own cleanup follows
	}
}

func (h *hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	filters := make([]string, len(pk.Filters))
	for i, f := range pk.Filters {
		filters[i] = f.Filter
	}
	h.b.unsubscribed(cl, filters)
}

// OnClientExpired: the session's expiry passed while it was away. Its
// positions go now, not at the next start, or a replacement device with the
// same client id would inherit them (RFC 0003 §8).
func (h *hook) OnClientExpired(cl *mqtt.Client) {
	h.b.endSession(cl.ID, nil)
}

func (b *Broker) sessionOf(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

func (s *session) isDurable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable
}

// sessionExpiry is what the client was granted: the Session Expiry Interval
// capped by limits.max_session_expiry; a 3.1.1 cleanSession=0 client gets the
// cap (RFC 0003 §8).
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
		old := s.owner()
		// The pumps' deliveries are taken back here, whether or not the
		// old connection's end has run yet: they are the session's, not
		// the connection's, so nothing of them is carried or resent by the
		// substrate (the chaos harness's append-duplicate finding was one
		// it resent next to the pump's own copy from the position).
		s.stopPumps()
		if old != nil {
			b.returnJobs(s, old)
		}
		b.flushSession(s, true)
		// A Clean Start ends the session, and so does any CONNECT for a
		// session that ends with its connection (delivery-front §3), or
		// for one whose expiry passed while it was away: expiry and
		// reconnect never interleave, whenever the sweep runs.
		ends := pk.Connect.Clean || !s.isDurable() || b.expiredAway(s)
		var passed []passedPosition
		if !ends {
			// invariant 1: checked here, at CONNECT and before anything
			// resumes. A position retention passed is the one loss a
			// consumer can be told of, and Session Present 0 is how
			// (delivery-front §8 "Resuming below retention floor").
			var err error
			if passed, err = b.passedPositions(s); err != nil {
				// A failed read writes nothing (delivery-front §3): the
				// CONNECT is refused 0x83 and the session stays as it was.
				b.log.Error("CONNECT refused: reading the session's stored positions failed", "client", cl.ID, "error", err)
				b.claims.mark(cl.ID, cl, func(c *idClaim) { c.refusal = codeSessionStore.Code })
			}
			ends = len(passed) > 0
		}
		b.settleWill(s, ends, old != nil)
		if ends {
			// delivery-front §3: a session that ends with its connection
			// ends at takeover; the new CONNECT is answered Session
			// Present 0 whatever its Clean Start. So does one retention
			// passed a position of: it is discarded — subscriptions, owed
			// broadcast, held QoS 2 publishes — except the positions
			// retention did not pass (delivery-front §3 "Session ends
			// when"), and the discard is stored before the CONNACK
			// (invariant 18). Each passed position goes with it, so the
			// channel is served from where a reader with no position
			// starts.
			keep := map[string]bool{}
			if len(passed) > 0 {
				for name, ch := range b.channels {
					keep[name] = ch.log != nil
				}
				for _, p := range passed {
					keep[p.ch.name] = false
					b.positionPassed(msgResumePassed, cl.ID, p.ch, p.position, p.floor)
				}
			}
			b.endSessionKeeping(cl.ID, s, keep)
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
	s.mu.Lock()
	// The connection's Will is the session's now; Sagüin sends it, not the
	// substrate (wills.go).
	s.will = willOf(pk)
	cl.Properties.Will = mqtt.Will{}
	s.cl = cl
	s.expiry = exp
	s.protocol = cl.Properties.ProtocolVersion
	s.lastSeen = time.Time{}
	wasDurable := s.durable
	s.durable = exp > 0
	s.mu.Unlock()
	if exp == 0 {
		if wasDurable {
			// The session now ends with this connection: a restart must
			// not bring it back (RFC 0003 §8).
			b.forgetSession(cl.ID)
		}
		return ended
	}
	// invariant 18: the session this CONNACK describes is stored first —
	// its expiry, and the subscriptions it resumes with, which the
	// substrate copies into the new connection only after this hook.
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
	return ended
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
		b.endSession(cl.ID, s) // publishes its Will first
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
		// (invariant 18; seeds/rfc-0003 "Last Will": at least once).
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
// of keeps the others (delivery-front §3).
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
		// "Ending happens in one place, all parts together; a pending
		// Will is published first" (delivery-front §3).
		b.willAtSessionEnd(s)
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
	cons := make([]*consumer, 0, len(s.consumers))
	for _, c := range s.consumers {
		cons = append(cons, c)
	}
	s.mu.Unlock()
	for _, c := range cons {
		b.savePosition(s, c, force)
	}
	b.flushBroadcast(s, force) // its broadcast-log cursor and window (bcastlog.go)
}
