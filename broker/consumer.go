package broker

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/topic"
	"saguin.dev/storage"
)

// Bounds on one consumer's pump (invariant 13): how many records it reads
// from storage at a time, and how many QoS>0 deliveries it keeps unacknowledged
// whatever Receive Maximum the client declared.
const (
	pumpReadBatch   = 256
	pumpMaxInflight = 256
)

// consumer is one session's reading of one append channel: a cursor, not a
// buffered copy, so it cannot overflow (docs/channels.md "`append`"). It is served by a pump
// goroutine of its own while the session is connected (invariant 16: a
// delivery never runs on the publisher's goroutine).
type consumer struct {
	b    *Broker
	sess *session
	ch   *channel

	mu sync.Mutex
	// next is the next offset the pump reads (served-from).
	next uint64
	// inflight holds the offset of each QoS>0 delivery not yet
	// acknowledged, in the current era only. The packet id is the
	// deliveries' own: each exchange carries its offset back (consumerAck).
	inflight map[uint64]struct{}
	// batch is the pump's reusable buffer of prepared deliveries.
	batch []prepared
	// era ends when a seek moves the position: acknowledgements of
	// deliveries from a closed era are ignored (docs/channels.md "`append`" "Seek").
	era uint64
	// stored is the last position written to storage; dirty says the
	// position moved since.
	stored uint64
	dirty  bool

	wake chan struct{} // an ack, a seek or a subscription change
	pump pumpRun
}

func newConsumer(b *Broker, s *session, ch *channel, start uint64) *consumer {
	return &consumer{
		b: b, sess: s, ch: ch,
		next:     start,
		stored:   start,
		inflight: make(map[uint64]struct{}),
		wake:     make(chan struct{}, 1),
	}
}

// position is the lowest offset not acknowledged: what a restart resumes
// from. It lags, never leads (docs/channels.md "`append`").
// seekTo moves the consumer to pos, stored already (seek.go
// moveConsumer): the era ends, so acknowledgements of deliveries already in
// flight are ignored, and written — the seek's reply — is called while the
// pump is held off this consumer, so the reply precedes every record of
// the new era.
func (c *consumer) seekTo(pos uint64, written func()) {
	c.mu.Lock()
	c.era++
	// Deliveries of the closed era stay in the session's ack table
	// (deliveries.go) until the client acknowledges them: their packet identifiers must not
	// be reused while the client holds them, or a late PUBACK would credit a
	// record it never processed. The acknowledgement itself is ignored,
	// because the consumer no longer lists the identifier.
	c.inflight = make(map[uint64]struct{})
	c.next, c.stored, c.dirty = pos, pos, false
	written()
	c.mu.Unlock()
	c.poke()
}

// position is the consumer's position, read under its lock (its view for
// the operations listener and the floor's check).
func (c *consumer) position() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.positionLocked()
}

func (c *consumer) positionLocked() uint64 {
	pos := c.next
	for off := range c.inflight {
		if off < pos {
			pos = off
		}
	}
	return pos
}

func (c *consumer) poke() { signal(c.wake) }

// logHandOver tells, at debug level, where a consumer stands as its session
// changes connection: its position, the next offset its pump would read
// and how many deliveries are unacknowledged. Bounded to one line per
// channel; it is how a chaos replay (-broker-log-level debug) shows what a
// takeover resumed from.
func (c *consumer) logHandOver(why string) {
	if !c.b.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.mu.Lock()
	pos, next, unacked := c.positionLocked(), c.next, len(c.inflight)
	c.mu.Unlock()
	c.b.log.Debug("consumer handed over", "client", c.sess.id, "channel", c.ch.name, "why", why,
		"position", pos, "next", next, "unacknowledged", unacked)
}

// start runs the pump, delivering through sink (delivery_sink.go: the
// session's deliveries bound to the connection it serves). The caller has
// stopped any earlier pump first (stop), so two pumps never write one
// consumer's records out of order.
func (c *consumer) start(sink deliverySink) {
	c.mu.Lock()
	// A new connection resumes from the lowest unacknowledged offset: the
	// deliveries of the old one are gone with it.
	c.next = c.positionLocked()
	c.inflight = make(map[uint64]struct{})
	c.era++
	from := c.next
	c.pump.goLocked(c.b, func(ctx context.Context) { c.run(ctx, sink) })
	c.mu.Unlock()
	c.b.log.Debug("consumer serving", "client", c.sess.id, "channel", c.ch.name, "from", from)
}

// stop ends the pump and waits for it.
func (c *consumer) stop() { c.pump.stopUnder(&c.mu) }

// consumerAck is the cookie an append delivery's exchange carries
// (deliveries.go): the consumer, the era it was sent in and the record's
// offset, brought back to the consumer with the client's PUBACK or PUBCOMP.
type consumerAck struct {
	c      *consumer
	era    uint64
	offset uint64
}

func (a consumerAck) acked(pid uint16) { a.c.acked(pid, a.era, a.offset) }

// acked applies a PUBACK (or PUBCOMP), under packet id pid, for the record
// at offset sent in era.
func (c *consumer) acked(pid uint16, era, offset uint64) {
	c.mu.Lock()
	_, held := c.inflight[offset]
	held = held && c.era == era
	if held {
		delete(c.inflight, offset)
		c.dirty = c.positionLocked() != c.stored
	}
	c.mu.Unlock()
	if !held {
		// Its delivery left the consumer (a seek, the floor passing it):
		// the acknowledgement moves nothing.
		c.b.log.Debug("acknowledgement of a delivery the consumer no longer holds", "client", c.sess.id,
			"channel", c.ch.name, "packet_id", pid)
	}
	c.poke()
}

// run is the pump: read from the consumer's offset, write what its filters
// match, wait for room and for new records. It exits when ctx ends or the
// connection fails.
func (c *consumer) run(ctx context.Context, sink deliverySink) {
	for ctx.Err() == nil && !sink.closed() {
		c.mu.Lock()
		from, era := c.next, c.era
		c.mu.Unlock()

		changed := c.ch.wait()
		recs, floor, err := c.ch.log.Read(from, pumpReadBatch)
		if errors.Is(err, storage.ErrBelowFloor) {
			c.overtaken(era, floor)
			continue
		}
		if err != nil {
			c.b.log.Error("reading channel for a consumer", "channel", c.ch.name, "client", c.sess.id, "error", err)
			if !c.sleep(ctx, time.Second) {
				return
			}
			continue
		}
		if len(recs) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-c.wake:
			}
			continue
		}
		batch := c.batch[:0]
		for i := range recs {
			ok := false
			batch, ok = c.prepare(ctx, sink, &recs[i], era, batch)
			if !ok {
				break
			}
		}
		c.batch = batch[:0]
		if !c.flush(sink, batch) {
			continue
		}
	}
}

// overtaken restarts a consumer the retention floor has passed at the floor
// (invariant 1). A connected reader cannot be told — no CONNACK is left to
// carry it and MQTT has no other signal — so it is never served the oldest
// survivor as if nothing happened, and the operator is told how many records
// it was never sent (floor.go). Its deliveries below the floor that are on
// the wire leave its position: their PUBACKs, when they come, move nothing,
// and the position is stored at the floor (the client keeps their packet
// identifiers until it acknowledges them).
func (c *consumer) overtaken(era, floor uint64) {
	c.mu.Lock()
	if c.era != era || c.next >= floor {
		c.mu.Unlock()
		return
	}
	from := c.next
	for off := range c.inflight {
		if off < floor {
			delete(c.inflight, off)
		}
	}
	c.next = floor
	c.dirty = true
	c.mu.Unlock()
	c.b.positionPassed(overtakenPassed, c.sess.id, c.ch, from, floor)
}

func (c *consumer) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// prepared is a delivery taken off the log and not yet written, in the era
// it was taken in.
type prepared struct {
	pk     packets.Packet
	offset uint64
	era    uint64
}

// pumpWriteBatch bounds how many deliveries one write carries: a replay is
// written in runs of packets, one system call a run, rather than one call a
// record.
const pumpWriteBatch = 64

// prepare adds one record to the batch if the consumer's filters match it,
// first writing the batch and waiting when the client's window is full. It
// returns false when the pump must re-read (era changed, context ended,
// connection failed).
func (c *consumer) prepare(ctx context.Context, sink deliverySink, rec *storage.Record, era uint64, batch []prepared) ([]prepared, bool) {
	m, ok := c.match(rec)
	if !ok {
		// Nothing of this session's wants the record (filters, No Local):
		// the position steps past it (docs/channels.md "Broadcast").
		c.mu.Lock()
		if c.era == era && c.next == rec.Offset {
			c.next = rec.Offset + 1
			c.dirty = c.positionLocked() != c.stored
		}
		stale := c.era != era
		c.mu.Unlock()
		return batch, !stale
	}

	// wait writes what is prepared, so the client can acknowledge it, and
	// waits for a wake (an acknowledgement, a grant given back) or a
	// raised floor. It reports whether the pump may look at rec again.
	wait := func() bool {
		if !c.flush(sink, batch) {
			batch = batch[:0]
			return false
		}
		batch = batch[:0]
		// invariant 1: the record waiting here was read before the wait,
		// and retention may pass it while the client holds its window.
		// A raised floor wakes the pump, which reads again — from below
		// the floor, so it restarts at the floor now, not once the
		// client acknowledges.
		raised := c.ch.floorWait()
		if rec.Offset < c.ch.log.Floor() {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-c.wake:
		case <-raised:
		}
		return true
	}
	for !sink.permit(routeAppend, rec.Topic) {
		// invariant 16: a refused record stalls the consumer where it
		// stands — never stepped over, its position unmoved — so nothing is
		// lost if the grant comes back, and the grant coming back is what
		// wakes it (permissionsChanged), not the next record published.
		if !wait() {
			return batch, false
		}
		c.mu.Lock()
		stale := c.era != era
		c.mu.Unlock()
		if stale {
			return batch, false
		}
	}
	if m.qos > 0 {
		for {
			c.mu.Lock()
			room := len(c.inflight) < pumpMaxInflight && sink.room()
			stale := c.era != era
			c.mu.Unlock()
			if stale {
				return batch, false
			}
			if room {
				break
			}
			// Out of room: the pump waits for an acknowledgement.
			if !wait() {
				return batch, false
			}
		}
	}

	now := c.b.clock.Now()
	pk := c.b.deliveryPacket(rec, c.ch, m, now)
	c.mu.Lock()
	if c.era != era || c.next != rec.Offset {
		c.mu.Unlock()
		return batch, false
	}
	if m.qos > 0 {
		if !sink.reserve(consumerAck{c, era, rec.Offset}, routeAppend, &pk, now) {
			// The window filled since it was looked at (another route
			// took the room): the pump reads again, and waits there.
			c.mu.Unlock()
			return batch, false
		}
		c.inflight[rec.Offset] = struct{}{}
	}
	c.next = rec.Offset + 1
	c.mu.Unlock()

	return addToRun(batch, prepared{pk: pk, offset: rec.Offset, era: era}, func(run []prepared) bool { return c.flush(sink, run) })
}

// addToRun adds a prepared delivery to a pump's run and writes the run
// once it holds pumpWriteBatch: the run left (empty once written), and
// whether the pump may go on.
func addToRun[T any](run []T, p T, flush func([]T) bool) ([]T, bool) {
	run = append(run, p)
	if len(run) < pumpWriteBatch {
		return run, true
	}
	return run[:0], flush(run)
}

// flush writes the prepared deliveries in one write through the sink,
// bounded by the connection's write deadline (invariant 16). It reports
// whether the pump may go on.
func (c *consumer) flush(sink deliverySink, batch []prepared) bool {
	if len(batch) == 0 {
		return true
	}
	if sink.closed() {
		return false
	}
	if floor := c.ch.log.Floor(); batch[0].offset < floor {
		// invariant 1: the floor is checked before every write, not only
		// before every read. These deliveries were read before retention
		// passed them (a write that waited on the socket, a window that
		// waited for an acknowledgement): none is written. They are
		// rolled back and the pump reads again, from below the floor, so
		// it restarts at the floor and the operator is told (overtaken).
		// A record checked here and written a moment after the floor
		// moved was read while it was held: it is the one delivered just
		// before the sweep, not one served from below the floor.
		for _, p := range batch {
			c.unsend(sink, p)
		}
		return false
	}
	i, err, werr := sink.writeRun(len(batch), func(i int) *packets.Packet { return &batch[i].pk })
	if err != nil {
		for _, p := range batch[i:] {
			c.unsend(sink, p)
		}
		if errors.Is(err, packets.ErrPacketTooLarge) {
			// docs/channels.md "What a delivery carries": a record too large for the subscriber's Maximum
			// Packet Size disconnects it with 0x95 and is never skipped:
			// the position stays below it.
			c.b.log.Warn("record larger than the client's Maximum Packet Size: disconnecting",
				"client", c.sess.id, "channel", c.ch.name, "offset", batch[i].offset)
			sink.refuseTooLarge()
		} else {
			c.b.log.Error("encoding a delivery", "client", c.sess.id, "channel", c.ch.name, "error", err)
		}
		return false
	}
	if werr != nil {
		return false
	}
	qos0 := false
	for i := range batch {
		qos0 = qos0 || batch[i].pk.FixedHeader.Qos == 0
	}
	if qos0 {
		// QoS 0 advances as it is written to the socket: at-most-once from
		// the socket on (docs/channels.md "`append`").
		c.mu.Lock()
		c.dirty = c.positionLocked() != c.stored
		c.mu.Unlock()
	}
	return true
}

// unsend rolls back a delivery that never reached the wire: its packet
// identifier is free again, and the consumer reads from it again unless a
// seek has moved the position since it was taken (its era ended).
func (c *consumer) unsend(sink deliverySink, p prepared) {
	pid := p.pk.PacketID
	c.mu.Lock()
	if c.era == p.era {
		if pid != 0 {
			delete(c.inflight, p.offset)
		}
		if p.offset < c.next {
			c.next = p.offset
		}
	}
	c.mu.Unlock()
	if pid != 0 {
		sink.release(pid, consumerAck{c, p.era, p.offset})
	}
}

// matched is how one record is served to one session: the highest QoS
// among matching subscriptions, every matching Subscription Identifier, and
// whether any asked Retain As Published.
type matched struct {
	qos          byte
	ids          []int
	rap          bool
	multiChannel bool
}

func (c *consumer) match(rec *storage.Record) (matched, bool) {
	var m matched
	found := false
	c.sess.eachSubscription(func(s subscription) {
		// A declared slice narrows replay and live records alike; a record
		// outside it is stepped past (docs/channels.md "Client-declared
		// partitioning").
		if !topic.Match(s.filter, rec.Topic) || !s.partition.Match(rec.Topic) {
			return
		}
		// No Local (docs/channels.md "Broadcast"): the stored publisher id decides; a record
		// with none is delivered.
		if s.noLocal && rec.PublisherID != "" && rec.PublisherID == c.sess.id {
			return
		}
		found = true
		if s.qos > m.qos {
			m.qos = s.qos
		}
		if s.identifier > 0 {
			m.ids = append(m.ids, s.identifier)
		}
		m.rap = m.rap || s.retainAsPublished
		m.multiChannel = m.multiChannel || s.multiChannel
	})
	if found && m.qos > rec.QoS {
		m.qos = rec.QoS // delivered at the lower of published and granted QoS
	}
	return m, found
}

// deliveryPacket builds the PUBLISH for a channel record: the publisher's
// message unchanged, plus saguin-id, saguin-offset, saguin-timestamp and
// (where the publisher set an expiry) saguin-expires, and saguin-channel
// where the filter reaches more than one channel.
func (b *Broker) deliveryPacket(rec *storage.Record, ch *channel, m matched, now time.Time) packets.Packet {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: m.qos},
		TopicName:   rec.Topic,
		Payload:     rec.Payload,
	}
	// Retain flag: never set on append delivery unless Retain As Published
	// was asked, and then the publisher's stored flag (MQTT-3.3.1-13).
	pk.FixedHeader.Retain = m.rap && rec.Retain
	p := &pk.Properties
	p.ContentType = rec.ContentType
	p.ResponseTopic = rec.ResponseTopic
	p.CorrelationData = rec.CorrelationData
	if rec.PayloadFormat != nil {
		p.PayloadFormat = *rec.PayloadFormat
		p.PayloadFormatFlag = true
	}
	user := make([]packets.UserProperty, 0, len(rec.Headers)+5)
	for _, h := range rec.Headers {
		user = append(user, packets.UserProperty{Key: h.Name, Val: h.Value})
	}
	user = append(user,
		packets.UserProperty{Key: "saguin-id", Val: rec.MessageID},
		packets.UserProperty{Key: "saguin-offset", Val: strconv.FormatUint(rec.Offset, 10)})
	if !rec.Timestamp.IsZero() {
		user = append(user, packets.UserProperty{Key: "saguin-timestamp", Val: strconv.FormatInt(rec.Timestamp.UnixMilli(), 10)})
	}
	if rec.MessageExpiry != nil {
		expires := rec.Timestamp.Add(time.Duration(*rec.MessageExpiry) * time.Second)
		user = append(user, packets.UserProperty{Key: "saguin-expires", Val: strconv.FormatInt(expires.UnixMilli(), 10)})
		// The interval is delivered decremented by the wait and omitted once
		// run out; the record itself stays (invariant 2).
		if left := expires.Sub(now); left > 0 {
			p.MessageExpiryInterval = uint32((left + time.Second - 1) / time.Second)
		}
	}
	if m.multiChannel {
		user = append(user, packets.UserProperty{Key: "saguin-channel", Val: ch.name})
	}
	p.User = user
	if len(m.ids) > 0 {
		p.SubscriptionIdentifier = m.ids
	}
	return pk
}
