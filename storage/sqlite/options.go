package sqlite

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults and ranges from docs/configuration.md "`broker.storage`" ("Provider keys"). The configuration
// layer validates the YAML; Open checks again so a provider can never run
// with values the spec refuses.
const (
	// DefaultFlushInterval is the WAL fsync cadence when none is given.
	DefaultFlushInterval = 150 * time.Millisecond
	// MinFlushInterval and MaxFlushInterval bound flush_interval.
	MinFlushInterval = 10 * time.Millisecond
	MaxFlushInterval = time.Second
	// MaxCommitInterval bounds publish_commit_interval.
	MaxCommitInterval = time.Second
	// DefaultBatchRecords is the batch ceiling when publishes are collected
	// without waiting (no publish_commit_interval).
	DefaultBatchRecords = 256
	// MinCommitMaxRecords is the smallest publish_commit_max_records.
	MinCommitMaxRecords = 2
	// DefaultReadConnections is read_connections when the key is absent.
	// Options.ReadConnections takes the resolved value: 0 there means every
	// read runs on the writer connection, as read_connections: 0 does.
	DefaultReadConnections = 2
	// MaxReadConnections bounds read_connections.
	MaxReadConnections = 8
	// PageSize is pinned on every database this provider creates.
	PageSize = 4096
)

// Options configure one sqlite provider. Zero values mean the spec's
// defaults except where a field says otherwise.
type Options struct {
	// Name is the provider's configured name; it appears in every error.
	Name string
	// FilePath is the database file. The lock is "<FilePath>.lock".
	FilePath string
	// MaxBytes bounds the database file (0: unbounded). Ordinary writes stop
	// at MaxBytes-Reserve; relief operations may use the reserve.
	MaxBytes int64
	// Reserve is one maximal record with its headers (max_message_size +
	// max_header_bytes). Publishes and enqueues may not use it; CountAttempt,
	// Resolve, DeadLetter and SavePosition may (docs/configuration.md "`broker.storage`").
	Reserve int64
	// FlushInterval is how often the WAL is fsynced when something has been
	// committed since the last fsync (default 150ms, range 10ms–1s).
	FlushInterval time.Duration
	// PublishCommitInterval, when > 0, makes a publish transaction wait up to
	// this long (or PublishCommitMaxRecords) for company. 0 collects without
	// waiting: a publish finding no transaction committing is stored at once
	// and those arriving meanwhile go together in the next, up to 256.
	PublishCommitInterval time.Duration
	// PublishCommitNone stores every publish in its own transaction
	// (publish_commit_interval: none).
	PublishCommitNone bool
	// PublishCommitMaxRecords closes a waiting transaction at this count.
	// Required (>= 2) with an interval; refused without one.
	PublishCommitMaxRecords int
	// ReadConnections is the number of read-only connections (0–8). 0 runs
	// every read on the writer connection. The configuration default is
	// DefaultReadConnections.
	ReadConnections int
	// MaxSessionExpiry caps the expiry each stored position is judged by at
	// open (limits.max_session_expiry; 0: no cap).
	MaxSessionExpiry time.Duration
	// Now is the clock (default time.Now). Injected by tests.
	Now func() time.Time
	// Writer is the build revision, kept in the meta table so a refused
	// database names the build that wrote it.
	Writer string
	// Logger receives warnings and flush errors (default slog.Default()).
	Logger *slog.Logger
	// Faults injects failures for tests and the chaos negative controls.
	// Nil in production.
	Faults *Faults
}

// Faults are test-only switches. Each one either injects a failure or
// deliberately re-creates a bug an invariant forbids, so a test can prove
// its check notices.
type Faults struct {
	// BetweenDeadLetterHalves runs after the record is written to the
	// dead-letter log and before it is deleted from the queue: inside the
	// one dead-letter transaction, where a non-nil error aborts the move
	// (invariant 5); or, with SplitDeadLetter, between the two
	// transactions, where the first has already committed and an error (or
	// the process dying) leaves the job in both places.
	BetweenDeadLetterHalves func() error
	// BetweenReleaseHalves runs inside a QoS 2 release's transaction,
	// after the record is inserted at the next offset and before the hold
	// row is deleted. A non-nil error rolls the release back: never both,
	// never neither (rfcs/qos2-holds.md).
	BetweenReleaseHalves func() error
	// SplitDeadLetter makes the dead-letter move two transactions — the
	// dead-letter write committed, then the removal from the queue — the
	// non-atomic move invariant 5 forbids. Chaos negative control only.
	SplitDeadLetter bool
	// SyncOff opens every connection with synchronous=OFF and stops the
	// flusher from fsyncing: no commit, checkpoint or directory entry is
	// ever made durable, the setting invariant 14's power-cut promise
	// forbids. Chaos negative control only.
	SyncOff bool
	// NextOffsetFromMaxPlusOne makes a channel's next offset, when the
	// channel is opened, MAX(offset)+1 over surviving rows instead of the
	// stored counter — the restart bug invariant 9 forbids. Chaos and
	// invariant tests use it as a negative control.
	NextOffsetFromMaxPlusOne bool
	// BeforePublishCommit runs on the writer inside every publish
	// transaction (a value Put committed alone included), after its
	// inserts and just before COMMIT, with the number of records it
	// carries. A test holds commits here to see what is answered before
	// them; a non-nil error fails the transaction, and every record in it
	// is answered with that error.
	BeforePublishCommit func(records int) error
	// AfterPublishCommit runs on the writer once a transaction that gives
	// records offsets has committed — its rows visible to every read
	// connection — and before the channels' in-memory counters move
	// (txnPublishing). A test holds it to look in that moment.
	AfterPublishCommit func()
	// InReliefWrite runs inside the transaction of a CountAttempt or a
	// Resolve, after its statement, with the job's offset. A non-nil error
	// fails that write and rolls back the relief group carrying it.
	InReliefWrite func(offset uint64) error
}

// resolved is Options after defaults and validation.
type resolved struct {
	Options
	batchMax       int   // records per publish transaction
	ordinaryPages  int64 // max_page_count for ordinary writes (0: unbounded)
	reliefPages    int64 // max_page_count inside relief transactions
	commitInterval time.Duration
}

func (o Options) resolve() (resolved, error) {
	r := resolved{Options: o}
	if o.Name == "" {
		return r, errors.New("sqlite provider: no name")
	}
	if o.FilePath == "" {
		return r, fmt.Errorf("storage %s: no file_path", o.Name)
	}
	if o.MaxBytes < 0 || o.Reserve < 0 {
		return r, fmt.Errorf("storage %s: max_bytes %d and reserve %d may not be negative", o.Name, o.MaxBytes, o.Reserve)
	}
	if o.MaxBytes > 0 {
		// docs/configuration.md "`broker.storage`": max_bytes < 2 × reserve is a startup error
		// naming both.
		if o.MaxBytes < 2*o.Reserve {
			return r, fmt.Errorf("storage %s: max_bytes %d is less than twice the reserve %d (max_message_size + max_header_bytes)", o.Name, o.MaxBytes, o.Reserve)
		}
		r.ordinaryPages = (o.MaxBytes - o.Reserve) / PageSize
		r.reliefPages = o.MaxBytes / PageSize
		// max_page_count = 0 would mean "query", not "nothing": a bound that
		// rounds to no pages is refused rather than silently unbounded.
		if r.ordinaryPages < 1 {
			return r, fmt.Errorf("storage %s: max_bytes %d less the reserve %d is under one %d-byte page", o.Name, o.MaxBytes, o.Reserve, PageSize)
		}
	} else if o.Reserve > 0 {
		// Unbounded: there is nothing to reserve out of.
		r.Reserve = 0
	}
	switch {
	case o.FlushInterval == 0:
		r.FlushInterval = DefaultFlushInterval
	case o.FlushInterval < MinFlushInterval || o.FlushInterval > MaxFlushInterval:
		return r, fmt.Errorf("storage %s: flush_interval %s outside %s–%s", o.Name, o.FlushInterval, MinFlushInterval, MaxFlushInterval)
	}
	switch {
	case o.PublishCommitNone:
		if o.PublishCommitInterval != 0 || o.PublishCommitMaxRecords != 0 {
			return r, fmt.Errorf("storage %s: publish_commit_interval none takes no interval or max records", o.Name)
		}
		r.batchMax = 1
	case o.PublishCommitInterval < 0 || o.PublishCommitInterval > MaxCommitInterval:
		return r, fmt.Errorf("storage %s: publish_commit_interval %s outside 0–%s", o.Name, o.PublishCommitInterval, MaxCommitInterval)
	case o.PublishCommitInterval > 0:
		if o.PublishCommitMaxRecords < MinCommitMaxRecords {
			return r, fmt.Errorf("storage %s: publish_commit_max_records is required with publish_commit_interval and must be at least %d, got %d", o.Name, MinCommitMaxRecords, o.PublishCommitMaxRecords)
		}
		r.batchMax = o.PublishCommitMaxRecords
		r.commitInterval = o.PublishCommitInterval
	default:
		if o.PublishCommitMaxRecords != 0 {
			return r, fmt.Errorf("storage %s: publish_commit_max_records %d needs a publish_commit_interval", o.Name, o.PublishCommitMaxRecords)
		}
		r.batchMax = DefaultBatchRecords
	}
	if o.ReadConnections < 0 || o.ReadConnections > MaxReadConnections {
		return r, fmt.Errorf("storage %s: read_connections %d outside 0–%d", o.Name, o.ReadConnections, MaxReadConnections)
	}
	if o.MaxSessionExpiry < 0 {
		return r, fmt.Errorf("storage %s: negative max session expiry", o.Name)
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r, nil
}
