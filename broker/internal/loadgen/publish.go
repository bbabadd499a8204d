package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// PublishConfig describes one publishing run.
type PublishConfig struct {
	Addr string // host:port of the broker's MQTT listener
	// TopicPrefix: publisher i publishes to TopicPrefix/p<i>; the verifying
	// subscriber (if any) subscribes to TopicPrefix/#.
	TopicPrefix string
	Publishers  int // concurrent connections, 1..4096
	// Window is the number of QoS 1 publishes each publisher keeps in
	// flight; 1 (the default) waits for each PUBACK before the next publish.
	Window int
	// Messages ends the run once this many have been acknowledged in total;
	// 0 = no count bound (Duration must then be set).
	Messages int64
	// Duration stops new publishes this long after the start; the ones in
	// flight are still waited for. 0 = no time bound (Messages must be set).
	Duration    time.Duration
	PayloadSize int // bytes, MinPayload..MaxPayload; 0 = DefaultPayload
	// ClientIDPrefix names the connections <prefix>-p<i> and <prefix>-sub.
	ClientIDPrefix string
	// AckTimeout bounds each PUBACK wait (and CONNECT/SUBACK); 0 = 10s.
	AckTimeout time.Duration
	// Subscribe attaches one QoS 1 subscriber to TopicPrefix/# before the
	// publishers start and requires it to receive every acknowledged
	// message exactly once (and in order, when Window is 1).
	Subscribe bool
	// SubscribeQoS0 subscribes at QoS 0 instead of QoS 1. Delivery is then
	// fire-and-forget, yet a broker on loopback that drops a message within
	// a bounded run still fails the run: the accounting is the same.
	SubscribeQoS0 bool
	// ReceiveMaximum is the subscriber's Receive Maximum; 0 = 1024.
	ReceiveMaximum uint16
	// MaxLag, with a subscriber, bounds how many messages may be published
	// and not yet delivered: a publisher waits before publishing past it.
	// Without it, publishers that are acknowledged as soon as a broker has
	// queued their message outrun the delivery, and every broker drops at
	// its own bound (mosquitto past max_queued_messages, 1,000 by default;
	// a Sagüin session past limits.session_queue_bytes; mochi past
	// MaximumClientWritesPending) - which then measures the bound, not the
	// broker. With it, the figure is the delivery rate the broker sustains.
	// 0 = no bound.
	MaxLag int64
	// DrainTimeout is how long the subscriber may go without receiving
	// anything, after the last PUBACK, before what it lacks counts as lost;
	// 0 = 10s.
	DrainTimeout time.Duration
}

// Result is what a run measured.
type Result struct {
	Run        uint32 // the run tag carried in every payload
	Publishers int
	Acked      int64    // PUBACKs with reason code 0x00
	AckedBy    []uint64 // per publisher; its sequences 0..AckedBy[i]-1 were acknowledged
	// Elapsed runs from the first publish to the last PUBACK.
	Elapsed time.Duration
	// Delivered and DeliveredAt are the subscriber's distinct messages and
	// the time from the first publish to the last of them (Subscribe only).
	Delivered   int64
	DeliveredAt time.Duration
}

// PublishRate is acknowledged messages per second.
func (r Result) PublishRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Acked) / r.Elapsed.Seconds()
}

// Rate is end-to-end messages per second: with a subscriber, until the last
// message reached it (a broker that acknowledges at once and delivers later
// is not credited with the backlog it built); otherwise PublishRate.
func (r Result) Rate() float64 {
	if r.DeliveredAt <= 0 {
		return r.PublishRate()
	}
	return float64(r.Delivered) / max(r.Elapsed, r.DeliveredAt).Seconds()
}

func (c *PublishConfig) normalise() error {
	if c.Addr == "" || c.TopicPrefix == "" {
		return errors.New("publish: Addr and TopicPrefix are required")
	}
	if c.Publishers < 1 || c.Publishers > maxPublishers {
		return fmt.Errorf("publish: %d publishers, want 1..%d", c.Publishers, maxPublishers)
	}
	if c.Window == 0 {
		c.Window = 1
	}
	if c.Window < 1 || c.Window > 65535 {
		return fmt.Errorf("publish: window %d, want 1..65535", c.Window)
	}
	if c.Messages < 0 || c.Duration < 0 || (c.Messages == 0 && c.Duration == 0) {
		return errors.New("publish: a run needs a message count, a duration, or both")
	}
	if c.PayloadSize == 0 {
		c.PayloadSize = DefaultPayload
	}
	if c.PayloadSize < MinPayload || c.PayloadSize > MaxPayload {
		return fmt.Errorf("publish: payload %d bytes, want %d..%d", c.PayloadSize, MinPayload, MaxPayload)
	}
	if c.ClientIDPrefix == "" {
		c.ClientIDPrefix = "loadgen"
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.ReceiveMaximum == 0 {
		c.ReceiveMaximum = 1024
	}
	if c.MaxLag < 0 {
		return fmt.Errorf("publish: max lag %d, want 0 (none) or more", c.MaxLag)
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 10 * time.Second
	}
	return nil
}

// newRunTag returns a random run tag, so runs read back from one channel
// (and a broker's leftovers from an earlier run) are told apart.
func newRunTag() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])
}

// Publish runs cfg: it connects every publisher (and the subscriber) first,
// then publishes until the count or the duration is reached, and returns an
// error on any failed publish, any PUBACK whose reason code is not 0x00, and
// - with a subscriber - any message lost, duplicated or reordered. ctx bounds
// the whole run; cancelling it fails the run.
func Publish(ctx context.Context, cfg PublishConfig) (Result, error) {
	if err := cfg.normalise(); err != nil {
		return Result{}, err
	}
	res := Result{Run: newRunTag(), Publishers: cfg.Publishers}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// taken[p] is the next sequence publisher p hands out; a sequence is
	// taken before it is sent, so taken bounds what the subscriber may see.
	taken := make([]atomic.Uint64, cfg.Publishers)
	acked := make([]atomic.Uint64, cfg.Publishers)

	var tracker *Tracker
	var sub *subscriber
	var lastDelivery atomic.Int64 // unix nanos of the newest delivery
	var gate *lagGate
	if cfg.Subscribe {
		var err error
		tracker, err = NewTracker(res.Run, cfg.Publishers, cfg.Window == 1, func(p int) uint64 { return taken[p].Load() })
		if err != nil {
			return res, err
		}
		if cfg.MaxLag > 0 {
			gate = newLagGate(cfg.MaxLag)
		}
		subQoS := byte(1)
		if cfg.SubscribeQoS0 {
			subQoS = 0
		}
		sub, _, err = dialSubscriber(ctx, cfg.Addr, subscriberOptions{
			ClientID:       cfg.ClientIDPrefix + "-sub",
			CleanStart:     true,
			ReceiveMaximum: cfg.ReceiveMaximum,
			Filter:         cfg.TopicPrefix + "/#",
			QoS:            subQoS,
			Timeout:        cfg.AckTimeout,
			OnPublish: func(d *delivery) {
				tracker.Observe(d.Payload)
				lastDelivery.Store(time.Now().UnixNano())
				if gate != nil {
					gate.delivered()
				}
			},
		})
		if err != nil {
			return res, fmt.Errorf("subscriber: %w", err)
		}
		defer sub.close()
	}

	clients := make([]*paho.Client, cfg.Publishers)
	defer func() {
		for _, c := range clients {
			if c != nil {
				disconnect(c)
			}
		}
	}()
	{
		// Connect in parallel: 64 sequential handshakes against a broker
		// that rate-limits accepts would eat into a short run's budget.
		var wg sync.WaitGroup
		var errs errFirst
		for i := range clients {
			wg.Go(func() {
				c, _, err := Dial(ctx, cfg.Addr, ClientOptions{
					ClientID:      fmt.Sprintf("%s-p%d", cfg.ClientIDPrefix, i),
					PacketTimeout: cfg.AckTimeout,
				})
				clients[i] = c
				errs.add(err)
			})
		}
		wg.Wait()
		if err := errs.err(); err != nil {
			return res, fmt.Errorf("publishers: %w", err)
		}
	}

	var claimed atomic.Int64 // messages claimed across all publishers
	var lastAck atomic.Int64 // unix nanos of the newest PUBACK
	var errs errFirst
	start := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	var wg sync.WaitGroup
	for i, c := range clients {
		topic := fmt.Sprintf("%s/p%d", cfg.TopicPrefix, i)
		for range cfg.Window {
			wg.Go(func() {
				buf := make([]byte, cfg.PayloadSize)
				for {
					if ctx.Err() != nil {
						return
					}
					if !deadline.IsZero() && !time.Now().Before(deadline) {
						return
					}
					if cfg.Messages > 0 && claimed.Add(1) > cfg.Messages {
						return
					}
					if gate != nil {
						if err := gate.wait(ctx, cfg.DrainTimeout); err != nil {
							if ctx.Err() == nil {
								errs.add(fmt.Errorf("publisher %d: %w", i, err))
							}
							cancel()
							return
						}
					}
					seq := taken[i].Add(1) - 1
					encodePayload(buf, res.Run, uint32(i), seq)
					pr, err := c.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: buf})
					if err == nil && pr != nil && pr.ReasonCode != 0 {
						err = fmt.Errorf("PUBACK reason 0x%02x%s", pr.ReasonCode, reasonString(pr))
					}
					if err == nil && pr == nil {
						err = errors.New("no PUBACK")
					}
					if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
						err = fmt.Errorf("no PUBACK within %s", cfg.AckTimeout)
					}
					if err != nil {
						if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
							errs.add(fmt.Errorf("publisher %d sequence %d on %s: %w", i, seq, topic, err))
						}
						// One failure ends the run: the figures of a run
						// that lost messages are not a measurement.
						cancel()
						return
					}
					acked[i].Add(1)
					lastAck.Store(time.Now().UnixNano())
				}
			})
		}
	}
	wg.Wait()
	if la := lastAck.Load(); la > 0 {
		res.Elapsed = time.Unix(0, la).Sub(start)
	}
	res.AckedBy = make([]uint64, cfg.Publishers)
	for i := range acked {
		res.AckedBy[i] = acked[i].Load()
		res.Acked += int64(res.AckedBy[i])
	}
	if err := errs.err(); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("publish run interrupted after %d PUBACKs: %w", res.Acked, err)
	}
	if res.Acked == 0 {
		return res, errors.New("no publish was acknowledged")
	}

	if tracker != nil {
		if err := drain(ctx, tracker, res.Acked, cfg.DrainTimeout, sub); err != nil {
			return res, err
		}
		distinct, err := tracker.Check(res.AckedBy)
		res.Delivered = distinct
		if ld := lastDelivery.Load(); ld > 0 {
			res.DeliveredAt = time.Unix(0, ld).Sub(start)
		}
		if err != nil {
			return res, fmt.Errorf("subscriber: %w", err)
		}
	}
	return res, nil
}

// drain waits until the subscriber has received want messages, or has gone
// idle for idle, or its connection dropped.
func drain(ctx context.Context, t *Tracker, want int64, idle time.Duration, sub *subscriber) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last, lastChange := t.Received(), time.Now()
	for {
		n := t.Received()
		if n >= want {
			return nil
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		if time.Since(lastChange) > idle {
			return nil // Check names what is missing
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("subscriber interrupted at %d of %d messages: %w", n, want, ctx.Err())
		case <-sub.done:
			if t.Received() >= want {
				return nil
			}
			return fmt.Errorf("subscriber connection ended at %d of %d messages: %v", t.Received(), want, sub.err)
		case <-tick.C:
		}
	}
}

func reasonString(pr *paho.PublishResponse) string {
	if pr.Properties != nil && pr.Properties.ReasonString != "" {
		return " (" + pr.Properties.ReasonString + ")"
	}
	return ""
}

// lagGate holds publishers back while the subscriber is more than max
// messages behind them.
type lagGate struct {
	max     int64
	sent    atomic.Int64 // messages let through
	recv    atomic.Int64 // messages delivered
	waiting atomic.Int32

	mu   sync.Mutex
	wake chan struct{} // closed (and replaced) to wake every waiter
}

func newLagGate(max int64) *lagGate {
	return &lagGate{max: max, wake: make(chan struct{})}
}

// wait returns once one more message may be published, or fails when the
// subscriber has received nothing for stall while publishers waited.
func (g *lagGate) wait(ctx context.Context, stall time.Duration) error {
	var timer *time.Timer
	for {
		g.mu.Lock()
		// waiting goes up before the check, and delivered reads recv
		// before waiting, so a delivery that the check missed always sees
		// a waiter and wakes it.
		g.waiting.Add(1)
		if g.sent.Load()-g.recv.Load() < g.max {
			g.waiting.Add(-1)
			g.sent.Add(1)
			g.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		wake := g.wake
		g.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(stall)
		}
		select {
		case <-wake:
			g.waiting.Add(-1)
			// A wake means deliveries arrived: the stall clock restarts.
			// (Since Go 1.23 Reset leaves no stale tick behind.)
			timer.Reset(stall)
		case <-ctx.Done():
			g.waiting.Add(-1)
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
			g.waiting.Add(-1)
			return fmt.Errorf("the subscriber is %d messages behind and received nothing for %s", g.sent.Load()-g.recv.Load(), stall)
		}
	}
}

// delivered counts one delivery and wakes waiting publishers once the lag
// is back under the bound.
func (g *lagGate) delivered() {
	n := g.recv.Add(1)
	if g.waiting.Load() == 0 {
		return
	}
	g.mu.Lock()
	if g.sent.Load()-n < g.max {
		close(g.wake)
		g.wake = make(chan struct{})
	}
	g.mu.Unlock()
}
