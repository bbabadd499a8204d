package broker

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// latestConsumer is one session's reading of one latest channel (docs/channels.md "`latest`"). It is a cursor into the channel's value store, read in offset order
// with ValueStore.Since, plus the current-state passes its SUBSCRIBEs owe:
//
//   - next is the mark: the lowest offset the live reader has not passed.
//     It lives in memory only; a resumed session is served the changes
//     from it, a restart loses it (full state at resume).
//   - each filter has a liveFrom: values at or above it are changes for
//     that filter; below it they are state, which a pass serves with RETAIN
//     (or which Retain Handling said not to send).
//   - a pass reads every current value below its bound (the store's next
//     offset when its SUBSCRIBE was recorded) matching its filters.
//
// Never an older value after a newer one, per topic: the store holds only
// a topic's newest value and a replacement takes a higher offset, so a
// reader in offset order meets a topic's values in increasing order, and a
// pass skips what has been replaced at or above its bound (the live reader
// serves that). The worst case is the same value twice — a pass and a live
// change — never an older one.
//
// One goroutine per consumer, started only once the SUBACK (or CONNACK) is
// written (invariant 16: never on the publisher's goroutine). Bounded
// (invariant 13): nothing is copied out of the store but one read batch,
// at most pumpMaxInflight deliveries are unacknowledged, and the resend
// list is at most that.
type latestConsumer struct {
	b    *Broker
	sess *session
	ch   *channel

	mu sync.Mutex
	// next is the mark (served-from): the lowest offset not yet read.
	next uint64
	// unmarked: restored at a start, mark lost: full state at resume.
	unmarked bool
	// served: a connection has been served before (a start is a resume).
	served bool
	// subs are the session's filters reaching this channel, each with the
	// offset its changes start at. Kept here, beside the mark, so that a
	// filter and its liveFrom change together (a SUBSCRIBE racing the
	// reader can neither lose a change nor have one sent before its SUBACK).
	subs map[string]latestFilter
	// passes owed, in SUBSCRIBE order.
	passes  []statePass
	passSeq uint64
	// inflight holds each QoS>0 delivery not yet acknowledged by the
	// consumer's own number for it (sent); its exchange carries that
	// number back (latestAck), so the packet id is the deliveries' alone.
	inflight map[uint64]latestDelivery
	sent     uint64
	// resend: the previous connection's unacknowledged deliveries, checked
	// against the store before anything else is sent (docs/channels.md "`latest`": a
	// superseded one is dropped, a current one sent again).
	resend []latestDelivery
	// awayBelow: a tombstone below it was stored while the session was
	// away, and a resume does not report deletions (no SUBSCRIBE, no
	// saguin-deletions).
	awayBelow uint64
	// hold > 0 while a SUBSCRIBE is between recording its filters and
	// writing its SUBACK: nothing is sent meanwhile (SUBACK first).
	hold  int
	batch []latestPrepared

	wake chan struct{}
	pump pumpRun
}

type latestFilter struct {
	sub      subscription
	liveFrom uint64
}

// statePass is one SUBSCRIBE's (or one resume's) current-state pass.
type statePass struct {
	id        uint64
	filters   []string
	deletions bool   // saguin-deletions: tombstones included
	bound     uint64 // values below it are the state
	from      uint64 // how far the pass has read
}

// latestDelivery is a delivery handed to the connection.
type latestDelivery struct {
	offset uint64
	topic  string
	state  bool // sent by a pass, with RETAIN
}

// Where an offered value came from: the cursor each advances.
const (
	fromLive = iota
	fromPass
	fromResend
)

type latestPrepared struct {
	pk  packets.Packet
	d   latestDelivery
	seq uint64 // its number in inflight (QoS > 0)
	src int
	// pass is the id of the pass a fromPass delivery belongs to.
	pass uint64
}

func newLatestConsumer(b *Broker, s *session, ch *channel) *latestConsumer {
	return &latestConsumer{
		b: b, sess: s, ch: ch,
		subs:     make(map[string]latestFilter),
		inflight: make(map[uint64]latestDelivery),
		wake:     make(chan struct{}, 1),
	}
}

// restoredLatestConsumer is a consumer brought back at a start: its
// filters, no mark.
func restoredLatestConsumer(b *Broker, s *session, ch *channel) *latestConsumer {
	c := newLatestConsumer(b, s, ch)
	c.unmarked = true
	return c
}

func (c *latestConsumer) poke() { signal(c.wake) }

// subscribed records one SUBSCRIBE's filters reaching this channel and the
// pass it owes (pass: the filters whose Retain Handling asks for state).
// The consumer holds off until released: the SUBACK goes first.
func (c *latestConsumer) subscribed(filters map[string]subscription, pass []string, deletions bool) {
	head := c.ch.values.Next()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.served && !c.unmarked && c.next == 0 {
		c.next = head // a new consumer: what is stored from now on is a change
	}
	for f, sub := range filters {
		old, existed := c.subs[f]
		from := head
		if existed && !slices.Contains(pass, f) {
			// A repeat SUBSCRIBE with no pass (Retain Handling 1 or 2)
			// keeps serving the filter's changes from where they were.
			from = old.liveFrom
		}
		c.subs[f] = latestFilter{sub: sub, liveFrom: from}
	}
	if len(pass) > 0 {
		c.passSeq++
		sort.Strings(pass)
		c.passes = append(c.passes, statePass{id: c.passSeq, filters: pass, deletions: deletions, bound: head, from: 1})
	}
	c.hold++
}

// release lets a held consumer go on once the SUBACK is written.
func (c *latestConsumer) release() {
	c.mu.Lock()
	if c.hold > 0 {
		c.hold--
	}
	c.mu.Unlock()
	c.poke()
}

// unsubscribed drops filters; a pass naming only dropped filters serves
// nothing.
func (c *latestConsumer) unsubscribed(filters []string) {
	c.mu.Lock()
	for _, f := range filters {
		delete(c.subs, f)
	}
	c.mu.Unlock()
}

// restoreFilter adds a filter of a session restored at start.
func (c *latestConsumer) restoreFilter(sub subscription) {
	c.mu.Lock()
	c.subs[sub.filter] = latestFilter{sub: sub}
	c.mu.Unlock()
}

// start serves the receiver sink (delivery_sink.go: the session's
// deliveries bound to the connection it serves). The caller has stopped any earlier pump
// (stop), so two never write one consumer's values out of order. A start
// after the first is a resume, and earns what docs/channels.md "`latest`" says a resumed
// session gets: the changes since its mark, not the deletions stored while
// it was away, the full state for its QoS 0 filters (whose deliveries say
// nothing about what arrived), and its unacknowledged deliveries again
// where the store still holds them. A consumer restored at a start has no
// mark and gets the full state.
func (c *latestConsumer) start(sink deliverySink) {
	head := c.ch.values.Next()
	c.mu.Lock()
	c.hold = 0
	switch {
	case c.unmarked:
		all := make([]string, 0, len(c.subs))
		for f, lf := range c.subs {
			lf.liveFrom = head
			c.subs[f] = lf
			all = append(all, f)
		}
		if len(all) > 0 {
			sort.Strings(all)
			c.passSeq++
			c.passes = append(c.passes, statePass{id: c.passSeq, filters: all, bound: head, from: 1})
		}
		c.next, c.unmarked = head, false
	case c.served:
		var q0 []string
		for f, lf := range c.subs {
			if lf.sub.qos == 0 {
				lf.liveFrom = head
				c.subs[f] = lf
				q0 = append(q0, f)
			}
		}
		if len(q0) > 0 {
			sort.Strings(q0)
			c.passSeq++
			c.passes = append(c.passes, statePass{id: c.passSeq, filters: q0, bound: head, from: 1})
		}
		c.awayBelow = head
		for _, d := range c.inflight {
			c.resend = append(c.resend, d)
		}
		slices.SortFunc(c.resend, func(a, b latestDelivery) int { return cmpU64(a.offset, b.offset) })
		c.inflight = make(map[uint64]latestDelivery)
	}
	c.served = true
	c.pump.goLocked(c.b, func(ctx context.Context) { c.run(ctx, sink) })
	c.mu.Unlock()
	c.b.log.Debug("latest consumer serving", "client", c.sess.id, "channel", c.ch.name)
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// stop ends the pump and waits for it.
func (c *latestConsumer) stop() { c.pump.stopUnder(&c.mu) }

// latestAck is the cookie a latest delivery's exchange carries
// (deliveries.go): the consumer and its number for the delivery, brought
// back with the client's PUBACK or PUBCOMP.
type latestAck struct {
	c   *latestConsumer
	seq uint64
}

func (a latestAck) acked(uint16) { a.c.acked(a.seq) }

// acked applies a PUBACK (or PUBCOMP) for the delivery numbered seq.
func (c *latestConsumer) acked(seq uint64) {
	c.mu.Lock()
	delete(c.inflight, seq)
	c.mu.Unlock()
	c.poke()
}

// run is the pump: resend what the last connection left unacknowledged,
// then any pass owed, then the changes; wait when there is nothing to do.
func (c *latestConsumer) run(ctx context.Context, sink deliverySink) {
	for ctx.Err() == nil && !sink.closed() {
		changed := c.ch.wait()
		c.mu.Lock()
		held := c.hold > 0
		var resend []latestDelivery
		var pass *statePass
		from := c.next
		switch {
		case held:
		case len(c.resend) > 0:
			resend, c.resend = c.resend, nil
		case len(c.passes) > 0:
			p := c.passes[0]
			pass = &p
		}
		c.mu.Unlock()
		switch {
		case held:
			select {
			case <-ctx.Done():
			case <-c.wake:
			}
		case resend != nil:
			c.resendAll(ctx, sink, resend)
		case pass != nil:
			c.runPass(ctx, sink, *pass)
		default:
			if !c.live(ctx, sink, from) {
				select {
				case <-ctx.Done():
				case <-changed:
				case <-c.wake:
				}
			}
		}
	}
}

func (c *latestConsumer) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// live serves the changes from the mark: one read of the store, in offset
// order. It reports whether it moved, so the pump waits only when there
// was nothing new.
func (c *latestConsumer) live(ctx context.Context, sink deliverySink, from uint64) bool {
	head := c.ch.values.Next() // before the read: every offset below it is committed
	recs, err := c.ch.values.Since(from, pumpReadBatch)
	if err != nil {
		c.b.log.Error("reading a latest channel for a consumer", "channel", c.ch.name, "client", c.sess.id, "error", err)
		c.sleep(ctx, time.Second)
		return true
	}
	now := c.b.clock.Now()
	batch := c.batch[:0]
	complete := true
	for i := range recs {
		var ok bool
		if batch, ok = c.offer(ctx, sink, &recs[i], fromLive, nil, false, now, batch); !ok {
			complete = false
			break
		}
	}
	c.batch = batch[:0]
	if !c.flush(sink, batch) {
		return true
	}
	moved := len(recs) > 0
	if complete && len(recs) < pumpReadBatch {
		// Every current value in [from, head) was in the read: the mark
		// passes the offsets that were replaced or removed too.
		c.mu.Lock()
		if c.next >= from && c.next < head {
			c.ch.superseded.Add(head - c.next) // as in advanceLocked
			c.next = head
			moved = true
		}
		c.mu.Unlock()
	}
	return moved
}

// runPass serves a batch of one current-state pass; the pass is done once
// it has read every value below its bound.
func (c *latestConsumer) runPass(ctx context.Context, sink deliverySink, p statePass) {
	recs, err := c.ch.values.Since(p.from, pumpReadBatch)
	if err != nil {
		c.b.log.Error("reading a latest channel's state for a consumer", "channel", c.ch.name, "client", c.sess.id, "error", err)
		c.sleep(ctx, time.Second)
		return
	}
	now := c.b.clock.Now()
	batch := c.batch[:0]
	done := len(recs) < pumpReadBatch
	for i := range recs {
		if recs[i].Offset >= p.bound {
			done = true // stored after the SUBSCRIBE: a change, served live
			break
		}
		var ok bool
		if batch, ok = c.offer(ctx, sink, &recs[i], fromPass, &p, true, now, batch); !ok {
			done = false
			break
		}
	}
	c.batch = batch[:0]
	if !c.flush(sink, batch) || !done {
		return
	}
	c.mu.Lock()
	if len(c.passes) > 0 && c.passes[0].id == p.id {
		c.passes = c.passes[1:]
	}
	c.mu.Unlock()
}

// resendAll sends the previous connection's unacknowledged deliveries that
// are still their topics' current values; the rest are dropped before
// anything is sent (their newer values come from the mark).
func (c *latestConsumer) resendAll(ctx context.Context, sink deliverySink, list []latestDelivery) {
	now := c.b.clock.Now()
	batch := c.batch[:0]
	for i, d := range list {
		rec, found, err := c.ch.values.Get(d.topic)
		if err != nil {
			c.b.log.Error("reading a latest value to resend", "channel", c.ch.name, "client", c.sess.id, "error", err)
			c.putBack(list[i:])
			c.sleep(ctx, time.Second)
			break
		}
		if !found || rec.Offset != d.offset {
			continue // superseded (or gone): never resent
		}
		var ok bool
		if batch, ok = c.offer(ctx, sink, &rec, fromResend, nil, d.state, now, batch); !ok {
			c.putBack(list[i:])
			break
		}
	}
	c.batch = batch[:0]
	c.flush(sink, batch)
}

// putBack returns deliveries to the front of the resend list.
func (c *latestConsumer) putBack(list []latestDelivery) {
	if len(list) == 0 {
		return
	}
	c.mu.Lock()
	c.resend = append(slices.Clone(list), c.resend...)
	c.mu.Unlock()
}

// decideLocked says how the session is served one stored value: whether it
// is delivered, and with what QoS, identifiers and labels. Caller holds
// c.mu.
func (c *latestConsumer) decideLocked(rec *storage.Record, src int, p *statePass, now time.Time) (matched, bool) {
	// A value under a topic this channel no longer claims (a filter
	// edited) is another channel's or broadcast now: one copy, from
	// wherever the topic lives (invariant 11).
	if name, ok := c.b.resolver.Resolve(rec.Topic); !ok || name != c.ch.name {
		return matched{}, false
	}
	if !latestServable(c.ch, rec, now) {
		return matched{}, false // retention_period: stale is worse than none
	}
	tomb := isTombstone(rec)
	switch src {
	case fromLive:
		if tomb && rec.Offset < c.awayBelow {
			return matched{}, false // deleted while away: not reported on resume
		}
	case fromPass:
		if tomb && !p.deletions {
			return matched{}, false // the state is what is set, unless saguin-deletions
		}
	}
	var m matched
	found := false
	consider := func(lf latestFilter) {
		s := lf.sub
		// A declared slice narrows both halves, state pass and changes
		// (rfcs/partition.md).
		if !topic.Match(s.filter, rec.Topic) || !s.partition.Match(rec.Topic) {
			return
		}
		// No Local (docs/channels.md "Broadcast"): the client id stored on the value.
		if s.noLocal && rec.PublisherID != "" && rec.PublisherID == c.sess.id {
			return
		}
		found = true
		m.qos = max(m.qos, s.qos)
		if s.identifier > 0 {
			m.ids = append(m.ids, s.identifier)
		}
		m.rap = m.rap || s.retainAsPublished
		m.multiChannel = m.multiChannel || s.multiChannel
	}
	switch src {
	case fromPass:
		for _, f := range p.filters {
			if lf, ok := c.subs[f]; ok {
				consider(lf)
			}
		}
	case fromLive:
		for _, lf := range c.subs {
			if lf.liveFrom <= rec.Offset {
				consider(lf)
			}
		}
	case fromResend:
		for _, lf := range c.subs {
			consider(lf)
		}
	}
	if found && m.qos > rec.QoS {
		m.qos = rec.QoS // the lower of published and granted QoS
	}
	slices.Sort(m.ids)
	return m, found
}

// advanceLocked moves the cursor an offered value came from past it.
func (c *latestConsumer) advanceLocked(src int, passID, off uint64) {
	switch src {
	case fromLive:
		if c.next <= off {
			// The offsets between the mark and this value held values
			// replaced (or removed) before this consumer read them
			// (saguin_latest_superseded_total).
			c.ch.superseded.Add(off - c.next)
			c.next = off + 1
		}
	case fromPass:
		if len(c.passes) > 0 && c.passes[0].id == passID && c.passes[0].from <= off {
			c.passes[0].from = off + 1
		}
	}
}

// offer adds one value to the batch if the session is owed it; when the
// client's window is full it writes the batch, waits for room and returns
// false, so the caller reads the store again. p is the
// pass a fromPass value belongs to; state says the value is current state
// (RETAIN set): a pass's, or a pass's sent again. It returns false when the
// pump must stop and look again (window was full, held by a SUBSCRIBE,
// context ended, no packet identifier).
func (c *latestConsumer) offer(ctx context.Context, sink deliverySink, rec *storage.Record, src int, p *statePass, state bool, now time.Time, batch []latestPrepared) ([]latestPrepared, bool) {
	var passID uint64
	if src == fromPass {
		passID = p.id
	}
	c.mu.Lock()
	if c.hold > 0 || ctx.Err() != nil {
		c.mu.Unlock()
		return batch, false
	}
	m, deliver := c.decideLocked(rec, src, p, now)
	if !deliver {
		// Nothing of this session's wants the value (filters, No
		// Local, age): the cursor steps past it.
		c.advanceLocked(src, passID, rec.Offset)
		c.mu.Unlock()
		return batch, true
	}
	// wait writes what is prepared, so the client can acknowledge it,
	// and waits for a wake: an acknowledgement, or a refused grant given
	// back (permissionsChanged). The caller reads the store again: the
	// values read before the wait may have been replaced during it (RFC
	// 0003 §9 "Window": a waiting value is replaced by a newer one for the
	// same topic). c.mu is held on entry and let go.
	wait := func() ([]latestPrepared, bool) {
		c.mu.Unlock()
		if !c.flush(sink, batch) {
			return batch[:0], false
		}
		select {
		case <-ctx.Done():
		case <-c.wake:
		}
		return batch[:0], false
	}
	if !sink.permit(routeLatest, rec.Topic) {
		// invariant 16: refused where it stands, never stepped over, so
		// nothing is lost if the grant comes back — and that is what
		// wakes the pump, not the next value stored.
		return wait()
	}
	if m.qos > 0 && len(c.inflight) >= pumpMaxInflight {
		return wait()
	}
	pk := c.b.deliveryPacket(rec, c.ch, m, now)
	if state {
		// The current-state pass always carries RETAIN, even for a
		// publisher that never set it (docs/channels.md "`latest`").
		pk.FixedHeader.Retain = true
	}
	d := latestDelivery{offset: rec.Offset, topic: rec.Topic, state: state}
	var seq uint64
	if m.qos > 0 {
		// Out of room in the client's window: wait for an acknowledgement.
		seq = c.sent + 1
		if !sink.reserve(latestAck{c, seq}, routeLatest, &pk, now) {
			return wait()
		}
		c.sent = seq
		c.inflight[seq] = d
	}
	c.advanceLocked(src, passID, rec.Offset)
	c.mu.Unlock()
	return addToRun(batch, latestPrepared{pk: pk, d: d, seq: seq, src: src, pass: passID}, func(run []latestPrepared) bool { return c.flush(sink, run) })
}

// flush writes the prepared deliveries in one write through the sink,
// bounded by the connection's write deadline (invariant 16).
// It reports whether the pump may go on.
// What never reached the wire is taken back: the cursor it came from goes
// back below it (a value is never skipped, docs/channels.md "What a delivery carries").
func (c *latestConsumer) flush(sink deliverySink, batch []latestPrepared) bool {
	if len(batch) == 0 {
		return true
	}
	if sink.closed() {
		c.unsend(sink, batch)
		return false
	}
	i, err, werr := sink.writeRun(len(batch), func(i int) *packets.Packet { return &batch[i].pk })
	if err != nil {
		c.unsend(sink, batch[i:])
		if errors.Is(err, packets.ErrPacketTooLarge) {
			// docs/channels.md "What a delivery carries": a value too large for the subscriber's Maximum
			// Packet Size disconnects it with 0x95 and is never skipped:
			// the mark stays below it.
			c.b.log.Warn("latest value larger than the client's Maximum Packet Size: disconnecting",
				"client", c.sess.id, "channel", c.ch.name, "topic", batch[i].d.topic, "offset", batch[i].d.offset)
			sink.refuseTooLarge()
		} else {
			c.b.log.Error("encoding a latest delivery", "client", c.sess.id, "channel", c.ch.name, "error", err)
		}
		return false
	}
	return werr == nil
}

// unsend takes back deliveries that never reached the wire.
func (c *latestConsumer) unsend(sink deliverySink, items []latestPrepared) {
	var back []latestDelivery
	var taken []latestPrepared
	c.mu.Lock()
	for _, it := range items {
		if it.pk.PacketID != 0 {
			delete(c.inflight, it.seq)
			taken = append(taken, it)
		}
		switch it.src {
		case fromLive:
			if it.d.offset < c.next {
				c.next = it.d.offset
			}
		case fromPass:
			if len(c.passes) > 0 && c.passes[0].id == it.pass && it.d.offset < c.passes[0].from {
				c.passes[0].from = it.d.offset
			}
		case fromResend:
			back = append(back, it.d)
		}
	}
	if len(back) > 0 {
		c.resend = append(back, c.resend...)
	}
	c.mu.Unlock()
	for _, it := range taken {
		sink.release(it.pk.PacketID, latestAck{c, it.seq})
	}
}
