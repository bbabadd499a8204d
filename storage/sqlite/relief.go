package sqlite

import (
	"context"
	"errors"
	"runtime"

	"saguin.dev/storage"
)

// reliefMax is the most relief writes one transaction carries (storage.md
// §5 "Group commit": groups of up to 8 that never wait for company).
const reliefMax = 8

// Relief writes — counting a queue attempt, resolving a job — are small
// writes a worker's read loop waits on, many per job. Each used to be a
// transaction of its own; now they are group-committed like publishes, in
// groups of their own:
//
//   - A group is whatever relief writes are queued when the writer takes the
//     first, up to reliefMax. It never waits for company: the first is
//     committed at once with whoever is already there.
//   - A group is one relief transaction: it may use the reserve, like each
//     of its writes alone (docs/configuration.md "`broker.storage`" "The reserve"). Publishes never join
//     it, so no ordinary write ever eats the reserve.
//   - Each caller is answered only after the transaction holding its write
//     commits (invariant 18), and in-memory counters move only then.
//   - A write that finds nothing to change (ErrNotFound) is that caller's
//     answer and changes nothing; the group goes on.
//   - Any other failure rolls the whole group back. Then every write of the
//     group is run again alone, in its own transaction, so each caller gets
//     the answer its own write earns — exactly what it got before groups.
type reliefReq struct {
	// write runs inside the group's transaction. ErrNotFound answers the
	// caller and lets the group go on; any other error aborts the group.
	write func(ctx context.Context, w *writer) error
	// committed runs on the writer after the write's transaction commits
	// (the in-memory counters). Nil when there is nothing to move.
	committed func()
	err       error
	done      chan struct{}
}

// relief hands one relief write to the writer and waits for its answer.
func (p *Provider) relief(write func(ctx context.Context, w *writer) error, committed func()) error {
	if p.closed.Load() {
		return p.errClosed()
	}
	r := &reliefReq{write: write, committed: committed, done: make(chan struct{})}
	select {
	case p.w.reliefs <- r:
	case <-p.w.close:
		return p.errClosed()
	}
	select {
	case <-r.done:
	case <-p.w.done:
		// The writer may have answered just before it stopped.
		select {
		case <-r.done:
		default:
			return p.errClosed()
		}
	}
	return r.err
}

// commitReliefs takes first and whatever relief writes are already queued
// (up to reliefMax) and commits them in one transaction.
func (w *writer) commitReliefs(first *reliefReq) {
	group := append(w.reliefBatch[:0], first)
	runtime.Gosched()
gather:
	for len(group) < reliefMax {
		select {
		case r := <-w.reliefs:
			group = append(group, r)
		default:
			break gather
		}
	}
	w.stats.reliefGroups.Add(1)
	err := w.txn(true, func(ctx context.Context) error {
		for _, r := range group {
			r.err = r.write(ctx, w)
			if r.err != nil && !errors.Is(r.err, storage.ErrNotFound) {
				return r.err
			}
		}
		return nil
	})
	if err == nil {
		for _, r := range group {
			if r.err == nil && r.committed != nil {
				r.committed()
			}
			close(r.done)
		}
	} else {
		// One write (or the commit) failed and the group rolled back: each
		// write is tried again alone and answered with its own result.
		for _, r := range group {
			w.reliefAlone(r)
		}
	}
	clear(group)
	w.reliefBatch = group[:0]
}

// reliefAlone commits one relief write in a transaction of its own.
func (w *writer) reliefAlone(r *reliefReq) {
	w.stats.reliefGroups.Add(1)
	r.err = w.txn(true, func(ctx context.Context) error {
		r.err = r.write(ctx, w)
		return r.err
	})
	// txn reports ErrNotFound from the write; nothing was changed.
	if r.err == nil && r.committed != nil {
		r.committed()
	}
	close(r.done)
}
