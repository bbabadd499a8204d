package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Current state: a set of topics holding one value each, published once,
// then read back whole by a new subscriber. On Sagüin the topics belong to
// a latest channel (rfcs/latest-channel.md); on a reference broker they
// are retained messages, which is the nearest thing MQTT has.

// MaxTopics bounds a topic set (invariant 13): the state reader keeps a
// bit and an offset per topic.
const MaxTopics = 1_000_000

// TopicSet names a run's topics and their values: topic i is
// <Prefix>/t<i>, and its value is a PayloadSize-byte payload carrying the
// run tag and i, so a reader can tell each topic's own value from any
// other (a value served under the wrong topic, or left by another run).
type TopicSet struct {
	Prefix      string
	Count       int
	Run         uint32
	PayloadSize int
}

// Topic is the name of topic i.
func (ts TopicSet) Topic(i int) string { return ts.Prefix + "/t" + strconv.Itoa(i) }

// Filter is the subscription filter that reaches every topic of the set.
func (ts TopicSet) Filter() string { return ts.Prefix + "/#" }

func (ts TopicSet) valid() error {
	switch {
	case ts.Prefix == "":
		return errors.New("topic set: no prefix")
	case ts.Count < 1 || ts.Count > MaxTopics:
		return fmt.Errorf("topic set: %d topics, want 1..%d", ts.Count, MaxTopics)
	case ts.PayloadSize < MinPayload || ts.PayloadSize > MaxPayload:
		return fmt.Errorf("topic set: payload %d bytes, want %d..%d", ts.PayloadSize, MinPayload, MaxPayload)
	}
	return nil
}

// value writes topic i's value into buf (PayloadSize bytes).
func (ts TopicSet) value(buf []byte, i int) { encodePayload(buf, ts.Run, 0, uint64(i)) }

// index parses a topic of the set back to its number.
func (ts TopicSet) index(topic []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(topic, []byte(ts.Prefix+"/t"))
	if !ok || len(rest) == 0 || len(rest) > 7 || (rest[0] == '0' && len(rest) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n < ts.Count
}

// checkValue reports how payload differs from topic i's value; scratch is
// a PayloadSize-byte buffer it may overwrite.
func (ts TopicSet) checkValue(i int, payload, scratch []byte) error {
	if len(payload) != ts.PayloadSize {
		return fmt.Errorf("a %d-byte value where %d bytes were published", len(payload), ts.PayloadSize)
	}
	ts.value(scratch, i)
	if bytes.Equal(payload, scratch) {
		return nil
	}
	if run, _, seq, ok := decodePayload(payload); ok && run == ts.Run {
		return fmt.Errorf("the value of topic %d", seq)
	}
	return errors.New("a value not from this run")
}

// FillConfig describes publishing one value to every topic of a set.
type FillConfig struct {
	Addr string
	// Topics is the set to fill; a zero Run is replaced by a fresh tag.
	Topics TopicSet
	// Publishers share the topics between them, each keeping Window QoS 1
	// publishes in flight; 0 = 8 and 8.
	Publishers int
	Window     int
	// Retain sets the RETAIN flag: how a reference broker is asked to keep
	// a topic's current value. A latest channel keeps it either way.
	Retain         bool
	ClientIDPrefix string        // connections <prefix>-p<i>
	AckTimeout     time.Duration // each PUBACK and CONNECT; 0 = 10s
	// Limit bounds the whole fill; 0 = 10 minutes.
	Limit time.Duration
}

// FillResult is a finished fill.
type FillResult struct {
	Topics  TopicSet // with its run tag
	Elapsed time.Duration
}

// Rate is values stored (acknowledged) per second.
func (r FillResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Topics.Count) / r.Elapsed.Seconds()
}

// noMatchingSubscribers is the PUBACK reason a broker may give a publish
// nobody is subscribed to (MQTT 5 §3.4.2.1): a success, and what mosquitto
// answers every retained value of a fill.
const noMatchingSubscribers = 0x10

// FillTopics publishes each topic's value once, at QoS 1, and fails unless
// every one was acknowledged with reason code 0x00 (or 0x10, No matching
// subscribers: the value was still accepted).
func FillTopics(ctx context.Context, cfg FillConfig) (FillResult, error) {
	ts := cfg.Topics
	if ts.Run == 0 {
		ts.Run = newRunTag()
	}
	if cfg.Addr == "" {
		return FillResult{}, errors.New("fill: Addr is required")
	}
	if err := ts.valid(); err != nil {
		return FillResult{}, fmt.Errorf("fill: %w", err)
	}
	if cfg.Publishers == 0 {
		cfg.Publishers = 8
	}
	if cfg.Window == 0 {
		cfg.Window = 8
	}
	if cfg.Publishers < 1 || cfg.Publishers > maxPublishers || cfg.Window < 1 || cfg.Window > 65535 {
		return FillResult{}, fmt.Errorf("fill: %d publishers with %d in flight, want 1..%d and 1..65535", cfg.Publishers, cfg.Window, maxPublishers)
	}
	if cfg.ClientIDPrefix == "" {
		cfg.ClientIDPrefix = "fill"
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Limit)
	defer cancel()
	res := FillResult{Topics: ts}

	pubs := min(cfg.Publishers, ts.Count)
	clients := make([]*paho.Client, pubs)
	defer func() {
		for _, c := range clients {
			if c != nil {
				disconnect(c)
			}
		}
	}()
	var errs errFirst
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c, _, err := Dial(ctx, cfg.Addr, ClientOptions{ClientID: fmt.Sprintf("%s-p%d", cfg.ClientIDPrefix, i), PacketTimeout: cfg.AckTimeout})
			clients[i] = c
			errs.add(err)
		})
	}
	wg.Wait()
	if err := errs.err(); err != nil {
		return res, fmt.Errorf("fill: %w", err)
	}

	var next, acked atomic.Int64
	start := time.Now()
	for _, c := range clients {
		for range cfg.Window {
			wg.Go(func() {
				buf := make([]byte, ts.PayloadSize)
				for ctx.Err() == nil {
					i := int(next.Add(1) - 1)
					if i >= ts.Count {
						return
					}
					ts.value(buf, i)
					pr, err := c.Publish(ctx, &paho.Publish{QoS: 1, Retain: cfg.Retain, Topic: ts.Topic(i), Payload: buf})
					switch {
					case err != nil && ctx.Err() != nil:
						err = fmt.Errorf("%w (fill bounded by %s)", context.Cause(ctx), cfg.Limit)
					case err == nil && pr == nil:
						err = errors.New("no PUBACK")
					case err == nil && pr.ReasonCode != 0 && pr.ReasonCode != noMatchingSubscribers:
						err = fmt.Errorf("PUBACK reason 0x%02x%s", pr.ReasonCode, reasonString(pr))
					}
					if err != nil {
						errs.add(fmt.Errorf("fill %s: %w", ts.Topic(i), err))
						cancel() // one failure ends the fill
						return
					}
					acked.Add(1)
				}
			})
		}
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	if err := errs.err(); err != nil {
		return res, err
	}
	if n := acked.Load(); n != int64(ts.Count) {
		return res, fmt.Errorf("fill: %d of %d values acknowledged: %w", n, ts.Count, context.Cause(ctx))
	}
	if err := barrier(ctx, clients); err != nil {
		return res, fmt.Errorf("fill: %w", err)
	}
	return res, nil
}

// barrierPrefix is a topic space no topic set and no Sagüin channel of the
// benchmark's uses: a barrier publish is delivered to nobody and stored
// nowhere.
const barrierPrefix = "loadgen-barrier/"

// barrier returns once the broker has finished with every publish the
// clients made. mochi acknowledges a publish before it hands it to the
// subscribers it has, so a reader subscribing right behind the last
// PUBACK could be sent a value both by the retained pass and live - twice.
// A broker reads a connection's packets in order, so the PUBACK of one
// more publish on each connection means the ones before it are done.
func barrier(ctx context.Context, clients []*paho.Client) error {
	var wg sync.WaitGroup
	var errs errFirst
	for i, c := range clients {
		wg.Go(func() {
			topic := barrierPrefix + strconv.Itoa(i)
			pr, err := c.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: []byte("barrier")})
			switch {
			case err == nil && pr == nil:
				err = errors.New("no PUBACK")
			case err == nil && pr.ReasonCode != 0 && pr.ReasonCode != noMatchingSubscribers:
				err = fmt.Errorf("PUBACK reason 0x%02x%s", pr.ReasonCode, reasonString(pr))
			}
			if err != nil {
				errs.add(fmt.Errorf("barrier publish to %s: %w", topic, err))
			}
		})
	}
	wg.Wait()
	return errs.err()
}

// StateConfig describes reading a topic set's current state: a new
// subscriber that must be sent every topic's value exactly once.
type StateConfig struct {
	Addr     string
	ClientID string
	Topics   TopicSet // as FillTopics returned it
	// QoS of the subscription, 0 or 1.
	QoS            byte
	ReceiveMaximum uint16        // 0 = 1024
	PacketTimeout  time.Duration // CONNECT and SUBACK; 0 = 10s
	// Labels requires the User Properties a Sagüin channel delivery
	// carries (saguin-offset, saguin-id, saguin-timestamp), with offsets
	// distinct across the state: each value is its own record.
	Labels bool
	// IdleTimeout fails the read when no value arrives for this long;
	// 0 = 10s.
	IdleTimeout time.Duration
	// Quiet is how long to keep listening after the last value: anything
	// arriving then is a value sent twice or one the set never had.
	Quiet time.Duration
	// Limit bounds the whole read, however steadily values trickle in
	// (mochi v2.7.9 sends a large QoS 1 state a value every few
	// milliseconds once its window is full); 0 = 2 minutes.
	Limit time.Duration
}

// StateResult is what a state read measured.
type StateResult struct {
	Values int64
	// Elapsed runs from connecting to receiving the last value.
	Elapsed time.Duration
}

// Rate is values per second.
func (r StateResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Values) / r.Elapsed.Seconds()
}

// stateTracker accounts for a state pass as the read loop delivers it.
type stateTracker struct {
	ts      TopicSet
	labels  bool
	scratch []byte

	mu       sync.Mutex
	seen     []uint64 // bitset over topic numbers
	offsets  []uint64 // with labels: every value's saguin-offset
	distinct int64
	received int64
	lastAt   time.Time
	// anomalies, each counted; example is the first, for the error
	dups, foreign, wrong, unretained, unlabelled int64
	example                                      string
	complete                                     chan struct{}
	finished                                     bool
}

func newStateTracker(ts TopicSet, labels bool) *stateTracker {
	t := &stateTracker{
		ts: ts, labels: labels, scratch: make([]byte, ts.PayloadSize),
		seen: make([]uint64, (ts.Count+63)/64), complete: make(chan struct{}),
	}
	if labels {
		t.offsets = make([]uint64, 0, ts.Count)
	}
	return t
}

func (t *stateTracker) note(format string, args ...any) {
	if t.example == "" {
		t.example = fmt.Sprintf(format, args...)
	}
}

// observe runs on the read loop for each delivery.
func (t *stateTracker) observe(d *delivery) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.received++
	i, ok := t.ts.index(d.Topic)
	if !ok {
		t.foreign++
		t.note("a value on %q, which is not a topic of the set", d.Topic)
		return
	}
	if err := t.ts.checkValue(i, d.Payload, t.scratch); err != nil {
		t.wrong++
		t.note("topic %s carried %v", d.Topic, err)
		return
	}
	// MQTT-3.3.1-9 for retained messages; rfcs/latest-channel.md for a
	// latest channel's state pass: a value sent because of the SUBSCRIBE
	// carries RETAIN.
	if !d.Retain {
		t.unretained++
		t.note("topic %s sent without RETAIN", d.Topic)
	}
	if t.labels {
		off, err := recordOffset(d)
		if err != nil {
			t.unlabelled++
			t.note("topic %s: %v", d.Topic, err)
		} else if len(t.offsets) < t.ts.Count {
			t.offsets = append(t.offsets, off)
		}
	}
	w, bit := i/64, uint64(1)<<(i%64)
	if t.seen[w]&bit != 0 {
		t.dups++
		t.note("topic %s sent twice", d.Topic)
		return
	}
	t.seen[w] |= bit
	t.distinct++
	t.lastAt = now
	if t.distinct == int64(t.ts.Count) && !t.finished {
		t.finished = true
		close(t.complete)
	}
}

// check names every anomaly seen, and what is missing.
func (t *stateTracker) check() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	missing := int64(t.ts.Count) - t.distinct
	var repeated int64
	if t.labels && len(t.offsets) > 1 {
		s := slices.Clone(t.offsets)
		slices.Sort(s)
		for k := 1; k < len(s); k++ {
			if s[k] == s[k-1] {
				repeated++
				t.note("saguin-offset %d on two values", s[k])
			}
		}
	}
	if missing == 0 && t.dups+t.foreign+t.wrong+t.unretained+t.unlabelled+repeated == 0 {
		return nil
	}
	msg := fmt.Sprintf("run %08x: %d values in the state, %d received: %d missing, %d sent twice, %d not of the set, %d wrong, %d without RETAIN",
		t.ts.Run, t.ts.Count, t.received, missing, t.dups, t.foreign, t.wrong, t.unretained)
	if t.labels {
		msg += fmt.Sprintf(", %d without the saguin-* labels, %d repeated offsets", t.unlabelled, repeated)
	}
	if missing > 0 {
		for i := range t.ts.Count {
			if t.seen[i/64]&(1<<(i%64)) == 0 {
				msg += "; first missing: " + t.ts.Topic(i)
				break
			}
		}
	}
	if t.example != "" {
		msg += "; first anomaly: " + t.example
	}
	return errors.New(msg)
}

func (t *stateTracker) progress() (int64, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.received, t.lastAt
}

// ReadState connects a new subscriber (Clean Start, no session kept),
// subscribes to the set's filter, and waits until every topic's value has
// arrived. It fails on a value missing (after IdleTimeout without
// progress), sent twice, sent without RETAIN, not the one published, on a
// topic outside the set, or - with Quiet - arriving after the state was
// complete; with Labels also on a value without the saguin-* properties.
func ReadState(ctx context.Context, cfg StateConfig) (StateResult, error) {
	if cfg.Addr == "" || cfg.ClientID == "" {
		return StateResult{}, errors.New("state: Addr and ClientID are required")
	}
	if err := cfg.Topics.valid(); err != nil {
		return StateResult{}, fmt.Errorf("state: %w", err)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Second
	}
	if cfg.ReceiveMaximum == 0 {
		cfg.ReceiveMaximum = 1024
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Limit, fmt.Errorf("state not complete within %s", cfg.Limit))
	defer cancel()
	t := newStateTracker(cfg.Topics, cfg.Labels)
	// The clock starts before CONNECT, as a replay's does: values may
	// follow the SUBACK at once.
	start := time.Now()
	sub, _, err := dialSubscriber(ctx, cfg.Addr, subscriberOptions{
		ClientID:       cfg.ClientID,
		CleanStart:     true,
		ReceiveMaximum: cfg.ReceiveMaximum,
		Filter:         cfg.Topics.Filter(),
		QoS:            cfg.QoS,
		Timeout:        cfg.PacketTimeout,
		OnPublish:      t.observe,
	})
	if err != nil {
		return StateResult{}, fmt.Errorf("state: %w", err)
	}
	defer sub.close()
	result := func() StateResult {
		t.mu.Lock()
		defer t.mu.Unlock()
		r := StateResult{Values: t.distinct}
		if !t.lastAt.IsZero() {
			r.Elapsed = t.lastAt.Sub(start)
		}
		return r
	}

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lastN, lastChange := int64(-1), time.Now()
wait:
	for {
		select {
		case <-t.complete:
			break wait
		case <-ctx.Done():
			return result(), fmt.Errorf("state read interrupted: %w; %w", context.Cause(ctx), t.check())
		case <-sub.done:
			select {
			case <-t.complete:
				break wait
			default:
			}
			return result(), fmt.Errorf("state: connection ended (%v); %w", sub.err, t.check())
		case <-tick.C:
			if n, _ := t.progress(); n != lastN {
				lastN, lastChange = n, time.Now()
			} else if time.Since(lastChange) > cfg.IdleTimeout {
				return result(), fmt.Errorf("state: nothing received for %s; %w", cfg.IdleTimeout, t.check())
			}
		}
	}
	if cfg.Quiet > 0 {
		select {
		case <-time.After(cfg.Quiet):
		case <-ctx.Done():
			return result(), ctx.Err()
		}
	}
	return result(), t.check()
}
