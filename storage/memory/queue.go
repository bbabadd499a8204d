package memory

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
)

// queueStore keeps a queue's unresolved work. Who holds a record, its
// Delivery ID, deadline and epoch are the broker's and never here
// (invariant 15); what is here is the record and its attempt history.
//
// items is in ascending offset order. Resolution happens anywhere, so a
// resolved item becomes a tombstone (offset kept for the search, record
// cleared); the tombstoned prefix is skipped by head, and the slice is
// compacted once tombstones are half of it, so reads skip at most as many
// tombstones as there are live items.
type queueStore struct {
	p    *Provider
	name string
	dlq  *appendLog

	mu       sync.Mutex
	items    []qitem
	head     int // items[:head] are all tombstones
	gone     int // tombstones in items[head:]
	live     int
	next     uint64 // stored, never derived (invariant 9)
	bytes    int64
	maxBytes int64
	holds    holdSet // unreleased QoS 2 publishes (holds.go)
}

type qitem struct {
	storage.QueueItem
	gone bool
}

var (
	_ storage.QueueStore = (*queueStore)(nil)
	_ storage.Submitter  = (*queueStore)(nil)
)

func (q *queueStore) errf(format string, args ...any) error {
	return q.p.errf(q.name, format, args...)
}

// Enqueue stores a job at the next offset. ErrFull at the queue's bound or
// the provider's bound less its reserve: flow control, never eviction
// (invariant 2).
func (q *queueStore) Enqueue(rec storage.Record) (storage.Record, error) {
	rec = clone(rec)
	size := rec.Size()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return storage.Record{}, q.errf("%w", storage.ErrClosed)
	}
	if q.maxBytes > 0 && q.bytes+size > q.maxBytes {
		return storage.Record{}, q.errf("job of %d bytes over max_bytes %d (holding %d): %w", size, q.maxBytes, q.bytes, storage.ErrFull)
	}
	if !q.p.admit(size) {
		return storage.Record{}, q.errf("job of %d bytes: provider at max_bytes %d less reserve %d: %w",
			size, q.p.maxBytes, q.p.reserve, storage.ErrFull)
	}
	// invariant 9: the offset comes from the stored counter, never from the jobs held.
	rec.Offset = q.next
	q.next++
	q.items = append(q.items, qitem{QueueItem: storage.QueueItem{Record: rec}})
	q.live++
	q.bytes += size
	return rec, nil
}

// find returns the index of the unresolved item at offset.
func (q *queueStore) find(offset uint64) (int, bool) {
	i, ok := slices.BinarySearchFunc(q.items[q.head:], offset, func(it qitem, o uint64) int {
		return cmpU64(it.Offset, o)
	})
	i += q.head
	return i, ok && !q.items[i].gone
}

func (q *queueStore) notFound(offset uint64) error {
	return q.errf("no unresolved job at offset %d: %w", offset, storage.ErrNotFound)
}

// Items returns up to max unresolved items with offset > after.
func (q *queueStore) Items(after uint64, max int) ([]storage.QueueItem, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return nil, q.errf("%w", storage.ErrClosed)
	}
	if max <= 0 {
		return nil, nil
	}
	i, found := slices.BinarySearchFunc(q.items[q.head:], after, func(it qitem, o uint64) int {
		return cmpU64(it.Offset, o)
	})
	i += q.head
	if found {
		i++
	}
	var out []storage.QueueItem
	for ; i < len(q.items) && len(out) < max; i++ {
		if !q.items[i].gone {
			out = append(out, q.items[i].QueueItem)
		}
	}
	return out, nil
}

// Get returns one unresolved item.
func (q *queueStore) Get(offset uint64) (storage.QueueItem, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return storage.QueueItem{}, q.errf("%w", storage.ErrClosed)
	}
	i, ok := q.find(offset)
	if !ok {
		return storage.QueueItem{}, q.notFound(offset)
	}
	return q.items[i].QueueItem, nil
}

// CountAttempt counts one delivery attempt. It is a relief operation: the
// attempt count is the precondition of the dead-letter move, so a bound
// never refuses it (docs/channels.md "`queue`"), and it changes no byte
// count.
func (q *queueStore) CountAttempt(offset uint64, at time.Time) (storage.QueueItem, error) {
	at = snapshot.Normalize(at)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return storage.QueueItem{}, q.errf("%w", storage.ErrClosed)
	}
	i, ok := q.find(offset)
	if !ok {
		return storage.QueueItem{}, q.notFound(offset)
	}
	it := &q.items[i].QueueItem
	if it.Attempts < math.MaxUint32 {
		it.Attempts++
	}
	if it.FirstDelivered.IsZero() {
		it.FirstDelivered = at
	}
	it.LastDelivered = at
	return *it, nil
}

// Resolve removes a finished item, giving its bytes back.
func (q *queueStore) Resolve(offset uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return q.errf("%w", storage.ErrClosed)
	}
	i, ok := q.find(offset)
	if !ok {
		return q.notFound(offset)
	}
	q.removeLocked(i)
	return nil
}

// removeLocked tombstones items[i] and returns its bytes to the queue and
// the provider in the same critical section.
func (q *queueStore) removeLocked(i int) {
	size := q.items[i].Size()
	q.items[i] = qitem{QueueItem: storage.QueueItem{Record: storage.Record{Offset: q.items[i].Offset}}, gone: true}
	q.live--
	q.gone++
	q.bytes -= size
	q.p.bytes.Add(-size)
	for q.head < len(q.items) && q.items[q.head].gone {
		q.head++
		q.gone--
	}
	if q.head+q.gone < len(q.items)/2 {
		return
	}
	// Compact in place (the write index never passes the read index), or
	// into a fresh array when the old one is far larger than what is held.
	kept := q.items[:0]
	if cap(q.items) > 4*max(q.live, 256) {
		kept = make([]qitem, 0, 2*q.live)
	}
	for _, it := range q.items[q.head:] {
		if !it.gone {
			kept = append(kept, it)
		}
	}
	clear(q.items[len(kept):])
	q.items, q.head, q.gone = kept, 0, 0
}

// DeadLetter moves an item into the dead-letter log. Invariant 5: the
// append and the removal happen under both locks - queue, then log, always
// in that order so two movers cannot deadlock - and a failure between them
// undoes the append, handing back the dead-letter offset (no hole), so
// neither half happens and the item keeps its attempts. The record keeps
// its MessageID (invariant 8), takes the given topic, the extra headers
// after its own, and at as its timestamp: it arrives in the dead-letter
// channel at that moment, and that channel's retention counts from it.
// A relief operation: it is charged, never refused for capacity, and the
// dead-letter channel's own bound does not apply to it.
func (q *queueStore) DeadLetter(offset uint64, topic string, extra []storage.Header, at time.Time) (storage.Record, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.p.closed.Load() {
		return storage.Record{}, q.errf("%w", storage.ErrClosed)
	}
	i, ok := q.find(offset)
	if !ok {
		return storage.Record{}, q.notFound(offset)
	}
	// invariant 8: the dead letter keeps the job's Message ID; only its offset is new.
	rec := q.items[i].Record
	rec.Topic = topic
	if len(extra) > 0 {
		hs := make([]storage.Header, 0, len(rec.Headers)+len(extra))
		rec.Headers = append(append(hs, rec.Headers...), extra...)
	}
	rec.Timestamp = snapshot.Normalize(at)
	size := rec.Size()

	l := q.dlq
	// invariant 5: both halves under both locks; a failure between them undoes the append.
	l.mu.Lock()
	defer l.mu.Unlock()
	l.p.bytes.Add(size)
	stored := l.appendLocked(rec, size)
	if f := q.p.faults.BetweenDeadLetterHalves; f != nil {
		if err := f(); err != nil {
			l.undoAppendLocked(size)
			return storage.Record{}, q.errf("dead-letter move of offset %d into %q: %w", offset, l.name, err)
		}
	}
	q.removeLocked(i)
	return stored, nil
}

func (q *queueStore) DeadLetters() storage.AppendLog { return q.dlq }

func (q *queueStore) Next() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.next
}

func (q *queueStore) Depth() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.live
}

func (q *queueStore) Bytes() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes
}

func (q *queueStore) SetMaxBytes(n int64) {
	q.mu.Lock()
	q.maxBytes = max(n, 0)
	q.mu.Unlock()
}

// checkLoaded is the decoder post-check on a queue read from a snapshot.
func (q *queueStore) checkLoaded() error {
	if q.next < 1 {
		return fmt.Errorf("queue %q: next %d (want >= 1)", q.name, q.next)
	}
	prev := uint64(0)
	for _, it := range q.items {
		if it.Offset <= prev || it.Offset >= q.next {
			return fmt.Errorf("queue %q: item offset %d after %d (want ascending, >= 1, < next %d)", q.name, it.Offset, prev, q.next)
		}
		prev = it.Offset
	}
	return nil
}

// Submit is Enqueue answered at once (appendLog.Submit).
func (q *queueStore) Submit(rec storage.Record) storage.Pending {
	return storage.Answered(q.Enqueue(rec))
}
