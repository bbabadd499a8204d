package broker

import (
	"maps"
	"slices"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/partition"
)

// The session's state behind methods. session.mu is taken in session.go,
// session_lifecycle.go and this file only (TestSessionSeam_*): every other
// file reaches a session's mutable fields through what is below, each
// method one critical section that takes no other lock of ours (session.mu
// is a leaf, doc.go "Locks"). Takeovers were the most-fixed area while
// those fields were read and written under the lock from fifteen files.

// durability reports whether the session outlives its connection, and for
// how long once away.
func (s *session) durability() (durable bool, expiry time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable, s.expiry
}

// endWithConnection makes the session one that ends with its connection
// (Session Expiry 0): the store had no room for it (sessionNotStored).
func (s *session) endWithConnection() {
	s.mu.Lock()
	s.durable, s.expiry = false, 0
	s.mu.Unlock()
}

// expiredAt reports whether the session, away, has passed its expiry at
// now.
func (s *session) expiredAt(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable && !s.lastSeen.IsZero() && !now.Before(s.lastSeen.Add(s.expiry))
}

// hasWill reports whether the session holds a Will.
func (s *session) hasWill() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.will != nil
}

// takeWill removes the session's Will and returns it (nil for none).
func (s *session) takeWill() *will {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.will
	s.will = nil
	return w
}

// armWill starts the Will's wait as the connection ends: a Will with a
// delay is given its due moment (if a DISCONNECT 0x04 did not already) and
// stays; one without is removed and returned, to publish now.
func (s *session) armWill(now time.Time) (publishNow *will) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.will
	if w == nil {
		return nil
	}
	if w.delay > 0 {
		// The wait never outlives the session: capped at the granted
		// expiry (MQTT 5 §3.1.3.2.2).
		if w.due.IsZero() {
			w.due = now.Add(min(w.delay, s.expiry))
		}
		return nil
	}
	s.will = nil
	return w
}

// willDue reports whether the session's Will has waited out its delay at
// now.
func (s *session) willDue(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.will != nil && !s.will.due.IsZero() && !now.Before(s.will.due)
}

// takeDueWill removes and returns the Will if it is due at now; nil when
// it is not (a resume cancelled it meanwhile).
func (s *session) takeDueWill(now time.Time) *will {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.will
	if w == nil || w.due.IsZero() || now.Before(w.due) {
		return nil
	}
	s.will = nil
	return w
}

// holdSubscribing holds the session's SUBSCRIBE turn until the returned
// function is called (session.subscribing).
func (s *session) holdSubscribing() (release func()) {
	s.subscribing.Lock()
	return s.subscribing.Unlock
}

// waitSubscribing waits for a SUBSCRIBE being processed to finish, its
// SUBACK written: a queue worker's first job never overtakes its SUBACK.
func (s *session) waitSubscribing() {
	s.subscribing.Lock()
	s.subscribing.Unlock() //nolint:staticcheck // a gate, not a critical section
}

// eachSubscription calls f with each of the session's channel-reaching
// subscriptions, under the session's lock: f takes no lock (a pump's
// match, consumer.go, runs once per record and copies nothing).
func (s *session) eachSubscription(f func(subscription)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		f(sub)
	}
}

// subscriptions copies the session's channel-reaching subscriptions by
// filter.
func (s *session) subscriptions() map[string]subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.subs)
}

// declarations copies the saguin-filter declarations of the session's
// filters (nil for none).
func (s *session) declarations() map[string]partition.Matcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.declared) == 0 {
		return nil
	}
	return maps.Clone(s.declared)
}

// declare records, for each granted filter, the packet's saguin-filter
// declaration — or its absence: a SUBSCRIBE replaces the filter's options,
// its declaration included.
func (s *session) declare(granted []packets.Subscription, declared partition.Matcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range granted {
		if declared.Declared() {
			s.declared[f.Filter] = declared
		} else {
			delete(s.declared, f.Filter)
		}
	}
}

// addQueue records that the session works queue name.
func (s *session) addQueue(name string) {
	s.mu.Lock()
	s.queues[name] = true
	s.mu.Unlock()
}

// consumerOf is the session's consumer of the append channel name, or nil.
func (s *session) consumerOf(name string) *consumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.consumers[name]
}

// consumersByChannel copies the session's append consumers by channel.
func (s *session) consumersByChannel() map[string]*consumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.consumers)
}

// channelSubscription is what subscribeChannels tells addChannelSubscription.
type channelSubscription struct {
	sub      subscription
	durable  bool
	expiry   time.Duration
	fresh    []*channel  // reached, with no consumer yet
	existing []*consumer // reached, consumed already
}

// subscribeChannels records filter f (reaching the channels reached, of
// which logs are the append ones) as one of the session's subscriptions,
// and splits logs into those it has a consumer of and those it has not.
func (s *session) subscribeChannels(f packets.Subscription, reached []string, logs []*channel) channelSubscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := channelSubscription{sub: subscriptionOf(f, reached, s.declared[f.Filter]), durable: s.durable, expiry: s.expiry}
	s.subs[f.Filter] = out.sub
	for _, ch := range logs {
		if c := s.consumers[ch.name]; c != nil {
			out.existing = append(out.existing, c)
		} else {
			out.fresh = append(out.fresh, ch)
		}
	}
	return out
}

// adoptConsumer keeps c as the session's consumer of its channel while cl
// still owns the session and no other consumer took the place meanwhile;
// false when c is not kept.
func (s *session) adoptConsumer(c *consumer, cl *mqtt.Client) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.consumers[c.ch.name] != nil || s.cl != cl {
		return false
	}
	s.consumers[c.ch.name] = c
	return true
}

// reachingFilter is one filter of a SUBSCRIBE with the channels it reaches.
type reachingFilter struct {
	sub     packets.Subscription
	reached []string
}

// recordSubscriptions records each filter as one of the session's
// subscriptions, all in one critical section, and returns them as the
// session serves them, in the order given.
func (s *session) recordSubscriptions(fs []reachingFilter) []subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]subscription, len(fs))
	for i, f := range fs {
		out[i] = subscriptionOf(f.sub, f.reached, s.declared[f.sub.Filter])
		s.subs[f.sub.Filter] = out[i]
	}
	return out
}

// latestOf is the session's consumer of latest channel name (or nil), and
// whether cl still owns the session.
func (s *session) latestOf(name string, cl *mqtt.Client) (c *latestConsumer, owned bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest[name], s.cl == cl
}

// adoptLatest keeps c as the session's consumer of latest channel name
// while cl still owns the session and no other took the place meanwhile.
func (s *session) adoptLatest(name string, c *latestConsumer, cl *mqtt.Client) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.latest[name] != nil || s.cl != cl {
		return false
	}
	s.latest[name] = c
	return true
}

// droppedFilters is what an UNSUBSCRIBE leaves the caller to stop.
type droppedFilters struct {
	queues                 []string // queues the session no longer works
	gone                   []*consumer
	latestGone, latestKept []*latestConsumer
}

// dropFilters removes filters from the session's subscriptions,
// declarations and queues, and the consumers no remaining filter reaches
// (reaching names the channels a filter reaches); forget is told each
// filter, under the session's lock (the partition spaces take their own
// leaf lock).
func (s *session) dropFilters(filters []string, reaching func(string) []string, forget func(string)) droppedFilters {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out droppedFilters
	for _, f := range filters {
		delete(s.subs, f)
		delete(s.declared, f)
		forget(f)
		if name, ok := strings.CutPrefix(f, "$saguin/queue/"); ok && s.queues[name] {
			delete(s.queues, name)
			out.queues = append(out.queues, name)
		}
	}
	reached := func(name string) bool {
		for f := range s.subs {
			if slices.Contains(reaching(f), name) {
				return true
			}
		}
		return false
	}
	for name, c := range s.latest {
		if reached(name) {
			out.latestKept = append(out.latestKept, c)
		} else {
			out.latestGone = append(out.latestGone, c)
			delete(s.latest, name)
		}
	}
	for name, c := range s.consumers {
		if !reached(name) {
			out.gone = append(out.gone, c)
			delete(s.consumers, name)
		}
	}
	return out
}

// keepRest adds r, a retained pass's rest for connection cl, to the
// session's waiting rests and calls start (which starts its goroutine)
// under the session's lock, so a stop that lists the rests finds it —
// unless its bytes would take the session past
// limits.session_queue_bytes (over: the caller refuses it), cl no longer
// owns the session or the broker is closing.
func (s *session) keepRest(r *retainedRest, cl *mqtt.Client, start func()) (over bool) {
	b := r.b
	s.mu.Lock()
	defer s.mu.Unlock()
	// invariant 13: bounded before it is kept.
	if s.restBytes+r.bytes > b.cfg.Broker.Limits.SessionQueueBytes {
		return true
	}
	if s.cl == cl && !b.closing.Load() {
		if s.rests == nil {
			s.rests = make(map[*retainedRest]struct{})
		}
		s.rests[r] = struct{}{}
		s.restBytes += r.bytes
		start()
	}
	return false
}

// forgetRest removes r from the session's waiting rests, giving its bytes
// back.
func (s *session) forgetRest(r *retainedRest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.rests[r]; ok {
		delete(s.rests, r)
		s.restBytes -= r.bytes
	}
}

// retainedRests lists the session's waiting rests. Caller holds s.mu.
func (s *session) retainedRests() []*retainedRest {
	out := make([]*retainedRest, 0, len(s.rests))
	for r := range s.rests {
		out = append(out, r)
	}
	return out
}

// sessionRecord is what storeSession writes of the session itself.
type sessionRecord struct {
	durable  bool
	expiry   time.Duration
	lastSeen time.Time
	protocol byte
	will     *storedWill
	declared map[string][]string
}

// record copies what the session's stored record holds, in one critical
// section.
func (s *session) record() sessionRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := sessionRecord{durable: s.durable, expiry: s.expiry, lastSeen: s.lastSeen, protocol: s.protocol,
		will: storeWill(s.will), declared: make(map[string][]string, len(s.declared))}
	for f, m := range s.declared {
		r.declared[f] = m.Values()
	}
	return r
}

// restoredSession is a durable session read from the store at a start,
// away, before any filter is restored onto it (sessionstore.go).
func restoredSession(id string, expiry time.Duration, protocol byte, lastSeen time.Time, w *will) *session {
	s := newSession(id)
	s.durable, s.expiry, s.protocol, s.lastSeen, s.will = true, expiry, protocol, lastSeen, w
	return s
}

// restoreDeclared records a restored filter's saguin-filter declaration.
func (s *session) restoreDeclared(filter string, m partition.Matcher) {
	s.mu.Lock()
	s.declared[filter] = m
	s.mu.Unlock()
}

// restoreSubscription records a restored filter as one of the session's
// subscriptions and returns it as served.
func (s *session) restoreSubscription(f packets.Subscription, reached []string) subscription {
	return s.recordSubscriptions([]reachingFilter{{f, reached}})[0]
}

// restoreLatest is the session's consumer of latest channel ch, made by
// newC when it has none.
func (s *session) restoreLatest(name string, newC func() *latestConsumer) *latestConsumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.latest[name]
	if c == nil {
		c = newC()
		s.latest[name] = c
	}
	return c
}

// restoreConsumer keeps c as the session's consumer of its channel.
func (s *session) restoreConsumer(c *consumer) {
	s.mu.Lock()
	s.consumers[c.ch.name] = c
	s.mu.Unlock()
}

// sessionView is a read-only copy of a session's state for the metrics
// catalogue and the operations routes (metrics_snapshot.go,
// ops_views.go), taken in one critical section.
type sessionView struct {
	id          string
	cl          *mqtt.Client // nil while away
	durable     bool
	expiry      time.Duration
	protocol    byte
	lastSeen    time.Time
	willWaiting bool                         // a Will waiting out its delay
	declared    map[string]partition.Matcher // nil for none
	consumers   map[string]*consumer         // by append channel
}

// view copies the session's state (sessionView).
func (s *session) view() sessionView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := sessionView{id: s.id, cl: s.cl, durable: s.durable, expiry: s.expiry, protocol: s.protocol,
		lastSeen: s.lastSeen, willWaiting: s.will != nil && !s.will.due.IsZero(),
		consumers: maps.Clone(s.consumers)}
	if len(s.declared) > 0 {
		v.declared = maps.Clone(s.declared)
	}
	return v
}

// outbox is the session's outbox, nil until broadcast is first owed.
func (s *session) outbox() *outbox { return s.bcast.Load() }

// seekTarget is what a seek on append channel name needs of the session:
// its consumer there (nil for none) and its durability, in one critical
// section (seek.go moveConsumer).
func (s *session) seekTarget(name string) (c *consumer, durable bool, expiry time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.consumers[name], s.durable, s.expiry
}
