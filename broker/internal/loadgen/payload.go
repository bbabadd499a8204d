package loadgen

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// Payload layout. Every message names the run, the publisher and its
// sequence number within that publisher, so a reader can account for each
// message individually rather than trusting a total: a lost message and a
// duplicated one cancel out in a count.
//
//	bytes 0-3   run tag (big endian uint32), distinct per run
//	bytes 4-7   publisher index
//	bytes 8-15  sequence number within the publisher, from 0
//	bytes 16-   filler
const (
	headerSize = 16
	// MinPayload is the smallest payload that carries the header.
	MinPayload = headerSize
	// MaxPayload bounds the payload size a caller may ask for (invariant 13).
	MaxPayload = 1 << 20
	// DefaultPayload is the payload size the benchmark issue names.
	DefaultPayload = 128
)

// maxPublishers bounds the publisher count of one run, and so the tracker's
// per-publisher tables (invariant 13).
const maxPublishers = 4096

func encodePayload(buf []byte, run uint32, pub uint32, seq uint64) {
	binary.BigEndian.PutUint32(buf[0:4], run)
	binary.BigEndian.PutUint32(buf[4:8], pub)
	binary.BigEndian.PutUint64(buf[8:16], seq)
	for i := headerSize; i < len(buf); i++ {
		buf[i] = 'a' + byte(i%26)
	}
}

// decodePayload reads the header; ok is false for a payload too short to
// carry one.
func decodePayload(b []byte) (run uint32, pub uint32, seq uint64, ok bool) {
	if len(b) < headerSize {
		return 0, 0, 0, false
	}
	return binary.BigEndian.Uint32(b[0:4]), binary.BigEndian.Uint32(b[4:8]), binary.BigEndian.Uint64(b[8:16]), true
}

// Tracker accounts for the messages of one run as a reader receives them:
// each (publisher, sequence) must arrive exactly once, must have been
// published, and - when each publisher had one message in flight - must
// arrive in the order it was published (MQTT 5 §4.6: the server treats each
// topic as an Ordered Topic, and a publisher that waits for each PUBACK
// before the next publish has fixed that order itself).
type Tracker struct {
	run        uint32
	checkOrder bool
	// published reports how many sequence numbers publisher p has taken so
	// far; a received sequence at or above it was never published.
	published func(p int) uint64

	mu       sync.Mutex
	seen     [][]uint64 // per publisher, a bitset of received sequences
	last     []int64    // per publisher, the last sequence received (-1: none)
	received int64
	dups     int64
	phantoms int64
	foreign  int64
	reorders int64
	example  string // the first anomaly, for the error message
}

// NewTracker tracks a run of publishers publishers. published(p) must return
// the count of sequence numbers publisher p has taken (and so may have sent);
// it is read on every message, so it is typically an atomic load.
func NewTracker(run uint32, publishers int, checkOrder bool, published func(p int) uint64) (*Tracker, error) {
	if publishers < 1 || publishers > maxPublishers {
		return nil, fmt.Errorf("tracker: %d publishers, want 1..%d", publishers, maxPublishers)
	}
	t := &Tracker{
		run:        run,
		checkOrder: checkOrder,
		published:  published,
		seen:       make([][]uint64, publishers),
		last:       make([]int64, publishers),
	}
	for i := range t.last {
		t.last[i] = -1
	}
	return t, nil
}

// Observe records one received payload.
func (t *Tracker) Observe(payload []byte) {
	run, pub, seq, ok := decodePayload(payload)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.received++
	if !ok || run != t.run {
		t.foreign++
		t.note(fmt.Sprintf("a message not from this run (%d bytes)", len(payload)))
		return
	}
	if int(pub) >= len(t.seen) || seq >= t.published(int(pub)) {
		// Checked before the bitset grows: a corrupt sequence number must not
		// size an allocation (invariant 13).
		t.phantoms++
		t.note(fmt.Sprintf("publisher %d sequence %d, which was never published", pub, seq))
		return
	}
	bits := t.seen[pub]
	word := seq / 64
	if word >= uint64(len(bits)) {
		grown := make([]uint64, max(word+1, uint64(2*len(bits))))
		copy(grown, bits)
		bits = grown
		t.seen[pub] = bits
	}
	mask := uint64(1) << (seq % 64)
	if bits[word]&mask != 0 {
		t.dups++
		t.note(fmt.Sprintf("publisher %d sequence %d delivered twice", pub, seq))
		return
	}
	bits[word] |= mask
	if t.checkOrder && int64(seq) < t.last[pub] {
		t.reorders++
		t.note(fmt.Sprintf("publisher %d sequence %d after sequence %d", pub, seq, t.last[pub]))
	}
	if int64(seq) > t.last[pub] {
		t.last[pub] = int64(seq)
	}
}

func (t *Tracker) note(s string) {
	if t.example == "" {
		t.example = s
	}
}

// Received is the number of messages observed, anomalies included.
func (t *Tracker) Received() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.received
}

// Check compares what was received with what was acknowledged: acked[p] is
// the number of messages publisher p had acknowledged, sequences 0..acked[p]-1.
// It returns the number of distinct messages received and an error naming
// every kind of anomaly seen.
func (t *Tracker) Check(acked []uint64) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(acked) != len(t.seen) {
		return 0, fmt.Errorf("tracker: %d publisher counts for %d publishers", len(acked), len(t.seen))
	}
	var distinct, missing int64
	var firstMissing string
	for p, n := range acked {
		bits := t.seen[p]
		for seq := uint64(0); seq < n; seq++ {
			w := seq / 64
			if w < uint64(len(bits)) && bits[w]&(1<<(seq%64)) != 0 {
				distinct++
				continue
			}
			missing++
			if firstMissing == "" {
				firstMissing = fmt.Sprintf("publisher %d sequence %d", p, seq)
			}
		}
	}
	// A sequence received but beyond what its publisher had acknowledged
	// was published without a PUBACK, which a run that returned no error
	// never does; count it with the phantoms.
	unacked := t.received - t.dups - t.phantoms - t.foreign - distinct
	if missing == 0 && t.dups == 0 && t.phantoms == 0 && t.foreign == 0 && t.reorders == 0 && unacked == 0 {
		return distinct, nil
	}
	msg := fmt.Sprintf("run %08x: %d acknowledged, %d received: %d lost, %d duplicated, %d never published, %d from elsewhere, %d out of order, %d not acknowledged",
		t.run, sum(acked), t.received, missing, t.dups, t.phantoms, t.foreign, t.reorders, unacked)
	if firstMissing != "" {
		msg += "; first lost: " + firstMissing
	}
	if t.example != "" {
		msg += "; first anomaly: " + t.example
	}
	return distinct, fmt.Errorf("%s", msg)
}

func sum(xs []uint64) uint64 {
	var s uint64
	for _, x := range xs {
		s += x
	}
	return s
}

// Ledger accounts for the messages of several finished runs read back
// together, as from a channel that all of them published into.
type Ledger struct {
	runs  map[uint32]*Tracker
	acked map[uint32][]uint64
	order []uint32

	mu      sync.Mutex
	foreign int64
	example string
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{runs: map[uint32]*Tracker{}, acked: map[uint32][]uint64{}}
}

// Add registers a finished run and its per-publisher acknowledged counts.
// Add must not be called once Observe has been.
func (l *Ledger) Add(r Result) error {
	if _, dup := l.runs[r.Run]; dup {
		return fmt.Errorf("ledger: run %08x added twice", r.Run)
	}
	acked := append([]uint64(nil), r.AckedBy...)
	t, err := NewTracker(r.Run, len(acked), false, func(p int) uint64 { return acked[p] })
	if err != nil {
		return err
	}
	l.runs[r.Run] = t
	l.acked[r.Run] = acked
	l.order = append(l.order, r.Run)
	return nil
}

// Total is the number of messages every added run had acknowledged.
func (l *Ledger) Total() int64 {
	var n uint64
	for _, a := range l.acked {
		n += sum(a)
	}
	return int64(n)
}

// Observe records one payload read back.
func (l *Ledger) Observe(payload []byte) {
	run, _, _, ok := decodePayload(payload)
	if t, known := l.runs[run]; ok && known {
		t.Observe(payload)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.foreign++
	if l.example == "" {
		l.example = fmt.Sprintf("a %d-byte message from no registered run", len(payload))
	}
}

// Check reports whether every acknowledged message of every run was read
// exactly once and nothing else was.
func (l *Ledger) Check() error {
	var errs errFirst
	for _, run := range l.order {
		_, err := l.runs[run].Check(l.acked[run])
		errs.add(err)
	}
	l.mu.Lock()
	if l.foreign > 0 {
		errs.add(fmt.Errorf("%d messages from no registered run; first: %s", l.foreign, l.example))
	}
	l.mu.Unlock()
	return errs.err()
}
