package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// The broadcast log (rfcs/broadcast-log.md): a QoS 1/2
// broadcast message owed to a session that outlives its connection is
// written once to an append log on the broker.session.storage provider,
// before its publisher is answered. Each durable session keeps a cursor
// there (the lowest offset it has not had acknowledged, stored as the
// reader position mqtt:<client id>) and a window (what is on the wire, with
// packet ids, stored in $saguin/session_inflight). Deliveries are still
// made from the session's outbox in memory (fanout.go); the log is what a
// restart serves them from again.

const (
	broadcastLogName = "$saguin/broadcast"
	// windowStoreName keeps each durable session's window: one value per
	// client id (the spec's session_inflight table).
	windowStoreName = "$saguin/session_inflight"
	windowFormat    = 1
	// bcastReadBatch bounds one read of the log at start (invariant 13).
	bcastReadBatch = 256
	// maxStoredWindow bounds a stored window: no client may have more than
	// 65,535 deliveries in flight (Receive Maximum), so a larger table is
	// damage (storage.md "table larger than window → refused").
	maxStoredWindow = 65535
)

// bcastLog is the broadcast log and what the broker tracks of it.
type bcastLog struct {
	log     storage.AppendLog
	windows storage.ValueStore

	mu sync.Mutex
	// lastTS is the timestamp the last write took: timestamps are made
	// strictly increasing, so removing every message older than the one at
	// an offset (AppendLog.Trim by age) removes exactly a prefix below it,
	// never past it, whatever the wall clock does.
	lastTS time.Time
	// pending holds the messages being fanned out: written (or being
	// written), not yet in every outbox owed them. Token → the offset, or
	// the log's next offset when the write began (a lower bound of it).
	pending map[uint64]uint64
	token   uint64

	writes atomic.Int64 // messages written (tests, stats)
	// relief serializes making room at a full provider (bcastlog_full.go);
	// lastFullWarn is its last warning (one per fanoutWarnEvery).
	relief       sync.Mutex
	lastFullWarn time.Time
	// opened is the log's next offset when it opened: what start serves
	// from the log lies below it; anything written since (a Will published
	// at start) was fanned out as it was written.
	opened uint64
}

// openBroadcastLog opens the log and the window store on the provider the
// sessions use (storage.md: broker.session.storage (provider for sessions
// + broadcast log)).
func (b *Broker) openBroadcastLog(p storage.Provider) error {
	l, err := p.Append(broadcastLogName)
	if err != nil {
		return fmt.Errorf("broadcast log on provider %s: %w", p.Name(), err)
	}
	w, err := p.Values(windowStoreName)
	if err != nil {
		return fmt.Errorf("session windows on provider %s: %w", p.Name(), err)
	}
	g, err := p.Values(shareStoreName)
	if err != nil {
		return fmt.Errorf("shared-group cursors on provider %s: %w", p.Name(), err)
	}
	bl := &bcastLog{log: l, windows: w, pending: make(map[uint64]uint64), opened: l.Next()}
	if n := l.Next(); n > l.Floor() {
		if recs, _, err := l.Read(n-1, 1); err == nil && len(recs) == 1 {
			bl.lastTS = recs[0].Timestamp
		}
	}
	b.fan.log = bl
	b.fan.shares = newShares(g)
	return nil
}

// begin registers a message about to be written (or fanned out) and
// returns its token and the timestamp it is written with.
func (l *bcastLog) begin(now time.Time) (uint64, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := now
	if !ts.After(l.lastTS) {
		ts = l.lastTS.Add(time.Nanosecond)
	}
	l.lastTS = ts
	l.token++
	l.pending[l.token] = l.log.Next()
	return l.token, ts
}

func (l *bcastLog) set(token, off uint64) {
	l.mu.Lock()
	l.pending[token] = off
	l.mu.Unlock()
}

func (l *bcastLog) end(token uint64) {
	l.mu.Lock()
	delete(l.pending, token)
	l.mu.Unlock()
}

// hold keeps off below the low-water mark while an already-written message
// is fanned out; the returned func lets go.
func (l *bcastLog) hold(off uint64) func() {
	l.mu.Lock()
	l.token++
	t := l.token
	l.pending[t] = off
	l.mu.Unlock()
	return func() { l.end(t) }
}

// watermark is the lowest offset that may not yet be in every outbox owed
// it: a session owed nothing in memory has its cursor here.
func (l *bcastLog) watermark() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.log.Next()
	for _, off := range l.pending {
		w = min(w, off)
	}
	return w
}

// BroadcastLog reports the broadcast log's next offset and floor, and how
// many messages this broker wrote to it since start (operations, tests).
func (b *Broker) BroadcastLog() (next, floor uint64, written int64) {
	l := b.fan.log
	if l == nil {
		return 0, 0, 0
	}
	return l.log.Next(), l.log.Floor(), l.writes.Load()
}

// BroadcastCursor reports the cursor stored for a session on the broadcast
// log: the lowest offset it has not had acknowledged (operations, tests).
func (b *Broker) BroadcastCursor(clientID string) (uint64, bool) {
	l := b.fan.log
	if l == nil {
		return 0, false
	}
	p, ok, err := l.log.Position("mqtt:" + clientID)
	if err != nil || !ok {
		return 0, false
	}
	return p.Offset, true
}

// BroadcastReserve is for a caller about to write a message into the
// broadcast log by other means (a QoS 2 hold released into it): called
// before that write, the returned func after deliverLogged, so no cursor
// is stored past the message before it is in every outbox owed it.
func (b *Broker) BroadcastReserve() func() {
	l := b.fan.log
	if l == nil {
		return func() {}
	}
	t, _ := l.begin(b.clock.Now())
	return func() { l.end(t) }
}

// deliverLogged fans out a record already written to the broadcast log (a
// QoS 2 broadcast hold released there by PUBREL): to every session whose
// subscriptions match it now, exactly as a fresh publish, without writing
// it again. Callers bracket the release with BroadcastReserve.
func (b *Broker) deliverLogged(cl *mqtt.Client, rec storage.Record) {
	subs := b.subscribers(rec.Topic)
	matched := len(subs.Subscriptions) > 0 || len(subs.Shared) > 0
	b.countBroadcast(cl, matched)
	if !matched {
		return
	}
	b.fanOutMsg(msgFromRecord(rec), subs, false)
}

// owedDurably reports whether m must go to the log: some session that
// outlives its connection is owed it at QoS 1/2, or a shared group with
// such a member matches it.
func owedDurably(m *broadcastMsg, subs *mqtt.Subscribers, own []*session, members map[string]*session) bool {
	for _, s := range own {
		if subs.Subscriptions[s.id].Qos > 0 && s.isDurable() {
			return true
		}
	}
	for _, group := range subs.Shared {
		for id, sub := range group {
			if s := members[id]; s != nil && sub.Qos > 0 && s.isDurable() {
				return true
			}
		}
	}
	return false
}

// logBroadcast writes m to the broadcast log, once. A refusal (the
// provider full, a store failure) is counted and the message served from
// memory only: the publisher is never refused for a subscriber's sake
// (rfcs/broadcast-log.md).
func (b *Broker) logBroadcast(m *broadcastMsg) func() {
	l := b.fan.log
	if l == nil {
		return func() {}
	}
	t, ts := l.begin(b.clock.Now())
	stored := recordOfMsg(m, ts, b.ids.New(ts))
	var rec storage.Record
	// invariant 16: one write keeps the message, however many sessions are owed it: the one storage wait a broadcast publisher has.
	err := b.withLogRoom(stored.Size(), func() (err error) {
		rec, err = l.log.Append(stored)
		return err
	})
	if err != nil {
		l.end(t)
		b.fan.logFailed.Add(1)
		b.log.Warn("broadcast log refused a message: served from memory only", "topic", m.topic, "error", err)
		return func() {}
	}
	l.writes.Add(1)
	l.set(t, rec.Offset)
	m.off = rec.Offset
	return func() { l.end(t) }
}

// recordOfMsg is the stored form of a broadcast message (docs/channels.md "What a publish is answered").
func recordOfMsg(m *broadcastMsg, ts time.Time, id string) storage.Record {
	p := m.props
	rec := storage.Record{Topic: m.topic, Timestamp: ts, Payload: m.payload, ContentType: p.ContentType,
		ResponseTopic: p.ResponseTopic, CorrelationData: p.CorrelationData, Retain: m.retain, QoS: m.qos,
		PublisherID: m.origin, MessageID: id}
	if p.PayloadFormatFlag {
		f := p.PayloadFormat
		rec.PayloadFormat = &f
	}
	if m.expiry > 0 {
		e := m.expiry
		rec.MessageExpiry = &e
	}
	if pub := publishedMessageID(p.User); pub != "" {
		rec.MessageID = pub // invariant 8: the publisher's id is the message's
	}
	// Every User Property is kept, saguin-id among them: broadcast forwards
	// the packet as published, and a message read back from the log
	// (msgFromRecord) is forwarded the same.
	for _, u := range p.User {
		rec.Headers = append(rec.Headers, storage.Header{Name: u.Key, Value: u.Val})
	}
	return rec
}

// msgFromRecord is a logged message as fan-out holds it; its expiry counts
// down from its write.
func msgFromRecord(rec storage.Record) *broadcastMsg {
	m := &broadcastMsg{topic: rec.Topic, payload: rec.Payload, qos: rec.QoS, retain: rec.Retain,
		origin: rec.PublisherID, created: rec.Timestamp, off: rec.Offset}
	m.props = packets.Properties{ContentType: rec.ContentType, ResponseTopic: rec.ResponseTopic,
		CorrelationData: rec.CorrelationData}
	if rec.PayloadFormat != nil {
		m.props.PayloadFormat, m.props.PayloadFormatFlag = *rec.PayloadFormat, true
	}
	if rec.MessageExpiry != nil {
		m.expiry = *rec.MessageExpiry
	}
	for _, h := range rec.Headers {
		m.props.User = append(m.props.User, packets.UserProperty{Key: h.Name, Val: h.Value})
	}
	m.measure()
	return m
}

// wireEntry is one delivery on the wire: what the bound charged it, and
// what its session's window stores of it. pid is the packet id it went out
// under, kept for what names it on the wire: the stored window, which a
// restart resends under the same ids (invariant 18), and the PUBREL the
// sender writes (appendPubrels). The outbox finds an entry by its own
// number (outbox.onWire), never by pid.
type wireEntry struct {
	pid    uint16
	charge int64
	m      *broadcastMsg
	qos    byte
	group  string // the $share/ filter whose group handed it; "": the session's own
	pubrel bool   // QoS 2 PUBREC'd: a PUBREL is owed, never the message again
	// relQueued: listed in outbox.pubrels, its PUBREL not yet written.
	relQueued bool
}

// storedWindow is a session's window as stored.
type storedWindow struct {
	Format  int              `json:"format"`
	Entries []storedInflight `json:"entries"`
}

type storedInflight struct {
	Offset uint64 `json:"off"`
	PID    uint16 `json:"pid"`
	QoS    byte   `json:"qos"`
	Pubrel bool   `json:"pubrel,omitempty"`
	Group  string `json:"group,omitempty"`
}

// cursorLocked is the session's cursor: the lowest logged offset it holds
// unacknowledged (waiting or on the wire), else the log's low-water mark.
// Caller holds o.mu.
func (o *outbox) cursorLocked(wm uint64) uint64 {
	c := wm
	for _, e := range o.q[o.head:] {
		if e.m.off != 0 && e.qos > 0 && e.group == "" {
			c = min(c, e.m.off)
		}
	}
	for _, w := range o.onWire {
		if w.m.off != 0 {
			c = min(c, w.m.off)
		}
	}
	return c
}

// windowLocked lists the logged deliveries on the wire, with the progress
// of each QoS 2 exchange (pubrecd). Caller holds o.mu.
func (o *outbox) windowLocked() []storedInflight {
	out := make([]storedInflight, 0, len(o.onWire))
	for _, w := range o.onWire {
		if w.m.off == 0 {
			continue
		}
		// Stored under the id it is on the wire under, so a restart resends
		// it (or its PUBREL) under that same id (invariant 18).
		out = append(out, storedInflight{Offset: w.m.off, PID: w.pid, QoS: w.qos, Pubrel: w.pubrel, Group: w.group})
	}
	slices.SortFunc(out, func(a, b storedInflight) int { return int(a.PID) - int(b.PID) })
	return out
}

// flushBroadcast stores a durable session's cursor if it moved (always,
// with force) and its window if it changed: every ack_commit_interval off
// the read loop, before the close answering a clean DISCONNECT, and at a
// graceful stop (invariant 18). Called from flushSession.
func (b *Broker) flushBroadcast(s *session, force bool) {
	l := b.fan.log
	o := s.bcast.Load()
	if l == nil || o == nil {
		return
	}
	durable, expiry := s.durability()
	if !durable {
		return
	}
	if err := b.storeWindow(o, force); err != nil {
		b.log.Error("storing a session's broadcast window", "client", s.id, "error", err)
	}
	wm := l.watermark()
	o.mu.Lock()
	cur := o.cursorLocked(wm)
	moved := cur != o.stored
	// Stored only once the session held a logged message: a cursor for
	// every durable session each time the log moves would put every
	// session on the provider's writer each interval.
	due := moved && (o.touched || force && o.stored != 0)
	o.touched = false
	o.mu.Unlock()
	if !due {
		return
	}
	err := l.log.SavePosition(storage.Position{Reader: s.reader(), Offset: cur, LastSeen: b.clock.Now(), Expiry: expiry})
	if err != nil {
		o.mu.Lock()
		o.touched = true // written again at the next flush
		o.mu.Unlock()
		b.log.Error("storing a broadcast cursor", "client", s.id, "error", err)
		return
	}
	o.mu.Lock()
	o.stored = cur
	o.mu.Unlock()
}

// storeWindow writes the session's window if it changed (always, with
// force, when there is one or was one).
func (b *Broker) storeWindow(o *outbox, force bool) error {
	l := b.fan.log
	o.mu.Lock()
	if !o.windowDirty && !force {
		o.mu.Unlock()
		return nil
	}
	win := o.windowLocked()
	had := o.storedWindow
	o.windowDirty = false
	o.mu.Unlock()
	var err error
	switch {
	case len(win) == 0 && !had:
		return nil
	case len(win) == 0:
		_, err = l.windows.Remove(o.s.id)
	default:
		payload, merr := json.Marshal(storedWindow{Format: windowFormat, Entries: win})
		if merr != nil {
			return merr
		}
		rec := storage.Record{Topic: o.s.id, Payload: payload, Timestamp: b.clock.Now()}
		err = b.withLogRoom(rec.Size(), func() error {
			_, err := l.windows.Put(rec)
			return err
		})
	}
	o.mu.Lock()
	if err != nil {
		o.windowDirty = true // written again at the next flush
	} else {
		o.storedWindow = len(win) > 0
	}
	o.mu.Unlock()
	return err
}

// forgetBroadcast drops an ended session's cursor and window.
func (b *Broker) forgetBroadcast(id string) {
	l := b.fan.log
	if l == nil {
		return
	}
	if _, ok, err := l.log.Position("mqtt:" + id); err == nil && ok {
		if _, err := l.log.DropPosition("mqtt:" + id); err != nil {
			b.log.Error("dropping a broadcast cursor", "client", id, "error", err)
		}
	}
	if _, ok, err := l.windows.Get(id); err == nil && ok {
		if _, err := l.windows.Remove(id); err != nil {
			b.log.Error("dropping a broadcast window", "client", id, "error", err)
		}
	}
	if s := b.sessionOf(id); s != nil {
		if o := s.bcast.Load(); o != nil {
			o.mu.Lock()
			o.stored, o.storedWindow = 0, false
			o.mu.Unlock()
		}
	}
}

// subscribedFrom gives each of a durable session's filters the log offset
// it was subscribed at, keeping the earlier one of a filter subscribed
// again, and forgets filters it no longer holds. Called as the session's
// record is written.
func (b *Broker) subscribedFrom(s *session, subs []packets.Subscription) map[string]uint64 {
	l := b.fan.log
	if l == nil {
		return nil
	}
	o := b.outboxOf(s)
	wm := l.watermark()
	o.mu.Lock()
	defer o.mu.Unlock()
	keep := make(map[string]uint64, len(subs))
	for _, f := range subs {
		from, ok := o.from[f.Filter]
		if !ok {
			from = wm
		}
		keep[f.Filter] = from
	}
	o.from = keep
	out := make(map[string]uint64, len(keep))
	for f, v := range keep {
		out[f] = v
	}
	return out
}

// bcastLoop trims the log and keeps the shared groups' backlogs stored and
// within broker.share.expires_after, every ack_commit_interval. Owned by
// the broker's context; its last round stores the groups at a stop.
func (b *Broker) bcastLoop(ctx context.Context) {
	t := b.clock.NewTicker(b.cfg.Broker.Session.AckCommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.fan.shares.expire(b)
			b.fan.shares.flush(b)
			return
		case <-t.C():
			b.fan.shares.expire(b)
			b.fan.shares.flush(b)
			b.trimBroadcast()
		}
	}
}

// lowWater is the lowest offset anything still owes: every durable
// session's cursor (stored and current), every shared group's, and what
// is being fanned out.
func (b *Broker) lowWater() uint64 {
	l := b.fan.log
	low := l.watermark()
	for _, s := range b.heldSessions() {
		o := s.bcast.Load()
		if o == nil || !s.isDurable() {
			continue
		}
		// The current cursor is enough: a stored one is never past a
		// message the session still holds unacknowledged (it was the
		// lowest held, or the low-water mark, when written).
		o.mu.Lock()
		low = min(low, o.cursorLocked(low))
		o.mu.Unlock()
	}
	return min(low, b.fan.shares.low(low))
}

// trimBound is the age bound that removes exactly the messages below
// offset below (AppendLog.Trim by age; the timestamps strictly increase):
// the timestamp of the message at below, or, when below is the log's next
// offset, just past the last one written — only while nothing is being
// written, since a write in progress may take an older timestamp's place
// below it. It reports false when no such bound is known now.
func (l *bcastLog) trimBound(below uint64) (time.Time, bool) {
	if below >= l.log.Next() {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.lastTS.Add(time.Nanosecond), len(l.pending) == 0
	}
	recs, _, err := l.log.Read(below, 1)
	if err != nil || len(recs) == 0 || recs[0].Offset != below {
		return time.Time{}, false
	}
	return recs[0].Timestamp, true
}

// trimBroadcast removes the messages every session and group is past
// (rfcs/broadcast-log.md: Message leaves log once all sessions/groups wanting
// it had it). Trim by age on the strictly increasing timestamps removes
// exactly the prefix below the low-water mark, and the floor moves in the
// same transaction (invariant 1).
func (b *Broker) trimBroadcast() {
	l := b.fan.log
	if l == nil {
		return
	}
	low := b.lowWater()
	if low <= l.log.Floor() {
		return
	}
	olderThan, ok := l.trimBound(low)
	if !ok {
		return
	}
	if _, _, err := l.log.Trim(olderThan, 0); err != nil {
		b.log.Warn("trimming the broadcast log; retried at the next tick", "error", err)
	}
}
