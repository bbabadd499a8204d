package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"

	L "saguin.dev/linearizability"
)

// keepConnected runs serve on a connection, reconnecting after every drop,
// until ctx ends. serve returns when the connection is dead or ctx ended.
func (e *env) keepConnected(ctx context.Context, opts func() dialOpts, serve func(ctx context.Context, c *mconn)) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		c, err := e.dial(ctx, opts())
		if err != nil {
			sleepCtx(ctx, backoff)
			backoff = min(2*backoff, 500*time.Millisecond)
			continue
		}
		backoff = 50 * time.Millisecond
		serve(ctx, c)
		if !c.isDead() {
			c.close()
		}
	}
}

// waitDead blocks until c ends or ctx does.
func waitDead(ctx context.Context, c *mconn) {
	select {
	case <-c.dead:
	case <-ctx.Done():
	}
}

// producer publishes QoS 1 records with a Message ID of its own (saguin-id)
// to an append channel, the queue or a latest channel's keys until stop
// closes; a publish already sent when stop closes is waited for, so the end
// of a campaign leaves no publish pending. A publish whose PUBACK never came
// is recorded pending and its connection dropped: paho keeps no state across
// connections, so it is never re-sent and takes effect at most once.
type producer struct {
	env      *env
	name     string
	op       string // L.OpAppendPublish or L.OpQueuePublish
	channel  string
	topic    string
	interval func() time.Duration
	stop     <-chan struct{}
	n        int
	// burst: publish this many, then pause for pause (the ticks channel
	// empties by retention between bursts).
	burst int
	pause time.Duration
	// latest (op L.OpLatestPublish): each publish sets one of keys, drawn
	// from rng, and one in deleteOneIn is a delete (a zero-length payload,
	// docs/channels.md "`latest`"). Every value is unique ("<name> #<n>"), so a read names
	// the write it saw.
	keys        []string
	rng         *lockedRand
	deleteOneIn int
}

func (p *producer) run(ctx context.Context) {
	// Stopping ends the reconnect loop too; a publish in flight is not
	// cancelled by it (publishOne detaches it from ctx).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	p.env.keepConnected(ctx, func() dialOpts { return dialOpts{clientID: p.name, cleanStart: true} },
		func(ctx context.Context, c *mconn) {
			for ctx.Err() == nil && !c.isDead() {
				select {
				case <-p.stop:
					return
				default:
				}
				if p.burst > 0 && p.n > 0 && p.n%p.burst == 0 {
					if !sleepCtx(ctx, p.pause) {
						return
					}
				}
				p.n++
				if !p.publishOne(ctx, c) {
					return
				}
				if !sleepCtx(ctx, p.interval()) {
					return
				}
			}
		})
}

func (p *producer) publishOne(ctx context.Context, c *mconn) bool {
	id := fmt.Sprintf("%s-%d", p.name, p.n)
	payload := []byte(fmt.Sprintf("%s #%d", p.name, p.n))
	if p.channel == chanTicks {
		p.env.ticksInFlight.Add(1)
		defer p.env.ticksInFlight.Add(-1)
		p.env.lastTickCall.Store(p.env.now())
	}
	topic := p.topic + strconv.Itoa(p.n%16)
	in := &L.Input{ID: id, Payload: payload}
	if p.op == L.OpLatestPublish {
		topic = p.keys[p.rng.intN(len(p.keys))]
		if p.rng.intN(p.deleteOneIn) == 0 {
			payload = nil
		}
		in = &L.Input{Key: topic, ID: id, Payload: payload}
	}
	call, err := p.env.hist.Begin(c.id, p.op, p.channel, in)
	if err != nil {
		p.env.fail(fmt.Errorf("history: %w", err))
		return false
	}
	// The publish is not cancelled by the campaign's stop: only by its own
	// bound, so a publish sent is a publish answered or known pending.
	resp := c.publish(context.WithoutCancel(ctx), &paho.Publish{
		Topic: topic, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "saguin-id", Value: id}}},
	})
	if resp == nil {
		if err := call.Abandon(); err != nil {
			p.env.fail(fmt.Errorf("history: %w", err))
		}
		c.abort()
		return false
	}
	if err := call.End(&L.Output{Reason: int(resp.ReasonCode)}); err != nil {
		p.env.fail(fmt.Errorf("history: %w", err))
		return false
	}
	return true
}

// reader is a durable consumer (Clean Start 0, Session Expiry > 0) of one
// append channel: it records every record delivered and acknowledges it,
// and after every drop it resumes its session. What it acknowledged on each
// connection goes in the notes, for the resume check (a stored position may
// lag, never lead).
type reader struct {
	env     *env
	name    string
	filter  string
	channel string
	topic   string // records of other channels under the filter are not this reader's
	started bool
	// onRead, when set, sees every record read (the final read counts them).
	onRead func(offset int64, id string)
}

func (r *reader) opts() dialOpts {
	clean := !r.started
	r.started = true
	return dialOpts{clientID: r.name, cleanStart: clean, sessionExpiry: 3600, receiveMax: 64,
		onPublish: r.onPublish}
}

func (r *reader) run(ctx context.Context) {
	r.env.keepConnected(ctx, r.opts, r.serve)
}

func (r *reader) serve(ctx context.Context, c *mconn) {
	r.env.note(Note{Kind: NoteConnack, Conn: c.id, ClientID: r.name, Channel: r.channel, SessionPresent: c.sessionPresent()})
	if !c.sessionPresent() {
		code, err := c.subscribe(ctx, r.filter, 1)
		if err != nil {
			c.abort()
		} else if code >= 0x80 {
			r.env.protocolFinding(0, "subscribe-refused", r.channel, fmt.Sprintf("%s: SUBSCRIBE %s refused 0x%02x", r.name, r.filter, code))
			c.abort()
		}
	}
	waitDead(ctx, c)
	if !c.isDead() {
		c.close()
	}
	<-c.pc.Done() // no handler runs after this: the acknowledged offset is final
	r.env.note(Note{Kind: NoteAcked, Conn: c.id, ClientID: r.name, Channel: r.channel, Value: c.acked.Load()})
}

func (r *reader) onPublish(c *mconn, p *paho.Publish) {
	if !strings.HasPrefix(p.Topic, r.topic) {
		return
	}
	t := r.env.now()
	off, okOff := userInt(p, "saguin-offset")
	id := userString(p, "saguin-id")
	if !okOff || off < 1 || id == "" {
		r.env.protocolFinding(8, "delivery-headers", r.channel,
			fmt.Sprintf("%s: record on %s without saguin-offset/saguin-id: %v", r.name, p.Topic, p.Properties))
		return
	}
	o := L.Op{Client: c.id, Op: L.OpAppendRead, Channel: r.channel, Call: t, Return: t,
		Output: &L.Output{ID: id, Offset: off, Payload: p.Payload}}
	if p.Duplicate() {
		o.Input = &L.Input{Dup: true} // a resumed session's resend: kept for diagnosis
	}
	r.env.write(o)
	if r.onRead != nil {
		r.onRead(off, id)
	}
	// paho acknowledges it as this returns (client.go, dialOpts.onPublish).
	if off > c.acked.Load() {
		c.acked.Store(off) // only paho's delivery goroutine writes it
	}
}

// dlqReader is a durable consumer of the queue's dead-letter channel. Its
// reads are recorded as queue.dead_letter, channel = the source queue.
type dlqReader struct {
	env     *env
	name    string
	started bool
	onRead  func(offset int64, id string)
}

func (r *dlqReader) run(ctx context.Context) {
	r.env.keepConnected(ctx, func() dialOpts {
		clean := !r.started
		r.started = true
		return dialOpts{clientID: r.name, cleanStart: clean, sessionExpiry: 3600, onPublish: r.onPublish}
	}, func(ctx context.Context, c *mconn) {
		r.env.note(Note{Kind: NoteConnack, Conn: c.id, ClientID: r.name, Channel: chanJobs + "__dlq", SessionPresent: c.sessionPresent()})
		if !c.sessionPresent() {
			if code, err := c.subscribe(ctx, filterDLQ, 1); err != nil || code >= 0x80 {
				c.abort()
				return
			}
		}
		waitDead(ctx, c)
	})
}

func (r *dlqReader) onPublish(c *mconn, p *paho.Publish) {
	t := r.env.now()
	off, okOff := userInt(p, "saguin-offset")
	id := userString(p, "saguin-id")
	attempts, _ := userInt(p, "saguin-dlq-attempts")
	if !okOff || off < 1 || id == "" {
		r.env.protocolFinding(8, "delivery-headers", chanJobs+"__dlq",
			fmt.Sprintf("%s: dead letter on %s without saguin-offset/saguin-id: %v", r.name, p.Topic, p.Properties))
		return
	}
	if src := userString(p, "saguin-dlq-channel"); src != chanJobs {
		r.env.protocolFinding(8, "delivery-headers", chanJobs+"__dlq",
			fmt.Sprintf("%s: dead letter %s names source channel %q", r.name, id, src))
	}
	r.env.write(L.Op{Client: c.id, Op: L.OpQueueDeadLetter, Channel: chanJobs, Call: t, Return: t,
		Output: &L.Output{ID: id, Offset: off, Attempt: int(attempts)}})
	if r.onRead != nil {
		r.onRead(off, id)
	}
}

// prober asks the broker, through seeks on its own durable session, for each
// channel's next offset (seek -1: an append.head operation) and floor (seek
// 0: a floor note). Its session subscribes to nothing, so moving its own
// position changes nothing anybody reads (docs/channels.md "Seek").
type prober struct {
	env     *env
	name    string
	every   time.Duration
	started bool

	mu      sync.Mutex
	conn    *mconn
	replies chan *paho.Publish
	corr    int
}

func newProber(e *env, name string, every time.Duration) *prober {
	return &prober{env: e, name: name, every: every, replies: make(chan *paho.Publish, 16)}
}

func (p *prober) opts() dialOpts {
	clean := !p.started
	p.started = true
	return dialOpts{clientID: p.name, cleanStart: clean, sessionExpiry: 3600, onPublish: func(_ *mconn, m *paho.Publish) {
		if m.Topic != seekReplyTopic {
			return
		}
		select {
		case p.replies <- m:
		default: // a reply nobody waits for any more
		}
	}}
}

func (p *prober) run(ctx context.Context) {
	p.env.keepConnected(ctx, p.opts, func(ctx context.Context, c *mconn) {
		p.mu.Lock()
		p.conn = c
		p.mu.Unlock()
		for ctx.Err() == nil && !c.isDead() {
			for _, ch := range []string{chanEvents, chanTicks} {
				t0 := p.env.now()
				quiet := p.env.ticksInFlight.Load() == 0 && p.env.lastTickCall.Load() < t0
				next, ok := p.head(ctx, c, ch)
				if !ok {
					return
				}
				floor, ok := p.floor(ctx, c, ch)
				if !ok {
					return
				}
				if ch == chanTicks && quiet && next > 0 && floor == next {
					p.env.ticksEmptyAt.Store(t0)
				}
			}
			if !sleepCtx(ctx, p.every) {
				return
			}
		}
	})
}

// seek publishes a seek and waits for its reply (matched by Correlation
// Data). ok is false when no reply came.
func (p *prober) seek(ctx context.Context, c *mconn, channel, target string) (string, paho.UserProperties, bool) {
	p.mu.Lock()
	p.corr++
	corr := strconv.Itoa(p.corr)
	p.mu.Unlock()
	resp := c.publish(ctx, &paho.Publish{Topic: "$saguin/consumer/" + channel + "/seek", QoS: 1, Payload: []byte(target),
		Properties: &paho.PublishProperties{ResponseTopic: seekReplyTopic, CorrelationData: []byte(corr)}})
	if resp == nil {
		c.abort()
		return "", nil, false
	}
	// The reply is written before the PUBACK (docs/channels.md: the reply comes
	// first), so it is here or on its way.
	timer := time.NewTimer(p.env.opTimeout)
	defer timer.Stop()
	for {
		select {
		case m := <-p.replies:
			if string(m.Properties.CorrelationData) != corr {
				continue // a late reply to an earlier seek
			}
			return string(m.Payload), m.Properties.User, true
		case <-c.dead:
			return "", nil, false
		case <-timer.C:
			c.abort()
			return "", nil, false
		case <-ctx.Done():
			return "", nil, false
		}
	}
}

// head records an append.head: call = the seek sent, return = its reply.
func (p *prober) head(ctx context.Context, c *mconn, channel string) (int64, bool) {
	call, err := p.env.hist.Begin(c.id, L.OpAppendHead, channel, nil)
	if err != nil {
		p.env.fail(fmt.Errorf("history: %w", err))
		return 0, false
	}
	reply, _, ok := p.seek(ctx, c, channel, "-1")
	next, perr := strconv.ParseInt(reply, 10, 64)
	if !ok || perr != nil || next < 1 {
		if ok {
			p.env.protocolFinding(0, "seek-refused", channel, fmt.Sprintf("%s: seek -1 on %s answered %q", p.name, channel, reply))
		}
		if err := call.Abandon(); err != nil {
			p.env.fail(fmt.Errorf("history: %w", err))
		}
		return 0, ok
	}
	if err := call.End(&L.Output{Next: next}); err != nil {
		p.env.fail(fmt.Errorf("history: %w", err))
		return 0, false
	}
	return next, true
}

// floor records the floor a seek to 0 reports.
func (p *prober) floor(ctx context.Context, c *mconn, channel string) (int64, bool) {
	reply, _, ok := p.seek(ctx, c, channel, "0")
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseInt(reply, 10, 64)
	if err != nil || f < 1 {
		p.env.protocolFinding(1, "seek-refused", channel, fmt.Sprintf("%s: seek 0 on %s answered %q", p.name, channel, reply))
		return 0, true
	}
	p.env.note(Note{Kind: NoteFloor, Conn: c.id, ClientID: p.name, Channel: channel, Value: f})
	return f, true
}

// jitter returns a duration uniformly in [lo, hi).
func jitter(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// lockedRand is a seeded source shared by goroutines of one actor.
type lockedRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) intN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.IntN(n)
}

func (l *lockedRand) between(lo, hi time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return jitter(l.rng, lo, hi)
}
