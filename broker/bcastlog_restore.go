package broker

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
)

// Start-up half of the broadcast log (bcastlog.go, rfcs/broadcast-log.md):
// what the log holds is served again to the sessions and shared groups that
// came back.

// restoredBcast is one restored session as the start-up read of the log
// serves it.
type restoredBcast struct {
	s      *session
	o      *outbox
	cl     *mqtt.Client
	cursor uint64
	subs   map[string]packets.Subscription
	window map[uint64]storedInflight
}

// restoreBroadcast serves every restored durable session (and shared
// group) what the log holds for it: from its cursor, the messages whose
// topic one of its filters matched when they were written (a filter's
// subscribed-at offset at or below the message's), in order, within its
// limits.session_queue_bytes (oldest given up, counted); the ones in its
// stored window go back into its deliveries under their packet ids, sent
// again (with DUP, or as the PUBREL owed) when the client resumes. Runs at
// start, after restoreSessions, before anything listens.
func (b *Broker) restoreBroadcast() error {
	l := b.fan.log
	if l == nil {
		return nil
	}
	b.mu.Lock()
	held := make(map[string]*session, len(b.sessions))
	for id, s := range b.sessions {
		held[id] = s
	}
	b.mu.Unlock()
	positions, err := l.log.Positions()
	if err != nil {
		return fmt.Errorf("reading broadcast cursors: %w", err)
	}
	cursors := make(map[string]uint64, len(positions))
	for _, p := range positions {
		id, ok := strings.CutPrefix(p.Reader, "mqtt:")
		if !ok {
			continue
		}
		if s := held[id]; s == nil || !s.isDurable() {
			// A cursor whose session is not held goes at start (storage.md).
			if _, err := l.log.DropPosition(p.Reader); err != nil {
				return fmt.Errorf("dropping the broadcast cursor of %q: %w", id, err)
			}
			continue
		}
		cursors[id] = p.Offset
	}
	floor, next := l.log.Floor(), l.opened
	var rs []*restoredBcast
	for id, s := range held {
		cl, ok := b.mqtt.Clients.Get(id)
		if !ok {
			continue
		}
		r := &restoredBcast{s: s, o: b.outboxOf(s), cl: cl, subs: cl.State.Subscriptions.GetAll()}
		cur, ok := cursors[id]
		if !ok {
			// No cursor stored (a crash before its first flush): from the
			// earliest of its filters' subscribed-at offsets.
			cur = next
			r.o.mu.Lock()
			for _, v := range r.o.from {
				cur = min(cur, v)
			}
			r.o.mu.Unlock()
		}
		r.cursor = max(cur, floor)
		if r.window, err = b.readWindow(id, r.cursor, next); err != nil {
			return err
		}
		rs = append(rs, r)
	}
	groups, err := b.fan.shares.restore(b, held)
	if err != nil {
		return err
	}
	from := next
	for _, r := range rs {
		from = min(from, r.cursor)
	}
	for _, g := range groups {
		from = min(from, g.restoreFrom())
	}
	from = max(from, floor)
	// A group's message on the wire to a member is that member's: its
	// window resends it under its packet id, so the group does not hand
	// it out again (MQTT 5 §4.8.2: never to two members).
	carried := make(map[string]map[uint64]bool)
	for _, r := range rs {
		for off, w := range r.window {
			if w.Group != "" {
				if carried[w.Group] == nil {
					carried[w.Group] = make(map[uint64]bool)
				}
				carried[w.Group][off] = true
			}
		}
	}
	now := b.clock.Now()
	for from < next {
		recs, _, err := l.log.Read(from, bcastReadBatch)
		if err != nil {
			return fmt.Errorf("reading the broadcast log at %d: %w", from, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, rec := range recs {
			if rec.Offset >= next {
				break
			}
			m := msgFromRecord(rec)
			for _, r := range rs {
				if rec.Offset >= r.cursor {
					b.restoreDelivery(r, m, now)
				}
			}
			for _, g := range groups {
				if !carried[g.filter][rec.Offset] {
					g.restoreRecord(b, m)
				}
			}
		}
		from = recs[len(recs)-1].Offset + 1
	}
	for _, r := range rs {
		r.o.mu.Lock()
		r.o.stored = r.cursor
		r.o.storedWindow = len(r.window) > 0
		r.o.mu.Unlock()
	}
	return nil
}

// readWindow reads a session's stored window, dropping entries behind its
// cursor (acknowledged). A table past any window is damage: refused.
func (b *Broker) readWindow(id string, cursor, next uint64) (map[uint64]storedInflight, error) {
	rec, ok, err := b.fan.log.windows.Get(id)
	if err != nil {
		return nil, fmt.Errorf("reading the broadcast window of %q: %w", id, err)
	}
	if !ok {
		return nil, nil
	}
	var w storedWindow
	if err := json.Unmarshal(rec.Payload, &w); err != nil {
		return nil, fmt.Errorf("broadcast window of %q: %w", id, err)
	}
	if w.Format != windowFormat || len(w.Entries) > maxStoredWindow {
		return nil, fmt.Errorf("broadcast window of %q: format %d with %d entries refused", id, w.Format, len(w.Entries))
	}
	out := make(map[uint64]storedInflight, len(w.Entries))
	for _, e := range w.Entries {
		if e.Offset >= next {
			return nil, fmt.Errorf("broadcast window of %q: offset %d past the log's end %d", id, e.Offset, next)
		}
		if e.Offset >= cursor || e.Group != "" {
			out[e.Offset] = e
		}
	}
	return out, nil
}

// restoreDelivery gives one restored session one logged message: back on
// the wire under its packet id if its window held it, else waiting in its
// outbox if its filters were owed it.
func (b *Broker) restoreDelivery(r *restoredBcast, m *broadcastMsg, now time.Time) {
	if w, ok := r.window[m.off]; ok {
		e := owed{m: m, qos: w.QoS, group: w.Group, charge: m.charge()}
		pk, left, outcome := shapeBroadcast(e, r.subs, nil, r.s.id, r.cl.Properties.ProtocolVersion, now)
		if outcome != shapeDeliver && !w.Pubrel {
			return // let go like an acknowledged one
		}
		pk.FixedHeader.Qos = w.QoS // the exchange as it was started
		var expires time.Time
		if left > 0 {
			expires = now.Add(time.Duration(left) * time.Second)
		}
		// Back on the wire as a new entry of the outbox's own (the next
		// seq, which no waiting message takes), keeping the packet id it
		// went out under: its exchange is restored under that id and
		// carries the entry back (outboxAck), so the client is sent it, or
		// its PUBREL, again under the same id (invariant 18).
		r.o.mu.Lock()
		seq := r.o.seq
		r.o.seq++
		r.o.onWire[seq] = wireEntry{pid: w.PID, charge: e.charge + inflightEntryCost, m: m, qos: w.QoS, group: w.Group, pubrel: w.Pubrel}
		r.o.wire += e.charge + inflightEntryCost
		r.o.countLocked(m, 1)
		r.o.mu.Unlock()
		// Called in offset order: the order first sent (MQTT-4.6.0-1).
		r.s.deliv.restore(w.PID, outboxAck{r.o, seq}, routeOf(e), &pk, w.Pubrel, expires)
		return
	}
	if b.channelTopic(m.topic) {
		return // a channel record copied for shared groups only
	}
	if qos := r.owes(m); qos > 0 {
		r.o.offer(b, m, qos, "", false)
	}
}

// owes is the QoS at which a restored session is owed m by its own
// filters: ones subscribed at or before m was written (matched at publish
// time; a later subscription does not reach back). 0: not owed.
func (r *restoredBcast) owes(m *broadcastMsg) byte {
	r.o.mu.Lock()
	defer r.o.mu.Unlock()
	var qos byte
	for filter, sub := range r.subs {
		if strings.HasPrefix(filter, "$share/") || strings.HasPrefix(filter, "$saguin/") {
			continue
		}
		from, ok := r.o.from[filter]
		if !ok || from > m.off || !topic.Match(filter, m.topic) {
			continue
		}
		if sub.NoLocal && m.origin == r.s.id {
			continue
		}
		qos = max(qos, sub.Qos)
	}
	return min(qos, m.qos)
}
