package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"saguin.dev/storage"
)

// queueStore keeps a queue's unresolved work in queue_items and its
// dead-letter log in records, in one database, so the dead-letter move is
// one transaction (invariant 5). Delivery state — holder, Delivery ID,
// deadline, epoch — is the broker's and is never stored (invariant 15).
type queueStore struct {
	p   *Provider
	ch  *channel
	dlq *appendLog
}

var (
	_ storage.QueueStore = (*queueStore)(nil)
	_ storage.Submitter  = (*queueStore)(nil)
)

// Enqueue stores a job at the queue's next offset in a group commit.
func (q *queueStore) Enqueue(rec storage.Record) (storage.Record, error) {
	return q.p.publish(q.ch, rec)
}

// Submit is Enqueue without the wait (appendLog.Submit).
func (q *queueStore) Submit(rec storage.Record) storage.Pending {
	return q.p.submit(q.ch, rec)
}

// Items returns up to max unresolved items after offset after, in order.
func (q *queueStore) Items(after uint64, max int) ([]storage.QueueItem, error) {
	if max <= 0 || after >= math.MaxInt64 {
		return nil, nil
	}
	var out []storage.QueueItem
	err := q.p.read(func(ctx context.Context, qr querier) error {
		rows, err := qr.query(ctx, stItems, q.ch.id, int64(after), max)
		if err != nil {
			return err
		}
		defer rows.Close()
		out = make([]storage.QueueItem, 0, min(max, 256))
		for rows.Next() {
			var s recordScan
			if err := rows.Scan(s.itemDest()...); err != nil {
				return err
			}
			it, err := s.item()
			if err != nil {
				return err
			}
			out = append(out, it)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, q.p.wrap("read queue "+q.ch.name, err)
	}
	return out, nil
}

// Get returns one unresolved item.
func (q *queueStore) Get(offset uint64) (storage.QueueItem, error) {
	var it storage.QueueItem
	err := q.p.read(func(ctx context.Context, qr querier) error {
		if offset > math.MaxInt64 {
			return q.notFound(offset)
		}
		var s recordScan
		err := qr.queryRow(ctx, stItem, q.ch.id, int64(offset)).Scan(s.itemDest()...)
		if errors.Is(err, sql.ErrNoRows) {
			return q.notFound(offset)
		}
		if err != nil {
			return err
		}
		it, err = s.item()
		return err
	})
	if err != nil {
		return storage.QueueItem{}, q.p.wrap("read queue "+q.ch.name, err)
	}
	return it, nil
}

func (q *queueStore) notFound(offset uint64) error {
	return fmt.Errorf("storage %s: queue %s has no unresolved item at offset %d: %w", q.p.opts.Name, q.ch.name, offset, storage.ErrNotFound)
}

// CountAttempt adds one to an item's attempts and records the delivery
// time. It may use the reserve: counting an attempt is never refused for
// capacity. It is a relief write: group-committed with other relief writes
// and answered after its transaction commits (relief.go).
func (q *queueStore) CountAttempt(offset uint64, at time.Time) (storage.QueueItem, error) {
	var it storage.QueueItem
	ts := timeToDB(at)
	err := q.p.relief(func(ctx context.Context, w *writer) error {
		if offset > math.MaxInt64 {
			return q.notFound(offset)
		}
		var s recordScan
		err := w.st[stCountAttempt].QueryRowContext(ctx, ts, ts, q.ch.id, int64(offset)).Scan(s.itemDest()...)
		if errors.Is(err, sql.ErrNoRows) {
			return q.notFound(offset)
		}
		if err != nil {
			return err
		}
		if it, err = s.item(); err != nil {
			return err
		}
		return q.faultInReliefWrite(offset)
	}, nil)
	if err != nil {
		return storage.QueueItem{}, q.p.wrap("count attempt on "+q.ch.name, err)
	}
	return it, nil
}

// Resolve removes a finished item. It may use the reserve. It is a relief
// write (relief.go); the queue's depth and bytes move once it commits.
func (q *queueStore) Resolve(offset uint64) error {
	var size int64
	err := q.p.relief(func(ctx context.Context, w *writer) error {
		if offset > math.MaxInt64 {
			return q.notFound(offset)
		}
		err := w.st[stResolve].QueryRowContext(ctx, q.ch.id, int64(offset)).Scan(&size)
		if errors.Is(err, sql.ErrNoRows) {
			return q.notFound(offset)
		}
		if err != nil {
			return err
		}
		return q.faultInReliefWrite(offset)
	}, func() {
		q.ch.mu.Lock()
		q.ch.depth--
		q.ch.bytes -= size
		q.ch.mu.Unlock()
	})
	return q.p.wrap("resolve on "+q.ch.name, err)
}

func (q *queueStore) faultInReliefWrite(offset uint64) error {
	if f := q.p.opts.Faults; f != nil && f.InReliefWrite != nil {
		return f.InReliefWrite(offset)
	}
	return nil
}

// DeadLetter moves an item into the dead-letter log in one transaction
// (invariant 5): the record keeps its MessageID (invariant 8), takes topic,
// gains extra after its own headers, is timestamped at, and takes the
// dead-letter log's next offset. On any failure the transaction rolls back
// and the in-memory counters are untouched: the item stays in the queue
// with its attempts, the log is unchanged and its next offset is not
// consumed. It may use the reserve and ignores the log's own max_bytes (a
// refused move would leave dead work live in the queue).
func (q *queueStore) DeadLetter(offset uint64, topic string, extra []storage.Header, at time.Time) (storage.Record, error) {
	var moved storage.Record
	err := q.p.do(func(w *writer) error {
		if offset > math.MaxInt64 {
			return q.notFound(offset)
		}
		dlq := q.dlq.ch
		dlq.mu.Lock()
		next, bytes := dlq.next, dlq.bytes
		dlq.mu.Unlock()
		var itemSize int64
		var enc encoded
		var rec storage.Record
		// write is the first half: the record into the dead-letter log and
		// the log's counter row.
		write := func(ctx context.Context) error {
			var s recordScan
			err := w.st[stItemForMove].QueryRowContext(ctx, q.ch.id, int64(offset)).Scan(append(s.itemDest(), &itemSize)...)
			if errors.Is(err, sql.ErrNoRows) {
				return q.notFound(offset)
			}
			if err != nil {
				return err
			}
			it, err := s.item()
			if err != nil {
				return err
			}
			// invariant 8: the dead letter keeps the job's Message ID; only its offset is new.
			rec = it.Record
			rec.Offset = next
			rec.Topic = topic
			rec.Timestamp = at
			rec.Headers = append(slices.Clip(rec.Headers), extra...)
			if enc, err = encodeRecord(&rec); err != nil {
				return err
			}
			if _, err := w.st[stInsertRecord].ExecContext(ctx, dlq.id, int64(rec.Offset), rec.MessageID, rec.Topic,
				enc.ts, enc.headers, enc.payload, enc.props, rec.Retain, int64(rec.QoS), rec.PublisherID, rec.Bridge, enc.size); err != nil {
				return fmt.Errorf("write to %s: %w", dlq.name, err)
			}
			if _, err := w.st[stUpdateNextBytes].ExecContext(ctx, int64(next+1), bytes+enc.size, dlq.id); err != nil {
				return fmt.Errorf("advance %s: %w", dlq.name, err)
			}
			return nil
		}
		// remove is the second half: the item out of the queue.
		remove := func(ctx context.Context) error {
			var deleted int64
			if err := w.st[stResolve].QueryRowContext(ctx, q.ch.id, int64(offset)).Scan(&deleted); err != nil {
				return fmt.Errorf("remove from %s: %w", q.ch.name, err)
			}
			return nil
		}
		// advanceDLQ moves the log's counters; txnPublishing runs it under
		// the log's lock, across the COMMIT.
		advanceDLQ := func() { dlq.next, dlq.bytes = next+1, bytes+enc.size }
		if f := q.p.opts.Faults; f != nil && f.SplitDeadLetter {
			// Deliberately the move invariant 5 forbids (negative control):
			// the first half commits on its own, so a failure or a crash
			// before the second leaves the job in both places.
			if err := w.txnPublishing(true, []*channel{dlq}, write, advanceDLQ); err != nil {
				return err
			}
			if err := q.faultBetweenDeadLetterHalves(); err != nil {
				return err
			}
			if err := w.txn(true, remove); err != nil {
				return err
			}
		} else {
			// invariant 5: both halves in one transaction: both commit or neither does.
			err := w.txnPublishing(true, []*channel{dlq}, func(ctx context.Context) error {
				if err := write(ctx); err != nil {
					return err
				}
				if err := q.faultBetweenDeadLetterHalves(); err != nil {
					return err
				}
				return remove(ctx)
			}, advanceDLQ)
			if err != nil {
				return err
			}
		}
		moved = rec
		q.ch.mu.Lock()
		q.ch.depth--
		q.ch.bytes -= itemSize
		q.ch.mu.Unlock()
		return nil
	})
	if err != nil {
		return storage.Record{}, q.p.wrap("dead-letter "+q.ch.name+" offset "+fmt.Sprint(offset), err)
	}
	return moved, nil
}

func (q *queueStore) faultBetweenDeadLetterHalves() error {
	if f := q.p.opts.Faults; f != nil && f.BetweenDeadLetterHalves != nil {
		return f.BetweenDeadLetterHalves()
	}
	return nil
}

// DeadLetters is the queue's dead-letter append log.
func (q *queueStore) DeadLetters() storage.AppendLog { return q.dlq }

// Next is the queue's next offset; offsets are never reused (invariant 9).
func (q *queueStore) Next() uint64 {
	q.ch.mu.Lock()
	defer q.ch.mu.Unlock()
	return q.ch.next
}

// Depth is the number of unresolved items.
func (q *queueStore) Depth() int {
	q.ch.mu.Lock()
	defer q.ch.mu.Unlock()
	return q.ch.depth
}

// Bytes is the sum of Size over unresolved items (summed at open).
func (q *queueStore) Bytes() int64 {
	q.ch.mu.Lock()
	defer q.ch.mu.Unlock()
	return q.ch.bytes
}

// SetMaxBytes sets the queue's bound; Enqueue refuses at it, and nothing is
// ever evicted (invariant 2).
func (q *queueStore) SetMaxBytes(n int64) { q.ch.maxBytes.Store(max(n, 0)) }
