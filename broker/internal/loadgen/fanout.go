package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Fan-out: many subscribers on one topic, one publish at a time, timed
// from the publish to each subscriber's delivery.

// MaxFanOut bounds the subscribers of one fan-out (invariant 13): each is a
// connection, a goroutine and a latency sample per round.
const MaxFanOut = 10_000

// maxFanOutRounds bounds the rounds, and with MaxFanOut the samples kept.
const maxFanOutRounds = 1000

// fanOutDialers is how many subscribers connect at once: enough that a
// thousand connect in a second or two, few enough that no listen backlog
// overflows (a dropped SYN costs a one-second retransmit).
const fanOutDialers = 16

// fanOutReadBuffer is each fan-out subscriber's read buffer: it receives
// one small message a round.
const fanOutReadBuffer = 4 << 10

// FanOutConfig describes a fan-out run.
type FanOutConfig struct {
	Addr string
	// TopicPrefix: the run publishes to <TopicPrefix>/<run tag>, a topic no
	// earlier run has given a value, so no subscriber is sent a stored
	// one on subscribing and every delivery counted is the round's.
	TopicPrefix string
	Subscribers int // 1..MaxFanOut
	Rounds      int // publishes, one at a time, each awaited everywhere; 1..1000
	// WarmUp publishes one round more, first, accounted for like the others
	// but left out of the figures: the first delivery on a connection pays
	// for buffers and caches the rest do not.
	WarmUp bool
	// QoS of the subscriptions, 0 or 1; the publish is QoS 1, without
	// RETAIN. (A retained publish would race the stored-value pass of a
	// subscription the broker is still completing after its SUBACK - mochi
	// then sends the value twice, once with RETAIN - which is a subscribe
	// figure, not a fan-out one. For the same reason the RETAIN flag of a
	// delivery is not checked: a latest channel may serve the round as the
	// state of a subscription it is still setting up.)
	QoS byte
	// Labels requires the saguin-* User Properties on every delivery.
	Labels         bool
	PayloadSize    int    // 0 = DefaultPayload
	ClientIDPrefix string // connections <prefix>-s<i> and <prefix>-pub
	// AckTimeout bounds each connection's handshake, the PUBACK, and the
	// wait for a round to reach every subscriber; 0 = 10s.
	AckTimeout time.Duration
	// Quiet is how long to keep listening after the last round, to catch
	// a delivery made twice.
	Quiet time.Duration
}

// FanOutResult is what a fan-out measured.
type FanOutResult struct {
	Subscribers int
	// Complete is, per round, the time from the publish to its delivery
	// to the last subscriber.
	Complete []time.Duration
	// Latencies are every subscriber's delivery times of every round
	// (publish to that subscriber's delivery), sorted.
	Latencies []time.Duration
	// Connect is how long connecting and subscribing them all took.
	Connect time.Duration
}

// Percentile is the nearest-rank percentile (0 < p <= 100) of the
// per-subscriber latencies.
func (r FanOutResult) Percentile(p float64) time.Duration { return percentile(r.Latencies, p) }

// MedianComplete is the median over rounds of the time until the last
// subscriber had the round's message.
func (r FanOutResult) MedianComplete() time.Duration {
	return percentile(sortedCopy(r.Complete), 50)
}

func sortedCopy(ds []time.Duration) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s
}

// percentile of a sorted list, by nearest rank; 0 for an empty one.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// fanOutState accounts for the deliveries of every round.
type fanOutState struct {
	run     uint32
	size    int
	labels  bool
	scratch []byte

	mu     sync.Mutex
	round  int // the round being delivered, from 1; 0 = none yet
	sentAt time.Time
	got    []int32 // per subscriber, the last round it received
	count  int     // subscribers that have the current round
	lat    []time.Duration
	last   time.Time // newest delivery of the current round
	done   chan struct{}
	// anomalies: deliveries of a round a subscriber already had or not
	// yet due, foreign or malformed messages, labels missing
	dups, foreign, unlabelled int64
	example                   string
}

func (f *fanOutState) note(format string, args ...any) {
	if f.example == "" {
		f.example = fmt.Sprintf(format, args...)
	}
}

// observe runs on subscriber i's read loop.
func (f *fanOutState) observe(i int, d *delivery) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	run, _, seq, ok := decodePayload(d.Payload)
	if !ok || run != f.run || len(d.Payload) != f.size {
		f.foreign++
		f.note("subscriber %d received a %d-byte message not from this run", i, len(d.Payload))
		return
	}
	encodePayload(f.scratch, run, 0, seq)
	if string(f.scratch) != string(d.Payload) {
		f.foreign++
		f.note("subscriber %d received a corrupted message", i)
		return
	}
	if f.labels {
		if _, err := recordOffset(d); err != nil {
			f.unlabelled++
			f.note("subscriber %d, round %d: %v", i, seq, err)
		}
	}
	if int(seq) != f.round || f.got[i] == int32(seq) {
		f.dups++
		f.note("subscriber %d received round %d during round %d (after round %d)", i, seq, f.round, f.got[i])
		return
	}
	f.got[i] = int32(seq)
	f.lat = append(f.lat, now.Sub(f.sentAt))
	f.last = now
	f.count++
	if f.count == len(f.got) {
		close(f.done)
	}
}

func (f *fanOutState) anomalies() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dups+f.foreign+f.unlabelled == 0 {
		return nil
	}
	msg := fmt.Sprintf("run %08x: %d deliveries twice or out of turn, %d foreign", f.run, f.dups, f.foreign)
	if f.labels {
		msg += fmt.Sprintf(", %d without the saguin-* labels", f.unlabelled)
	}
	return errors.New(msg + "; first: " + f.example)
}

// FanOut connects the subscribers, all to one topic, then publishes Rounds
// messages one at a time, each only once every subscriber has the one
// before. It fails on a PUBACK other than 0x00, a subscriber that does not
// receive a round within AckTimeout, and any delivery that is twice, out of
// turn, not the run's, or (Labels) without the saguin-* properties.
func FanOut(ctx context.Context, cfg FanOutConfig) (FanOutResult, error) {
	switch {
	case cfg.Addr == "" || cfg.TopicPrefix == "":
		return FanOutResult{}, errors.New("fan-out: Addr and TopicPrefix are required")
	case cfg.Subscribers < 1 || cfg.Subscribers > MaxFanOut:
		return FanOutResult{}, fmt.Errorf("fan-out: %d subscribers, want 1..%d", cfg.Subscribers, MaxFanOut)
	case cfg.Rounds < 1 || cfg.Rounds > maxFanOutRounds:
		return FanOutResult{}, fmt.Errorf("fan-out: %d rounds, want 1..%d", cfg.Rounds, maxFanOutRounds)
	case cfg.QoS > 1:
		return FanOutResult{}, fmt.Errorf("fan-out: QoS %d, want 0 or 1", cfg.QoS)
	}
	if cfg.PayloadSize == 0 {
		cfg.PayloadSize = DefaultPayload
	}
	if cfg.PayloadSize < MinPayload || cfg.PayloadSize > MaxPayload {
		return FanOutResult{}, fmt.Errorf("fan-out: payload %d bytes, want %d..%d", cfg.PayloadSize, MinPayload, MaxPayload)
	}
	if cfg.ClientIDPrefix == "" {
		cfg.ClientIDPrefix = "fanout"
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	f := &fanOutState{
		run: newRunTag(), size: cfg.PayloadSize, labels: cfg.Labels, scratch: make([]byte, cfg.PayloadSize),
		got: make([]int32, cfg.Subscribers), lat: make([]time.Duration, 0, cfg.Subscribers*(cfg.Rounds+1)),
	}
	topic := cfg.TopicPrefix + "/" + strconv.FormatUint(uint64(f.run), 16)
	res := FanOutResult{Subscribers: cfg.Subscribers}

	subs := make([]*subscriber, cfg.Subscribers)
	defer func() {
		// Closed in parallel: a thousand DISCONNECTs one after another
		// would add seconds to every run.
		var wg sync.WaitGroup
		sem := make(chan struct{}, fanOutDialers)
		for _, s := range subs {
			if s != nil {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					s.close()
				})
			}
		}
		wg.Wait()
	}()
	connectStart := time.Now()
	{
		var wg sync.WaitGroup
		var errs errFirst
		sem := make(chan struct{}, fanOutDialers)
		dctx, cancel := context.WithCancel(ctx)
		for i := range subs {
			sem <- struct{}{}
			if dctx.Err() != nil {
				<-sem
				break
			}
			wg.Go(func() {
				defer func() { <-sem }()
				s, _, err := dialSubscriber(dctx, cfg.Addr, subscriberOptions{
					ClientID:       fmt.Sprintf("%s-s%d", cfg.ClientIDPrefix, i),
					CleanStart:     true,
					ReceiveMaximum: 16,
					Filter:         topic,
					QoS:            cfg.QoS,
					Timeout:        cfg.AckTimeout,
					OnPublish:      func(d *delivery) { f.observe(i, d) },
					ReadBuffer:     fanOutReadBuffer,
				})
				subs[i] = s
				if err != nil {
					errs.add(fmt.Errorf("subscriber %d: %w", i, err))
					cancel()
				}
			})
		}
		wg.Wait()
		cancel()
		if err := errs.err(); err != nil {
			return res, fmt.Errorf("fan-out: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("fan-out: connecting: %w", err)
		}
	}
	res.Connect = time.Since(connectStart)

	pub, _, err := Dial(ctx, cfg.Addr, ClientOptions{ClientID: cfg.ClientIDPrefix + "-pub", PacketTimeout: cfg.AckTimeout})
	if err != nil {
		return res, fmt.Errorf("fan-out publisher: %w", err)
	}
	defer disconnect(pub)

	buf := make([]byte, cfg.PayloadSize)
	rounds, counted := cfg.Rounds, 1
	if cfg.WarmUp {
		rounds, counted = cfg.Rounds+1, 2
	}
	for round := 1; round <= rounds; round++ {
		encodePayload(buf, f.run, 0, uint64(round))
		f.mu.Lock()
		f.round, f.count, f.done = round, 0, make(chan struct{})
		done := f.done
		f.sentAt = time.Now()
		sentAt := f.sentAt
		f.mu.Unlock()
		pr, err := pub.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: buf})
		if err == nil && pr == nil {
			err = errors.New("no PUBACK")
		}
		if err == nil && pr.ReasonCode != 0 {
			err = fmt.Errorf("PUBACK reason 0x%02x%s", pr.ReasonCode, reasonString(pr))
		}
		if err != nil {
			return res, fmt.Errorf("fan-out round %d: publish to %s: %w", round, topic, err)
		}
		timer := time.NewTimer(cfg.AckTimeout)
		select {
		case <-done:
			timer.Stop()
		case <-ctx.Done():
			timer.Stop()
			return res, fmt.Errorf("fan-out round %d interrupted: %w", round, ctx.Err())
		case <-timer.C:
			return res, fmt.Errorf("fan-out round %d: %w", round, f.missing(subs, cfg.AckTimeout))
		}
		if err := f.anomalies(); err != nil {
			return res, fmt.Errorf("fan-out round %d: %w", round, err)
		}
		f.mu.Lock()
		if round < counted {
			f.lat = f.lat[:0]
		} else {
			res.Complete = append(res.Complete, f.last.Sub(sentAt))
		}
		f.mu.Unlock()
	}
	if cfg.Quiet > 0 {
		select {
		case <-time.After(cfg.Quiet):
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	if err := f.anomalies(); err != nil {
		return res, fmt.Errorf("fan-out: %w", err)
	}
	f.mu.Lock()
	res.Latencies = sortedCopy(f.lat)
	f.mu.Unlock()
	return res, nil
}

// missing describes a round that did not reach every subscriber.
func (f *fanOutState) missing(subs []*subscriber, waited time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lacking, first := 0, -1
	for i, r := range f.got {
		if int(r) != f.round {
			lacking++
			if first < 0 {
				first = i
			}
		}
	}
	msg := fmt.Sprintf("%d of %d subscribers did not receive it within %s; first: subscriber %d", lacking, len(f.got), waited, first)
	if first >= 0 {
		select {
		case <-subs[first].done:
			msg += fmt.Sprintf(" (its connection ended: %v)", subs[first].err)
		default:
		}
	}
	if f.example != "" {
		msg += "; first anomaly: " + f.example
	}
	return errors.New(msg)
}
