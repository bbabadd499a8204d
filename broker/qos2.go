package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/logging"
	"saguin.dev/storage"
)

// QoS 2 inbound on channels: held publishes (rfcs/qos2-holds.md, rfcs/qos2-holds.md).
//
// A QoS 2 PUBLISH to a channel is not a record yet: it is kept as a hold in
// its channel's provider (no offset, invisible to readers and retention —
// invariant 1) and PUBREC'd; its PUBREL releases it, one atomic store
// operation that writes the record at the channel's next offset and deletes
// the hold, and only then is PUBCOMP sent (invariant 18). The substrate
// still writes the PUBREC (the publish hook returns CodeSuccessIgnore), but
// every PUBREL of a channel exchange is taken in OnPacketRead and answered
// here: the substrate's PUBREC table is per connection and gone after a
// restart, while the hold is not.

var (
	codePacketIDNotFound = packets.Code{Code: 0x92, Reason: "packet identifier not found"}
	codeTakenOver        = packets.Code{Code: 0x80, Reason: "the client id is held by another connection"}
)

// qos2State is the broker's index of held exchanges: which client holds
// which packet id in which channel, and since when. The holds themselves
// live in the providers; the index counts them per client
// (broker.qos2.max_inflight_per_client) and finds them at PUBREL and
// expiry without a store read. Invariant 13: bounded by clients × the
// per-client allowance.
type qos2State struct {
	mu       sync.Mutex
	byClient map[string]map[uint16]qos2Exchange
	// abandoned counts holds dropped unreleased: expired, session ended,
	// dropped at start (saguin_qos2_abandoned_total).
	abandoned atomic.Uint64
	// refused lists clients with a drop the store refused, retried every
	// second; bounded (invariant 13) — past it the expiry sweep, which
	// reads such an exchange as due, retries the rest.
	refused []string
}

const maxRefusedDropClients = 1024

type qos2Exchange struct {
	channel string
	heldAt  time.Time // zero: a drop the store refused, retried by the sweep
	// deletion: a zero-length publish to a latest channel, which deletes
	// topic's value at release — and stores nothing if there is none.
	deletion bool
	topic    string // set for a deletion only
}

// asDeletion marks an exchange holding a zero-length publish to a latest
// channel.
func (ex qos2Exchange) asDeletion(ch *channel, topic string, payload []byte) qos2Exchange {
	if ch != nil && ch.values != nil && len(payload) == 0 {
		ex.deletion, ex.topic = true, topic
	}
	return ex
}

// QoS2Stats is what the broker counts of held QoS 2 publishes.
type QoS2Stats struct {
	// Held is how many exchanges are held now (PUBREC'd, not released).
	Held int
	// Abandoned is saguin_qos2_abandoned_total: holds dropped unreleased.
	Abandoned uint64
}

// QoS2Stats reports the held-publish counters.
func (b *Broker) QoS2Stats() QoS2Stats {
	q := &b.qos2
	q.mu.Lock()
	n := 0
	for _, m := range q.byClient {
		n += len(m)
	}
	q.mu.Unlock()
	return QoS2Stats{Held: n, Abandoned: q.abandoned.Load()}
}

// index records an exchange; the caller holds q.mu.
func (q *qos2State) indexLocked(client string, pid uint16, ex qos2Exchange) {
	if q.byClient == nil {
		q.byClient = map[string]map[uint16]qos2Exchange{}
	}
	m := q.byClient[client]
	if m == nil {
		m = map[uint16]qos2Exchange{}
		q.byClient[client] = m
	}
	m[pid] = ex
}

// takeLocked removes and returns an exchange; the caller holds q.mu. Taking
// it is what serializes a release with an expiry or a session's end: only
// the one that took it acts on the hold.
func (q *qos2State) takeLocked(client string, pid uint16) (qos2Exchange, bool) {
	m := q.byClient[client]
	ex, ok := m[pid]
	if ok {
		delete(m, pid)
		if len(m) == 0 {
			delete(q.byClient, client)
		}
	}
	return ex, ok
}

// holdStoreNamed is the hold store keeping holds under a channel's name, or
// the broadcast log's.
func (b *Broker) holdStoreNamed(channel string) storage.HoldStore {
	if channel == broadcastLogName {
		return b.bcastHolds
	}
	if ch := b.channels[channel]; ch != nil {
		return b.holdStoreOf(ch)
	}
	return nil
}

// holdStoreOf is the hold store of the provider a channel lives in.
func (b *Broker) holdStoreOf(ch *channel) storage.HoldStore {
	hs, _ := b.providers[ch.cfg.Storage].(storage.HoldStore)
	return hs
}

// holdPublish keeps a client's QoS 2 PUBLISH to a channel as a hold and lets
// the substrate answer PUBREC 0x00. Refusals are PUBREC codes (docs/channels.md "What a publish is answered"): 0x97 at the per-client allowance (the connection stays) or when
// the channel or its provider has no room, nothing held.
func (b *Broker) holdPublish(cl *mqtt.Client, pk packets.Packet, ch *channel) (packets.Packet, error) {
	// invariant 17: a connection that no longer owns the id holds nothing for it.
	if s := b.sessionOf(cl.ID); s != nil && s.owner() != cl {
		return b.refuse(cl, pk, codeTakenOver)
	}
	hs := b.holdStoreOf(ch)
	if hs == nil {
		return b.refuse(cl, pk, withReason(codeImplementation, fmt.Sprintf("channel %s's provider keeps no held publishes", ch.name)))
	}
	q := &b.qos2
	q.mu.Lock()
	held := q.byClient[cl.ID]
	if _, repeat := held[pk.PacketID]; repeat {
		// A PUBLISH re-sent for an exchange already held (after a
		// restart the substrate no longer knows it): the same message,
		// PUBREC'd again, held once (MQTT 5 §4.3.3).
		q.mu.Unlock()
		return pk, packets.CodeSuccessIgnore
	}
	// invariant 13: the per-client allowance is judged before anything is held.
	if max := b.cfg.Broker.QoS2.MaxInflightPerClient; len(held) >= max {
		q.mu.Unlock()
		return b.refuse(cl, pk, withReason(codeQuotaExceeded,
			fmt.Sprintf("%s: %d QoS 2 publishes held; broker.qos2.max_inflight_per_client is %d", inflightReason, len(held), max)))
	}
	q.mu.Unlock()

	rec := b.recordOf(cl, pk)
	if ch.queue != nil {
		rec.Retain = false // a job is nobody's current value, as on the QoS 1 path
	}
	now := b.clock.Now()
	err := hs.Hold(storage.Held{Channel: ch.name, ClientID: cl.ID, PacketID: pk.PacketID, HeldAt: now, Record: rec})
	switch {
	case err == nil, errors.Is(err, storage.ErrExists):
		// ErrExists: the store already holds this exchange though the
		// index does not (listing the provider's holds failed at start):
		// it is indexed now and answered as the repeat it is, held once.
	case errors.Is(err, storage.ErrFull):
		return b.refuse(cl, pk, withReason(codeQuotaExceeded, fmt.Sprintf("channel %s is full", ch.name)))
	default:
		b.log.Error("holding a QoS 2 publish", "client", cl.ID, "channel", ch.name, "error", err)
		return b.refuse(cl, pk, withReason(codeImplementation, fmt.Sprintf("channel %s could not hold the publish", ch.name)))
	}
	q.mu.Lock()
	q.indexLocked(cl.ID, pk.PacketID, qos2Exchange{channel: ch.name, heldAt: now}.asDeletion(ch, pk.TopicName, pk.Payload))
	q.mu.Unlock()
	return pk, packets.CodeSuccessIgnore
}

// noopPacket is what a PUBREL answered here becomes for the substrate: a
// PUBACK for packet id 0, which no in-flight entry ever has, so the
// substrate's processPuback returns without acting.
var noopPacket = packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}}

// pubrel answers a PUBREL of a held channel exchange: release, then
// PUBCOMP. A PUBREL for no held channel exchange goes on to the substrate,
// which completes a broadcast exchange or answers 0x92.
func (b *Broker) pubrel(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	q := &b.qos2
	q.mu.Lock()
	ex, ok := q.byClient[cl.ID][pk.PacketID]
	if !ok {
		q.mu.Unlock()
		return pk, nil
	}
	// invariant 17: a taken-over connection completes nothing: the exchange is the new owner's.
	if s := b.sessionOf(cl.ID); s != nil && s.owner() != cl {
		// No PUBCOMP on a connection whose client id was taken over: the
		// exchange is the new owner's to finish (rfcs/qos2-holds.md).
		q.mu.Unlock()
		return pk, packets.ErrSessionTakenOver
	}
	q.takeLocked(cl.ID, pk.PacketID)
	q.mu.Unlock()

	if b.expired(ex) {
		// Judged at the PUBREL too, so the answer does not depend on when
		// the sweep last ran.
		b.dropExchange(cl.ID, pk.PacketID, ex, "expired")
		return b.pubcomp(cl, pk.PacketID, codePacketIDNotFound)
	}
	if ex.channel == broadcastLogName {
		return b.releaseBroadcast(cl, pk.PacketID, ex) // qos2_broadcast.go
	}
	ch := b.channels[ex.channel]
	var hs storage.HoldStore
	if ch != nil {
		hs = b.holdStoreOf(ch)
	}
	if hs == nil {
		return b.pubcomp(cl, pk.PacketID, codePacketIDNotFound)
	}
	if ex.deletion {
		// As at QoS 1 (storeLatest): a delete's look and store are one
		// step among deletes, and deleting a topic that holds no value
		// stores nothing — the hold is dropped and the exchange completes.
		ch.deleteMu.Lock()
		defer ch.deleteMu.Unlock()
		cur, ok, err := ch.values.Get(ex.topic)
		if err == nil && (!ok || isTombstone(&cur)) {
			if _, err := hs.DropHold(ex.channel, cl.ID, pk.PacketID); err == nil {
				return b.pubcomp(cl, pk.PacketID, packets.CodeSuccess)
			}
		}
	}
	// invariant 18: PUBCOMP only once the release has stored the record.
	rec, err := hs.Release(ex.channel, cl.ID, pk.PacketID)
	switch {
	case err == nil:
		ch.published.Add(1)
		if ch.queue == nil {
			// Shared groups over append/latest are served a held publish
			// at its release, not its arrival (rfcs/qos2-holds.md).
			b.shareChannelRecord(rec)
		}
		ch.notify()
		if e := b.engines[ch.name]; e != nil {
			e.poke()
		}
		return b.pubcomp(cl, pk.PacketID, packets.CodeSuccess)
	case errors.Is(err, storage.ErrNotFound):
		return b.pubcomp(cl, pk.PacketID, codePacketIDNotFound)
	}
	// The hold stays (the release is atomic): back in the index, and the
	// connection closed without PUBCOMP; the client re-sends PUBREL on its
	// next connection.
	q.mu.Lock()
	q.indexLocked(cl.ID, pk.PacketID, ex)
	q.mu.Unlock()
	code := withReason(codeImplementation, fmt.Sprintf("channel %s could not store the released publish", ex.channel))
	if errors.Is(err, storage.ErrFull) {
		code = withReason(codeQuotaExceeded, fmt.Sprintf("channel %s is full; send PUBREL again once it has room", ex.channel))
	} else {
		b.log.Error("releasing a QoS 2 publish", "client", cl.ID, "channel", ex.channel, "error", err)
	}
	return noopPacket, b.refuseRelease(cl, pk.PacketID, ex.channel, code)
}

// refuseRelease answers a PUBREL whose release did not happen — the hold
// stays, and the client sends PUBREL again on its next connection: MQTT 5
// DISCONNECT with the code, a 3.1.1 close (3.1.1 has no server
// DISCONNECT). It returns the code, which OnPacketRead turns into the
// rejection that keeps the substrate from completing the exchange
// (invariant 18: no PUBCOMP for what was not released).
func (b *Broker) refuseRelease(cl *mqtt.Client, pid uint16, channel string, code packets.Code) error {
	b.refusedClosing(slog.LevelWarn, cl, refusePublish, code.Code, "PUBREL refused: the held publish stays until a PUBREL on a later connection",
		"channel", channel, "packet_id", pid, "reason", code.Reason)
	if cl.Properties.ProtocolVersion < 5 {
		cl.Stop(code)
	} else {
		_ = b.mqtt.DisconnectClient(cl, code)
	}
	return code
}

// pubcomp writes the PUBCOMP of a PUBREL answered here, frees the
// substrate's PUBREC entry for the packet id, and hands the substrate a
// packet it ignores.
func (b *Broker) pubcomp(cl *mqtt.Client, pid uint16, code packets.Code) (packets.Packet, error) {
	b.forgetPubrec(cl, pid)
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: pid, ReasonCode: code.Code}
	if code.Code >= packets.ErrUnspecifiedError.Code {
		ack.Properties.ReasonString = code.Reason
	}
	if err := cl.WritePacket(ack); err != nil {
		return noopPacket, err
	}
	return noopPacket, nil
}

// forgetPubrec removes the substrate's in-flight PUBREC for an inbound
// exchange and gives back the receive quota it took, as its own PUBREL
// handling would. The substrate's table holds only the client's own QoS 2
// exchanges (the broker's deliveries keep theirs: deliveries.go); a PUBREC
// entry is the only kind left there across packets.
func (b *Broker) forgetPubrec(cl *mqtt.Client, pid uint16) {
	if cl == nil {
		return
	}
	if pk, ok := cl.State.Inflight.Get(pid); ok && pk.FixedHeader.Type == packets.Pubrec {
		if cl.State.Inflight.Delete(pid) {
			atomic.AddInt64(&b.mqtt.Info.Inflight, -1)
		}
		cl.State.Inflight.IncreaseReceiveQuota()
	}
}

func (b *Broker) expired(ex qos2Exchange) bool {
	return ex.heldAt.IsZero() || !b.clock.Now().Before(ex.heldAt.Add(b.cfg.Broker.QoS2.ExpiresAfter))
}

// dropExchange drops a hold taken out of the index (whose substrate PUBREC
// the taker freed) and counts it abandoned. A drop the store refuses goes back into the index marked for the
// sweep to retry (rfcs/sessions-ownership.md: retried every second).
func (b *Broker) dropExchange(client string, pid uint16, ex qos2Exchange, why string) {
	var err error
	if hs := b.holdStoreNamed(ex.channel); hs != nil {
		_, err = hs.DropHold(ex.channel, client, pid)
	}
	if err != nil {
		b.log.Error("dropping a held QoS 2 publish; retried", "client", client, "channel", ex.channel, "packet_id", pid, "error", err)
		b.qos2.mu.Lock()
		b.qos2.indexLocked(client, pid, qos2Exchange{channel: ex.channel, deletion: ex.deletion, topic: ex.topic})
		if len(b.qos2.refused) < maxRefusedDropClients {
			b.qos2.refused = append(b.qos2.refused, client)
		}
		b.qos2.mu.Unlock()
		return
	}
	b.qos2.abandoned.Add(1)
	b.logAbandoned(client, "held QoS 2 publish abandoned", "channel", ex.channel, "packet_id", pid, "reason", why)
}

// logAbandoned is the line a held exchange dropped unreleased writes,
// rate-limited per client like a refusal (operations.md "No client can
// make the log large"): a client that holds publishes and never releases
// them, session after session, writes one line per interval, not one per
// exchange. Every drop is counted in saguin_qos2_abandoned_total whether
// its line is written or not.
func (b *Broker) logAbandoned(client, msg string, args ...any) {
	b.refusals.Refused(logging.Refusal{Level: slog.LevelInfo, Client: client, Kind: abandonedQoS2Hold,
		Msg: msg, Args: args, ClientID: client})
}

// forgetPubrecLocked frees the substrate's PUBREC of an exchange taken out
// of the index, under q.mu: a PUBREL that does not find the exchange in the
// index then cannot find the substrate's entry either, and is answered
// 0x92 (not completed by the substrate as if nothing had been dropped).
func (b *Broker) forgetPubrecLocked(client string, pid uint16) {
	if cl, ok := b.mqtt.Clients.Get(client); ok {
		b.forgetPubrec(cl, pid)
	}
}

// dropHoldsOf drops every hold of a client id: its session ended (rfcs/sessions-ownership.md: unreleased inbound QoS 2 publishes end with the session, counted
// abandoned).
func (b *Broker) dropHoldsOf(client string) {
	q := &b.qos2
	q.mu.Lock()
	m := q.byClient[client]
	delete(q.byClient, client)
	for pid := range m {
		b.forgetPubrecLocked(client, pid)
	}
	q.mu.Unlock()
	for pid, ex := range m {
		b.dropExchange(client, pid, ex, "session ended")
	}
}

// expireHolds drops every hold older than broker.qos2.expires_after (and
// retries drops the store refused).
func (b *Broker) expireHolds() {
	type due struct {
		client string
		pid    uint16
		ex     qos2Exchange
	}
	var out []due
	q := &b.qos2
	q.mu.Lock()
	for client, m := range q.byClient {
		for pid, ex := range m {
			if b.expired(ex) {
				out = append(out, due{client, pid, ex})
			}
		}
	}
	for _, d := range out {
		q.takeLocked(d.client, d.pid)
		b.forgetPubrecLocked(d.client, d.pid)
	}
	q.mu.Unlock()
	for _, d := range out {
		b.dropExchange(d.client, d.pid, d.ex, "expired")
	}
}

// qos2SweepInterval is a tenth of expires_after, between 1 s and 1 min.
func (b *Broker) qos2SweepInterval() time.Duration {
	return min(max(b.cfg.Broker.QoS2.ExpiresAfter/10, time.Second), time.Minute)
}

// qos2Loop ticks every second: a drop the store refused is retried each
// tick (rfcs/sessions-ownership.md: "retried every 1 s"), and the expiry sweep runs every
// qos2SweepInterval.
func (b *Broker) qos2Loop(ctx context.Context) {
	t := b.clock.NewTicker(time.Second)
	defer t.Stop()
	every := int(b.qos2SweepInterval() / time.Second)
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if tick%every == 0 {
				b.expireHolds()
			} else {
				b.retryRefusedDrops()
			}
		}
	}
}

// retryRefusedDrops drops again the holds whose drop the store refused
// (kept in the index with no held-at moment, which expired() reads as due).
func (b *Broker) retryRefusedDrops() {
	type due struct {
		client string
		pid    uint16
		ex     qos2Exchange
	}
	var out []due
	q := &b.qos2
	q.mu.Lock()
	for _, client := range q.refused {
		for pid, ex := range q.byClient[client] {
			if ex.heldAt.IsZero() {
				out = append(out, due{client, pid, ex})
			}
		}
	}
	q.refused = q.refused[:0]
	taken := out[:0]
	for _, d := range out {
		// A client listed twice finds its exchange taken the first time.
		if _, ok := q.takeLocked(d.client, d.pid); ok {
			taken = append(taken, d)
		}
	}
	q.mu.Unlock()
	for _, d := range taken {
		b.dropExchange(d.client, d.pid, d.ex, "drop retried")
	}
}

// startQoS2 runs after sessions are restored and before anything listens:
// it indexes every hold whose session came back and whose channel is still
// configured on the provider that keeps it, drops (and counts abandoned)
// every other (rfcs/qos2-holds.md "Restart cost", "Channel removed from config"),
// and starts the expiry sweep.
func (b *Broker) startQoS2() {
	for name, p := range b.providers {
		hs, ok := p.(storage.HoldStore)
		if !ok {
			continue
		}
		if n := hs.AbandonedAtOpen(); n > 0 {
			b.qos2.abandoned.Add(uint64(n))
		}
		holds, err := hs.Holds()
		if err != nil {
			b.log.Error("listing held QoS 2 publishes at start", "provider", name, "error", err)
			continue
		}
		for _, h := range holds {
			ch := b.channels[h.Channel]
			why := ""
			switch {
			case h.Channel == broadcastLogName:
				// Broadcast holds live with the sessions (qos2_broadcast.go).
				if name != b.sessionProvider {
					why = "broadcast log no longer on this provider"
				} else if b.sessionOf(h.ClientID) == nil {
					why = "session did not come back"
				}
			case ch == nil || ch.cfg.Storage != name || ch.cfg.DeadLetterOf != "":
				why = "channel no longer configured on this provider"
			case b.sessionOf(h.ClientID) == nil:
				why = "session did not come back"
			}
			if why == "" {
				b.qos2.mu.Lock()
				b.qos2.indexLocked(h.ClientID, h.PacketID, qos2Exchange{channel: h.Channel, heldAt: h.HeldAt}.asDeletion(ch, h.Record.Topic, h.Record.Payload))
				b.qos2.mu.Unlock()
				continue
			}
			if _, err := hs.DropHold(h.Channel, h.ClientID, h.PacketID); err != nil {
				b.log.Error("dropping a held QoS 2 publish at start", "provider", name, "channel", h.Channel,
					"client", h.ClientID, "error", err)
				continue
			}
			b.qos2.abandoned.Add(1)
			b.logAbandoned(h.ClientID, "held QoS 2 publish abandoned at start", "provider", name, "channel", h.Channel,
				"packet_id", h.PacketID, "reason", why)
		}
	}
	b.background(b.qos2Loop)
}
