package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"saguin.dev/storage"
)

// appendLog is an append channel: records at dense offsets from floor to
// next-1, with next, floor and bytes stored in its channels row.
type appendLog struct {
	p  *Provider
	ch *channel
}

var (
	_ storage.AppendLog = (*appendLog)(nil)
	_ storage.Submitter = (*appendLog)(nil)
)

// errNoChange ends a write transaction that found nothing to do: it is
// rolled back, so an idle sweep commits nothing and causes no fsync.
var errNoChange = errors.New("no change")

// Append stores rec at the channel's next offset in a group commit and
// returns it as stored, after its transaction has committed (invariant 18).
func (l *appendLog) Append(rec storage.Record) (storage.Record, error) {
	return l.p.publish(l.ch, rec)
}

// Submit is Append without the wait: the record is given its place in the
// provider's queue of publishes now and answered once its transaction
// commits (storage.Submitter).
func (l *appendLog) Submit(rec storage.Record) storage.Pending {
	return l.p.submit(l.ch, rec)
}

// Read returns up to max records from offset from on, with the floor read
// in the same snapshot, so a read never straddles a trim (invariant 1). A
// from below the floor is refused, never served the oldest survivor.
func (l *appendLog) Read(from uint64, max int) ([]storage.Record, uint64, error) {
	var out []storage.Record
	var floor uint64
	err := l.p.read(func(ctx context.Context, q querier) error {
		var f, next int64
		if err := q.queryRow(ctx, stChannelBounds, l.ch.id).Scan(&f, &next); err != nil {
			return fmt.Errorf("read bounds: %w", err)
		}
		floor = uint64(f)
		// invariant 1: below the floor is refused, never served the oldest survivor.
		if from < floor {
			return fmt.Errorf("storage %s: append %s: offset %d is below the floor %d: %w", l.p.opts.Name, l.ch.name, from, floor, storage.ErrBelowFloor)
		}
		if max <= 0 || from >= uint64(next) {
			return nil
		}
		// Bounded before allocating (invariant 13): never more than the
		// channel holds past from.
		out = make([]storage.Record, 0, min(uint64(max), uint64(next)-from, 1024))
		rows, err := q.query(ctx, stReadRecords, l.ch.id, int64(from), max)
		if err != nil {
			return err
		}
		defer rows.Close()
		s := newPageScan()
		for rows.Next() {
			if err := rows.Scan(s.dest...); err != nil {
				return err
			}
			r, err := s.record()
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, floor, l.p.wrap("read "+l.ch.name, err)
	}
	return out, floor, nil
}

// Next is the offset the next record will take.
func (l *appendLog) Next() uint64 {
	l.ch.mu.Lock()
	defer l.ch.mu.Unlock()
	return l.ch.next
}

// Floor is the oldest offset still readable.
func (l *appendLog) Floor() uint64 {
	l.ch.mu.Lock()
	defer l.ch.mu.Unlock()
	return l.ch.floor
}

// Bytes is the sum of Size over held records (the stored bytes column).
func (l *appendLog) Bytes() int64 {
	l.ch.mu.Lock()
	defer l.ch.mu.Unlock()
	return l.ch.bytes
}

// SetMaxBytes sets the channel's own bound; Append refuses at it.
func (l *appendLog) SetMaxBytes(n int64) { l.ch.maxBytes.Store(max(n, 0)) }

// FirstAtOrAfter is the earliest held offset with a timestamp >= t. It
// scans every candidate: wall clocks step backwards, so timestamps are not
// sorted by offset and a bisection would miss one.
func (l *appendLog) FirstAtOrAfter(t time.Time) (uint64, bool, error) {
	var off sql.NullInt64
	err := l.p.read(func(ctx context.Context, q querier) error {
		if t.IsZero() {
			// Every record, even one without a timestamp, is at or after
			// the zero time.
			return q.queryRow(ctx, stFirstHeld, l.ch.id).Scan(&off)
		}
		// A record without a timestamp (stored 0) is before any real t.
		return q.queryRow(ctx, stFirstAtOrAfter, l.ch.id, t.UnixNano()).Scan(&off)
	})
	if err != nil {
		return 0, false, l.p.wrap("search "+l.ch.name, err)
	}
	if !off.Valid {
		return 0, false, nil
	}
	return uint64(off.Int64), true, nil
}

// Trim removes records older than olderThan, then the oldest while Bytes
// exceeds maxBytes. The age rule walks from the oldest and ends at the
// first record that is not too old; the size rule then goes on from there. Deletion, the new floor and the new bytes are one
// transaction (invariant 1), so no reader ever sees records gone and the
// floor still below them. It walks from the oldest and stops at the first
// record it keeps, so its cost is what it removes, not the channel's
// length; sizes come from the size column written by Record.Size, never
// from SQL length(). A record with a zero timestamp is never too old.
func (l *appendLog) Trim(olderThan time.Time, maxBytes int64) (removed int, freed int64, err error) {
	ch := l.ch
	err = l.p.do(func(w *writer) error {
		ch.mu.Lock()
		floor, next, bytes := ch.floor, ch.next, ch.bytes
		ch.mu.Unlock()
		if floor >= next {
			return nil
		}
		cutoff, byAge := int64(0), !olderThan.IsZero()
		if byAge {
			cutoff = olderThan.UnixNano()
		}
		newFloor := floor
		err := w.txn(false, func(ctx context.Context) error {
			rows, err := w.st[stTrimScan].QueryContext(ctx, ch.id, int64(floor))
			if err != nil {
				return err
			}
			newFloor = next // if every held record goes
			// Two rules in turn: the age rule until the first record that
			// is not too old, then the size rule from there while the
			// channel holds more than maxBytes.
			ageDone := !byAge
			for rows.Next() {
				var off, ts, size int64
				if err := rows.Scan(&off, &ts, &size); err != nil {
					rows.Close()
					return err
				}
				if !ageDone && !(ts != 0 && ts < cutoff) {
					ageDone = true
				}
				if ageDone && !(maxBytes > 0 && bytes-freed > maxBytes) {
					newFloor = uint64(off)
					break
				}
				removed++
				freed += size
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return err
			}
			if removed == 0 {
				return errNoChange
			}
			if _, err := w.st[stTrimDelete].ExecContext(ctx, ch.id, int64(floor), int64(newFloor)); err != nil {
				return err
			}
			// invariant 1: the floor rises in the deletion's own transaction, on the size path too.
			_, err = w.st[stUpdateFloorBytes].ExecContext(ctx, int64(newFloor), bytes-freed, ch.id)
			return err
		})
		if err != nil {
			removed, freed = 0, 0
			return err
		}
		if removed > 0 {
			ch.mu.Lock()
			ch.floor = newFloor
			ch.bytes = bytes - freed
			ch.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return 0, 0, l.p.wrap("trim "+ch.name, err)
	}
	return removed, freed, nil
}

// Position returns a reader's stored position.
func (l *appendLog) Position(reader string) (storage.Position, bool, error) {
	pos := storage.Position{Reader: reader}
	found := false
	err := l.p.read(func(ctx context.Context, q querier) error {
		var off, seen, exp int64
		err := q.queryRow(ctx, stPosition, l.ch.id, reader).Scan(&off, &seen, &exp)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		pos.Offset, pos.LastSeen, pos.Expiry = uint64(off), timeFromDB(seen), time.Duration(exp)
		return nil
	})
	if err != nil {
		return storage.Position{}, false, l.p.wrap("read position of "+reader+" on "+l.ch.name, err)
	}
	if !found {
		return storage.Position{}, false, nil
	}
	return pos, true, nil
}

// SavePosition stores a reader's position. It may use the reserve: a bound
// never blocks a consumer's progress. A position past next is refused —
// positions lag, never lead (docs/channels.md "`append`").
func (l *appendLog) SavePosition(pos storage.Position) error {
	if pos.Reader == "" {
		return fmt.Errorf("storage %s: append %s: position without a reader", l.p.opts.Name, l.ch.name)
	}
	if pos.Expiry < 0 || pos.Offset > math.MaxInt64 {
		return fmt.Errorf("storage %s: append %s: position of %s out of range", l.p.opts.Name, l.ch.name, pos.Reader)
	}
	err := l.p.do(func(w *writer) error {
		if next := l.Next(); pos.Offset > next {
			return fmt.Errorf("storage %s: append %s: position %d of %s is past next %d: %w", l.p.opts.Name, l.ch.name, pos.Offset, pos.Reader, next, storage.ErrBeyondEnd)
		}
		return w.txn(true, func(ctx context.Context) error {
			_, err := w.st[stSavePosition].ExecContext(ctx, l.ch.id, pos.Reader, int64(pos.Offset), timeToDB(pos.LastSeen), int64(pos.Expiry))
			return err
		})
	})
	return l.p.wrap("save position of "+pos.Reader+" on "+l.ch.name, err)
}

// DropPosition removes a reader's position and reports whether it existed.
func (l *appendLog) DropPosition(reader string) (bool, error) {
	existed := false
	err := l.p.do(func(w *writer) error {
		return w.txn(true, func(ctx context.Context) error {
			res, err := w.st[stDropPosition].ExecContext(ctx, l.ch.id, reader)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			if err != nil {
				return err
			}
			if n == 0 {
				return errNoChange
			}
			existed = true
			return nil
		})
	})
	if err != nil {
		return false, l.p.wrap("drop position of "+reader+" on "+l.ch.name, err)
	}
	return existed, nil
}

// LowestPosition is the lowest stored position and how many are stored,
// in one read of the positions table (storage.AppendLog).
func (l *appendLog) LowestPosition() (uint64, int, error) {
	var lowest, count int64
	err := l.p.read(func(ctx context.Context, q querier) error {
		return q.queryRow(ctx, stLowestPosition, l.ch.id).Scan(&lowest, &count)
	})
	if err != nil {
		return 0, 0, l.p.wrap("lowest position on "+l.ch.name, err)
	}
	return uint64(lowest), int(count), nil
}

// Positions lists every stored position on the channel.
func (l *appendLog) Positions() ([]storage.Position, error) {
	var out []storage.Position
	err := l.p.read(func(ctx context.Context, q querier) error {
		rows, err := q.query(ctx, stPositions, l.ch.id)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var reader string
			var off, seen, exp int64
			if err := rows.Scan(&reader, &off, &seen, &exp); err != nil {
				return err
			}
			out = append(out, storage.Position{Reader: reader, Offset: uint64(off), LastSeen: timeFromDB(seen), Expiry: time.Duration(exp)})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, l.p.wrap("list positions on "+l.ch.name, err)
	}
	return out, nil
}
