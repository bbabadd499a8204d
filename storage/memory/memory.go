// Package memory is the memory storage provider: records live in the
// process and survive a graceful shutdown through a versioned, checksummed
// snapshot written by Close, and nothing else. Invariant 14: its durability
// is exactly the last successful snapshot; a crash loses everything since.
//
// Records handed out (by Append, Read, Items, Get, DeadLetter) share memory
// with the store and must not be modified. Append copies what it is given.
// An empty payload, correlation data or header list is stored as nil.
package memory

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"saguin.dev/storage"
)

// Options configure one memory provider.
type Options struct {
	// Name is the provider's configured name, used in every error.
	Name string
	// SnapshotDir is where the snapshot is loaded from at Open and written
	// to at Close. Empty means snapshot_dir: none - nothing survives.
	SnapshotDir string
	// MaxBytes bounds the record bytes the provider holds (0: unbounded).
	MaxBytes int64
	// Reserve is carved out of MaxBytes: publishes and enqueues may not use
	// it, relief operations (attempt count, resolve, dead-letter move,
	// stored position) may. One largest record with its headers
	// (docs/channels.md "`queue`").
	Reserve int64
	// Writer is the build revision written into snapshot headers.
	Writer string
	// Now is the clock (nil: time.Now). It dates snapshots and judges, at
	// Open, which mqtt: positions expired while the broker was down.
	Now func() time.Time
	// Logger receives warnings about the snapshot directory (nil: discard).
	Logger *slog.Logger
	// Faults injects failures for tests (nil: none).
	Faults *Faults
}

// Faults are test hooks that fail an operation at a point no real failure
// can be arranged from outside.
type Faults struct {
	// BetweenDeadLetterHalves runs after the dead-letter log took the
	// record and before the queue lets go of it. An error must undo the
	// first half (invariant 5).
	BetweenDeadLetterHalves func() error
	// BeforeSnapshotRename runs after a snapshot file's replacement is
	// written and synced, before it is renamed over the old one. An error
	// abandons the replacement and must leave the old file whole
	// (invariant 14).
	BeforeSnapshotRename func(path string) error
	// BetweenReleaseHalves runs inside a QoS 2 release, after the record
	// was written at the next offset and before the hold is deleted. An
	// error must undo the write: never both, never neither (rfcs/qos2-holds.md).
	BetweenReleaseHalves func() error
	// SyncSnapshot, when set, is called in place of f.Sync to sync a
	// snapshot file's replacement before its rename, and must sync it: a
	// test records which files were synced, at what size, so a missing
	// fsync is seen without a power-cut filesystem (invariant 14).
	SyncSnapshot func(f *os.File) error
}

// Provider is a memory provider. It implements storage.Provider.
type Provider struct {
	name     string
	dir      string
	writer   string
	maxBytes int64
	reserve  int64
	now      func() time.Time
	log      *slog.Logger
	faults   Faults

	// bytes is the provider-wide count against maxBytes, shared by every
	// channel: the check and the charge are one compare-and-swap.
	bytes  atomic.Int64
	closed atomic.Bool

	mu       sync.Mutex // guards the maps below and lock
	logs     map[string]*appendLog
	queues   map[string]*queueStore
	values   map[string]*valueStore
	restored map[string]*unit  // loaded from the snapshot, not yet asked for
	dlqOf    map[string]string // restored dead-letter log -> its queue
	lastAt   time.Time         // the loaded manifest's moment
	// abandonedAtOpen counts holds dropped at Open (holds.go).
	abandonedAtOpen int
	lock            *os.File
}

var _ storage.Provider = (*Provider)(nil)

// Open creates a provider, loading the snapshot in SnapshotDir if there is
// one. A damaged, truncated or wrong-version snapshot is an error naming
// the file and what is wrong, never an empty start (invariant 14).
func Open(o Options) (*Provider, error) {
	if o.MaxBytes < 0 || o.Reserve < 0 {
		return nil, fmt.Errorf("memory provider %q: max_bytes %d and reserve %d must not be negative", o.Name, o.MaxBytes, o.Reserve)
	}
	if o.MaxBytes > 0 && o.MaxBytes < 2*o.Reserve {
		return nil, fmt.Errorf("memory provider %q: max_bytes %d is below twice the reserve %d (one largest record with its headers)",
			o.Name, o.MaxBytes, o.Reserve)
	}
	p := &Provider{
		name:     o.Name,
		dir:      o.SnapshotDir,
		writer:   o.Writer,
		maxBytes: o.MaxBytes,
		reserve:  o.Reserve,
		now:      o.Now,
		log:      o.Logger,
		logs:     map[string]*appendLog{},
		queues:   map[string]*queueStore{},
		values:   map[string]*valueStore{},
		restored: map[string]*unit{},
		dlqOf:    map[string]string{},
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if o.Faults != nil {
		p.faults = *o.Faults
	}
	if p.dir == "" {
		return p, nil
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	return p, nil
}

// Name is the provider's configured name.
func (p *Provider) Name() string { return p.name }

// Bytes is what the provider counts against MaxBytes: the records of every
// channel asked for since Open, restored ones included.
func (p *Provider) Bytes() int64 { return p.bytes.Load() }

// MaxBytes is the provider bound (0: unbounded).
func (p *Provider) MaxBytes() int64 { return p.maxBytes }

// Counters reports what the provider counted of itself (storage.Provider).
// A memory provider's calls fail only with the refusals callers expect, and
// it has no transactions: nothing to count yet.
func (p *Provider) Counters() storage.Counters { return storage.Counters{Type: "memory"} }

// admit charges n bytes of a publish or enqueue, refusing when they would
// reach into the reserve. It never evicts (invariant 2).
func (p *Provider) admit(n int64) bool {
	if p.maxBytes == 0 {
		p.bytes.Add(n)
		return true
	}
	// invariants 2, 13: at the bound a write is refused; nothing is evicted to make room.
	limit := p.maxBytes - p.reserve
	for {
		cur := p.bytes.Load()
		if cur+n > limit {
			return false
		}
		if p.bytes.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (p *Provider) errf(channel string, format string, args ...any) error {
	return fmt.Errorf("memory provider %q: channel %q: %w", p.name, channel, fmt.Errorf(format, args...))
}

// Append opens the append log for channel, restoring it from the snapshot
// the first time it is asked for. The same name returns the same log.
// A queue's dead-letter log is returned by its name too.
func (p *Provider) Append(channel string) (storage.AppendLog, error) {
	if channel == "" {
		return nil, fmt.Errorf("memory provider %q: empty channel name", p.name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, p.errf(channel, "%w", storage.ErrClosed)
	}
	if l, ok := p.logs[channel]; ok {
		return l, nil
	}
	if _, ok := p.queues[channel]; ok {
		return nil, p.errf(channel, "is a queue, not an append channel")
	}
	if _, ok := p.values[channel]; ok {
		return nil, p.errf(channel, "is a value store, not an append channel")
	}
	if q, ok := p.dlqOf[channel]; ok {
		// A restored dead-letter log comes back with its queue: they are
		// one file and one unit (rfcs/storage-memory.md).
		u := p.restored[q]
		p.attach(q, u)
		return u.log, nil
	}
	if u, ok := p.restored[channel]; ok {
		if u.log == nil || u.queue != nil {
			return nil, p.errf(channel, "the snapshot holds %s under this name, not an append channel", u.what())
		}
		p.attach(channel, u)
		return u.log, nil
	}
	l := newLog(p, channel)
	p.logs[channel] = l
	return l, nil
}

// Queue opens the queue store for channel with its dead-letter log, which
// lives in the same provider and the same snapshot file so that the
// dead-letter move is one critical section (invariant 5).
func (p *Provider) Queue(channel, deadLetter string) (storage.QueueStore, error) {
	if channel == "" || deadLetter == "" || channel == deadLetter {
		return nil, fmt.Errorf("memory provider %q: queue %q needs a dead-letter channel of its own, got %q", p.name, channel, deadLetter)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, p.errf(channel, "%w", storage.ErrClosed)
	}
	if q, ok := p.queues[channel]; ok {
		if q.dlq.name != deadLetter {
			return nil, p.errf(channel, "queue is open with dead-letter channel %q, asked for %q", q.dlq.name, deadLetter)
		}
		return q, nil
	}
	if _, ok := p.logs[channel]; ok {
		return nil, p.errf(channel, "is an append channel, not a queue")
	}
	if _, ok := p.values[channel]; ok {
		return nil, p.errf(channel, "is a value store, not a queue")
	}
	if _, ok := p.values[deadLetter]; ok {
		return nil, p.errf(channel, "dead-letter channel %q is open as a value store", deadLetter)
	}
	if u, ok := p.restored[channel]; ok {
		if u.queue == nil {
			return nil, p.errf(channel, "the snapshot holds %s under this name, not a queue", u.what())
		}
		if u.log.name != deadLetter {
			return nil, p.errf(channel, "the snapshot keeps this queue's dead letters in %q, asked for %q", u.log.name, deadLetter)
		}
		p.attach(channel, u)
		return u.queue, nil
	}
	if _, ok := p.logs[deadLetter]; ok {
		return nil, p.errf(channel, "dead-letter channel %q is already open as an append channel; open the queue first", deadLetter)
	}
	if _, ok := p.restored[deadLetter]; ok {
		return nil, p.errf(channel, "the snapshot holds %q as a channel of its own, it cannot become this queue's dead-letter channel", deadLetter)
	}
	if q, ok := p.dlqOf[deadLetter]; ok {
		return nil, p.errf(channel, "the snapshot holds %q as the dead-letter channel of queue %q", deadLetter, q)
	}
	l := newLog(p, deadLetter)
	l.queue = channel
	q := &queueStore{p: p, name: channel, dlq: l, next: 1}
	p.logs[deadLetter] = l
	p.queues[channel] = q
	return q, nil
}

// Values opens the value store name, restoring it from the snapshot the
// first time it is asked for. The same name returns the same store. A name
// is one kind for good: a value store's name is refused as a channel and
// the other way round, in memory and in the snapshot (storage-memory.md).
func (p *Provider) Values(name string) (storage.ValueStore, error) {
	if name == "" {
		return nil, fmt.Errorf("memory provider %q: empty value store name", p.name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, p.errf(name, "%w", storage.ErrClosed)
	}
	if v, ok := p.values[name]; ok {
		return v, nil
	}
	if l, ok := p.logs[name]; ok {
		if l.queue != "" {
			return nil, p.errf(name, "is the dead-letter channel of queue %q, not a value store", l.queue)
		}
		return nil, p.errf(name, "is an append channel, not a value store")
	}
	if _, ok := p.queues[name]; ok {
		return nil, p.errf(name, "is a queue, not a value store")
	}
	if q, ok := p.dlqOf[name]; ok {
		return nil, p.errf(name, "the snapshot holds this name as the dead-letter channel of queue %q, not a value store", q)
	}
	if u, ok := p.restored[name]; ok {
		if u.values == nil {
			return nil, p.errf(name, "the snapshot holds %s under this name, not a value store", u.what())
		}
		p.attach(name, u)
		return u.values, nil
	}
	v := newValues(p, name)
	p.values[name] = v
	return v, nil
}

// attach makes a restored unit live and charges its bytes: what a start
// puts back it also counts (invariant 13), loaded whole even over the
// bound, which then refuses publishes until there is room.
func (p *Provider) attach(name string, u *unit) {
	// invariant 13: what a start puts back is counted against the bound too.
	delete(p.restored, name)
	if u.values != nil {
		p.values[name] = u.values
		p.bytes.Add(u.values.bytes + u.values.holds.bytes())
		return
	}
	p.logs[u.log.name] = u.log
	n := u.log.bytes + u.log.holds.bytes()
	if u.queue != nil {
		delete(p.dlqOf, u.log.name)
		p.queues[name] = u.queue
		n += u.queue.bytes + u.queue.holds.bytes()
	}
	p.bytes.Add(n)
}

// Close writes the snapshot (when there is a snapshot directory) and
// releases the directory lock. Every operation after Close returns
// ErrClosed. A second Close does nothing.
func (p *Provider) Close() error {
	p.mu.Lock()
	if p.closed.Swap(true) {
		p.mu.Unlock()
		return nil
	}
	units := make([]*unit, 0, len(p.logs)+len(p.values))
	for _, l := range p.logs {
		if l.queue == "" {
			units = append(units, &unit{log: l})
		}
	}
	for _, q := range p.queues {
		units = append(units, &unit{log: q.dlq, queue: q})
	}
	for _, v := range p.values {
		units = append(units, &unit{values: v})
	}
	p.mu.Unlock()
	if p.dir == "" {
		return nil
	}
	// Every operation checks closed under its channel's lock, and the
	// writer takes each lock to encode, so nothing changes once a channel
	// is being written.
	err := p.save(units)
	return errors.Join(err, p.unlock())
}
