package memory

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"saguin.dev/storage"
)

// scanPage is how many values Scan copies out under the lock at a time: fn
// runs with no lock held, so it may call the store (or take its time)
// without stalling a Put.
const scanPage = 256

// valueStore keeps one current value per topic (the retained store, latest
// channels). vals is ordered by topic, byte-wise, so Get is a binary search
// and Scan walks it in order; it holds pointers so inserting a new topic
// moves eight bytes per value, not a whole record. byOffset holds the same
// values in offset order for Since: a Put appends (its offset is the
// highest), and a replaced or removed value leaves a hole there, compacted
// away once holes outnumber the values.
type valueStore struct {
	p    *Provider
	name string

	mu       sync.RWMutex
	vals     []*storage.Record
	byOffset []offsetEntry
	holes    int
	next     uint64 // stored, never derived from vals (invariant 9)
	bytes    int64
	holds    holdSet // unreleased QoS 2 publishes (holds.go)
}

// offsetEntry is one value in offset order; rec is nil once the value was
// replaced or removed (a hole).
type offsetEntry struct {
	off uint64
	rec *storage.Record
}

var (
	_ storage.ValueStore = (*valueStore)(nil)
	_ storage.Submitter  = (*valueStore)(nil)
)

func newValues(p *Provider, name string) *valueStore {
	return &valueStore{p: p, name: name, next: 1}
}

func (v *valueStore) errf(format string, args ...any) error {
	return fmt.Errorf("memory provider %q: value store %q: %w", v.p.name, v.name, fmt.Errorf(format, args...))
}

// find returns where topic is, or would be inserted, in vals.
func (v *valueStore) find(topic string) (int, bool) {
	return slices.BinarySearchFunc(v.vals, topic, func(r *storage.Record, t string) int {
		return strings.Compare(r.Topic, t)
	})
}

// Put stores rec as its topic's current value at the next offset,
// replacing the earlier value in the same critical section. The growth
// (new size less the replaced value's) is charged against the provider's
// max_bytes less its reserve, so a Put that replaces a value at least as
// large is never refused: it frees what it takes. A refused Put consumes
// no offset and leaves the old value in place (invariant 2: never evict).
func (v *valueStore) Put(rec storage.Record) (storage.Record, error) {
	if rec.Topic == "" {
		return storage.Record{}, v.errf("a value needs a topic")
	}
	rec = clone(rec)
	size := rec.Size()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.p.closed.Load() {
		return storage.Record{}, v.errf("%w", storage.ErrClosed)
	}
	i, found := v.find(rec.Topic)
	var old int64
	if found {
		old = v.vals[i].Size()
	}
	if grow := size - old; grow > 0 {
		if !v.p.admit(grow) {
			return storage.Record{}, v.errf("value of %d bytes for %q (replacing %d): provider at max_bytes %d less reserve %d: %w",
				size, rec.Topic, old, v.p.maxBytes, v.p.reserve, storage.ErrFull)
		}
	} else {
		v.p.bytes.Add(grow) // gives back what a smaller value frees
	}
	// invariant 9: the offset comes from the stored counter, which never moves back.
	rec.Offset = v.next
	v.next++
	stored := &rec
	v.byOffset = append(v.byOffset, offsetEntry{off: rec.Offset, rec: stored})
	if found {
		replaced := v.vals[i].Offset
		v.vals[i] = stored
		v.unindex(replaced) // after vals is current: it may reindex from vals
	} else {
		v.vals = slices.Insert(v.vals, i, stored)
	}
	v.bytes += size - old
	return rec, nil
}

// unindex turns the offset-order entry of a value that has left vals into
// a hole, and compacts the index (from vals) once holes outnumber the
// values. Caller holds the write lock.
func (v *valueStore) unindex(off uint64) {
	j, found := slices.BinarySearchFunc(v.byOffset, off, func(e offsetEntry, o uint64) int {
		return cmp.Compare(e.off, o)
	})
	if !found || v.byOffset[j].rec == nil {
		return
	}
	v.byOffset[j].rec = nil
	v.holes++
	if v.holes > 64 && v.holes > len(v.vals) {
		v.reindex()
	}
}

// reindex rebuilds byOffset from vals, with no holes.
func (v *valueStore) reindex() {
	v.byOffset = make([]offsetEntry, len(v.vals))
	for i, r := range v.vals {
		v.byOffset[i] = offsetEntry{off: r.Offset, rec: r}
	}
	slices.SortFunc(v.byOffset, func(a, b offsetEntry) int { return cmp.Compare(a.off, b.off) })
	v.holes = 0
}

// Remove deletes a topic's value and gives its bytes back. Never refused
// for capacity: it only frees. The offset counter does not move back.
func (v *valueStore) Remove(topic string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.p.closed.Load() {
		return false, v.errf("%w", storage.ErrClosed)
	}
	i, found := v.find(topic)
	if !found {
		return false, nil
	}
	v.removeAt(i)
	return true, nil
}

// RemoveIf deletes a topic's value only while it is the one at offset.
func (v *valueStore) RemoveIf(topic string, offset uint64) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.p.closed.Load() {
		return false, v.errf("%w", storage.ErrClosed)
	}
	i, found := v.find(topic)
	if !found || v.vals[i].Offset != offset {
		return false, nil
	}
	v.removeAt(i)
	return true, nil
}

// removeAt removes vals[i] and gives its bytes back. Caller holds the
// write lock.
func (v *valueStore) removeAt(i int) {
	size, off := v.vals[i].Size(), v.vals[i].Offset
	v.vals = slices.Delete(v.vals, i, i+1)
	v.unindex(off) // after vals is current: it may reindex from vals
	v.bytes -= size
	v.p.bytes.Add(-size)
	if cap(v.vals) > 4*max(len(v.vals), 256) { // far larger than what is held
		v.vals = slices.Clip(slices.Clone(v.vals))
	}
}

// Since returns up to max current values with offset >= from, in offset
// order, under one read lock (one snapshot). The records share memory with
// the store and must not be modified.
func (v *valueStore) Since(from uint64, max int) ([]storage.Record, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.p.closed.Load() {
		return nil, v.errf("%w", storage.ErrClosed)
	}
	j, _ := slices.BinarySearchFunc(v.byOffset, from, func(e offsetEntry, o uint64) int {
		return cmp.Compare(e.off, o)
	})
	var out []storage.Record
	for ; j < len(v.byOffset) && len(out) < max; j++ {
		if r := v.byOffset[j].rec; r != nil {
			out = append(out, *r)
		}
	}
	return out, nil
}

// Get returns a topic's value. The record shares memory with the store
// and must not be modified.
func (v *valueStore) Get(topic string) (storage.Record, bool, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.p.closed.Load() {
		return storage.Record{}, false, v.errf("%w", storage.ErrClosed)
	}
	i, found := v.find(topic)
	if !found {
		return storage.Record{}, false, nil
	}
	return *v.vals[i], true, nil
}

// Scan calls fn for every value in topic order. It copies a page of values
// under the read lock and calls fn on them with no lock held; each value
// it passes was current when its page was read, and a value put or
// removed during the scan is seen or not according to where its topic
// falls relative to the scan's progress.
func (v *valueStore) Scan(fn func(storage.Record) bool) error {
	page := make([]storage.Record, 0, scanPage)
	after, first := "", true
	for {
		page = page[:0]
		v.mu.RLock()
		if v.p.closed.Load() {
			v.mu.RUnlock()
			return v.errf("%w", storage.ErrClosed)
		}
		i := 0
		if !first {
			var found bool
			if i, found = v.find(after); found {
				i++
			}
		}
		for ; i < len(v.vals) && len(page) < scanPage; i++ {
			page = append(page, *v.vals[i])
		}
		v.mu.RUnlock()
		for _, r := range page {
			if !fn(r) {
				return nil
			}
		}
		if len(page) < scanPage {
			return nil
		}
		after, first = page[len(page)-1].Topic, false
	}
}

// Len is how many values are held.
func (v *valueStore) Len() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.vals)
}

// Bytes is the sum of Size over held values.
func (v *valueStore) Bytes() int64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.bytes
}

// Next is the offset the next Put takes.
func (v *valueStore) Next() uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.next
}

// checkLoaded is the decoder post-check on a value store read from a
// snapshot (rfcs/storage-memory.md, storage-memory.md "kind 2"): next >= 1, topics
// non-empty and strictly ascending (so each topic once), every offset
// in [1, next) and no offset twice (invariant 9: two values never share
// one).
func (v *valueStore) checkLoaded() error {
	if v.next < 1 {
		return fmt.Errorf("value store %q: next %d (want >= 1)", v.name, v.next)
	}
	offs := make([]uint64, len(v.vals))
	prev := ""
	for i, r := range v.vals {
		if r.Topic <= prev {
			return fmt.Errorf("value store %q: topic %q after %q (want non-empty, strictly ascending)", v.name, r.Topic, prev)
		}
		if r.Offset < 1 || r.Offset >= v.next {
			return fmt.Errorf("value store %q: value offset %d for %q (want >= 1, < next %d)", v.name, r.Offset, r.Topic, v.next)
		}
		prev = r.Topic
		offs[i] = r.Offset
	}
	slices.Sort(offs)
	for i := 1; i < len(offs); i++ {
		if offs[i] == offs[i-1] {
			return fmt.Errorf("value store %q: value offset %d held twice", v.name, offs[i])
		}
	}
	v.reindex()
	return nil
}

// Submit is Put answered at once (appendLog.Submit).
func (v *valueStore) Submit(rec storage.Record) storage.Pending {
	return storage.Answered(v.Put(rec))
}
