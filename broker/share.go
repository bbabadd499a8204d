package broker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// Shared subscriptions on broadcast (MQTT 5 §4.8.2, rfcs/broadcast-log.md,
// docs/channels.md "Shared subscriptions"; rfcs/broadcast-log.md). One member per message,
// round-robin in client-id order among connected members with room. With
// none, a QoS 1/2 message waits in the group's backlog — if some member's
// session outlives its connection; else it is dropped, counted
// no_shared_member — behind the group's cursor in the broadcast log, and is
// served to the first member back, in publish order.

const (
	shareStoreName = "$saguin/share_groups"
	shareFormat    = 1
	// maxStoredReturned bounds a stored group's returned deliveries
	// (invariant 13): no member holds more than 65,535 in flight.
	maxStoredReturned = 65535
)

// shares is the broker's shared groups that hold (or held) a backlog.
type shares struct {
	store  storage.ValueStore
	mu     sync.Mutex
	groups map[string]*shareGroup // by $share/ filter; a group leaves once its backlog is empty and unstored
	n      atomic.Int64           // len(groups), read without the lock by senders
}

// shareGroup is one group's backlog.
type shareGroup struct {
	filter, inner string

	mu       sync.Mutex
	backlog  []owed // oldest first; entry qos is the message's
	returned int    // the first returned entries came back from ended members (ahead of the cursor)
	bytes    int64  // what limits.session_queue_bytes counts of the backlog
	lastLive time.Time
	dirty    bool
	stored   bool // a record of it is stored
	// ended: no member session is left; its record goes at the next flush.
	ended bool

	// Read at start only (restore).
	rCursor   uint64
	rReturned map[uint64]bool
}

type storedGroup struct {
	Format   int      `json:"format"`
	Cursor   uint64   `json:"cursor"`
	Returned []uint64 `json:"returned,omitempty"`
}

func newShares(store storage.ValueStore) *shares {
	return &shares{store: store, groups: make(map[string]*shareGroup)}
}

func newShareGroup(filter string, now time.Time) *shareGroup {
	g := &shareGroup{filter: filter, lastLive: now}
	if parts := strings.SplitN(filter, "/", 3); len(parts) == 3 {
		g.inner = parts[2]
	}
	return g
}

func (sh *shares) get(filter string) *shareGroup {
	if sh == nil || sh.n.Load() == 0 {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.groups[filter]
}

func (sh *shares) getOrCreate(filter string, now time.Time) *shareGroup {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.groups[filter]
	if g == nil {
		g = newShareGroup(filter, now)
		sh.groups[filter] = g
		sh.n.Store(int64(len(sh.groups)))
	}
	return g
}

func (sh *shares) all() []*shareGroup {
	if sh == nil {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	out := make([]*shareGroup, 0, len(sh.groups))
	for _, g := range sh.groups {
		out = append(out, g)
	}
	return out
}

// pushLocked adds m at the back of the backlog, within
// limits.session_queue_bytes: past it the oldest go, counted (docs/channels.md "Shared subscriptions" "Backlog bounded by limits.session_queue_bytes (oldest dropped)").
func (g *shareGroup) pushLocked(b *Broker, m *broadcastMsg) {
	charge := m.charge()
	for g.bytes+charge > b.cfg.Broker.Limits.SessionQueueBytes && len(g.backlog) > 0 {
		g.popLocked()
		b.fan.shareFull.Add(1)
	}
	g.backlog = append(g.backlog, owed{m: m, charge: charge, qos: m.qos, group: g.filter})
	g.bytes += charge
	g.dirty = true
	b.events.sharesHeld.Add(1)
}

func (g *shareGroup) popLocked() owed {
	e := g.backlog[0]
	g.backlog[0] = owed{}
	g.backlog = g.backlog[1:]
	if len(g.backlog) == 0 {
		g.backlog = nil
	}
	if g.returned > 0 {
		g.returned--
	}
	g.bytes -= e.charge
	g.dirty = true
	return e
}

// cursorLocked is the group's cursor: its oldest logged backlog message
// that is not a returned one, else the log's low-water mark.
func (g *shareGroup) cursorLocked(wm uint64) uint64 {
	for _, e := range g.backlog[g.returned:] {
		if e.m.off != 0 {
			return min(wm, e.m.off)
		}
	}
	return wm
}

func (g *shareGroup) returnedLocked() []uint64 {
	var out []uint64
	for _, e := range g.backlog[:g.returned] {
		if e.m.off != 0 {
			out = append(out, e.m.off)
		}
	}
	return out
}

// drainLocked hands the backlog, oldest first, to connected members with
// room, in turn. Caller holds g.mu.
func (b *Broker) drainLocked(g *shareGroup, group map[string]packets.Subscription, members map[string]*session) {
	ids := make([]string, 0, len(group))
	for id := range group {
		if members[id] != nil {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	for len(g.backlog) > 0 {
		e := g.backlog[0]
		id := b.handToMember(e.m, g.filter, ids, group, members)
		if id == "" {
			return
		}
		g.popLocked()
		b.events.sharesDrained.Add(1)
		g.lastLive = b.clock.Now()
	}
}

// handToMember offers m to the group's connected members in turn from the
// one after the member last served, without giving anything up; it returns
// the member that took it ("": none).
func (b *Broker) handToMember(m *broadcastMsg, filter string, ids []string, group map[string]packets.Subscription, members map[string]*session) string {
	b.fan.mu.Lock()
	last := b.fan.turn[filter]
	b.fan.mu.Unlock()
	start, _ := slices.BinarySearch(ids, last)
	if start < len(ids) && ids[start] == last {
		start++
	}
	for i := range ids {
		id := ids[(start+i)%len(ids)]
		if b.outboxOf(members[id]).offer(b, m, min(m.qos, group[id].Qos), filter, true) {
			b.fan.mu.Lock()
			if b.fan.turn == nil || len(b.fan.turn) >= fanoutTurns {
				b.fan.turn = make(map[string]string)
			}
			b.fan.turn[filter] = id
			b.fan.mu.Unlock()
			return id
		}
	}
	return ""
}

// shareOut hands m to one member of the shared group subscribed with filter
// (MQTT 5 §4.8.2). While the group has a backlog a QoS 1/2 message joins its
// back (MQTT-4.6.0-6: in order). Else the next connected member in turn with
// room takes it; with none, a QoS 1/2 message waits in the backlog if a
// member's session outlives its connection, else it is dropped and counted.
func (b *Broker) shareOut(m *broadcastMsg, filter string, group map[string]packets.Subscription, members map[string]*session) {
	g := b.fan.shares.get(filter)
	if g != nil && m.qos > 0 {
		g.mu.Lock()
		if len(g.backlog) > 0 {
			g.pushLocked(b, m)
			b.drainLocked(g, group, members)
			g.mu.Unlock()
			return
		}
		if m.off != 0 {
			// Handed on directly: the stored cursor moves past it at the
			// next flush.
			g.dirty = true
		}
		g.mu.Unlock()
	}
	ids := make([]string, 0, len(group))
	for id := range group {
		if members[id] != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) > 0 && b.handToMember(m, filter, ids, group, members) != "" {
		return
	}
	if m.qos > 0 && b.fan.shares != nil && durableMember(m, group, members) {
		g := b.fan.shares.getOrCreate(filter, b.clock.Now())
		g.mu.Lock()
		g.pushLocked(b, m)
		g.mu.Unlock()
		return
	}
	b.fan.noMember.Add(1)
}

// noUnsent: no message a group handed is waiting unsent.
const noUnsent = ^uint64(0)

// oldestUnsentHanded is the lowest log offset among the messages group
// (a $share/ filter) handed to a member and not yet acknowledged by it —
// waiting in its outbox or on the wire (noUnsent: none).
func (b *Broker) oldestUnsentHanded(group string) uint64 {
	low := noUnsent
	_, members := b.groupMembers(group, "")
	for _, s := range members {
		o := s.bcast.Load()
		if o == nil {
			continue
		}
		o.mu.Lock()
		for _, e := range o.q[o.head:] {
			if e.group == group && e.m.off != 0 && e.m.off < low {
				low = e.m.off
			}
		}
		// On the wire too: taken for writing a moment before the window
		// holding it is stored, and unacknowledged after. A restart does
		// not hand one the member's window carries to anyone else
		// (restoreBroadcast), so holding the cursor here only costs log
		// space until the acknowledgement.
		for _, w := range o.onWire {
			if w.group == group && w.m != nil && w.m.off != 0 && w.m.off < low {
				low = w.m.off
			}
		}
		o.mu.Unlock()
	}
	return low
}

// eligible reports whether a connected member may be handed m now
// (docs/channels.md "Shared subscriptions"): it may be sent m
// (the permission every delivery asks), at QoS 1/2 its Receive Maximum has
// room for one more beyond what it holds and what waits for it, and m fits
// its Maximum Packet Size. A member it does not fit is passed over, never
// disconnected and nothing counted; with no fitting member the group holds
// m as if none were connected. Asked without o.mu, which is never held
// while another lock is taken: what it reads may change at once, and the
// member's sender decides again when it writes.
func (o *outbox) eligible(b *Broker, m *broadcastMsg, qos byte) bool {
	o.mu.Lock()
	cl, live, waiting := o.cl, o.live, len(o.q)-o.head
	o.mu.Unlock()
	if cl == nil || !live {
		return false
	}
	if max := cl.Properties.Props.MaximumPacketSize; max > 0 && m.packetSizeBound() > int64(max) {
		return false
	}
	if !b.permit(cl, routeShared, m.topic) {
		return false
	}
	return qos == 0 || o.s.deliv.inFlight()+waiting < clientReceiveMaximum(cl)
}

// packetSizeBound is at least the size of m's PUBLISH to any subscriber:
// fixed header, topic, packet id, the publisher's properties with their
// identifiers and lengths, room for Subscription Identifiers and a Message
// Expiry Interval, and the payload. Being an upper bound, it may pass over
// a member a message within a few bytes of its limit would have fitted,
// never hand one a message it must then drop.
func (m *broadcastMsg) packetSizeBound() int64 {
	p := m.props
	props := 4 + 2 + 5 + 16 // property length, payload format, expiry, subscription identifiers
	if p.ContentType != "" {
		props += 3 + len(p.ContentType)
	}
	if p.ResponseTopic != "" {
		props += 3 + len(p.ResponseTopic)
	}
	if len(p.CorrelationData) > 0 {
		props += 3 + len(p.CorrelationData)
	}
	for _, u := range p.User {
		props += 5 + len(u.Key) + len(u.Val)
	}
	return int64(5 + 2 + len(m.topic) + 2 + props + len(m.payload))
}

// durableMember reports whether a member that could be owed m at QoS 1/2
// has a session outliving its connection.
func durableMember(m *broadcastMsg, group map[string]packets.Subscription, members map[string]*session) bool {
	for id, sub := range group {
		if s := members[id]; s != nil && min(sub.Qos, m.qos) > 0 && s.isDurable() {
			return true
		}
	}
	return false
}

// pullShares moves what the groups cl belongs to hold, oldest first, into
// its outbox while it has room: the first member back is served the
// backlog (rfcs/broadcast-log.md). Run by the member's sender.
func (b *Broker) pullShares(o *outbox, cl *mqtt.Client) {
	sh := b.fan.shares
	if sh == nil || sh.n.Load() == 0 {
		return
	}
	for filter, sub := range cl.State.Subscriptions.GetAll() {
		if !strings.HasPrefix(filter, "$share/") {
			continue
		}
		g := sh.get(filter)
		if g == nil {
			continue
		}
		g.mu.Lock()
		g.lastLive = b.clock.Now()
		for len(g.backlog) > 0 {
			e := g.backlog[0]
			if !o.offer(b, e.m, min(e.m.qos, sub.Qos), filter, true) {
				break
			}
			g.popLocked()
			b.events.sharesDrained.Add(1)
		}
		g.mu.Unlock()
	}
}

// groupMembers lists the held sessions (but except) whose connection or
// away record holds filter, with their subscriptions.
func (b *Broker) groupMembers(filter, except string) (map[string]packets.Subscription, map[string]*session) {
	b.mu.Lock()
	held := make(map[string]*session, len(b.sessions))
	for id, s := range b.sessions {
		if id != except {
			held[id] = s
		}
	}
	b.mu.Unlock()
	group := make(map[string]packets.Subscription)
	members := make(map[string]*session)
	for id, s := range held {
		cl, ok := b.mqtt.Clients.Get(id)
		if !ok {
			continue
		}
		if sub, ok := cl.State.Subscriptions.Get(filter); ok {
			group[id] = sub
			members[id] = s
		}
	}
	return group, members
}

// hasGroupMember reports whether a held session other than except holds
// filter; it stops at the first.
func (b *Broker) hasGroupMember(filter, except string) bool {
	b.mu.Lock()
	ids := make([]string, 0, len(b.sessions))
	for id := range b.sessions {
		if id != except {
			ids = append(ids, id)
		}
	}
	b.mu.Unlock()
	for _, id := range ids {
		if cl, ok := b.mqtt.Clients.Get(id); ok {
			if _, ok := cl.State.Subscriptions.Get(filter); ok {
				return true
			}
		}
	}
	return false
}

// memberEnded settles what shared groups had handed a session that is
// ending (MQTT 5 §4.8.2, rfcs/broadcast-log.md): QoS 1 goes back to its group,
// ahead of the cursor; QoS 2 is never given to another member
// (MQTT-4.8.2-5) — PUBREC'd counts as delivered, the rest is dropped and
// counted member_ended. A group whose last member this was loses its
// backlog, counted no_shared_member. Only a session ending does this.
func (b *Broker) memberEnded(s *session) {
	var handed []owed
	pubrel := make(map[*broadcastMsg]bool)
	if o := s.bcast.Load(); o != nil {
		o.mu.Lock()
		kept := o.q[:0]
		for _, e := range o.q[o.head:] {
			if e.group != "" {
				o.queued -= e.charge
				o.countLocked(e.m, -1)
				handed = append(handed, e)
			} else {
				kept = append(kept, e)
			}
		}
		clear(o.q[len(kept):])
		o.q, o.head = kept, 0
		for seq, w := range o.onWire {
			if w.group == "" {
				continue
			}
			// Its exchange stays in the session's deliveries, which end
			// with the session; an acknowledgement meanwhile finds no entry
			// under this seq (outbox.acked).
			delete(o.onWire, seq)
			o.wire -= w.charge
			o.countLocked(w.m, -1)
			handed = append(handed, owed{m: w.m, qos: w.qos, group: w.group, charge: w.m.charge()})
			pubrel[w.m] = w.pubrel
		}
		// The session has ended: what it still holds is delivered to no
		// one, and pays for no message's encodings (fanout_encode.go).
		for _, e := range kept {
			o.countLocked(e.m, -1)
		}
		for _, w := range o.onWire {
			o.countLocked(w.m, -1)
		}
		o.ended = true
		o.mu.Unlock()
	}
	slices.SortStableFunc(handed, func(a, b owed) int {
		switch {
		case a.m.off < b.m.off:
			return -1
		case a.m.off > b.m.off:
			return 1
		}
		return 0
	})
	back := make(map[string][]owed)
	for _, e := range handed {
		switch {
		case e.qos == 2 && pubrel[e.m]:
			// PUBREC'd: delivered.
		case e.qos == 2:
			// Taken back by its group and dropped there, so the group's
			// counts still add up: held − drained − dropped = backlog.
			b.events.sharesHeld.Add(1)
			b.fan.memberEnded.Add(1)
		case e.qos == 1:
			b.events.sharesHeld.Add(1)
			back[e.group] = append(back[e.group], e)
		}
	}
	// The groups it belonged to: what they handed it, its filters as
	// stored, and its connection's record.
	filters := make(map[string]bool, len(back))
	for f := range back {
		filters[f] = true
	}
	if o := s.bcast.Load(); o != nil {
		o.mu.Lock()
		for f := range o.from {
			if strings.HasPrefix(f, "$share/") {
				filters[f] = true
			}
		}
		o.mu.Unlock()
	}
	if cl, ok := b.mqtt.Clients.Get(s.id); ok {
		for f := range cl.State.Subscriptions.GetAll() {
			if strings.HasPrefix(f, "$share/") {
				filters[f] = true
			}
		}
	}
	for filter := range filters {
		ret := back[filter]
		if len(ret) == 0 {
			if b.fan.shares.get(filter) == nil || b.hasGroupMember(filter, s.id) {
				continue // nothing to hand back, and the group goes on
			}
		}
		group, members := b.groupMembers(filter, s.id)
		if len(members) == 0 {
			g := b.fan.shares.get(filter)
			n := int64(len(ret))
			if g != nil {
				g.mu.Lock()
				n += int64(len(g.backlog))
				g.backlog, g.returned, g.bytes, g.dirty, g.ended = nil, 0, 0, true, true
				g.mu.Unlock()
			}
			b.fan.noneLeft.Add(n)
			continue
		}
		if len(ret) == 0 {
			continue
		}
		g := b.fan.shares.getOrCreate(filter, b.clock.Now())
		g.mu.Lock()
		for i := range ret {
			ret[i].qos, ret[i].group, ret[i].charge = ret[i].m.qos, filter, ret[i].m.charge()
			g.bytes += ret[i].charge
		}
		g.backlog = append(ret, g.backlog...)
		g.returned += len(ret)
		g.dirty = true
		b.drainLocked(g, group, members)
		g.mu.Unlock()
	}
}

// heldBetween counts the logged messages in [lo, hi) the groups' backlogs
// hold (bcastlog_full.go: what a full provider took from them).
func (sh *shares) heldBetween(lo, hi uint64) int64 {
	var n int64
	for _, g := range sh.all() {
		g.mu.Lock()
		for _, e := range g.backlog {
			if e.m.off >= lo && e.m.off < hi {
				n++
			}
		}
		g.mu.Unlock()
	}
	return n
}

// low is the lowest log offset any group still needs.
func (sh *shares) low(wm uint64) uint64 {
	low := wm
	for _, g := range sh.all() {
		g.mu.Lock()
		low = min(low, g.cursorLocked(wm))
		for _, off := range g.returnedLocked() {
			low = min(low, off)
		}
		// The stored cursor is never past a message the backlog holds
		// (it was the lowest held, or the low-water mark, when written),
		// so the current backlog is all trimming must keep.
		g.mu.Unlock()
	}
	return low
}

// expire drops the backlog of a group no member has been connected to for
// broker.share.expires_after (docs/channels.md "Shared subscriptions"), counted.
func (sh *shares) expire(b *Broker) {
	after := b.cfg.Broker.Share.ExpiresAfter
	if sh == nil || after <= 0 {
		return
	}
	now := b.clock.Now()
	for _, g := range sh.all() {
		g.mu.Lock()
		if len(g.backlog) > 0 && now.Sub(g.lastLive) >= after {
			b.fan.shareExpire.Add(int64(len(g.backlog)))
			b.log.Info("shared group backlog expired: broker.share.expires_after passed with no member connected",
				"group", g.filter, "messages", len(g.backlog))
			g.backlog, g.returned, g.bytes, g.dirty = nil, 0, 0, true
		}
		g.mu.Unlock()
	}
}

// flush stores each changed group's cursor and returned deliveries (with
// the sessions, on broker.session.storage), and removes the record of a
// group whose last member session ended; such a group leaves the map.
func (sh *shares) flush(b *Broker) {
	if sh == nil {
		return
	}
	wm := b.fan.log.watermark()
	for _, g := range sh.all() {
		// A message handed to a member waits in its outbox until the
		// member's sender stores it in its window and writes it: until
		// then only the group's cursor keeps it across a crash, so the
		// cursor stays at it, and the group is looked at again next time.
		unsent := b.oldestUnsentHanded(g.filter)
		g.mu.Lock()
		dirty, ended, stored := g.dirty, g.ended, g.stored
		cursor := g.cursorLocked(wm)
		if unsent < cursor {
			cursor = unsent
		}
		rec := storedGroup{Format: shareFormat, Cursor: cursor, Returned: g.returnedLocked()}
		g.dirty = unsent != noUnsent
		g.mu.Unlock()
		if !dirty {
			continue
		}
		var err error
		switch {
		case ended && stored:
			_, err = sh.store.Remove(g.filter)
		case ended:
		default:
			err = sh.put(b, g.filter, rec)
		}
		g.mu.Lock()
		if err != nil {
			g.dirty = true
			b.log.Error("storing a shared group's backlog cursor", "group", g.filter, "error", err)
		} else {
			g.stored = !ended
		}
		gone := g.ended && !g.dirty
		g.mu.Unlock()
		if gone {
			sh.mu.Lock()
			if sh.groups[g.filter] == g {
				delete(sh.groups, g.filter)
				sh.n.Store(int64(len(sh.groups)))
			}
			sh.mu.Unlock()
		}
	}
}

func (sh *shares) put(b *Broker, filter string, rec storedGroup) error {
	payload, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	rec2 := storage.Record{Topic: filter, Payload: payload, Timestamp: b.clock.Now()}
	return b.withLogRoom(rec2.Size(), func() error {
		_, err := sh.store.Put(rec2)
		return err
	})
}

// ensureGroups gives each shared group a durable session subscribes to at
// QoS 1/2 a stored cursor before that SUBSCRIBE is answered (rfcs/broadcast-log.md: Group cursor created with record of first outliving-session member),
// so a backlog that builds while every member is away survives even a crash
// right after. from is the session's filters' subscribed-at offsets.
func (b *Broker) ensureGroups(subs []packets.Subscription, from map[string]uint64) error {
	sh := b.fan.shares
	if sh == nil {
		return nil
	}
	for _, f := range subs {
		if f.Qos == 0 || !strings.HasPrefix(f.Filter, "$share/") {
			continue
		}
		g := sh.getOrCreate(f.Filter, b.clock.Now())
		g.mu.Lock()
		stored := g.stored
		g.ended = false
		cursor := min(g.cursorLocked(from[f.Filter]), from[f.Filter])
		g.mu.Unlock()
		if stored {
			continue
		}
		if err := sh.put(b, f.Filter, storedGroup{Format: shareFormat, Cursor: cursor}); err != nil {
			return fmt.Errorf("storing shared group %s: %w", f.Filter, err)
		}
		g.mu.Lock()
		g.stored = true
		g.mu.Unlock()
	}
	return nil
}

// restore reads the stored groups at start. A group none of whose members'
// sessions came back is dropped (rfcs/sessions-ownership.md: dropped at start if no
// member left).
func (sh *shares) restore(b *Broker, held map[string]*session) ([]*shareGroup, error) {
	if sh == nil {
		return nil, nil
	}
	var recs []storage.Record
	if err := sh.store.Scan(func(r storage.Record) bool {
		recs = append(recs, r)
		return true
	}); err != nil {
		return nil, fmt.Errorf("reading shared groups: %w", err)
	}
	var out []*shareGroup
	for _, r := range recs {
		var st storedGroup
		if err := json.Unmarshal(r.Payload, &st); err != nil {
			return nil, fmt.Errorf("stored shared group %q: %w", r.Topic, err)
		}
		if st.Format != shareFormat || len(st.Returned) > maxStoredReturned {
			return nil, fmt.Errorf("stored shared group %q: format %d with %d returned refused", r.Topic, st.Format, len(st.Returned))
		}
		member := false
		for id := range held {
			if cl, ok := b.mqtt.Clients.Get(id); ok {
				if _, ok := cl.State.Subscriptions.Get(r.Topic); ok {
					member = true
					break
				}
			}
		}
		if !member {
			b.log.Info("shared group backlog dropped at start: no member session came back", "group", r.Topic)
			b.fan.noneLeft.Add(1)
			if _, err := sh.store.Remove(r.Topic); err != nil {
				return nil, fmt.Errorf("dropping shared group %q: %w", r.Topic, err)
			}
			continue
		}
		g := sh.getOrCreate(r.Topic, b.clock.Now())
		g.rCursor = st.Cursor
		g.rReturned = make(map[uint64]bool, len(st.Returned))
		for _, off := range st.Returned {
			g.rReturned[off] = true
		}
		g.stored = true
		out = append(out, g)
	}
	return out, nil
}

func (g *shareGroup) restoreFrom() uint64 {
	from := g.rCursor
	for off := range g.rReturned {
		from = min(from, off)
	}
	return from
}

// restoreRecord puts a logged message back in the backlog if the group
// was owed it: a returned one, or one at or past its cursor its filter
// matches.
func (g *shareGroup) restoreRecord(b *Broker, m *broadcastMsg) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.rReturned[m.off]:
		g.backlog = append(g.backlog, owed{m: m, charge: m.charge(), qos: m.qos, group: g.filter})
		g.bytes += m.charge()
		g.returned++
		b.events.sharesHeld.Add(1)
	case m.off >= g.rCursor && m.qos > 0 && topic.Match(g.inner, m.topic):
		g.pushLocked(b, m)
	}
	g.dirty = false
}
