package broker

import (
	"sync"
	"sync/atomic"

	"saguin.dev/broker/config"
	"saguin.dev/storage"
)

// channel is one configured channel as the broker runs it: its configuration,
// its store, and a signal its consumers wait on for new records.
type channel struct {
	name string
	cfg  config.Channel
	// log is set for append channels (including every derived __dlq).
	log storage.AppendLog
	// queue is set for queue channels.
	queue storage.QueueStore
	// values is set for latest channels: one current value per topic,
	// deletions kept as tombstones (latest.go).
	values storage.ValueStore
	// deleteMu makes a latest delete's look-then-store one step (latest.go
	// storeLatest): two deletes of one value store one tombstone.
	deleteMu sync.Mutex

	mu      sync.Mutex
	changed chan struct{} // closed and replaced each time a record lands
	// raised is closed and replaced each time retention raises the floor:
	// a pump waiting for room in its client's window wakes on it alone, not
	// on every record (invariant 1, consumer.go).
	raised chan struct{}

	// lost counts the positions retention passed on this channel
	// (floor.go): saguin_channel_position_lost_total reads it.
	lost positionLoss

	// The channel's own counters for the metric catalogue: one atomic per
	// channel, on paths that already take this channel's lock (notify)
	// or its store's.
	published atomic.Uint64 // records stored by publishers (channelWrite.stored, pubrel)
	removed   atomic.Uint64 // records or values retention removed (trim, sweepLatest)
	// superseded: latest values a consumer's mark passed without reading,
	// replaced before it got to them (latest_consumer.go).
	superseded atomic.Uint64
	// retainIgnored: retained publishes a queue took as ordinary jobs.
	retainIgnored atomic.Uint64
}

func newChannel(cfg config.Channel) *channel {
	return &channel{name: cfg.Name, cfg: cfg, changed: make(chan struct{}), raised: make(chan struct{})}
}

// wait returns a channel that is closed the next time a record is stored.
// A pump takes it before reading, so a record stored between the read and
// the wait still wakes it.
func (c *channel) wait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// notify wakes every pump waiting on this channel.
func (c *channel) notify() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// floorWait returns a channel that is closed the next time retention raises
// the floor. A pump takes it before it looks at the floor, so a raise
// between the look and the wait still wakes it.
func (c *channel) floorWait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raised
}

// floorRaised wakes every pump of this channel: those waiting for records,
// and those waiting for room while holding a record the floor may now have
// passed.
func (c *channel) floorRaised() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	close(c.raised)
	c.raised = make(chan struct{})
	c.mu.Unlock()
}

// channelView is what the metric catalogue and the operations routes read
// of one channel, copied: its configuration, its own counters, and its
// store's in-memory counters. A plain value, so the views format it with
// nothing of the channel's held (rfcs/delivery-seam.md "The session behind
// methods"; rfcs/metrics.md "Where each number comes from").
type channelView struct {
	name, filter, typ, provider                   string
	published, removed, superseded, retainIgnored uint64
	store                                         channelStore
	next, floor                                   uint64 // append
	bytes                                         int64  // append and queue
	values                                        int    // latest: the values held
}

// channelStore says which of a channel's three stores is set.
type channelStore int

const (
	noStore channelStore = iota
	appendStore
	latestStore
	queueStore
)

// view copies the channel for the metric catalogue and the operations
// routes. It takes no lock: the configuration and the stores are set before
// the broker serves and never change, the counters are atomics, and each
// store reads its own in-memory counters under its own lock, never one of
// ours (rfcs/metrics.md "Where each number comes from").
func (c *channel) view() channelView {
	v := channelView{name: c.name, filter: c.cfg.FilterAsWritten, typ: c.cfg.Type, provider: c.cfg.Storage,
		published: c.published.Load(), removed: c.removed.Load(), superseded: c.superseded.Load()}
	switch {
	case c.log != nil:
		v.store = appendStore
		v.next, v.floor, v.bytes = c.log.Next(), c.log.Floor(), c.log.Bytes()
	case c.values != nil:
		v.store = latestStore
		v.values = c.values.Len()
	case c.queue != nil:
		v.store = queueStore
		v.bytes = c.queue.Bytes()
		v.retainIgnored = c.retainIgnored.Load()
	}
	return v
}

// lowestPosition is an append channel's lowest stored position and how
// many are stored: one pass over them in its store, the one figure a
// metrics recompute counts (rfcs/metrics.md "Where each number comes
// from"). Only for a channel whose view says appendStore.
func (c *channel) lowestPosition() (lowest uint64, count int, err error) {
	return c.log.LowestPosition()
}

// storedPositions are an append channel's stored reader positions, for
// /v1/operations/consumers. Only for a channel whose view says appendStore.
func (c *channel) storedPositions() ([]storage.Position, error) {
	return c.log.Positions()
}
