package broker

import (
	"saguin.dev/broker/partition"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// A latest channel (docs/channels.md "`latest`") keeps one current value per topic in a
// storage.ValueStore. A zero-length publish deletes: it is stored as a
// tombstone — a value with an empty payload and an offset of its own — so
// a subscriber that was there hears of it live, a point read answers it as
// "no value", and deletion_retention_period decides how long it is kept.
// Values and tombstones share the store's one counter (invariant 9).
//
// Delivery is a cursor per session and channel (latestConsumer), never a
// buffered copy: the store is the buffer. A value replaced while a
// subscriber waits is simply not there to be read any more, so at most one
// waiting value per topic exists by construction (invariant 13), and a
// consumer that reads in offset order never sends a topic's older value
// after its newer one.

// latestSweepLimit bounds what one age sweep of one latest channel removes;
// the rest waits for the next tick (invariant 13).
const latestSweepLimit = 100000

// deletionsProperty is the SUBSCRIBE User Property asking for tombstones in the
// current-state pass (docs/channels.md "`latest`"). Its presence is the request.
const deletionsProperty = "saguin-deletions"

// isTombstone: a latest value with no payload is a deletion.
func isTombstone(rec *storage.Record) bool { return len(rec.Payload) == 0 }

// storeLatest stores a publish to a latest channel before it is
// acknowledged (invariants 16, 18); its caller wakes the channel's
// consumers (channelWrite.stored).
// Deleting a topic that holds no value stores nothing: nobody could be told
// of it, and a tombstone would only take an offset and bytes.
//
// The look and the store are one step among deletes (ch.deleteMu): two
// concurrent deletes of one value that both looked before either stored
// would store two tombstones, the second a delete of a key with no value
// that no order of the two explains (docs/channels.md "`latest`"; found by chaos seed 4000
// as two tombstones sent for state/k2 at consecutive offsets). A value
// publish needs no lock: a delete that looked before it landed is ordered
// before it, one that stores after it deletes it.
func (b *Broker) storeLatest(ch *channel, rec storage.Record) error {
	if isTombstone(&rec) {
		ch.deleteMu.Lock()
		defer ch.deleteMu.Unlock()
		cur, ok, err := ch.values.Get(rec.Topic)
		if err != nil {
			return err
		}
		if !ok || isTombstone(&cur) {
			return nil
		}
		rec.Payload = nil
	}
	_, err := ch.values.Put(rec)
	return err
}

// latestServable reports whether a latest channel serves a stored value now:
// a value older than retention_period is not served even before the sweep
// removes it (the age guarantee), nor a tombstone older than
// deletion_retention_period. A record with no timestamp is never too old.
// The publisher's Message Expiry plays no part (invariant 2).
func latestServable(ch *channel, rec *storage.Record, now time.Time) bool {
	// invariant 2: retention decides what is served; the publisher's Message Expiry plays no part.
	period := ch.cfg.RetentionPeriod
	if isTombstone(rec) {
		period = ch.cfg.DeletionRetentionPeriod
	}
	return period <= 0 || rec.Timestamp.IsZero() || now.Sub(rec.Timestamp) <= period
}

// sweepLatest removes values past retention_period and tombstones past
// deletion_retention_period, on the age sweep (docs/channels.md "When retention
// removes"). RemoveIf takes a value only while it is still the one judged,
// so a publish landing during the sweep is never removed with it. Nobody
// is told: retention is silent.
func (b *Broker) sweepLatest() {
	now := b.clock.Now()
	for _, ch := range b.channels {
		if ch.values == nil || (ch.cfg.RetentionPeriod <= 0 && ch.cfg.DeletionRetentionPeriod <= 0) {
			continue
		}
		type gone struct {
			topic  string
			offset uint64
		}
		var old []gone
		err := ch.values.Scan(func(rec storage.Record) bool {
			if !latestServable(ch, &rec, now) {
				old = append(old, gone{rec.Topic, rec.Offset})
			}
			return len(old) < latestSweepLimit
		})
		if err != nil {
			b.log.Warn("latest retention sweep failed; retried at the next tick", "channel", ch.name, "error", err)
			continue
		}
		removed := 0
		for _, g := range old {
			ok, err := ch.values.RemoveIf(g.topic, g.offset)
			if err != nil {
				b.log.Warn("latest retention sweep: removing a value failed; retried at the next tick",
					"channel", ch.name, "topic", g.topic, "error", err)
				break
			}
			if ok {
				removed++
			}
		}
		if removed > 0 {
			ch.removed.Add(uint64(removed))
			b.log.Info("retention removed latest values", "channel", ch.name, "values", removed)
		}
	}
}

// countStrayLatestValues logs, per latest channel, how many stored values
// sit under a topic the channel's filter no longer claims (docs/configuration.md "`channels`":
// editing a filter moves no stored records). Those values are not served
// by this channel: another channel, or broadcast, holds the topic now.
func (b *Broker) countStrayLatestValues() {
	for _, ch := range b.channels {
		if ch.values == nil || ch.values.Len() == 0 {
			continue
		}
		stray := 0
		if err := ch.values.Scan(func(rec storage.Record) bool {
			if name, ok := b.resolver.Resolve(rec.Topic); !ok || name != ch.name {
				stray++
			}
			return true
		}); err != nil {
			b.log.Error("reading a latest channel at start", "channel", ch.name, "error", err)
			continue
		}
		if stray > 0 {
			b.log.Warn("latest channel holds values its filter no longer claims; they are not served",
				"channel", ch.name, "values", stray)
		}
	}
}

// latestChannelsOf lists the latest channels among a filter's reach.
func (b *Broker) latestChannelsOf(reached []string) []*channel {
	var out []*channel
	for _, name := range reached {
		if ch := b.channels[name]; ch != nil && ch.values != nil {
			out = append(out, ch)
		}
	}
	return out
}

// subscriptionOf is how Sagüin serves one granted filter.
func subscriptionOf(f packets.Subscription, reached []string, declared partition.Matcher) subscription {
	return subscription{
		filter: f.Filter, qos: f.Qos, identifier: f.Identifier, noLocal: f.NoLocal,
		retainAsPublished: f.RetainAsPublished, retainHandling: f.RetainHandling,
		multiChannel: len(reached) > 1, partition: declared,
	}
}

// latestSubscribe is one granted filter of a SUBSCRIBE, as the latest
// channels see it.
type latestSubscribe struct {
	sub packets.Subscription
	// existed: the session already held this filter (Retain Handling 1).
	existed bool
}

// addLatestSubscriptions gives one SUBSCRIBE's granted filters their
// consumers on every latest channel they reach (docs/configuration.md "`channels`"), and queues
// each consumer's current-state pass: every reachable topic's value, with
// RETAIN set, for the filters whose Retain Handling asks for it — 0 always,
// 1 when the subscription is new, 2 never (docs/channels.md "`latest`"; 3.1.1 has no Retain
// Handling, so every SUBSCRIBE gets it). deletions is the packet's
// saguin-deletions. The pass covers the values stored before this moment;
// what is stored from now on is a change, so a publish racing the SUBACK is
// delivered rather than missed.
//
// It returns the new consumers, to start once the SUBACK is written, and
// the existing ones, held until then and released after it (SUBACK first).
func (b *Broker) addLatestSubscriptions(s *session, cl *mqtt.Client, subs []latestSubscribe, deletions bool) (fresh, held []*latestConsumer) {
	type reach struct {
		ch      *channel
		filters map[string]subscription // filters reaching ch
		pass    []string                // of those, the ones owed a state pass
	}
	var order []*reach
	byName := map[string]*reach{}
	var reaching []reachingFilter
	var reachingChans [][]*channel
	var reachingSubs []latestSubscribe
	for _, ls := range subs {
		reached := b.resolver.Reaching(ls.sub.Filter)
		chans := b.latestChannelsOf(reached)
		if len(chans) == 0 {
			continue
		}
		reaching = append(reaching, reachingFilter{ls.sub, reached})
		reachingChans = append(reachingChans, chans)
		reachingSubs = append(reachingSubs, ls)
	}
	// The filters are recorded together, in one critical section.
	recorded := s.recordSubscriptions(reaching)
	for i, ls := range reachingSubs {
		sub, chans := recorded[i], reachingChans[i]
		rh := ls.sub.RetainHandling
		wantsPass := rh == 0 || (rh == 1 && !ls.existed)
		for _, ch := range chans {
			r := byName[ch.name]
			if r == nil {
				r = &reach{ch: ch, filters: map[string]subscription{}}
				byName[ch.name] = r
				order = append(order, r)
			}
			r.filters[ls.sub.Filter] = sub
			if wantsPass {
				r.pass = append(r.pass, ls.sub.Filter)
			}
		}
	}

	for _, r := range order {
		c, owned := s.latestOf(r.ch.name, cl)
		if !owned {
			break // taken over meanwhile: the new owner resumes the session
		}
		if c != nil {
			c.subscribed(r.filters, r.pass, deletions)
			held = append(held, c)
			continue
		}
		c = newLatestConsumer(b, s, r.ch)
		c.subscribed(r.filters, r.pass, deletions)
		if s.adoptLatest(r.ch.name, c, cl) {
			fresh = append(fresh, c)
		}
	}
	return fresh, held
}

// restoreLatestSubscription gives a filter of a session restored at start
// its consumers on the latest channels it reaches. Marks live in memory
// only, so each comes back without one: the session is served the full
// current state when it resumes (docs/channels.md "`latest`" "Reconnecting consumer").
func (b *Broker) restoreLatestSubscription(s *session, f packets.Subscription) {
	reached := b.resolver.Reaching(f.Filter)
	chans := b.latestChannelsOf(reached)
	if len(chans) == 0 {
		return
	}
	sub := s.restoreSubscription(f, reached)
	for _, ch := range chans {
		c := s.restoreLatest(ch.name, func() *latestConsumer { return restoredLatestConsumer(b, s, ch) })
		c.restoreFilter(sub)
	}
}
