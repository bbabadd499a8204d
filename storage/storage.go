// Package storage defines what the broker asks of a place records live (a
// provider), and the records themselves. Two providers implement it: memory
// (with a versioned, checksummed snapshot written at graceful shutdown) and
// sqlite. Both must pass the conformance suite in storagetest.
//
// The interfaces are small on purpose: the broker keeps everything volatile
// (deliveries, Delivery IDs, deadlines, leases) itself, and asks storage only
// for what must survive. That is invariant 15 by construction: a store that
// never holds a lease cannot restore one.
package storage

import (
	"errors"
	"time"
)

// Errors a store returns. Callers test them with errors.Is; providers wrap
// them with context.
var (
	// ErrBelowFloor: a read asked for an offset the channel no longer holds.
	// Invariant 1: such a read is rejected, never served the oldest survivor.
	ErrBelowFloor = errors.New("offset below the channel's floor")
	// ErrBeyondEnd: an offset past the channel's next offset.
	ErrBeyondEnd = errors.New("offset beyond the channel's end")
	// ErrFull: a bound (channel max_bytes or provider max_bytes less its
	// reserve) refuses the write. Maps to reason code 0x97 on the wire.
	ErrFull = errors.New("no room: size bound reached")
	// ErrNotFound: the named item (queue record, position) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrClosed: the provider has been closed.
	ErrClosed = errors.New("provider closed")
)

// Header is one MQTT 5 User Property. Records keep them as a sequence, in the
// publisher's order, duplicates kept (docs/channels.md "What a delivery carries").
type Header struct {
	Name  string
	Value string
}

// Record is one stored message: what docs/channels.md "What a publish is answered" says a publish becomes.
type Record struct {
	// Offset is broker-assigned, channel-local, monotonic and never reused
	// (invariant 9). Zero on a record not yet stored.
	Offset uint64
	// MessageID is stable for the life of the message, distinct from Offset
	// (invariant 8). A UUIDv7 unless the publisher supplied saguin-id.
	MessageID string
	Topic     string
	// Timestamp is broker receipt time. Stored as Unix nanoseconds with the
	// zero time stored as 0 (and read back as the zero time), so a record
	// with no timestamp never reads as a date in 1754.
	Timestamp time.Time
	Headers   []Header
	Payload   []byte

	// The five MQTT 5 publish properties kept with a record.
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	// PayloadFormat is nil when the publisher did not set the property.
	PayloadFormat *byte
	// MessageExpiry (seconds) is nil when the publisher set no expiry. It is
	// the publisher's clock and never removes a record (invariant 2).
	MessageExpiry *uint32

	// Retain is the publisher's retain flag, stored and not acted on (used
	// for Retain As Published).
	Retain bool
	// QoS the record was published at.
	QoS byte
	// PublisherID is the publishing client id, for No Local; never delivered.
	PublisherID string
	// Bridge names the bridge the record arrived on, empty for local clients.
	Bridge string
}

// Size is what a record counts against a byte bound: payload, topic, message
// id, every header name and value, and the variable-length publish
// properties. Every provider and the broker use this one function, so a
// channel's byte count means the same thing everywhere (docs/channels.md "When retention passes a position").
func (r *Record) Size() int64 {
	n := len(r.Payload) + len(r.Topic) + len(r.MessageID) +
		len(r.ContentType) + len(r.ResponseTopic) + len(r.CorrelationData) +
		len(r.PublisherID) + len(r.Bridge)
	for _, h := range r.Headers {
		n += len(h.Name) + len(h.Value)
	}
	return int64(n)
}

// Position is a reader's stored cursor on an append channel: the lowest
// offset it has not acknowledged. Positions lag, never lead (docs/channels.md "`append`").
type Position struct {
	// Reader is "mqtt:<client id>" or "bridge:<bridge name>".
	Reader string
	Offset uint64
	// LastSeen is when the reader's session was last connected.
	LastSeen time.Time
	// Expiry is the session expiry the reader was granted; a position whose
	// LastSeen+Expiry has passed is dropped when the provider opens.
	Expiry time.Duration
}

// Provider is one place records live. A channel's records, counters and
// positions all live in one provider, never split.
type Provider interface {
	// Name is the provider's configured name.
	Name() string
	// Append opens (or returns the already open) append log for a channel.
	// The same name always returns the same object, so there is one counter.
	Append(channel string) (AppendLog, error)
	// Values opens (or returns the already open) value store of the given
	// name: one current value per topic. The same name always returns the
	// same object.
	Values(name string) (ValueStore, error)
	// Queue opens the queue store for a queue channel together with its
	// dead-letter append log, which must live in the same provider so the
	// dead-letter move is one transaction (invariant 5).
	Queue(channel, deadLetter string) (QueueStore, error)
	// Bytes is what the provider currently counts against its max_bytes.
	Bytes() int64
	// MaxBytes is the provider bound (0: unbounded).
	MaxBytes() int64
	// Counters reports what the provider counted of itself since it
	// opened: numbers it already holds, read without a query (the broker's
	// metrics call it once per recompute, docs/operations.md "Metrics").
	Counters() Counters
	// Close releases the provider. The memory provider writes its snapshot
	// here (invariant 14: memory durability is exactly the last snapshot).
	Close() error
}

// Counters are a provider's counts of itself (Provider.Counters).
type Counters struct {
	// Type is the provider's kind: "memory" or "sqlite".
	Type string
	// Errors counts storage calls that failed for another reason than the
	// refusals a caller is written to expect (ErrFull, ErrNotFound,
	// ErrBelowFloor, ErrBeyondEnd, ErrExists, ErrClosed), and failed
	// periodic WAL fsyncs.
	Errors uint64
	// Commits is nil for a provider that does not gather publishes into
	// transactions (memory).
	Commits *CommitCounters
}

// CommitCounters are the publish transactions of a provider that gathers
// publishes into transactions (sqlite's group commit).
type CommitCounters struct {
	// Publish transactions by what closed them: the record ceiling, the
	// commit interval, a transaction already committing when the batch
	// began (collected without waiting), one publish per transaction
	// (publish_commit_interval: none).
	ByRecords, ByInterval, ByCommit, Unbatched uint64
	// Records is how many records those transactions carried.
	Records uint64
	// MaxRecords is the record ceiling of one transaction as configured:
	// publish_commit_max_records, the default when the key is absent, 0
	// with publish_commit_interval: none.
	MaxRecords int
}

// AppendLog is an append channel: a replayable log with a floor and a next
// offset, both stored and never derived from surviving rows (invariants 1, 9).
type AppendLog interface {
	// Append stores one record at the next offset and returns it as stored.
	// Concurrent calls may be committed together (group commit); each
	// returns only after its record is durable as far as the provider
	// promises. ErrFull when a bound refuses it.
	Append(rec Record) (Record, error)
	// Read returns up to max records at offsets >= from, in offset order, and
	// the floor read in the same snapshot. A from below the floor returns
	// ErrBelowFloor (invariant 1). A from at or past Next returns none.
	Read(from uint64, max int) ([]Record, uint64, error)
	// Next is the offset the next record will take (starts at 1).
	Next() uint64
	// Floor is the oldest offset still readable (starts at 1).
	Floor() uint64
	// Bytes is the sum of Size over held records.
	Bytes() int64
	// FirstAtOrAfter is the earliest held offset whose timestamp is >= t,
	// scanning every candidate (wall clocks step backwards).
	FirstAtOrAfter(t time.Time) (uint64, bool, error)
	// SetMaxBytes sets the channel's own bound (0: none). At the bound,
	// Append returns ErrFull; it never evicts.
	SetMaxBytes(n int64)
	// Trim removes records older than olderThan (zero time: no age rule) and
	// then the oldest records while Bytes exceeds maxBytes (0: no size rule),
	// raising the floor in the same transaction as the deletion (invariant 1).
	// Records with a zero timestamp are never too old.
	Trim(olderThan time.Time, maxBytes int64) (removed int, freed int64, err error)
	// Position returns a reader's stored position.
	Position(reader string) (Position, bool, error)
	// SavePosition stores a reader's position. Never refused for capacity
	// (it relieves nothing, but a bound may not block a consumer's progress:
	// docs/channels.md "`queue`").
	SavePosition(p Position) error
	// DropPosition removes a reader's position; reports whether one existed.
	DropPosition(reader string) (bool, error)
	// Positions lists every stored position (for start-up expiry and ops).
	Positions() ([]Position, error)
	// LowestPosition is the lowest stored position's offset and how many
	// positions are stored, found in one pass without copying them out
	// (lowest is 0 when count is 0). The broker's metrics pay this one
	// pass per recompute (docs/operations.md "Metrics": the one figure counted per scrape).
	LowestPosition() (lowest uint64, count int, err error)
}

// QueueItem is one unresolved queue record with what survives a restart
// about its delivery history. Holder, Delivery ID, deadline and epoch are
// deliberately absent (invariant 15).
type QueueItem struct {
	Record
	Attempts       uint32
	FirstDelivered time.Time // zero until the first attempt is counted
	LastDelivered  time.Time
}

// QueueStore keeps a queue's unresolved work. Delivery state is the broker's.
type QueueStore interface {
	// Enqueue stores a job at the queue's next offset. ErrFull at max_bytes.
	Enqueue(rec Record) (Record, error)
	// Items returns up to max unresolved items with offset > after, in offset
	// order.
	Items(after uint64, max int) ([]QueueItem, error)
	// Get returns one unresolved item.
	Get(offset uint64) (QueueItem, error)
	// CountAttempt adds one to an item's attempt count and records the
	// delivery time. Uses the reserve: never refused for capacity.
	CountAttempt(offset uint64, at time.Time) (QueueItem, error)
	// Resolve removes a finished item. Uses the reserve.
	Resolve(offset uint64) error
	// DeadLetter moves an item into the dead-letter log in one transaction
	// (invariant 5): the record keeps its MessageID (invariant 8), takes the
	// given topic and extra headers, and gets the dead-letter log's next
	// offset. On any failure neither half happens and the dead-letter offset
	// is not consumed. Uses the reserve.
	DeadLetter(offset uint64, topic string, extra []Header, at time.Time) (Record, error)
	// DeadLetters is the dead-letter append log.
	DeadLetters() AppendLog
	// Next is the queue's next offset; offsets are never reused (invariant 9).
	Next() uint64
	Depth() int
	Bytes() int64
	SetMaxBytes(n int64)
}

// ValueStore keeps one current value per topic: the broadcast retained store
// (broker.retained) and latest channels. Values are records: a Put stores the
// record under its topic, taking the store's next offset (monotonic, never
// reused: invariant 9), and replaces any earlier value of that topic in the
// same transaction. A record with an empty payload is a value like any other
// (a latest channel keeps its deletions that way, as tombstones).
type ValueStore interface {
	// Put stores rec as its topic's current value and returns it as stored
	// (with its offset). ErrFull when the provider bound (less the reserve)
	// refuses it; a Put that replaces a larger value is never refused.
	Put(rec Record) (Record, error)
	// Remove deletes a topic's value; reports whether there was one.
	Remove(topic string) (bool, error)
	// RemoveIf deletes a topic's value only while it is still the one
	// stored at offset; reports whether it removed it. A sweep that judged
	// a value too old cannot remove the newer one a publish put in its
	// place meanwhile.
	RemoveIf(topic string, offset uint64) (bool, error)
	// Since returns up to max current values whose offset is >= from, in
	// offset order, read in one snapshot. Offsets are committed in order,
	// so a reader that goes on from the last offset it was given + 1 sees
	// every value put after its previous call that is still current — a
	// replaced value is never returned, its replacement is (at a higher
	// offset). A latest channel's consumers read their changes this way.
	Since(from uint64, max int) ([]Record, error)
	// Get returns a topic's value.
	Get(topic string) (Record, bool, error)
	// Scan calls fn for every value in topic order until fn returns false.
	// The broker matches filters itself; storage knows nothing of MQTT.
	Scan(fn func(Record) bool) error
	// Len is how many values are held; Bytes their summed Size.
	Len() int
	Bytes() int64
	// Next is the offset the next Put takes.
	Next() uint64
}

// Held is one unreleased QoS 2 publish (rfcs/qos2-holds.md): the record a client
// handed over at PUBREC, waiting in its channel's provider for the PUBREL
// that makes it a record. A hold has no offset and is invisible to readers
// and to retention (invariant 1: an offset taken early would let a record
// appear below a position that already moved past it). It counts against
// the provider's max_bytes, not the channel's.
type Held struct {
	// Channel is the channel the PUBLISH resolved to; a release writes
	// there whatever the topic resolves to by then.
	Channel string
	// ClientID and PacketID name the exchange: one hold per client per
	// packet identifier per channel.
	ClientID string
	PacketID uint16
	// HeldAt is when the hold was taken (the broker's clock), for
	// broker.qos2.expires_after.
	HeldAt time.Time
	// Record is the record the release writes; its Offset is zero.
	Record Record
}

// HoldStore keeps a provider's held QoS 2 publishes. Every provider
// implements it next to Provider; the channel named must be open (asked
// for through Append, Queue or Values) in the same provider.
type HoldStore interface {
	// Hold keeps h until its release or drop. ErrFull when the provider's
	// max_bytes less its reserve refuses it, or the channel (append or
	// queue) is already at its own max_bytes: then nothing is held. A
	// second hold for the same (channel, client, packet id) replaces
	// nothing and returns an error wrapping ErrExists.
	Hold(h Held) error
	// Release writes the held record at the channel's next offset (append:
	// the log; queue: a new job; latest: the topic's value) and deletes the
	// hold, in one atomic operation: never both, never neither. It uses the
	// provider's reserve, so a provider that filled after the hold does not
	// refuse it; the channel's own max_bytes (append, queue) may, with
	// ErrFull, and the hold stays. ErrNotFound when there is no such hold.
	Release(channel, clientID string, packetID uint16) (Record, error)
	// ReleaseAt is Release with the record's timestamp set to at (a zero
	// at keeps the hold's). The broadcast log needs it: its timestamps
	// rise with its offsets, which is what lets it be trimmed by age
	// exactly below an offset, and a hold's receipt time is older than
	// whatever was written while it waited.
	ReleaseAt(channel, clientID string, packetID uint16, at time.Time) (Record, error)
	// DropHold deletes a hold without writing it; reports whether one was
	// there.
	DropHold(channel, clientID string, packetID uint16) (bool, error)
	// Holds lists the holds the provider can see, ordered by channel,
	// client and packet id (start-up, expiry and session ends): those of
	// its open channels and, on sqlite, those of channels its file keeps
	// that nobody opened (a channel removed from the configuration), which
	// the broker drops at start (rfcs/qos2-holds.md). DropHold takes their names.
	Holds() ([]Held, error)
	// AbandonedAtOpen is how many holds the provider itself dropped while
	// opening (memory: a channel file older than the manifest's shutdown).
	AbandonedAtOpen() int
}

// ErrExists: a hold for the same exchange is already kept.
var ErrExists = errors.New("already exists")
