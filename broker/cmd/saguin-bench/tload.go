package main

// The table's load (table.go): QoS 0 and QoS 1 publishers with an
// accounting subscriber, a fan-out to many subscribers with end-to-end
// latencies, and queue workers - all on wire.go's client, so MQTT 3.1.1
// (NATS) and MQTT 5 brokers get the same load from the same code.
//
// A payload is the publisher's index (4 bytes), its sequence number (8) and
// the send time in nanoseconds since the run began (8), padded to the
// configured size. A subscriber requires each publisher's sequence in
// order, every number exactly once: a repeat is a duplicate, a gap a loss,
// and either fails the run.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const payloadHeader = 20

func putPayload(b []byte, pub uint32, seq uint64, sent time.Duration) {
	binary.BigEndian.PutUint32(b, pub)
	binary.BigEndian.PutUint64(b[4:], seq)
	binary.BigEndian.PutUint64(b[12:], uint64(sent))
}

func getPayload(b []byte) (pub uint32, seq uint64, sent time.Duration, ok bool) {
	if len(b) < payloadHeader {
		return 0, 0, 0, false
	}
	return binary.BigEndian.Uint32(b), binary.BigEndian.Uint64(b[4:]), time.Duration(binary.BigEndian.Uint64(b[12:])), true
}

// seqCheck follows each publisher's sequence on one subscriber.
type seqCheck struct {
	next []uint64
}

func newSeqCheck(pubs int) *seqCheck { return &seqCheck{next: make([]uint64, pubs)} }

func (s *seqCheck) observe(payload []byte) (time.Duration, error) {
	pub, seq, sent, ok := getPayload(payload)
	switch {
	case !ok || int(pub) >= len(s.next):
		return 0, fmt.Errorf("a payload this run did not publish (%d bytes)", len(payload))
	case seq < s.next[pub]:
		return 0, fmt.Errorf("duplicate: publisher %d's message %d again after %d", pub, seq, s.next[pub]-1)
	case seq > s.next[pub]:
		return 0, fmt.Errorf("lost: publisher %d's messages %d..%d never arrived before %d", pub, s.next[pub], seq-1, seq)
	}
	s.next[pub]++
	return sent, nil
}

// tpubConfig is one publish run.
type tpubConfig struct {
	addr       string
	version    byte
	ids        string // client id prefix; unique per run
	topic      string // publisher i publishes to topic/p<i>
	pubs       int
	window     int // QoS 1 publishes in flight per publisher
	qos        byte
	duration   time.Duration
	messages   int64 // > 0: publish exactly this many in all (duration still bounds the run)
	subscribe  bool  // an accounting subscriber on topic/#, at qos
	subQoS0    bool  // the subscriber at QoS 0 whatever qos is
	maxLag     int   // publishers wait while the subscriber is this many behind (0: never)
	payload    int
	ackTimeout time.Duration // longest wait without progress
}

type tpubResult struct {
	sent, acked, delivered int64
	lastAck, lastDelivery  time.Duration // since the first publish
}

// rate is what the run sustained: deliveries per second when a subscriber
// was attached, PUBACKs per second otherwise.
func (r tpubResult) rate(subscribed bool) float64 {
	if subscribed {
		return float64(r.delivered) / r.lastDelivery.Seconds()
	}
	return float64(r.acked) / r.lastAck.Seconds()
}

// tpublisher is one publishing connection.
type tpublisher struct {
	c        *wconn
	idx      uint32
	window   chan struct{} // QoS 1 slots
	mu       sync.Mutex
	inflight map[uint16]bool // guarded by mu
	nextID   uint16          // guarded by mu
	sent     atomic.Int64
	acked    atomic.Int64
}

// takeID assigns the next packet id not in flight.
func (p *tpublisher) takeID() uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		p.nextID++
		if p.nextID == 0 {
			p.nextID = 1
		}
		if !p.inflight[p.nextID] {
			p.inflight[p.nextID] = true
			return p.nextID
		}
	}
}

func (p *tpublisher) release(id uint16) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.inflight[id] {
		return false
	}
	delete(p.inflight, id)
	return true
}

// acquire takes a slot from ch, waiting at most stall.
func acquire(ctx context.Context, ch chan struct{}, stall time.Duration, what string) error {
	select {
	case ch <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(stall)
	defer t.Stop()
	select {
	case ch <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("stalled: %s for %s", what, stall)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// waitFor polls cond until it holds, failing when progress stands still
// for stall.
func waitFor(ctx context.Context, cond func() bool, progress func() int64, stall time.Duration, what string) error {
	last, since := progress(), time.Now()
	for !cond() {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if p := progress(); p != last {
			last, since = p, time.Now()
		} else if time.Since(since) > stall {
			return fmt.Errorf("stalled: %s (no progress for %s)", what, stall)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// tpublish runs publishers (and a subscriber) and accounts for every
// message.
func tpublish(ctx context.Context, cfg tpubConfig) (tpubResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var res tpubResult
	var (
		delivered  atomic.Int64
		lastDeliv  atomic.Int64
		lastAck    atomic.Int64
		begin      time.Time
		beginSet   = make(chan struct{})
		tokens     chan struct{}
		readers    sync.WaitGroup
		closeConns []*wconn
	)
	defer func() {
		for _, c := range closeConns {
			c.close()
		}
		readers.Wait()
	}()
	if cfg.subscribe && cfg.maxLag > 0 {
		tokens = make(chan struct{}, cfg.maxLag)
	}
	if cfg.subscribe {
		sub, err := wDial(ctx, cfg.addr, wdial{id: cfg.ids + "-sub", version: cfg.version, clean: true, receiveMax: 65535, timeout: cfg.ackTimeout})
		if err != nil {
			return res, err
		}
		closeConns = append(closeConns, sub)
		subQoS := cfg.qos
		if cfg.subQoS0 {
			subQoS = 0
		}
		if err := sub.subscribe(cfg.topic+"/#", subQoS, cfg.ackTimeout); err != nil {
			return res, err
		}
		check := newSeqCheck(cfg.pubs)
		readers.Add(1)
		go func() {
			defer readers.Done()
			var p wpublish
			for {
				typ, flags, body, err := sub.read()
				if err != nil {
					cancel(fmt.Errorf("subscriber: %w", err))
					return
				}
				if typ != pPUBLISH {
					continue
				}
				if err := sub.decodePublishBody(flags, body, &p); err != nil {
					cancel(fmt.Errorf("subscriber: %w", err))
					return
				}
				if _, err := check.observe(p.payload); err != nil {
					cancel(fmt.Errorf("subscriber: %w", err))
					return
				}
				if p.qos > 0 {
					_ = sub.writePuback(p.id)
					if sub.r.Buffered() == 0 {
						_ = sub.flush()
					}
				}
				<-beginSet
				lastDeliv.Store(int64(time.Since(begin)))
				delivered.Add(1)
				if tokens != nil {
					select {
					case <-tokens:
					default:
					}
				}
			}
		}()
	}
	pubs := make([]*tpublisher, cfg.pubs)
	for i := range pubs {
		c, err := wDial(ctx, cfg.addr, wdial{id: fmt.Sprintf("%s-p%d", cfg.ids, i), version: cfg.version, clean: true, timeout: cfg.ackTimeout})
		if err != nil {
			return res, err
		}
		closeConns = append(closeConns, c)
		pubs[i] = &tpublisher{c: c, idx: uint32(i), window: make(chan struct{}, cfg.window), inflight: map[uint16]bool{}}
	}
	if cfg.qos > 0 {
		for _, p := range pubs {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					typ, _, body, err := p.c.read()
					if err != nil {
						cancel(fmt.Errorf("publisher %d: %w", p.idx, err))
						return
					}
					if typ != pPUBACK {
						continue
					}
					id, reason, err := pubackReason(body)
					if err == nil && reason != 0 {
						err = fmt.Errorf("PUBACK reason 0x%02x", reason)
					}
					if err == nil && !p.release(id) {
						err = fmt.Errorf("PUBACK for packet id %d, not in flight", id)
					}
					if err != nil {
						cancel(fmt.Errorf("publisher %d: %w", p.idx, err))
						return
					}
					<-beginSet
					lastAck.Store(int64(time.Since(begin)))
					p.acked.Add(1)
					<-p.window
				}
			}()
		}
	}

	var issued atomic.Int64
	deadline := time.Now().Add(cfg.duration)
	begin = time.Now()
	close(beginSet)
	var wg sync.WaitGroup
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, max(cfg.payload, payloadHeader))
			topic := fmt.Sprintf("%s/p%d", cfg.topic, p.idx)
			unflushed := 0
			flush := func() error {
				unflushed = 0
				return p.c.flush()
			}
			for seq := uint64(0); ; seq++ {
				if ctx.Err() != nil || time.Now().After(deadline) {
					break
				}
				if cfg.messages > 0 && issued.Add(1) > cfg.messages {
					break
				}
				if cfg.qos > 0 {
					if err := acquire(ctx, p.window, cfg.ackTimeout, "no PUBACK"); err != nil {
						cancel(fmt.Errorf("publisher %d: %w", p.idx, err))
						return
					}
				}
				if tokens != nil {
					select {
					case tokens <- struct{}{}:
					default:
						if err := flush(); err != nil {
							cancel(err)
							return
						}
						if err := acquire(ctx, tokens, cfg.ackTimeout, fmt.Sprintf("the subscriber stayed %d behind", cfg.maxLag)); err != nil {
							cancel(fmt.Errorf("publisher %d: %w", p.idx, err))
							return
						}
					}
				}
				putPayload(buf, p.idx, seq, time.Since(begin))
				var id uint16
				if cfg.qos > 0 {
					id = p.takeID()
				}
				if err := p.c.writePublish(topic, cfg.qos, id, buf, nil); err != nil {
					cancel(fmt.Errorf("publisher %d: %w", p.idx, err))
					return
				}
				p.sent.Add(1)
				unflushed++
				if cfg.qos > 0 || unflushed >= 32 {
					if err := flush(); err != nil {
						cancel(err)
						return
					}
				}
			}
			if err := flush(); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	sum := func(f func(*tpublisher) int64) int64 {
		var n int64
		for _, p := range pubs {
			n += f(p)
		}
		return n
	}
	res.sent = sum(func(p *tpublisher) int64 { return p.sent.Load() })
	ackedN := func() int64 { return sum(func(p *tpublisher) int64 { return p.acked.Load() }) }
	var err error
	if cfg.qos > 0 {
		err = waitFor(ctx, func() bool { return ackedN() == res.sent }, ackedN, cfg.ackTimeout, "waiting for PUBACKs")
	}
	want := res.sent
	if err == nil && cfg.subscribe {
		err = waitFor(ctx, func() bool { return delivered.Load() >= want }, delivered.Load, cfg.ackTimeout,
			fmt.Sprintf("the subscriber had %d of %d", delivered.Load(), want))
	}
	if err == nil {
		// Anything past the last message is a duplicate or a stranger.
		time.Sleep(quiet)
		err = context.Cause(ctx)
		if err == nil && cfg.subscribe && delivered.Load() != want {
			err = fmt.Errorf("the subscriber received %d messages, %d were published", delivered.Load(), want)
		}
	}
	res.acked, res.delivered = ackedN(), delivered.Load()
	res.lastAck, res.lastDelivery = time.Duration(lastAck.Load()), time.Duration(lastDeliv.Load())
	if err == nil && res.sent == 0 {
		err = errors.New("nothing was published")
	}
	return res, err
}

// tfanConfig is one fan-out run: one QoS 1 publisher, many subscribers.
type tfanConfig struct {
	addr        string
	version     byte
	ids, topic  string
	subscribers int
	subQoS      byte
	window      int
	maxLag      int // the publisher waits while the slowest subscriber is this many behind
	duration    time.Duration
	payload     int
	ackTimeout  time.Duration
}

type tfanResult struct {
	sent, delivered int64
	last            time.Duration // first publish to last delivery
	p50, p99        time.Duration
}

// maxLatencySamples bounds the latencies kept per subscriber (invariant
// 13); past it the run keeps counting but stops sampling.
const maxLatencySamples = 200_000

// tfanout publishes for the duration and times every delivery.
func tfanout(ctx context.Context, cfg tfanConfig) (tfanResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var res tfanResult
	type fsub struct {
		c         *wconn
		delivered atomic.Int64
		lat       []time.Duration
	}
	subs := make([]*fsub, cfg.subscribers)
	var readers sync.WaitGroup
	var conns []*wconn
	defer func() {
		for _, c := range conns {
			c.close()
		}
		readers.Wait()
	}()
	var (
		begin     time.Time
		beginSet  = make(chan struct{})
		lastDeliv atomic.Int64
		progress  = make(chan struct{}, 1)
	)
	for i := range subs {
		c, err := wDial(ctx, cfg.addr, wdial{id: fmt.Sprintf("%s-s%d", cfg.ids, i), version: cfg.version, clean: true, receiveMax: 65535, timeout: cfg.ackTimeout})
		if err != nil {
			return res, err
		}
		conns = append(conns, c)
		if err := c.subscribe(cfg.topic, cfg.subQoS, cfg.ackTimeout); err != nil {
			return res, err
		}
		subs[i] = &fsub{c: c}
	}
	for i, s := range subs {
		readers.Add(1)
		go func() {
			defer readers.Done()
			check := newSeqCheck(1)
			var p wpublish
			for {
				typ, flags, body, err := s.c.read()
				if err != nil {
					cancel(fmt.Errorf("subscriber %d: %w", i, err))
					return
				}
				if typ != pPUBLISH {
					continue
				}
				if err := s.c.decodePublishBody(flags, body, &p); err != nil {
					cancel(fmt.Errorf("subscriber %d: %w", i, err))
					return
				}
				sent, err := check.observe(p.payload)
				if err != nil {
					cancel(fmt.Errorf("subscriber %d: %w", i, err))
					return
				}
				if p.qos > 0 {
					_ = s.c.writePuback(p.id)
					if s.c.r.Buffered() == 0 {
						_ = s.c.flush()
					}
				}
				<-beginSet
				now := time.Since(begin)
				if len(s.lat) < maxLatencySamples {
					s.lat = append(s.lat, now-sent)
				}
				lastDeliv.Store(int64(now))
				s.delivered.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	pubConn, err := wDial(ctx, cfg.addr, wdial{id: cfg.ids + "-pub", version: cfg.version, clean: true, timeout: cfg.ackTimeout})
	if err != nil {
		return res, err
	}
	conns = append(conns, pubConn)
	pub := &tpublisher{c: pubConn, window: make(chan struct{}, cfg.window), inflight: map[uint16]bool{}}
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			typ, _, body, err := pub.c.read()
			if err != nil {
				cancel(fmt.Errorf("publisher: %w", err))
				return
			}
			if typ != pPUBACK {
				continue
			}
			id, reason, err := pubackReason(body)
			if err == nil && reason != 0 {
				err = fmt.Errorf("PUBACK reason 0x%02x", reason)
			}
			if err == nil && !pub.release(id) {
				err = fmt.Errorf("PUBACK for packet id %d, not in flight", id)
			}
			if err != nil {
				cancel(fmt.Errorf("publisher: %w", err))
				return
			}
			pub.acked.Add(1)
			<-pub.window
		}
	}()
	minDelivered := func() int64 {
		m := int64(-1)
		for _, s := range subs {
			if d := s.delivered.Load(); m < 0 || d < m {
				m = d
			}
		}
		return m
	}
	buf := make([]byte, max(cfg.payload, payloadHeader))
	begin = time.Now()
	close(beginSet)
	deadline := begin.Add(cfg.duration)
	for seq := uint64(0); time.Now().Before(deadline) && ctx.Err() == nil; seq++ {
		stalled := time.Now()
		for int64(seq)-minDelivered() >= int64(cfg.maxLag) {
			select {
			case <-progress:
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			if time.Since(stalled) > cfg.ackTimeout {
				cancel(fmt.Errorf("stalled: the slowest subscriber stayed %d behind for %s", cfg.maxLag, cfg.ackTimeout))
			}
		}
		if ctx.Err() != nil {
			break
		}
		if err := acquire(ctx, pub.window, cfg.ackTimeout, "no PUBACK"); err != nil {
			cancel(fmt.Errorf("publisher: %w", err))
			break
		}
		putPayload(buf, 0, seq, time.Since(begin))
		if err := pub.c.writePublish(cfg.topic, 1, pub.takeID(), buf, nil); err != nil {
			cancel(fmt.Errorf("publisher: %w", err))
			break
		}
		if err := pub.c.flush(); err != nil {
			cancel(fmt.Errorf("publisher: %w", err))
			break
		}
		pub.sent.Add(1)
	}
	res.sent = pub.sent.Load()
	total := func() int64 {
		var n int64
		for _, s := range subs {
			n += s.delivered.Load()
		}
		return n
	}
	err = waitFor(ctx, func() bool { return pub.acked.Load() == res.sent && minDelivered() >= res.sent }, total, cfg.ackTimeout,
		"waiting for every subscriber's last message")
	if err == nil {
		time.Sleep(quiet)
		err = context.Cause(ctx)
	}
	res.delivered = total()
	if err == nil && res.delivered != res.sent*int64(cfg.subscribers) {
		err = fmt.Errorf("%d deliveries, want %d x %d", res.delivered, res.sent, cfg.subscribers)
	}
	if err != nil {
		return res, err
	}
	cancel(nil) // the readers stop with their connections; their slices are then ours
	for _, c := range conns {
		c.close()
	}
	readers.Wait()
	conns = nil
	var lat []time.Duration
	for _, s := range subs {
		lat = append(lat, s.lat...)
	}
	slices.Sort(lat)
	res.last = time.Duration(lastDeliv.Load())
	res.p50, res.p99 = pct(lat, 50), pct(lat, 99)
	return res, nil
}

func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}
