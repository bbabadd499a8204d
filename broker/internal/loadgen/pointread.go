package loadgen

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// Point reads (rfcs/latest-channel.md): a QoS 1 PUBLISH to
// $saguin/kv/get whose payload names a topic of a latest channel; the
// broker answers the asking client alone, on the request's Response Topic,
// with the topic's value as payload and the request's Correlation Data.
//
// The reading client is the load generator's own connection (subscriber),
// not paho, for the reason subscriber.go gives: every answer carries User
// Properties, and at tens of thousands of answers a second paho's decoding
// would be measured beside the broker. The request is encoded by hand into
// one write.

// PointReadTopic is where a point read is published.
const PointReadTopic = "$saguin/kv/get"

// correlationSize is the Correlation Data of a request: run tag, client,
// sequence, laid out as a payload header, so an answer names exactly the
// request it answers.
const correlationSize = headerSize

// PointReadConfig describes a point-read run: Clients connections, each
// keeping one read in flight, reading the topics of a filled set in turn.
type PointReadConfig struct {
	Addr string
	// Keys is the set read, as FillTopics returned it: every answer must
	// be the value published to the topic it names.
	Keys    TopicSet
	Clients int // 1..4096
	// Reads ends the run once this many have been issued in total; 0 = no
	// count bound (Duration must then be set).
	Reads int64
	// Duration stops new reads this long after the start; the ones in
	// flight are still awaited. 0 = no time bound.
	Duration       time.Duration
	ClientIDPrefix string // connections <prefix>-c<i>, answers on replies/<client id>
	// AckTimeout bounds CONNECT/SUBACK and each read's wait for both its
	// answer and its PUBACK; 0 = 10s.
	AckTimeout time.Duration
	// Quiet is how long to keep listening after the last read, to catch an
	// answer sent twice.
	Quiet time.Duration
}

// PointReadResult is what a point-read run measured.
type PointReadResult struct {
	Clients int
	Reads   int64 // answered with the right value and acknowledged with 0x00
	// Elapsed runs from the first request to the last read completed.
	Elapsed time.Duration
}

// Rate is completed reads per second.
func (r PointReadResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Reads) / r.Elapsed.Seconds()
}

// encodePointRead appends a QoS 1 PUBLISH to PointReadTopic with the given
// packet identifier, Response Topic, Correlation Data and key (MQTT 5
// §3.3) to dst.
func encodePointRead(dst []byte, id uint16, responseTopic string, corr []byte, key string) []byte {
	props := 1 + 2 + len(responseTopic) + 1 + 2 + len(corr)
	remaining := 2 + len(PointReadTopic) + 2 + vbiLen(props) + props + len(key)
	dst = append(dst, packets.PUBLISH<<4|1<<1)
	dst = appendVBI(dst, remaining)
	dst = appendString(dst, PointReadTopic)
	dst = binary.BigEndian.AppendUint16(dst, id)
	dst = appendVBI(dst, props)
	dst = append(dst, 0x08) // Response Topic
	dst = appendString(dst, responseTopic)
	dst = append(dst, 0x09) // Correlation Data
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(corr)))
	dst = append(dst, corr...)
	return append(dst, key...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

func appendVBI(dst []byte, n int) []byte {
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 0x80
		}
		dst = append(dst, b)
		if n == 0 {
			return dst
		}
	}
}

func vbiLen(n int) int {
	l := 1
	for n >= 128 {
		n /= 128
		l++
	}
	return l
}

// reader is one point-read connection and the one read it has in flight.
type reader struct {
	keys    TopicSet
	replyTo string
	scratch []byte

	mu       sync.Mutex
	active   bool
	id       uint16
	corr     [correlationSize]byte
	key      int
	answered bool
	acked    bool
	err      error
	done     chan struct{} // signalled when the read completes or fails
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.signal()
}

func (r *reader) signal() {
	select {
	case r.done <- struct{}{}:
	default:
	}
}

// onAnswer runs on the read loop for every PUBLISH the connection gets.
func (r *reader) onAnswer(d *delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case string(d.Topic) != r.replyTo:
		r.fail(fmt.Errorf("a message on %q, not the Response Topic %q", d.Topic, r.replyTo))
	case !r.active || !bytes.Equal(d.Correlation, r.corr[:]):
		what := "a request not in flight"
		if _, c, seq, ok := decodePayload(d.Correlation); ok && len(d.Correlation) == correlationSize {
			what = fmt.Sprintf("client %d's read %d", c, seq)
		}
		r.fail(fmt.Errorf("an answer with Correlation Data of %s (an answer sent twice, or to the wrong client)", what))
	case r.answered:
		r.fail(fmt.Errorf("read %d of %s answered twice", binary.BigEndian.Uint64(r.corr[8:]), r.keys.Topic(r.key)))
	default:
		if err := r.keys.checkValue(r.key, d.Payload, r.scratch); err != nil {
			if len(d.Payload) == 0 {
				err = errors.New("no value (an empty answer)")
			}
			r.fail(fmt.Errorf("read of %s answered with %w", r.keys.Topic(r.key), err))
			return
		}
		r.answered = true
		if r.acked {
			r.signal()
		}
	}
}

// onPuback runs on the read loop for every PUBACK.
func (r *reader) onPuback(id uint16, reason byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.active || id != r.id || r.acked:
		r.fail(fmt.Errorf("PUBACK for packet %d, which is not in flight", id))
	case reason != 0:
		r.fail(fmt.Errorf("read of %s refused: PUBACK reason 0x%02x", r.keys.Topic(r.key), reason))
	default:
		r.acked = true
		if r.answered {
			r.signal()
		}
	}
}

// PointReads runs cfg and fails on the first read that is refused, answered
// with anything but the value its key was given, answered twice, answered
// with another read's Correlation Data, or left without its answer or its
// PUBACK for AckTimeout - and, with Quiet, on any answer after the last.
func PointReads(ctx context.Context, cfg PointReadConfig) (PointReadResult, error) {
	switch {
	case cfg.Addr == "":
		return PointReadResult{}, errors.New("point reads: Addr is required")
	case cfg.Clients < 1 || cfg.Clients > maxPublishers:
		return PointReadResult{}, fmt.Errorf("point reads: %d clients, want 1..%d", cfg.Clients, maxPublishers)
	case cfg.Reads < 0 || cfg.Duration < 0 || (cfg.Reads == 0 && cfg.Duration == 0):
		return PointReadResult{}, errors.New("point reads: a run needs a read count, a duration, or both")
	}
	if err := cfg.Keys.valid(); err != nil {
		return PointReadResult{}, fmt.Errorf("point reads: %w", err)
	}
	if cfg.ClientIDPrefix == "" {
		cfg.ClientIDPrefix = "kv"
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 10 * time.Second
	}
	run := newRunTag()
	res := PointReadResult{Clients: cfg.Clients}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	readers := make([]*reader, cfg.Clients)
	conns := make([]*subscriber, cfg.Clients)
	defer func() {
		for _, s := range conns {
			if s != nil {
				s.close()
			}
		}
	}()
	{
		var wg sync.WaitGroup
		var errs errFirst
		for i := range readers {
			id := fmt.Sprintf("%s-c%d", cfg.ClientIDPrefix, i)
			r := &reader{keys: cfg.Keys, replyTo: "replies/" + id, scratch: make([]byte, cfg.Keys.PayloadSize), done: make(chan struct{}, 1)}
			readers[i] = r
			wg.Go(func() {
				// Subscribed to its own Response Topic, an ordinary
				// broadcast topic, as a stock client asking for answers
				// would be.
				s, _, err := dialSubscriber(ctx, cfg.Addr, subscriberOptions{
					ClientID: id, CleanStart: true, ReceiveMaximum: 16, Filter: r.replyTo, QoS: 1,
					Timeout: cfg.AckTimeout, OnPublish: r.onAnswer, OnPuback: r.onPuback,
				})
				conns[i] = s
				errs.add(err)
			})
		}
		wg.Wait()
		if err := errs.err(); err != nil {
			return res, fmt.Errorf("point reads: %w", err)
		}
	}

	var issued, completed atomic.Int64
	var lastDone atomic.Int64 // unix nanos of the newest completed read
	var errs errFirst
	start := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	var wg sync.WaitGroup
	for i, r := range readers {
		s := conns[i]
		wg.Go(func() {
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			var pkt []byte
			var id uint16
			for seq := uint64(0); ; seq++ {
				if ctx.Err() != nil || (!deadline.IsZero() && !time.Now().Before(deadline)) {
					return
				}
				if cfg.Reads > 0 && issued.Add(1) > cfg.Reads {
					return
				}
				// Consecutive keys across clients: every topic is read in
				// turn, none twice in a row by the same client.
				key := int((seq*uint64(cfg.Clients) + uint64(i)) % uint64(cfg.Keys.Count))
				if id++; id == 0 {
					id = 1
				}
				r.mu.Lock()
				r.active, r.id, r.key, r.answered, r.acked = true, id, key, false, false
				encodePayload(r.corr[:], run, uint32(i), seq)
				pkt = encodePointRead(pkt[:0], id, r.replyTo, r.corr[:], cfg.Keys.Topic(key))
				r.mu.Unlock()
				if err := s.send(pkt); err != nil {
					errs.add(fmt.Errorf("client %d: sending read %d: %w", i, seq, err))
					cancel()
					return
				}
				timer.Reset(cfg.AckTimeout)
				var err error
				select {
				case <-r.done:
				case <-ctx.Done():
					return
				case <-s.done:
					err = fmt.Errorf("connection ended: %v", s.err)
				case <-timer.C:
					err = fmt.Errorf("no answer and PUBACK within %s", cfg.AckTimeout)
				}
				r.mu.Lock()
				if err == nil {
					err = r.err
				}
				if err == nil && !(r.answered && r.acked) {
					err = errors.New("internal: read signalled before it completed")
				}
				if err != nil {
					err = fmt.Errorf("client %d, read %d of %s (answered %v, acknowledged %v): %w", i, seq, cfg.Keys.Topic(key), r.answered, r.acked, err)
				}
				r.active = false
				r.mu.Unlock()
				if err != nil {
					errs.add(err)
					cancel() // one failed read ends the run
					return
				}
				completed.Add(1)
				lastDone.Store(time.Now().UnixNano())
			}
		})
	}
	wg.Wait()
	res.Reads = completed.Load()
	if ld := lastDone.Load(); ld > 0 {
		res.Elapsed = time.Unix(0, ld).Sub(start)
	}
	if err := errs.err(); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("point reads interrupted after %d reads: %w", res.Reads, err)
	}
	if res.Reads == 0 {
		return res, errors.New("point reads: no read completed")
	}
	if cfg.Quiet > 0 {
		select {
		case <-time.After(cfg.Quiet):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		for i, r := range readers {
			r.mu.Lock()
			err := r.err
			r.mu.Unlock()
			if err != nil {
				return res, fmt.Errorf("client %d after its last read: %w", i, err)
			}
		}
	}
	return res, nil
}
