package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/internal/metrics"
)

// Wills are Sagüin's, not the substrate's (rfcs/wills.md): the
// substrate publishes a Will straight to subscribers, so one aimed at a
// channel would be stored nowhere and skip every bound. Sagüin takes the
// Will off the connection when the session is claimed (the substrate then
// holds none), keeps it with the session, and publishes it through the
// ordinary publish path when it falls due.

// willTick is how often waiting Wills are checked (Will Delay Interval is
// in whole seconds), and refused session writes retried (invariant 18).
const willTick = time.Second

// will is a Last Will held for a session.
type will struct {
	topic   string
	payload []byte
	qos     byte
	retain  bool
	// props are the publish properties the Will carried (Content Type,
	// Payload Format Indicator, Message Expiry, Response Topic,
	// Correlation Data, User Properties): delivered with it like any
	// publish's.
	props packets.Properties
	delay time.Duration // the Will Delay Interval asked for
	// due is when a waiting Will is published; zero while its connection
	// lives.
	due      time.Time
	username string
}

// willOf takes the Will a CONNECT carries, or nil.
func willOf(pk packets.Packet) *will {
	c := pk.Connect
	if !c.WillFlag {
		return nil
	}
	wp := c.WillProperties
	return &will{
		topic:   c.WillTopic,
		payload: append([]byte(nil), c.WillPayload...),
		qos:     c.WillQos,
		retain:  c.WillRetain,
		props: packets.Properties{
			PayloadFormat: wp.PayloadFormat, PayloadFormatFlag: wp.PayloadFormatFlag,
			MessageExpiryInterval: wp.MessageExpiryInterval,
			ContentType:           wp.ContentType, ResponseTopic: wp.ResponseTopic,
			CorrelationData: append([]byte(nil), wp.CorrelationData...),
			User:            append([]packets.UserProperty(nil), wp.User...),
		},
		delay:    time.Duration(wp.WillDelayInterval) * time.Second,
		username: string(c.Username),
	}
}

// willRefusal decides, at CONNECT, a Will that could never be delivered
// (rfcs/wills.md): refused with 0x90 (0x99 for a
// payload that is not what its Payload Format Indicator says), because each
// case is permanent for that client's configuration and a device that
// connects happily for months with its monitoring never armed is worse than
// one turned away where it can be told.
func (b *Broker) willRefusal(pk packets.Packet) (packets.Code, bool) {
	if !pk.Connect.WillFlag {
		return packets.Code{}, false
	}
	t := pk.Connect.WillTopic
	lim := b.cfg.Broker.Limits
	bad := func(why string) (packets.Code, bool) {
		return withReason(codeTopicInvalid, "Will topic "+why), true
	}
	switch {
	case t == "":
		return bad("is empty")
	case strings.ContainsAny(t, "+#"):
		return bad("holds a wildcard: nothing may publish to it")
	case t == "$SYS" || strings.HasPrefix(t, "$SYS/"):
		return bad("is in $SYS, which is the broker's")
	case strings.HasPrefix(t, "$share/"):
		return bad("begins $share/, a subscription form")
	case strings.HasPrefix(t, "$saguin/"):
		return bad("is in the reserved $saguin/ space")
	case len(t) > lim.MaxTopicLength:
		return bad(fmt.Sprintf("is %d bytes; limits.max_topic_length is %d", len(t), lim.MaxTopicLength))
	case strings.Count(t, "/")+1 > lim.MaxTopicLevels:
		return bad(fmt.Sprintf("has %d levels; limits.max_topic_levels is %d", strings.Count(t, "/")+1, lim.MaxTopicLevels))
	}
	if name, ok := b.resolver.Resolve(t); ok {
		if ch := b.channels[name]; ch != nil && ch.cfg.DeadLetterOf != "" {
			return bad(fmt.Sprintf("is in %s, the dead-letter channel of queue %s, which only the broker writes",
				ch.name, ch.cfg.DeadLetterOf))
		}
	}
	if !payloadFormatValid(pk.Connect.WillProperties, pk.Connect.WillPayload) {
		// MQTT 5 §3.1.3.2.3: the Server may check the Will is what its
		// Payload Format Indicator says, and answers CONNACK 0x99 if not;
		// published, it would be refused 0x99 as any PUBLISH is (publish.go).
		return withReason(codePayloadFormatInvalid,
			"the Will's Payload Format Indicator says UTF-8, but its payload is not well-formed UTF-8"), true
	}
	return packets.Code{}, false
}

// willAllowed asks the ACL whether the client may publish to its Will's
// topic (docs/channels.md: a Will meets the rules the client's own PUBLISH meets;
// docs/security.md "Every refusal, and its code", CONNACK 0x87), at CONNECT.
func (b *Broker) willAllowed(cl *mqtt.Client, topic string) bool {
	g, all := b.grantsOf(cl)
	return all || b.mayPublishTo(g, topic, false)
}

// willStillAllowed is the question asked again when a Will fires (rfcs/wills.md), as the identity that armed it: the rules may have been reloaded
// since its CONNECT, and its connection may be gone.
func (b *Broker) willStillAllowed(id string, w *will) bool {
	g := b.grantsFor(w.username, id)
	if g == nil {
		return true // no ACL
	}
	if g.Denies(acl.Will) || (w.qos == 2 && g.Denies(acl.QoS2)) {
		return false
	}
	if _, channel := b.resolver.Resolve(w.topic); w.retain && !channel && g.Denies(acl.Retained) {
		return false
	}
	return b.mayPublishTo(g, w.topic, len(w.payload) == 0)
}

// refuseWill answers a CONNECT whose Will is refused. A 3.1.1 client has no
// 0x90: it is told "not authorized" (0x05), the one return code that stops
// a client library retrying, and the log names the reason.
func (b *Broker) refuseWill(cl *mqtt.Client, code packets.Code) error {
	b.refused(slog.LevelWarn, cl, refuseConnect, code.Code, "CONNECT refused for its Will",
		"topic", cl.Properties.Will.TopicName, "reason", code.Reason)
	if cl.Properties.ProtocolVersion < 5 {
		_ = b.mqtt.SendConnack(cl, packets.Err3NotAuthorized, false, nil)
		return packets.Err3NotAuthorized
	}
	_ = b.mqtt.SendConnack(cl, code, false, nil)
	return code
}

// settleWill decides, as a connection claims session s, the Will the
// session already held (the claiming connection's own replaces it
// afterwards), following rfcs/sessions-ownership.md: a session ending here
// publishes it (the wait ends when the session does); a live connection
// being replaced has it published when it asked for no delay, dropped
// otherwise; a waiting one is cancelled by the resume.
func (b *Broker) settleWill(s *session, sessionEnds, replacingLive bool) {
	if old := s.takeWill(); old != nil {
		// A Will with no moment on a session no connection holds is one
		// restored from a client connected when the broker stopped: its
		// client is back, and this CONNECT replaces it (rfcs/wills.md)
		// — even one ending the session.
		restoredUnarmed := !replacingLive && old.due.IsZero()
		switch {
		case sessionEnds && !restoredUnarmed:
			b.publishWill(s.id, old, metrics.WillSessionEnded)
		case replacingLive && old.delay == 0:
			b.publishWill(s.id, old, metrics.WillImmediate)
		default:
			if !old.due.IsZero() {
				// It was waiting out its delay: the resume cancels it.
				b.events.willsCancelled.Add(1)
			}
			b.log.Debug("Will cancelled: the session resumed", "client", s.id)
		}
	}
}

// discardWill: a DISCONNECT 0x00 discards the Will; 0x04 (Disconnect with
// Will Message) keeps it (MQTT 5 §3.14.2.1).
func (b *Broker) discardWill(s *session, pk packets.Packet) {
	if pk.ReasonCode == 0x04 {
		return
	}
	s.takeWill()
}

// willAtConnectionEnd starts the Will's wait, or publishes it now; the
// caller stores the session afterwards. A session ending with its
// connection publishes through endSession instead.
func (b *Broker) willAtConnectionEnd(s *session) {
	if b.closing.Load() {
		// The broker's own stop cut the connection: the device did not die.
		// Its Will stays unarmed and is dropped at the next start (a
		// restart keeps only Wills with a due moment).
		return
	}
	// A Will with a delay waits, never past the session's expiry; a
	// DISCONNECT 0x04 started the wait already (disconnecting), and stored
	// that moment (session.armWill).
	if w := s.armWill(b.clock.Now()); w != nil {
		b.publishWill(s.id, w, metrics.WillImmediate)
	}
}

// willAtSessionEnd publishes a session's Will as the session ends ("a
// pending Will is published first"): counted session_ended, or immediate
// when the session ends with its connection (connectionEnded).
func (b *Broker) willAtSessionEnd(s *session, cause metrics.WillCause) {
	if b.closing.Load() {
		return
	}
	w := s.takeWill()
	if w == nil {
		return
	}
	if w.delay > 0 && w.due.IsZero() && !s.isDurable() {
		b.log.Info("Will published at the disconnect: a Will Delay needs a session to wait inside",
			"client", s.id, "will_delay", w.delay,
			"fix", "connect with a Session Expiry Interval at least as long as the Will Delay Interval")
	}
	b.publishWill(s.id, w, cause)
}

// publishWill publishes w as the client id that armed it, through the
// ordinary publish path: the reserved prefix stripped, every bound applied,
// stored in the channel that claims its topic, or retained and fanned out
// on a broadcast topic. What fails here is logged and no more: the client
// is gone, so there is nobody to answer.
// willListener names the stand-in connections a Will is published from:
// in-process publishers, whose QoS 2 publishes are written at once, never
// held for a PUBREL no one will send (rfcs/qos2-holds.md: Only client publishes
// are held).
const willListener = "will"

// cause is why it is published, counted once it is
// (saguin_wills_published_total).
func (b *Broker) publishWill(id string, w *will, cause metrics.WillCause) {
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: w.qos, Retain: w.retain},
		TopicName:       w.topic,
		Payload:         w.payload,
		Properties:      w.props,
		ProtocolVersion: 5,
	}
	pk.Properties.User = append([]packets.UserProperty(nil), w.props.User...)
	// A stand-in for the gone connection: publish reads the client id (the
	// record's publisher, No Local) and the protocol from it, and writes
	// nothing to it (a refusal's PUBACK has no socket to go to).
	as := b.mqtt.NewClient(nil, willListener, id, false)
	as.Properties.ProtocolVersion = 5
	as.Properties.Username = []byte(w.username)
	if !b.willStillAllowed(id, w) {
		// The one question asked again when a Will fires (docs/channels.md).
		b.log.Warn("Will not published: its client may no longer publish there", "client", id,
			"topic", w.topic, "reason", codeNotAuthorized.Reason)
		return
	}
	// invariants 10, 13: a Will takes the clients' publish path: its saguin-* properties stripped, its topic and header bounds applied.
	if err := b.publishFrom(as, willListener, pk); err != nil {
		b.log.Error("Will not published", "client", id, "topic", w.topic, "error", err)
		return
	}
	b.events.willPublished(cause)
	b.log.Info("Will published", "client", id, "topic", w.topic)
}

// publishFrom publishes pk from as, an in-process stand-in connection on
// listener (a Will's, a bridge's): through the clients' publish path, and
// for a broadcast topic injected from a second stand-in carrying the same
// client id, so No Local still applies. nil: stored in its channel, or
// handed to the fan-out; else the refusal (a packets.Code) or the failure.
func (b *Broker) publishFrom(as *mqtt.Client, listener string, pk packets.Packet) error {
	if b.retainedBroadcast(as, pk) {
		// Stored here and fanned out by the injection below: one step
		// among new subscriptions (retained_order.go).
		b.retainedOrder.RLock()
		defer b.retainedOrder.RUnlock()
	}
	out, err := b.publish(as, pk)
	switch {
	case err == nil:
		// Broadcast: the substrate hands the injected packet to the
		// OnPublish hook, which gives it to Sagüin's own fan-out
		// (receivePublish, fanout.go) and marks it ignored.
		inj := b.mqtt.NewClient(nil, listener, as.ID, true)
		inj.Properties.ProtocolVersion = 5
		if out.FixedHeader.Qos > 0 {
			// The substrate validates a QoS>0 publish's packet id even from
			// an in-process client, which is never acknowledged.
			out.PacketID = 1
		}
		return b.mqtt.InjectPacket(inj, out)
	case errors.Is(err, packets.CodeSuccessIgnore):
		// Stored in its channel, which delivers it.
		return nil
	}
	return err
}

// willLoop publishes Wills whose wait is over, and stores the sessions
// they left. It runs once at once, so a Will that fell due while the broker
// was stopped is published at start ("published at least once across a
// crash": the record is updated only after the publish is stored).
func (b *Broker) willLoop(ctx context.Context) {
	t := b.clock.NewTicker(willTick)
	defer t.Stop()
	// The first pass publishes what fell due while the broker was
	// stopped: counted as published at the start, never as immediate.
	cause := metrics.WillAtStart
	for {
		b.fireDueWills(cause)
		cause = metrics.WillDelayed
		// invariant 18: session records the store refused, every second.
		b.rewriteSessions()
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

func (b *Broker) fireDueWills(cause metrics.WillCause) {
	now := b.clock.Now()
	b.mu.Lock()
	var due []*session
	for _, s := range b.sessions {
		if s.willDue(now) {
			due = append(due, s)
		}
	}
	b.mu.Unlock()
	for _, s := range due {
		w := s.takeDueWill(now)
		if w == nil {
			continue // resumed meanwhile
		}
		b.publishWill(s.id, w, cause)
		b.storeAfterWill(s)
	}
}

// storeAfterWill rewrites a session's stored record after its Will was
// published, so a restart does not publish it again.
func (b *Broker) storeAfterWill(s *session) {
	if cl, ok := b.mqtt.Clients.Get(s.id); ok {
		b.storeSessionOrRetry(s, cl, "after its Will")
	}
}
