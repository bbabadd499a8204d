package memory

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
)

// Held QoS 2 publishes (rfcs/qos2-holds.md). A hold lives with its channel's store,
// under that store's lock, so a release — the record written at the next
// offset and the hold deleted — is one critical section, and the hold is
// written in the channel's snapshot file (rfcs/storage-memory.md). Its bytes count
// against the provider from the hold on; the release moves that charge to
// the record, so it never asks the provider for room again (the release
// "uses the reserve": it can never be refused by the provider bound).

type holdKey struct {
	client string
	pid    uint16
}

// holdSet is one channel's holds. nil until the first hold.
type holdSet map[holdKey]storage.Held

func (s holdSet) bytes() (n int64) {
	for _, h := range s {
		n += h.Record.Size()
	}
	return n
}

var _ storage.HoldStore = (*Provider)(nil)

// holdTarget is the channel a hold belongs to, as the hold operations see
// it: its lock, its set, and what writing a released record means there.
type holdTarget struct {
	lock, unlock func()
	set          *holdSet
	// fits reports whether the channel's own bound takes size more bytes
	// (append and queue; latest has none).
	fits func(size int64) (bool, string)
	// write stores rec at the next offset with its bytes already charged to
	// the provider; undo reverses exactly that write.
	write func(rec storage.Record, size int64) (storage.Record, func())
}

func (p *Provider) holdTarget(channel string) (*holdTarget, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, p.errf(channel, "%w", storage.ErrClosed)
	}
	if l, ok := p.logs[channel]; ok && l.queue == "" {
		return l.holdTarget(), nil
	}
	if q, ok := p.queues[channel]; ok {
		return q.holdTarget(), nil
	}
	if v, ok := p.values[channel]; ok {
		return v.holdTarget(), nil
	}
	return nil, p.errf(channel, "no open channel of this name takes held publishes: %w", storage.ErrNotFound)
}

func (l *appendLog) holdTarget() *holdTarget {
	return &holdTarget{
		lock: l.mu.Lock, unlock: l.mu.Unlock, set: &l.holds,
		fits: func(size int64) (bool, string) {
			if l.maxBytes > 0 && l.bytes+size > l.maxBytes {
				return false, fmt.Sprintf("channel max_bytes %d (holding %d)", l.maxBytes, l.bytes)
			}
			return true, ""
		},
		write: func(rec storage.Record, size int64) (storage.Record, func()) {
			out := l.appendLocked(rec, size)
			return out, func() {
				l.recs.PopBack()
				l.next--
				l.bytes -= size
			}
		},
	}
}

func (q *queueStore) holdTarget() *holdTarget {
	return &holdTarget{
		lock: q.mu.Lock, unlock: q.mu.Unlock, set: &q.holds,
		fits: func(size int64) (bool, string) {
			if q.maxBytes > 0 && q.bytes+size > q.maxBytes {
				return false, fmt.Sprintf("queue max_bytes %d (holding %d)", q.maxBytes, q.bytes)
			}
			return true, ""
		},
		write: func(rec storage.Record, size int64) (storage.Record, func()) {
			rec.Offset = q.next
			q.next++
			q.items = append(q.items, qitem{QueueItem: storage.QueueItem{Record: rec}})
			q.live++
			q.bytes += size
			return rec, func() {
				q.items = q.items[:len(q.items)-1]
				q.next--
				q.live--
				q.bytes -= size
			}
		},
	}
}

func (v *valueStore) holdTarget() *holdTarget {
	return &holdTarget{
		lock: v.mu.Lock, unlock: v.mu.Unlock, set: &v.holds,
		// A latest channel has no max_bytes of its own: its release is
		// never refused for room (rfcs/qos2-holds.md).
		fits: func(int64) (bool, string) { return true, "" },
		write: func(rec storage.Record, size int64) (storage.Record, func()) {
			i, found := v.find(rec.Topic)
			var old *storage.Record
			var oldSize int64
			if found {
				old = v.vals[i]
				oldSize = old.Size()
			}
			rec.Offset = v.next
			v.next++
			stored := &rec
			v.byOffset = append(v.byOffset, offsetEntry{off: rec.Offset, rec: stored})
			if found {
				v.vals[i] = stored
				v.unindex(old.Offset)
			} else {
				v.vals = slices.Insert(v.vals, i, stored)
			}
			v.bytes += size - oldSize
			v.p.bytes.Add(-oldSize) // the replaced value's bytes come back
			return rec, func() {
				if found {
					v.vals[i] = old
				} else {
					v.vals = slices.Delete(v.vals, i, i+1)
				}
				v.next--
				v.bytes -= size - oldSize
				v.p.bytes.Add(oldSize)
				v.reindex() // the index may have compacted the old entry away
			}
		},
	}
}

// Hold keeps h in its channel's store. ErrFull when the channel (append,
// queue) is already at its max_bytes or the provider bound less its
// reserve refuses the bytes: nothing is held.
func (p *Provider) Hold(h storage.Held) error {
	if h.ClientID == "" || h.PacketID == 0 {
		return p.errf(h.Channel, "a hold needs a client id and a packet id, got %q and %d", h.ClientID, h.PacketID)
	}
	t, err := p.holdTarget(h.Channel)
	if err != nil {
		return err
	}
	h.Record = clone(h.Record)
	h.Record.Offset = 0
	h.HeldAt = snapshot.Normalize(h.HeldAt)
	size := h.Record.Size()
	k := holdKey{h.ClientID, h.PacketID}
	t.lock()
	defer t.unlock()
	if p.closed.Load() {
		return p.errf(h.Channel, "%w", storage.ErrClosed)
	}
	if _, dup := (*t.set)[k]; dup {
		return p.errf(h.Channel, "hold of client %q packet id %d: %w", h.ClientID, h.PacketID, storage.ErrExists)
	}
	if ok, why := t.fits(size); !ok {
		return p.errf(h.Channel, "hold of %d bytes: channel at %s: %w", size, why, storage.ErrFull)
	}
	if !p.admit(size) {
		return p.errf(h.Channel, "hold of %d bytes: provider at max_bytes %d less reserve %d: %w",
			size, p.maxBytes, p.reserve, storage.ErrFull)
	}
	if *t.set == nil {
		*t.set = holdSet{}
	}
	(*t.set)[k] = h
	return nil
}

// Release writes the held record at the channel's next offset and deletes
// the hold, under the channel's lock: both or neither.
func (p *Provider) Release(channel, clientID string, packetID uint16) (storage.Record, error) {
	return p.ReleaseAt(channel, clientID, packetID, time.Time{})
}

// ReleaseAt is Release with the written record stamped at (zero: as held).
func (p *Provider) ReleaseAt(channel, clientID string, packetID uint16, at time.Time) (storage.Record, error) {
	t, err := p.holdTarget(channel)
	if err != nil {
		return storage.Record{}, err
	}
	k := holdKey{clientID, packetID}
	t.lock()
	defer t.unlock()
	if p.closed.Load() {
		return storage.Record{}, p.errf(channel, "%w", storage.ErrClosed)
	}
	h, ok := (*t.set)[k]
	if !ok {
		return storage.Record{}, p.errf(channel, "no hold of client %q packet id %d: %w", clientID, packetID, storage.ErrNotFound)
	}
	size := h.Record.Size()
	if ok, why := t.fits(size); !ok {
		// The hold stays: the client re-sends PUBREL once there is room.
		return storage.Record{}, p.errf(channel, "release of %d bytes: channel at %s: %w", size, why, storage.ErrFull)
	}
	rec := h.Record
	if !at.IsZero() {
		rec.Timestamp = at
	}
	// invariant 1: the offset is taken now, at the release, never at the hold.
	out, undo := t.write(rec, size)
	if f := p.faults.BetweenReleaseHalves; f != nil {
		if err := f(); err != nil {
			undo()
			return storage.Record{}, p.errf(channel, "release of client %q packet id %d: %w", clientID, packetID, err)
		}
	}
	delete(*t.set, k)
	return out, nil
}

// DropHold deletes a hold without writing it and gives its bytes back.
func (p *Provider) DropHold(channel, clientID string, packetID uint16) (bool, error) {
	t, err := p.holdTarget(channel)
	if err != nil {
		return false, err
	}
	k := holdKey{clientID, packetID}
	t.lock()
	defer t.unlock()
	if p.closed.Load() {
		return false, p.errf(channel, "%w", storage.ErrClosed)
	}
	h, ok := (*t.set)[k]
	if !ok {
		return false, nil
	}
	delete(*t.set, k)
	p.bytes.Add(-h.Record.Size())
	return true, nil
}

// Holds lists the holds of every open channel. A channel whose snapshot
// was not asked for is not read, so its holds are not listed (rfcs/qos2-holds.md:
// not counted).
func (p *Provider) Holds() ([]storage.Held, error) {
	p.mu.Lock()
	if p.closed.Load() {
		p.mu.Unlock()
		return nil, fmt.Errorf("memory provider %q: %w", p.name, storage.ErrClosed)
	}
	var ts []*holdTarget
	for _, l := range p.logs {
		if l.queue == "" {
			ts = append(ts, l.holdTarget())
		}
	}
	for _, q := range p.queues {
		ts = append(ts, q.holdTarget())
	}
	for _, v := range p.values {
		ts = append(ts, v.holdTarget())
	}
	p.mu.Unlock()
	var out []storage.Held
	for _, t := range ts {
		t.lock()
		out = slices.AppendSeq(out, maps.Values(*t.set))
		t.unlock()
	}
	slices.SortFunc(out, compareHeld)
	return out, nil
}

// AbandonedAtOpen is how many holds Open dropped: those of a channel file
// older than the manifest's shutdown (rfcs/storage-memory.md).
func (p *Provider) AbandonedAtOpen() int { return p.abandonedAtOpen }

func compareHeld(a, b storage.Held) int {
	return cmp.Or(strings.Compare(a.Channel, b.Channel), strings.Compare(a.ClientID, b.ClientID),
		cmp.Compare(a.PacketID, b.PacketID))
}

// encodeHolds writes a channel's holds, sorted so equal stores write equal
// files. Caller holds the channel's lock.
func encodeHolds(e *snapshot.Encoder, s holdSet) {
	hs := slices.SortedFunc(maps.Values(s), compareHeld)
	e.Count(len(hs))
	for i := range hs {
		e.Held(&hs[i])
	}
}

// decodeHolds reads a channel's holds; the count is checked against the
// bytes present before anything is made (invariant 13).
func decodeHolds(d *snapshot.Decoder, channel string) holdSet {
	n := d.Count("hold", snapshot.MinHeldSize)
	if n == 0 {
		return nil
	}
	s := make(holdSet, n)
	for range n {
		h := d.Held(channel)
		if d.Err() != nil {
			return nil
		}
		k := holdKey{h.ClientID, h.PacketID}
		if _, dup := s[k]; dup {
			d.Fail("hold of client %q packet id %d repeated", h.ClientID, h.PacketID)
			return nil
		}
		s[k] = h
	}
	return s
}

// dropHolds empties a restored unit's holds and says how many there were.
func (u *unit) dropHolds() int {
	if u == nil {
		return 0
	}
	var n int
	switch {
	case u.values != nil:
		n, u.values.holds = len(u.values.holds), nil
	case u.queue != nil:
		n, u.queue.holds = len(u.queue.holds), nil
	default:
		n, u.log.holds = len(u.log.holds), nil
	}
	return n
}
