package broker

import (
	"context"
	"saguin.dev/broker/partition"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// session is Sagüin's part of a client id's session: which connection
// currently owns it, the channel consumers it holds, the broadcast it is
// owed (its outbox, fanout.go) and every delivery in flight to its
// connection (deliveries.go). The substrate keeps the rest of MQTT's part:
// the subscriptions in its topic tree, and in its Inflight table only the
// client's own QoS 2 exchanges.
type session struct {
	id string

	mu sync.Mutex
	// subscribing is held while a SUBSCRIBE is processed, SUBACK included. A
	// queue registers a new worker before the SUBACK (so a worker is
	// offered work from the moment its SUBACK is out) and its write waits
	// here, so the SUBACK always reaches the client first.
	subscribing sync.Mutex
	// cl is the connection that owns the session now; nil while away.
	// Invariant 17: only this connection changes what is kept here.
	cl *mqtt.Client
	// durable: the session outlives its connection (Session Expiry Interval
	// > 0, or 3.1.1 cleanSession=0), so positions are stored.
	durable bool
	expiry  time.Duration
	// consumers by channel name: one per append channel the session's
	// filters reach.
	consumers map[string]*consumer
	// latest by channel name: one per latest channel the session's filters
	// reach (latest_consumer.go).
	latest map[string]*latestConsumer
	// deliv is every delivery to the session's connection, and its ack
	// table (deliveries.go). Reached without s.mu.
	deliv *deliveries
	// queues are the queues this session consumes ($saguin/queue/<name>).
	queues map[string]bool
	// subs are the session's channel-reaching subscriptions by filter.
	subs map[string]subscription
	// protocol is the MQTT version of the connection that last owned it.
	protocol byte
	// lastSeen is when its last connection ended; zero while one owns it.
	lastSeen time.Time
	// will is the session's Last Will (wills.go): its connection's, or one
	// waiting out its delay.
	will *will
	// declared holds the saguin-filter declaration of each filter that was
	// subscribed with one (rfcs/partition.md): it
	// lasts as long as the session, and a SUBSCRIBE of the same filter
	// without one replaces it.
	declared map[string]partition.Matcher
	// bcast holds the broadcast messages the session is owed (fanout.go).
	// Reached without s.mu: a publisher enqueues there and takes no lock of
	// the session's.
	bcast atomic.Pointer[outbox]
	// rests are the retained passes waiting for room in the client's
	// Receive Maximum (retained_rest.go), and restBytes what they hold:
	// bounded by limits.session_queue_bytes (invariant 13).
	rests     map[*retainedRest]struct{}
	restBytes int64
}

// subscription is one SUBSCRIBE filter with the options Sagüin serves it by.
type subscription struct {
	filter            string
	qos               byte
	identifier        int // 0: none
	noLocal           bool
	retainAsPublished bool
	retainHandling    byte
	// multiChannel: the filter reaches more than one channel, so deliveries
	// carry saguin-channel (docs/channels.md "What a publish is answered").
	multiChannel bool
	// partition is the slice the subscriber declared (its zero value,
	// nothing declared, matches every topic).
	partition partition.Matcher
}

func newSession(id string) *session {
	return &session{
		id:        id,
		consumers: make(map[string]*consumer),
		latest:    make(map[string]*latestConsumer),
		deliv:     newDeliveries(),
		queues:    make(map[string]bool),
		subs:      make(map[string]subscription),
		declared:  make(map[string]partition.Matcher),
	}
}

// reader is the name positions are stored under (docs/operations.md "Storage files").
func (s *session) reader() string { return "mqtt:" + s.id }

// owner returns the connection that owns the session, or nil.
func (s *session) owner() *mqtt.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cl
}

// stopPumps stops every consumer's pump and the broadcast sender, and takes
// back their unacknowledged deliveries (deliveries.takeBack): nothing more
// is written to the connection, and a channel consumer resumes from its
// position, never from a delivery that belonged to a connection that is
// gone (invariant 15's rule for channels, docs/channels.md "`append`").
func (s *session) stopPumps() {
	s.mu.Lock()
	cons := s.channelConsumers()
	latest := s.latestConsumers()
	rests := s.retainedRests()
	s.mu.Unlock()
	// The pumps stop first: one still running could take a packet id after
	// the table was taken back, and its delivery would stay in the table —
	// sent again (DUP) to a resuming connection next to the pump's own copy
	// from the position. A pump blocked in a write to a client that stopped
	// reading is cut (stopWriting), as is a queue job's write in progress.
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for _, c := range cons {
			c.stop()
		}
		for _, c := range latest {
			c.stop() // its unacknowledged values are its own to resend (latest_consumer.go)
		}
		if o := s.bcast.Load(); o != nil {
			o.stop()
		}
		for _, r := range rests {
			r.stop()
		}
	}()
	s.deliv.stopWriting(stopped)
	s.deliv.takeBack()
}

// logHandOver tells, at debug level, where each of the session's consumers
// stands as a CONNECT claims the session (consumer.logHandOver).
func (s *session) logHandOver(why string) {
	s.mu.Lock()
	cons := s.channelConsumers()
	s.mu.Unlock()
	for _, c := range cons {
		c.logHandOver(why)
	}
}

// roomFreed wakes everything that may be waiting for room in the client's
// window: the session's consumers and the queues it works.
func (s *session) roomFreed(b *Broker) {
	s.mu.Lock()
	cons := s.channelConsumers()
	queues := s.queueEngines(b)
	latest := s.latestConsumers()
	rests := s.retainedRests()
	s.mu.Unlock()
	for _, c := range cons {
		c.poke()
	}
	for _, r := range rests {
		r.poke()
	}
	for _, c := range latest {
		c.poke()
	}
	for _, q := range queues {
		q.poke()
	}
	if o := s.bcast.Load(); o != nil {
		o.poke()
	}
}

// channelConsumers lists the session's append-channel consumers. Caller
// holds s.mu.
func (s *session) channelConsumers() []*consumer {
	out := make([]*consumer, 0, len(s.consumers))
	for _, c := range s.consumers {
		out = append(out, c)
	}
	return out
}

// latestConsumers lists the session's latest consumers. Caller holds s.mu.
func (s *session) latestConsumers() []*latestConsumer {
	out := make([]*latestConsumer, 0, len(s.latest))
	for _, c := range s.latest {
		out = append(out, c)
	}
	return out
}

// pumpRun is a delivery goroutine — a consumer's pump, a latest
// consumer's, an outbox's sender — as its owner keeps it, under the
// owner's lock: how to cancel it and when it has returned. Owned by the
// session (its stop) and, under it, by the broker: the goroutine runs under
// the broker's context and wait group, so Close's cancel ends it too.
type pumpRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// running reports whether a goroutine is kept. Caller holds the owner's
// lock.
func (r *pumpRun) running() bool { return r.cancel != nil }

// goLocked starts f as the owner's goroutine. Caller holds the owner's
// lock, and has stopped any earlier one.
func (r *pumpRun) goLocked(b *Broker, f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	r.cancel, r.done = cancel, done
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(done)
		f(ctx)
	}()
}

// takeLocked hands the kept goroutine over, to be stopped outside the
// owner's lock, and keeps none.
func (r *pumpRun) takeLocked() pumpRun {
	t := *r
	*r = pumpRun{}
	return t
}

// stop cancels a goroutine taken and waits for it to return.
func (r pumpRun) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
}

// stopUnder takes the kept goroutine under mu, the owner's lock, and stops
// it and waits for it outside the lock.
func (r *pumpRun) stopUnder(mu *sync.Mutex) {
	mu.Lock()
	t := r.takeLocked()
	mu.Unlock()
	t.stop()
}

// signal wakes whoever waits on ch (a buffer of one), or leaves the wake
// already there.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// heldSessions lists the sessions the broker holds now.
func (b *Broker) heldSessions() []*session {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*session, 0, len(b.sessions))
	for _, s := range b.sessions {
		out = append(out, s)
	}
	return out
}

func (b *Broker) sessionOf(id string) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sessions[id]
}

func (s *session) isDurable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable
}
