package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/partition"
	"saguin.dev/storage"
)

// Reason codes on a SUBACK (docs/security.md "Every refusal, and its code").
const (
	subackImplementation = 0x83
	subackNotAuthorized  = 0x87
	subackFilterInvalid  = 0x8F
	subackQuotaExceeded  = 0x97
	subackV3Failure      = 0x80
)

// handled replaces a packet Sagüin has fully processed in OnPacketRead, so
// the substrate does nothing more with it: a PUBACK for packet identifier 0,
// which no delivery ever uses, is looked up, not found and ignored.
var handled = packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}}

// subscribe serves a SUBSCRIBE in place of the substrate, which can answer a
// filter only with the codes it knows. Sagüin decides each filter's code
// itself (docs/security.md "Every refusal, and its code"), registers broadcast interest with the substrate's
// index, writes the SUBACK, and only then lets channel pumps and retained
// broadcast values flow, so the SUBACK always goes first. It reads as its
// phases, in that order (rfcs/delivery-seam.md "The session behind
// methods"); the session's subscribing turn is held across all of them.
func (b *Broker) subscribe(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	v5 := cl.Properties.ProtocolVersion == 5
	if err := b.refuseMalformedSubscribe(cl, pk, v5); err != nil {
		return pk, err
	}
	g, all := b.grantsOf(cl)
	if err := b.refuseDeniedShare(cl, pk, v5, g, all); err != nil {
		return pk, err
	}
	in := b.readSubscribeInstructions(cl, pk)
	s := b.sessionOf(cl.ID)
	if s != nil {
		defer s.holdSubscribing()()
	}
	codes, granted := b.admitFilters(cl, pk, &in, g, all, v5)
	granted = b.withinSubscriptionLimit(cl, pk, granted, codes, v5)
	granted = b.storeSubscriptions(s, cl, granted, codes, v5)
	b.declareSlices(s, cl, granted, in.declared)
	made := b.addSubscriptions(s, cl, granted, in)
	if err := b.writeSuback(cl, pk, codes, in.reason, made); err != nil {
		return pk, err
	}
	b.startDeliveries(s, cl, made)
	return handled, nil
}

// refuseMalformedSubscribe ends the connection over a SUBSCRIBE MQTT calls
// a protocol error: no filters or a bad packet identifier, No Local on a
// shared subscription (MQTT-3.8.3-4), Retain Handling 3.
func (b *Broker) refuseMalformedSubscribe(cl *mqtt.Client, pk packets.Packet, v5 bool) error {
	if code := pk.SubscribeValidate(); code != packets.CodeSuccess {
		// No filters, bad packet id: a protocol error ends the connection.
		_ = b.mqtt.DisconnectClient(cl, code)
		return code
	}
	for _, f := range pk.Filters {
		if v5 && f.NoLocal && strings.HasPrefix(f.Filter, "$share/") {
			_ = b.mqtt.DisconnectClient(cl, packets.ErrProtocolViolationInvalidSharedNoLocal) // [MQTT-3.8.3-4]
			return packets.ErrProtocolViolationInvalidSharedNoLocal
		}
		if f.RetainHandling == 3 {
			_ = b.mqtt.DisconnectClient(cl, packets.ErrProtocolViolation)
			return packets.ErrProtocolViolation
		}
	}
	return nil
}

// refuseDeniedShare ends the connection of a client the ACL denies shared
// subscriptions that asks for one anyway.
func (b *Broker) refuseDeniedShare(cl *mqtt.Client, pk packets.Packet, v5 bool, g *acl.Grants, all bool) error {
	if all || !v5 || g == nil || !g.Denies(acl.Share) {
		return nil
	}
	for _, f := range pk.Filters {
		if strings.HasPrefix(f.Filter, "$share/") {
			// docs/security.md "Every refusal, and its code"; docs/security.md "A feature the ACL denies": the CONNACK said Shared Subscription
			// Available 0; a client that asks anyway is disconnected.
			code := withReason(packets.ErrSharedSubscriptionsNotSupported, "this client may not use shared subscriptions")
			b.refusedClosing(slog.LevelWarn, cl, refuseSubscribe, code.Code, "DISCONNECT: shared subscription from a client denied share", "filter", f.Filter)
			_ = b.mqtt.DisconnectClient(cl, code)
			return code
		}
	}
	return nil
}

// subscribeInstructions is what a SUBSCRIBE's user properties ask of every
// filter in it.
type subscribeInstructions struct {
	packetCode byte              // a refusal of every filter (0: none)
	reason     string            // the SUBACK's Reason String, when a rule of ours refused
	deletions  bool              // saguin-deletions: tombstones in the latest state pass (latest.go)
	declared   partition.Matcher // saguin-filter: the slice declared (rfcs/partition.md)
}

// readSubscribeInstructions reads a SUBSCRIBE's saguin-* user properties.
func (b *Broker) readSubscribeInstructions(cl *mqtt.Client, pk packets.Packet) subscribeInstructions {
	var in subscribeInstructions
	// An unread saguin-* instruction refuses every filter in the packet
	// (docs/channels.md "What a publish is answered": unknown instruction refused, unknown data stripped).
	// saguin-filter: the slice the subscriber declares (rfcs/partition.md), on the packet, so it applies to
	// every filter named. A malformed declaration refuses the packet.
	var decl partition.Declaration
	var declRefused error
	for _, u := range pk.Properties.User {
		if u.Key == deletionsProperty {
			in.deletions = true
			continue
		}
		if u.Key == partition.PropertyName {
			if declRefused == nil {
				declRefused = decl.Add(u.Val)
			}
			continue
		}
		if strings.HasPrefix(u.Key, reservedPrefix) {
			in.packetCode = subackImplementation
			b.refused(slog.LevelWarn, cl, refuseSubscribe, subackImplementation,
				"SUBSCRIBE refused: unread saguin- property", "property", u.Key)
		}
	}

	in.declared = decl.Matcher()
	if declRefused != nil {
		in.packetCode = subackImplementation
		var pe *partition.Error
		if errors.As(declRefused, &pe) {
			in.reason = pe.Reason()
		}
		b.refused(slog.LevelWarn, cl, refuseSubscribe, subackImplementation,
			"SUBSCRIBE refused: saguin-filter", "reason", declRefused)
	}
	return in
}

// admitFilters decides each filter's SUBACK code: the packet's own
// refusal, a declared slice of a filter that divides its stream already,
// the configuration's routing, then the ACL. It returns the codes, by
// filter, and the filters granted (their QoS the code, the packet's
// Subscription Identifier on each); a slice refusal sets in.reason.
func (b *Broker) admitFilters(cl *mqtt.Client, pk packets.Packet, in *subscribeInstructions, g *acl.Grants, all, v5 bool) ([]byte, []packets.Subscription) {
	codes := make([]byte, len(pk.Filters))
	granted := make([]packets.Subscription, 0, len(pk.Filters))
	var refusedHere filterRefusals
	for i, f := range pk.Filters {
		code := in.packetCode
		if code == 0 && in.declared.Declared() {
			// A shared subscription or a queue already divides its stream:
			// a slice of it is refused, decided by the prefix alone.
			var pe *partition.Error
			if err := partition.CheckFilter(f.Filter); errors.As(err, &pe) {
				code, in.reason = pe.Code(), pe.Reason()
				refusedHere.add(f.Filter, code, in.reason)
			}
		}
		if code == 0 {
			var why string
			if code, why = b.filterCode(cl, f); code >= 0x80 {
				refusedHere.add(f.Filter, code, why)
			} else if !all {
				// The ACL may only narrow what the configuration grants.
				if code, why = b.subscribeRefusal(g, f, code); code >= 0x80 {
					refusedHere.add(f.Filter, code, why)
				}
			}
		}
		if code >= 0x80 {
			if !v5 {
				code = subackV3Failure
			}
			codes[i] = code
			continue
		}
		f.Qos = code
		if len(pk.Properties.SubscriptionIdentifier) > 0 {
			f.Identifier = pk.Properties.SubscriptionIdentifier[0]
		}
		codes[i] = f.Qos
		granted = append(granted, f)
	}
	b.logFilterRefusals(cl, &refusedHere, len(pk.Filters))
	return codes, granted
}

// storeSubscriptions stores the session with the granted filters before
// the SUBACK grants them (invariant 18); a store that refuses refuses the
// filters (their codes set, none left granted).
func (b *Broker) storeSubscriptions(s *session, cl *mqtt.Client, granted []packets.Subscription, codes []byte, v5 bool) []packets.Subscription {
	if s == nil || len(granted) == 0 {
		return granted
	}
	if err := b.storeSession(s, withSubscriptions(cl, granted)); err != nil {
		b.log.Error("SUBSCRIBE refused: the session could not be stored", "client", cl.ID, "error", err)
		refusal := byte(subackImplementation)
		if errors.Is(err, storage.ErrFull) {
			refusal = subackQuotaExceeded
		}
		if !v5 {
			refusal = subackV3Failure
		}
		for i, c := range codes {
			if c < 0x80 {
				codes[i] = refusal
			}
		}
		granted = granted[:0]
	}
	return granted
}

// declareSlices records the slice the SUBSCRIBE declared on the session's
// granted filters, and in the broker's partition spaces (rfcs/partition.md).
func (b *Broker) declareSlices(s *session, cl *mqtt.Client, granted []packets.Subscription, declared partition.Matcher) {
	if s == nil {
		return
	}
	s.declare(granted, declared)
	for _, f := range granted {
		if d, disagree := b.spaces.Declare(f.Filter, cl.ID, declared); disagree {
			b.log.Warn("partition spaces disagree", "detail", d.String())
		}
	}
}

// retainedPass is a granted filter's retained values, read as it was
// subscribed and sent after the SUBACK.
type retainedPass struct {
	sub  packets.Subscription
	recs []storage.Record
}

// subscriptionsMade is what addSubscriptions made of the granted filters,
// to be served once the SUBACK is written: the retained passes, the new
// append consumers, and the latest consumers new (fresh) or held off
// their pumps until the SUBACK (held).
type subscriptionsMade struct {
	retained                []retainedPass
	started                 []*consumer
	latestFresh, latestHeld []*latestConsumer
}

// addSubscriptions registers each granted filter: the queue form and the
// seek reply topic with the substrate only (a queue's worker added), a
// broadcast filter with the substrate's index and its retained values read
// in the same step, and the channel consumers it reaches (append and
// latest). Nothing is written to the client here.
func (b *Broker) addSubscriptions(s *session, cl *mqtt.Client, granted []packets.Subscription, in subscribeInstructions) subscriptionsMade {
	var made subscriptionsMade
	var latestSubs []latestSubscribe
	for _, f := range granted {
		if strings.HasPrefix(f.Filter, "$saguin/") {
			// The queue form and the seek reply topic. Registered with the
			// substrate only so that UNSUBSCRIBE finds them; nothing is ever
			// published to them (publish refuses both topics).
			b.mqtt.Topics.Subscribe(cl.ID, f)
			cl.State.Subscriptions.Add(f.Filter, f)
			if name, ok := strings.CutPrefix(f.Filter, "$saguin/queue/"); ok && s != nil {
				s.addQueue(name)
				b.engines[name].addWorker(s, s.sink(b, cl))
			}
			continue
		}
		// Broadcast interest: the substrate's index serves every topic no
		// channel claims (it never sees channel records: publish marks them
		// ignored). The subscription is made and its retained values read
		// as one step among retained publishes (retained_order.go), so each
		// such publish reaches it once: in the pass, or live.
		b.pauses.subscribeAtOrder.at()
		b.retainedOrder.Lock()
		isNew := b.mqtt.Topics.Subscribe(cl.ID, f)
		cl.State.Subscriptions.Add(f.Filter, f)
		recs := b.retainedFor(f, !isNew, in.declared)
		b.retainedOrder.Unlock()
		if isNew {
			atomic.AddInt64(&b.mqtt.Info.Subscriptions, 1)
		}
		made.retained = append(made.retained, retainedPass{f, recs})
		if s != nil && !strings.HasPrefix(f.Filter, "$share/") {
			made.started = append(made.started, b.addChannelSubscription(s, cl, f)...)
			latestSubs = append(latestSubs, latestSubscribe{sub: f, existed: !isNew})
		}
	}
	// Latest channels take the packet's filters together: one state pass
	// per channel, saguin-deletions applying to every filter (docs/channels.md "`latest`").
	if len(latestSubs) > 0 {
		made.latestFresh, made.latestHeld = b.addLatestSubscriptions(s, cl, latestSubs, in.deletions)
	}
	return made
}

// writeSuback writes the SUBACK, and then lets the latest consumers held
// for it go on with their passes, whether or not it was written.
func (b *Broker) writeSuback(cl *mqtt.Client, pk packets.Packet, codes []byte, reason string, made subscriptionsMade) error {
	b.log.Debug("subscribe", "client", cl.ID, "filters", len(pk.Filters), "codes", fmt.Sprint(codes), "consumers", len(made.started))
	ack := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Suback},
		PacketID:    pk.PacketID,
		ReasonCodes: codes,
		// Left out by the encoder when the client asked for no problem
		// information (MQTT-3.1.2-29).
		Properties: packets.Properties{ReasonString: reason},
	}
	err := cl.WritePacket(ack)
	for _, c := range made.latestHeld {
		c.release() // SUBACK written (or the connection is going): on with the pass
	}
	return err
}

// startDeliveries serves what the SUBSCRIBE made, after its SUBACK: the
// retained passes first, then the new consumers' pumps, through the
// session's sink for this connection (delivery_sink.go).
func (b *Broker) startDeliveries(s *session, cl *mqtt.Client, made subscriptionsMade) {
	b.pauses.beforeRetainedPass.at()
	for _, r := range made.retained {
		b.sendRetained(s, cl, r.sub, r.recs)
	}
	if s == nil {
		return // no session: no consumer was made (addSubscriptions)
	}
	sink := s.sink(b, cl)
	for _, c := range made.started {
		c.start(sink)
	}
	for _, c := range made.latestFresh {
		c.start(sink)
	}
}

// withinSubscriptionLimit refuses, with 0x97 (3.1.1: 0x80), each granted
// filter that would take the client past limits.max_subscriptions, counted
// after the SUBSCRIBE: a filter it already holds is a replacement and adds
// nothing (docs/configuration.md "`broker.limits`"; invariant 13). The connection stays.
func (b *Broker) withinSubscriptionLimit(cl *mqtt.Client, pk packets.Packet, granted []packets.Subscription, codes []byte, v5 bool) []packets.Subscription {
	max := b.cfg.Broker.Limits.MaxSubscriptions
	held := cl.State.Subscriptions.GetAll()
	count := len(held)
	kept := granted[:0]
	refused := 0
	for _, f := range granted {
		if _, replaces := held[f.Filter]; !replaces {
			if count >= max {
				for i, pf := range pk.Filters {
					if pf.Filter == f.Filter && codes[i] < 0x80 {
						codes[i] = subackQuotaExceeded
						if !v5 {
							codes[i] = subackV3Failure
						}
					}
				}
				refused++
				continue
			}
			count++
			held[f.Filter] = f
		}
		kept = append(kept, f)
	}
	if refused > 0 {
		b.refusals.Refused(logging.Refusal{Level: slog.LevelWarn, Client: cl.ID, Kind: refuseSubscribe,
			Code: subackQuotaExceeded, Count: uint64(refused),
			Msg: "SUBSCRIBE past limits.max_subscriptions: filters refused", Args: []any{"refused", refused, "limit", max}})
	}
	return kept
}

// withSubscriptions is cl's subscription set with granted added (replacing
// any of the same filter, as MQTT 5 §3.8.4 says a repeat does).
func withSubscriptions(cl *mqtt.Client, granted []packets.Subscription) []packets.Subscription {
	byFilter := cl.State.Subscriptions.GetAll()
	for _, f := range granted {
		byFilter[f.Filter] = f
	}
	out := make([]packets.Subscription, 0, len(byFilter))
	for _, f := range byFilter {
		out = append(out, f)
	}
	sortSubscriptions(out)
	return out
}

// filterCode decides one filter of a client's SUBSCRIBE: the granted QoS,
// or the refusal docs/security.md "Every refusal, and its code" names for it and why (for the log line,
// logFilterRefusals). The decision is the configuration's alone
// (routing.filterCode); the client adds only its protocol version.
func (b *Broker) filterCode(cl *mqtt.Client, f packets.Subscription) (byte, string) {
	return b.routing.filterCode(f, cl.Properties.ProtocolVersion == 5)
}

// addChannelSubscription records filter f on the session and gives it a
// consumer on every append channel it reaches (docs/configuration.md "`channels`"), positioned
// where docs/channels.md "`append`" says. It returns the new consumers, which the caller
// starts once the SUBACK is written: the SUBACK always goes first.
func (b *Broker) addChannelSubscription(s *session, cl *mqtt.Client, f packets.Subscription) []*consumer {
	reached := b.resolver.Reaching(f.Filter)
	var logs []*channel
	for _, name := range reached {
		// invariant 11: a consumer for each append channel reached; a queue's jobs go to its $saguin/queue/ workers alone.
		if ch := b.channels[name]; ch != nil && ch.log != nil {
			logs = append(logs, ch)
		}
	}
	if len(logs) == 0 {
		return nil
	}
	v5 := cl.Properties.ProtocolVersion == 5

	cs := s.subscribeChannels(f, reached, logs)

	var out []*consumer
	for _, ch := range cs.fresh {
		start, err := b.startingPosition(s, ch, cs.durable, cs.expiry, v5 && cs.sub.retainHandling == 2)
		if err != nil {
			b.log.Error("reading a stored position", "client", s.id, "channel", ch.name, "error", err)
			start = ch.log.Next()
		}
		c := newConsumer(b, s, ch, start)
		if !s.adoptConsumer(c, cl) {
			continue
		}
		out = append(out, c) // started once the SUBACK is written
	}
	for _, c := range cs.existing {
		// A filter added later does not reach back (docs/channels.md "`append`"): the
		// consumer goes on from where it is, now matching more.
		c.poke()
	}
	return out
}

// startingPosition is where a new consumer of ch begins: its stored
// position when the session is durable and has one; otherwise the floor, or
// the head on a start: tail channel. Retain Handling 2 means only new
// records: without a position, the head; with one, the position is
// committed at the head and the backlog dropped (docs/channels.md "`append`").
func (b *Broker) startingPosition(s *session, ch *channel, durable bool, expiry time.Duration, rh2 bool) (uint64, error) {
	if durable {
		p, ok, err := ch.log.Position(s.reader())
		if err != nil {
			return 0, err
		}
		if ok {
			if rh2 {
				head := ch.log.Next()
				return head, ch.log.SavePosition(storage.Position{Reader: s.reader(), Offset: head,
					LastSeen: b.clock.Now(), Expiry: expiry})
			}
			if floor := ch.log.Floor(); p.Offset < floor {
				// invariant 1: a position below the floor is never served the
				// oldest survivor as if nothing happened; the reader restarts
				// where a reader with no position starts, and the operator is
				// told what was lost. (A position found passed at CONNECT was
				// answered Session Present 0 and dropped there: this is one
				// the floor passed since, with no CONNACK left to say so.)
				b.positionPassed(subscribePassed, s.id, ch, p.Offset, floor)
			} else {
				return p.Offset, nil
			}
		}
	}
	return noPositionStart(ch, rh2), nil
}

// noPositionStart is where a reader of ch with no position starts: the
// floor, or the head on a start: tail channel or for Retain Handling 2
// (docs/channels.md "`append`").
func noPositionStart(ch *channel, rh2 bool) uint64 {
	if rh2 || ch.cfg.StartTail {
		return ch.log.Next()
	}
	return ch.log.Floor()
}

// unsubscribed drops filters from the session's channel subscriptions and
// stops consumers no remaining filter reaches.
func (b *Broker) unsubscribed(cl *mqtt.Client, filters []string) {
	s := b.sessionOf(cl.ID)
	if s == nil {
		return
	}
	d := s.dropFilters(filters, b.resolver.Reaching, func(f string) { b.spaces.Forget(f, cl.ID) })
	// The substrate has removed the filters and writes the UNSUBACK after
	// this hook: the stored session loses them first.
	if err := b.storeSessionOf(s, cl); err != nil {
		b.log.Error("storing a session at UNSUBSCRIBE", "client", cl.ID, "error", err)
	}
	for _, name := range d.queues {
		b.engines[name].removeWorker(s, s.sink(b, cl))
	}
	for _, c := range d.gone {
		c.stop()
		b.savePosition(s, c, true)
	}
	for _, c := range d.latestKept {
		c.unsubscribed(filters)
	}
	for _, c := range d.latestGone {
		c.stop()
	}
}
