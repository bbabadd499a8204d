package memory

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
)

// appendLog is an append channel (or a queue's dead-letter log). recs
// holds the held records in ascending offset order; retention removes a
// prefix of them (docs/channels.md "When retention passes a position").
type appendLog struct {
	p     *Provider
	name  string
	queue string // the queue whose dead letters this is, "" for a channel

	mu        sync.RWMutex
	recs      deque[storage.Record]
	next      uint64 // stored, never derived from recs (invariant 9)
	floor     uint64 // stored, never derived from recs (invariant 1)
	bytes     int64
	maxBytes  int64
	positions map[string]storage.Position
	holds     holdSet // unreleased QoS 2 publishes (holds.go)
}

var (
	_ storage.AppendLog = (*appendLog)(nil)
	_ storage.Submitter = (*appendLog)(nil)
)

func newLog(p *Provider, name string) *appendLog {
	return &appendLog{p: p, name: name, next: 1, floor: 1, positions: map[string]storage.Position{}}
}

func (l *appendLog) errf(format string, args ...any) error {
	return l.p.errf(l.name, format, args...)
}

// clone copies what the caller may reuse (byte slices, headers, the two
// optional properties) into memory the store owns: one allocation for the
// byte fields, one for headers, one for both optional properties.
func clone(r storage.Record) storage.Record {
	if n := len(r.Payload) + len(r.CorrelationData); n > 0 {
		buf := make([]byte, n)
		p := copy(buf, r.Payload)
		copy(buf[p:], r.CorrelationData)
		r.Payload, r.CorrelationData = sub(buf[:p]), sub(buf[p:])
	} else {
		r.Payload, r.CorrelationData = nil, nil
	}
	if len(r.Headers) > 0 {
		r.Headers = slices.Clone(r.Headers)
	} else {
		r.Headers = nil
	}
	if r.PayloadFormat != nil || r.MessageExpiry != nil {
		o := new(struct {
			pf byte
			me uint32
		})
		if r.PayloadFormat != nil {
			o.pf, r.PayloadFormat = *r.PayloadFormat, &o.pf
		}
		if r.MessageExpiry != nil {
			o.me, r.MessageExpiry = *r.MessageExpiry, &o.me
		}
	}
	r.Timestamp = snapshot.Normalize(r.Timestamp)
	return r
}

// sub caps a slice at its length, so nobody can append into its neighbour;
// empty is nil.
func sub(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b[:len(b):len(b)]
}

// Append stores rec at the next offset. ErrFull when the channel's own
// bound or the provider's bound less its reserve refuses it; nothing is
// evicted and no offset is consumed.
func (l *appendLog) Append(rec storage.Record) (storage.Record, error) {
	rec = clone(rec)
	size := rec.Size()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p.closed.Load() {
		return storage.Record{}, l.errf("%w", storage.ErrClosed)
	}
	if l.maxBytes > 0 && l.bytes+size > l.maxBytes {
		return storage.Record{}, l.errf("record of %d bytes over max_bytes %d (holding %d): %w", size, l.maxBytes, l.bytes, storage.ErrFull)
	}
	if !l.p.admit(size) {
		return storage.Record{}, l.errf("record of %d bytes: provider at max_bytes %d less reserve %d: %w",
			size, l.p.maxBytes, l.p.reserve, storage.ErrFull)
	}
	return l.appendLocked(rec, size), nil
}

// appendLocked takes the next offset; the caller holds mu and has charged
// size to the provider.
func (l *appendLog) appendLocked(rec storage.Record, size int64) storage.Record {
	// invariant 9: the offset comes from the stored counter, never from the records held.
	rec.Offset = l.next
	l.next++
	l.recs.Push(rec)
	l.bytes += size
	return rec
}

// undoAppendLocked hands back the offset and bytes of the last append, so
// a failed transaction leaves no hole (invariant 5, invariant 9).
func (l *appendLog) undoAppendLocked(size int64) {
	l.recs.PopBack()
	l.next--
	l.bytes -= size
	l.p.bytes.Add(-size)
}

// Read returns up to max records from offset from, and the floor read under
// the same lock. Invariant 1: a from below the floor is refused, never
// served the oldest survivor.
func (l *appendLog) Read(from uint64, max int) ([]storage.Record, uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.p.closed.Load() {
		return nil, 0, l.errf("%w", storage.ErrClosed)
	}
	floor := l.floor
	// invariant 1: below the floor is refused, never served the oldest survivor.
	if from < floor {
		return nil, floor, l.errf("read from %d, floor is %d: %w", from, floor, storage.ErrBelowFloor)
	}
	if from >= l.next || max <= 0 {
		return nil, floor, nil
	}
	i := l.recs.Search(func(r *storage.Record) bool { return r.Offset >= from })
	n := min(max, l.recs.Len()-i)
	if n == 0 {
		return nil, floor, nil
	}
	out := make([]storage.Record, n)
	for k := range out {
		out[k] = *l.recs.At(i + k)
	}
	return out, floor, nil
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (l *appendLog) Next() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.next
}

func (l *appendLog) Floor() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.floor
}

func (l *appendLog) Bytes() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.bytes
}

func (l *appendLog) SetMaxBytes(n int64) {
	l.mu.Lock()
	l.maxBytes = max(n, 0)
	l.mu.Unlock()
}

// FirstAtOrAfter scans every held record from the oldest and returns the
// first whose timestamp is >= t. No bisection: wall clocks step backwards,
// so timestamps are not sorted by offset.
func (l *appendLog) FirstAtOrAfter(t time.Time) (uint64, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.p.closed.Load() {
		return 0, false, l.errf("%w", storage.ErrClosed)
	}
	for i := range l.recs.Len() {
		if r := l.recs.At(i); !r.Timestamp.Before(t) {
			return r.Offset, true, nil
		}
	}
	return 0, false, nil
}

// Trim removes, from the oldest, records older than olderThan and then
// records while the channel is over maxBytes. It walks from the oldest and
// stops at the first keeper, so only a prefix goes and the floor can name
// it. Invariant 1: the floor is raised under the same lock as the
// deletion, on the size path as on the age path. Retention never uses the
// reserve; it only gives bytes back.
func (l *appendLog) Trim(olderThan time.Time, maxBytes int64) (int, int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p.closed.Load() {
		return 0, 0, l.errf("%w", storage.ErrClosed)
	}
	i, n := 0, l.recs.Len()
	var freed int64
	if !olderThan.IsZero() {
		for ; i < n; i++ {
			r := l.recs.At(i)
			if r.Timestamp.IsZero() || !r.Timestamp.Before(olderThan) { // a record with no timestamp is never too old
				break
			}
			freed += r.Size()
		}
	}
	if maxBytes > 0 {
		for ; i < n && l.bytes-freed > maxBytes; i++ {
			freed += l.recs.At(i).Size()
		}
	}
	if i == 0 {
		return 0, 0, nil
	}
	// invariant 1: the floor rises under the deletion's lock, on the size path too.
	l.floor = max(l.floor, l.recs.At(i-1).Offset+1)
	l.recs.DropFront(i)
	l.bytes -= freed
	l.p.bytes.Add(-freed)
	return i, freed, nil
}

// Position returns a reader's stored position.
func (l *appendLog) Position(reader string) (storage.Position, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.p.closed.Load() {
		return storage.Position{}, false, l.errf("%w", storage.ErrClosed)
	}
	pos, ok := l.positions[reader]
	return pos, ok, nil
}

// SavePosition stores a reader's position. Never refused for capacity: a
// bound may not block a consumer's progress (docs/channels.md "`queue`").
// A position past next is refused (ErrBeyondEnd): positions lag, never
// lead, and a snapshot holding one would not load.
func (l *appendLog) SavePosition(pos storage.Position) error {
	if !validReader(pos.Reader) {
		return l.errf("reader %q is not mqtt:<client id> or bridge:<bridge name>", pos.Reader)
	}
	pos.LastSeen = snapshot.Normalize(pos.LastSeen)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p.closed.Load() {
		return l.errf("%w", storage.ErrClosed)
	}
	if pos.Offset > l.next {
		return l.errf("position %d for %s past next offset %d: %w", pos.Offset, pos.Reader, l.next, storage.ErrBeyondEnd)
	}
	l.positions[pos.Reader] = pos
	return nil
}

func validReader(r string) bool {
	name, ok := strings.CutPrefix(r, "mqtt:")
	if !ok {
		name, ok = strings.CutPrefix(r, "bridge:")
	}
	return ok && name != ""
}

// DropPosition removes a reader's position.
func (l *appendLog) DropPosition(reader string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p.closed.Load() {
		return false, l.errf("%w", storage.ErrClosed)
	}
	_, ok := l.positions[reader]
	delete(l.positions, reader)
	return ok, nil
}

// LowestPosition is the lowest stored position and how many are stored, in
// one pass over the map (storage.AppendLog).
func (l *appendLog) LowestPosition() (uint64, int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.p.closed.Load() {
		return 0, 0, l.errf("%w", storage.ErrClosed)
	}
	var lowest uint64
	first := true
	for _, pos := range l.positions {
		if first || pos.Offset < lowest {
			lowest, first = pos.Offset, false
		}
	}
	return lowest, len(l.positions), nil
}

// Positions lists every stored position, ordered by reader.
func (l *appendLog) Positions() ([]storage.Position, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.p.closed.Load() {
		return nil, l.errf("%w", storage.ErrClosed)
	}
	out := make([]storage.Position, 0, len(l.positions))
	for _, r := range slices.Sorted(maps.Keys(l.positions)) {
		out = append(out, l.positions[r])
	}
	return out, nil
}

// expirePositions drops mqtt: positions whose session would have expired
// while the broker was down. bridge: readers exist only while configured,
// so they are not judged by a clock (docs/operations.md "Storage files").
func (l *appendLog) expirePositions(now time.Time) (dropped []string) {
	for r, pos := range l.positions {
		if strings.HasPrefix(r, "mqtt:") && now.After(pos.LastSeen.Add(pos.Expiry)) {
			delete(l.positions, r)
			dropped = append(dropped, r)
		}
	}
	slices.Sort(dropped)
	return dropped
}

// checkLoaded is the decoder post-check on a log read from a snapshot
// (rfcs/storage-memory.md): counters sane, offsets ascending inside [floor, next),
// no position past next.
func (l *appendLog) checkLoaded() error {
	if l.next < 1 || l.floor < 1 || l.floor > l.next {
		return fmt.Errorf("log %q: next %d, floor %d (want 1 <= floor <= next)", l.name, l.next, l.floor)
	}
	prev := uint64(0)
	for i := range l.recs.Len() {
		r := l.recs.At(i)
		if r.Offset <= prev || r.Offset < l.floor || r.Offset >= l.next {
			return fmt.Errorf("log %q: record offset %d after %d (want ascending, >= floor %d, < next %d)",
				l.name, r.Offset, prev, l.floor, l.next)
		}
		prev = r.Offset
	}
	for _, pos := range l.positions {
		if pos.Offset > l.next {
			return fmt.Errorf("log %q: position of %s at %d past next %d", l.name, pos.Reader, pos.Offset, l.next)
		}
	}
	return nil
}

// sizeOf sums Size over records.
func sizeOf(recs []storage.Record) (n int64) {
	for i := range recs {
		n += recs[i].Size()
	}
	return n
}

// Submit is Append answered at once: the memory provider stores on the
// caller's goroutine, so a record is as durable as it will be (until the
// snapshot at close) when Append returns, and one goroutine's records take
// offsets in the order it submits them.
func (l *appendLog) Submit(rec storage.Record) storage.Pending {
	return storage.Answered(l.Append(rec))
}
