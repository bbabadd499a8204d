package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"saguin.dev/storage"
)

// scanPage is how many values one Scan read transaction fetches. fn runs
// between pages with no transaction open and no connection held, so it may
// call the store — even with read_connections: 0, where a read runs on the
// writer goroutine and a Put from inside it would wait forever.
const scanPage = 256

// valueStore keeps one current value per topic in latest_values, with its
// next offset in its channels row (kind latest). Len and Bytes are summed
// at open and kept by the writer goroutine after each commit, like a
// queue's depth and bytes.
type valueStore struct {
	p  *Provider
	ch *channel
}

var (
	_ storage.ValueStore = (*valueStore)(nil)
	_ storage.Submitter  = (*valueStore)(nil)
)

// Put stores rec as its topic's value at the store's next offset. It goes
// through the group commit like Append (rfcs/storage-sqlite.md: "latest replace" is a
// batched path) and returns only after its transaction commits (invariant
// 18). The replaced row is deleted and the new one inserted in that same
// transaction, with the counter row. Bounded by the page ceiling less the
// reserve (ErrFull); a Put replacing a value at least as large commits
// alone as a relief write and is not refused for capacity.
func (v *valueStore) Put(rec storage.Record) (storage.Record, error) {
	if rec.Topic == "" {
		return storage.Record{}, fmt.Errorf("storage %s: latest %s: a value needs a topic", v.p.opts.Name, v.ch.name)
	}
	return v.p.publish(v.ch, rec)
}

// Submit is Put without the wait (appendLog.Submit).
func (v *valueStore) Submit(rec storage.Record) storage.Pending {
	if rec.Topic == "" {
		return storage.Answered(storage.Record{}, fmt.Errorf("storage %s: latest %s: a value needs a topic", v.p.opts.Name, v.ch.name))
	}
	return v.p.submit(v.ch, rec)
}

// Remove deletes a topic's value in its own transaction. It may use the
// reserve: removing only frees. next does not move back (invariant 9).
func (v *valueStore) Remove(topic string) (bool, error) {
	return v.remove(topic, func(ctx context.Context, w *writer) *sql.Row {
		return w.st[stDeleteValue].QueryRowContext(ctx, v.ch.id, topic)
	})
}

// RemoveIf deletes a topic's value only while it is the one at offset, in
// one statement, so a value put in its place meanwhile stays.
func (v *valueStore) RemoveIf(topic string, offset uint64) (bool, error) {
	return v.remove(topic, func(ctx context.Context, w *writer) *sql.Row {
		return w.st[stDeleteValueAt].QueryRowContext(ctx, v.ch.id, topic, int64(offset))
	})
}

// remove runs one deleting statement (RETURNING the size) as a relief
// transaction of its own and moves the counters once it commits.
func (v *valueStore) remove(topic string, del func(ctx context.Context, w *writer) *sql.Row) (bool, error) {
	existed := false
	err := v.p.do(func(w *writer) error {
		var size int64
		err := w.txn(true, func(ctx context.Context) error {
			err := del(ctx, w).Scan(&size)
			if errors.Is(err, sql.ErrNoRows) {
				return errNoChange
			}
			if err != nil {
				return err
			}
			existed = true
			return nil
		})
		if err != nil || !existed {
			return err
		}
		v.ch.mu.Lock()
		v.ch.depth--
		v.ch.bytes -= size
		v.ch.mu.Unlock()
		return nil
	})
	if err != nil {
		return false, v.p.wrap("remove the value of "+topic+" from "+v.ch.name, err)
	}
	return existed, nil
}

// Get returns a topic's value.
func (v *valueStore) Get(topic string) (storage.Record, bool, error) {
	var rec storage.Record
	found := false
	err := v.p.read(func(ctx context.Context, q querier) error {
		var s recordScan
		err := q.queryRow(ctx, stValue, v.ch.id, topic).Scan(s.recordDest()...)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		rec, err = s.record()
		found = err == nil
		return err
	})
	if err != nil {
		return storage.Record{}, false, v.p.wrap("read the value of "+topic+" in "+v.ch.name, err)
	}
	return rec, found, nil
}

// Scan calls fn for every value in topic order (byte-wise, SQLite's BINARY
// collation), a page at a time. Each page is its own read transaction: a
// value Put or Removed during the scan is seen or not according to where
// its topic falls relative to the scan's progress, and every value passed
// was current when its page was read.
func (v *valueStore) Scan(fn func(storage.Record) bool) error {
	after := "" // no topic is empty (the table's CHECK), so "" is before all
	page := make([]storage.Record, 0, scanPage)
	for {
		page = page[:0]
		err := v.p.read(func(ctx context.Context, q querier) error {
			rows, err := q.query(ctx, stValuesAfter, v.ch.id, after, scanPage)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var s recordScan
				if err := rows.Scan(s.recordDest()...); err != nil {
					return err
				}
				r, err := s.record()
				if err != nil {
					return err
				}
				page = append(page, r)
			}
			return rows.Err()
		})
		if err != nil {
			return v.p.wrap("scan "+v.ch.name, err)
		}
		for _, r := range page {
			if !fn(r) {
				return nil
			}
		}
		if len(page) < scanPage {
			return nil
		}
		after = page[len(page)-1].Topic
	}
}

// Since returns up to max current values with offset >= from, in offset
// order, in one read transaction (one snapshot). The writer commits offsets
// in order, so what one call does not see has a higher offset than what it
// returned.
func (v *valueStore) Since(from uint64, max int) ([]storage.Record, error) {
	if from > math.MaxInt64 {
		return nil, nil
	}
	var out []storage.Record
	err := v.p.read(func(ctx context.Context, q querier) error {
		out = out[:0]
		rows, err := q.query(ctx, stValuesSince, v.ch.id, int64(from), max)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var s recordScan
			if err := rows.Scan(s.recordDest()...); err != nil {
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
		return nil, v.p.wrap("read the values of "+v.ch.name+" since an offset", err)
	}
	return out, nil
}

// Len is how many values are held.
func (v *valueStore) Len() int {
	v.ch.mu.Lock()
	defer v.ch.mu.Unlock()
	return v.ch.depth
}

// Bytes is the sum of Size over held values (summed at open).
func (v *valueStore) Bytes() int64 {
	v.ch.mu.Lock()
	defer v.ch.mu.Unlock()
	return v.ch.bytes
}

// Next is the offset the next Put takes; never reused (invariant 9).
func (v *valueStore) Next() uint64 {
	v.ch.mu.Lock()
	defer v.ch.mu.Unlock()
	return v.ch.next
}
