package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// User Properties a Sagüin channel delivery carries (docs/channels.md "What a delivery carries").
const (
	PropOffset    = "saguin-offset"
	PropID        = "saguin-id"
	PropTimestamp = "saguin-timestamp"
)

// ReaderConfig describes a channel read: a durable subscriber that reads a
// known number of records and checks that their offsets run without a gap
// or a repeat.
type ReaderConfig struct {
	Addr     string
	ClientID string // a fresh id, so the session has no stored position
	Filter   string
	Records  int64 // read exactly this many, >= 1
	// FirstOffset is the saguin-offset the first record must carry; 0 = 1,
	// where a reader with no stored position starts on a channel nothing
	// has been removed from (invariant 9: offsets start at 1).
	FirstOffset uint64
	// SessionExpiry makes the session durable (Clean Start 0 and a non-zero
	// Session Expiry Interval is what the spec calls a durable consumer);
	// 0 = 300 seconds.
	SessionExpiry  uint32
	ReceiveMaximum uint16        // 0 = 1024
	PacketTimeout  time.Duration // CONNECT and SUBACK; 0 = 10s
	// IdleTimeout fails the read when no record arrives for this long;
	// 0 = 10s.
	IdleTimeout time.Duration
	// Quiet, if set, is how long to keep listening after the last expected
	// record; anything arriving then means the channel held more than the
	// caller accounted for, which fails the read.
	Quiet time.Duration
	// Observe, if set, sees each record's payload (e.g. Ledger.Observe).
	Observe func(payload []byte)
}

// ReadResult is what a channel read measured.
type ReadResult struct {
	Records     int64
	FirstOffset uint64
	LastOffset  uint64
	// Elapsed runs from connecting to receiving the last record.
	Elapsed time.Duration
}

// Rate is records per second.
func (r ReadResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Records) / r.Elapsed.Seconds()
}

// Reader is a channel read in progress: OpenReader connects and subscribes,
// Read waits for the records.
type Reader struct {
	cfg     ReaderConfig
	sub     *subscriber
	started time.Time

	mu       sync.Mutex
	next     uint64 // the offset the next record must carry
	n        int64
	lastAt   time.Time
	extra    int64
	err      error
	finished bool
	complete chan struct{} // closed when n reaches Records or err is set
}

// OpenReader connects a durable session under cfg.ClientID and subscribes
// to cfg.Filter at QoS 1; records start flowing at once.
func OpenReader(ctx context.Context, cfg ReaderConfig) (*Reader, error) {
	if cfg.Addr == "" || cfg.ClientID == "" || cfg.Filter == "" {
		return nil, errors.New("reader: Addr, ClientID and Filter are required")
	}
	if cfg.Records < 1 {
		return nil, fmt.Errorf("reader: %d records, want at least 1", cfg.Records)
	}
	if cfg.FirstOffset == 0 {
		cfg.FirstOffset = 1
	}
	if cfg.SessionExpiry == 0 {
		cfg.SessionExpiry = 300
	}
	if cfg.ReceiveMaximum == 0 {
		cfg.ReceiveMaximum = 1024
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Second
	}
	r := &Reader{cfg: cfg, next: cfg.FirstOffset, complete: make(chan struct{})}
	// The clock starts before CONNECT: a broker may begin the replay the
	// moment the SUBSCRIBE is read, and records can trail the SUBACK.
	r.started = time.Now()
	sub, present, err := dialSubscriber(ctx, cfg.Addr, subscriberOptions{
		ClientID:       cfg.ClientID,
		CleanStart:     false,
		SessionExpiry:  cfg.SessionExpiry,
		ReceiveMaximum: cfg.ReceiveMaximum,
		Filter:         cfg.Filter,
		QoS:            1,
		Timeout:        cfg.PacketTimeout,
		OnPublish:      r.onPublish,
	})
	if err != nil {
		return nil, fmt.Errorf("reader: %w", err)
	}
	if present {
		sub.close()
		return nil, fmt.Errorf("reader: client id %q already has a session; a replay measurement needs a fresh one", cfg.ClientID)
	}
	r.sub = sub
	return r, nil
}

// onPublish runs on the subscriber's read loop, once per record, in order.
func (r *Reader) onPublish(d *delivery) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		if r.err == nil {
			r.extra++
		}
		return
	}
	off, err := recordOffset(d)
	if err == nil && off != r.next {
		if off < r.next {
			err = fmt.Errorf("offset %d after offset %d: a record delivered twice or out of order", off, r.next-1)
		} else {
			err = fmt.Errorf("offset %d where %d was due: %d records skipped", off, r.next, off-r.next)
		}
	}
	if err != nil {
		r.err = fmt.Errorf("record %d on %s: %w", r.n+1, d.Topic, err)
		r.finish()
		return
	}
	r.next++
	r.n++
	r.lastAt = now
	if r.cfg.Observe != nil {
		r.cfg.Observe(d.Payload)
	}
	if r.n == r.cfg.Records {
		r.finish()
	}
}

// finish closes complete once; r.mu is held.
func (r *Reader) finish() {
	if !r.finished {
		r.finished = true
		close(r.complete)
	}
}

// recordOffset reads a delivery's saguin-offset and checks the other two
// properties every channel record carries are there.
func recordOffset(d *delivery) (uint64, error) {
	raw := d.Prop(PropOffset)
	if raw == nil {
		return 0, fmt.Errorf("no %s User Property: not a channel record", PropOffset)
	}
	off, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || off == 0 {
		return 0, fmt.Errorf("%s %q is not a positive integer", PropOffset, raw)
	}
	if len(d.Prop(PropID)) == 0 {
		return 0, fmt.Errorf("offset %d has no %s User Property", off, PropID)
	}
	if len(d.Prop(PropTimestamp)) == 0 {
		return 0, fmt.Errorf("offset %d has no %s User Property", off, PropTimestamp)
	}
	return off, nil
}

// Read waits for the records, then disconnects (the session is left to
// expire). It fails on a gap or repeat in the offsets, on IdleTimeout
// without progress, on the connection ending, and - with Quiet - on any
// record beyond the expected count.
func (r *Reader) Read(ctx context.Context) (ReadResult, error) {
	defer r.sub.close()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lastN, lastChange := int64(-1), time.Now()
wait:
	for {
		select {
		case <-r.complete:
			break wait
		case <-ctx.Done():
			return r.result(), fmt.Errorf("read interrupted at record %d of %d: %w", r.count(), r.cfg.Records, ctx.Err())
		case <-r.sub.done:
			// The connection may have ended right after the last record.
			select {
			case <-r.complete:
				break wait
			default:
			}
			return r.result(), fmt.Errorf("connection ended at record %d of %d: %v", r.count(), r.cfg.Records, r.sub.err)
		case <-tick.C:
			if n := r.count(); n != lastN {
				lastN, lastChange = n, time.Now()
			} else if time.Since(lastChange) > r.cfg.IdleTimeout {
				return r.result(), fmt.Errorf("no record for %s at record %d of %d (next offset due %d)", r.cfg.IdleTimeout, n, r.cfg.Records, r.nextOffset())
			}
		}
	}
	r.mu.Lock()
	err := r.err
	r.mu.Unlock()
	if err != nil {
		return r.result(), err
	}
	if r.cfg.Quiet > 0 {
		select {
		case <-time.After(r.cfg.Quiet):
		case <-ctx.Done():
			return r.result(), ctx.Err()
		}
		r.mu.Lock()
		extra := r.extra
		r.mu.Unlock()
		if extra > 0 {
			return r.result(), fmt.Errorf("%d records arrived after the %d expected", extra, r.cfg.Records)
		}
	}
	return r.result(), nil
}

func (r *Reader) count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *Reader) nextOffset() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

func (r *Reader) result() ReadResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := ReadResult{Records: r.n, FirstOffset: r.cfg.FirstOffset}
	if r.n > 0 {
		res.LastOffset = r.next - 1
		res.Elapsed = r.lastAt.Sub(r.started)
	}
	return res
}

// Replay opens a reader and reads: the whole channel read in one call.
func Replay(ctx context.Context, cfg ReaderConfig) (ReadResult, error) {
	r, err := OpenReader(ctx, cfg)
	if err != nil {
		return ReadResult{}, err
	}
	return r.Read(ctx)
}
