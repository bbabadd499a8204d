package broker

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// Offering: how the offer loop finds available jobs and hands them to free
// workers (rfcs/0003-queue-engine.md "Offering").

// offerScanLimit bounds how many stored jobs one offer pass reads past
// (jobs out with workers or waiting out a backoff) looking for one to hand
// over (invariant 13).
const offerScanLimit = 4096

// offerPage is the most jobs one read of the offer loop takes from
// storage, and offerPageMin the fewest it asks for.
const (
	offerPage    = 64
	offerPageMin = 16
)

// changedLimit bounds how many changed jobs the engine remembers about the
// page an offer pass is working through (invariant 13). Past it, every job
// handed over from that page is read again, as if all of them had changed.
const changedLimit = 4096

// offer hands jobs to free workers, round-robin over those that are live,
// hold no job from this queue and have room in their window.
//
// Jobs are read forward from scanFrom, a page at a time, and looked at in
// offset order (seed docs/channels.md). A pass that leaves jobs of its
// page unread keeps them for the next pass while scanPrefix holds (the
// next pass, starting at scanFrom, would read exactly those jobs again);
// otherwise the next pass starts over at scanFrom. A job that comes back
// (a return, a timeout, a failed write or move) may be older than the
// page: the loop starts over at scanFrom at its next step, even mid-pass.
func (q *queueEngine) offer() {
	now := q.b.clock.Now()
	scanned := 0
	for first := true; ; first = false {
		q.mu.Lock()
		w, free, _ := q.freeWorkerLocked("")
		workers := len(q.workers)
		// Start over at scanFrom when a job came back (it may be older
		// than the page), or when the last pass went past a job it could
		// not hand over. Otherwise a pass keeps to its page: past a job
		// waiting out a backoff, it looks at the rest once.
		restart := q.cameBack || first && !q.scanPrefix
		read := w != nil && (len(q.page) == 0 || restart)
		if read {
			if restart {
				// Nothing looked at yet: the prefix holds until a job
				// comes back.
				q.page, q.pageEnd, q.scanPrefix, q.cameBack = nil, q.scanFrom, true, false
			}
			// The page is read after this point: anything that changes a
			// job from here on is noted (claimLocked relies on it).
			clear(q.changed)
			q.changedAll = false
		}
		from := q.pageEnd
		q.mu.Unlock()
		if w == nil {
			return
		}
		if read {
			if scanned >= offerScanLimit {
				return
			}
			// About one job per worker: in a busy queue the jobs after
			// scanFrom are available and are handed over in the passes to
			// come, one page serving many.
			n := min(max(workers, free, offerPageMin), offerPage, offerScanLimit-scanned)
			page, err := q.ch.queue.Items(from, n)
			if err != nil {
				q.b.log.Error("reading queue", "queue", q.ch.name, "error", err)
				return
			}
			if len(page) == 0 {
				return
			}
			q.page, q.pageEnd = page, page[len(page)-1].Offset
		}
		item := q.page[0]
		scanned++
		if exp := q.ch.cfg.JobExpiresAfter; exp > 0 && !item.Timestamp.IsZero() && now.Sub(item.Timestamp) > exp {
			q.page = q.page[1:]
			q.mu.Lock()
			out := q.out[item.Offset] != nil
			// Whatever the move does, scanFrom stays below this job: a
			// failed move leaves it in the queue.
			q.scanPrefix = false
			q.mu.Unlock()
			if !out {
				// Out of time rather than out of attempts: dead-lettered
				// whatever its attempt count, without further delivery.
				q.deadLetter(item.Offset, "expired", nil)
			}
			continue
		}
		if !q.handOver(item, now) {
			return // the job stays first in the page
		}
		q.page = q.page[1:]
	}
}

// freeWorkerLocked picks the next worker in round-robin order that can take
// a job now, and counts the workers that can. With a job's topic, a worker
// the permission hook refuses it to is passed over (counted in refused):
// the grant is asked where the worker is chosen, before anything is handed
// over, so a job nobody may take stays available with its attempt unspent
// (invariant 16 "A refusal on the way out is not a delivery"). The hook is
// called under q.mu: it takes no lock but its own.
func (q *queueEngine) freeWorkerLocked(topic string) (*worker, int, int) {
	n := len(q.workers)
	start := 0
	for i, w := range q.workers {
		if w == q.last {
			start = i + 1
			break
		}
	}
	var first *worker
	free, refused := 0, 0
	for i := 0; i < n; i++ {
		w := q.workers[(start+i)%n]
		if w.holding != nil || w.sink == nil || w.sink.closed() || !w.sink.room() {
			continue
		}
		if topic != "" && !w.sink.permit(routeQueue, topic) {
			refused++
			continue
		}
		if first == nil {
			first = w
		}
		free++
	}
	return first, free, refused
}

// newDeliveryID makes an opaque Delivery ID: the engine's epoch and eight
// random bytes, so it is unique per attempt and never guessable from another.
func (q *queueEngine) newDeliveryIDLocked() string {
	// invariant 3: a fresh ID per attempt, from an advancing epoch: no answer to an earlier attempt names this one.
	q.epoch++
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], q.epoch)
	_, _ = rand.Read(b[8:])
	return string(b[:])
}

// claimOutcome is what claimLocked made of a job read by an offer pass.
type claimOutcome int

const (
	claimSkip    claimOutcome = iota // out, waiting out a backoff, or gone: the pass moves on
	claimStop                        // no free worker or no packet identifier: the pass ends
	claimRefused                     // every free worker was refused the job: the pass moves on, the job stays
	claimFresh                       // claimed; the page shows the job as it is stored
	claimStale                       // claimed; the job changed since the page was read
)

// claimLocked decides, in one critical section, whether a job read by the
// offer pass can go out, and if so claims it for the next free worker.
//
// Invariants 4, 5: the job was read before the claim, so a resolve or
// dead-letter move that finished in between is not in what was read. Every
// such move (and every change to a job's attempts) happens while the job is
// in out, and is noted in changed before the job leaves out; the page was
// read after changed was cleared. So a job not in out whose entry in changed
// is absent has not changed since the page was read: the page decides. One
// that left the queue is skipped; one that changed otherwise is read again
// once claimed (no move can start on a claimed job).
func (q *queueEngine) claimLocked(item storage.QueueItem, now time.Time) (*delivery, claimOutcome) {
	if q.out[item.Offset] != nil {
		// Out with a worker: the pass may start after it next time.
		q.passedLocked(item.Offset, true)
		return nil, claimSkip
	}
	gone, changed := q.changed[item.Offset]
	if gone {
		q.passedLocked(item.Offset, true)
		return nil, claimSkip
	}
	if until, ok := q.waiting[item.Offset]; ok {
		if now.Before(until) {
			q.passedLocked(item.Offset, false)
			return nil, claimSkip
		}
		delete(q.waiting, item.Offset)
	}
	w, _, refused := q.freeWorkerLocked(item.Topic)
	if w == nil && refused > 0 {
		// Available, and offered again at the next pass: a grant that
		// comes back wakes the engine (permissionsChanged).
		q.passedLocked(item.Offset, false)
		return nil, claimRefused
	}
	if w == nil {
		return nil, claimStop // not looked past: the job stays first in the page
	}
	d := &delivery{id: q.newDeliveryIDLocked(), offset: item.Offset, worker: w, sink: w.sink, received: now}
	// The packet identifier is the worker's session's (deliveries.go); the
	// packet itself is built once the claim decides the job goes out.
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}}
	if !d.sink.reserve(queueAck{q: q, d: d}, routeQueue, &pk, now) {
		return nil, claimStop
	}
	d.pid = pk.PacketID
	// invariant 4: the job is out with exactly this delivery; every other
	// path checks q.out before handing it over again.
	q.out[item.Offset] = d
	q.byID[d.id] = d
	w.holding = d
	q.passedLocked(item.Offset, true)
	if changed || q.changedAll {
		return d, claimStale
	}
	return d, claimFresh
}

// passedLocked records that the pass went past the job at offset, which is
// out with a worker or gone (out) or neither. scanFrom follows the pass
// only while every job it read, in offset order from scanFrom, was out or
// gone and none came back meanwhile (dropOutLocked ends the prefix when one
// does): then no job at or below offset can be offered.
func (q *queueEngine) passedLocked(offset uint64, out bool) {
	if !out || !q.scanPrefix {
		q.scanPrefix = false
		return
	}
	q.scanFrom = max(q.scanFrom, offset)
}

// dropOutLocked takes a job out of out. left: its removal from the queue
// (resolve or dead-letter move) is stored. Otherwise the job may be back
// in the queue, so scanFrom drops below it and the running pass stops
// raising scanFrom. Either way the change is noted for the offer's page
// (claimLocked).
func (q *queueEngine) dropOutLocked(offset uint64, left bool) {
	delete(q.out, offset)
	q.noteChangedLocked(offset, left)
	if !left {
		q.scanPrefix, q.cameBack = false, true
		if offset <= q.scanFrom {
			q.scanFrom = offset - 1
		}
	}
}

// noteChangedLocked records that the job's stored state changed (left: it
// left the queue) for the page the offer loop is working through.
func (q *queueEngine) noteChangedLocked(offset uint64, left bool) {
	if q.changedAll {
		return
	}
	if len(q.changed) >= changedLimit {
		clear(q.changed)
		q.changedAll = true
		return
	}
	q.changed[offset] = q.changed[offset] || left
}

// handOver gives one job to one worker: the job becomes DELIVERING and the
// PUBLISH is written on a goroutine of its own, so a worker that stops
// reading holds up its own delivery and nothing else (invariant 16). It
// reports false when the pass should stop.
func (q *queueEngine) handOver(item storage.QueueItem, now time.Time) bool {
	q.mu.Lock()
	d, outcome := q.claimLocked(item, now)
	q.mu.Unlock()
	switch outcome {
	case claimSkip, claimRefused:
		return true
	case claimStop:
		return false
	case claimStale:
		// With the claim in place no move can start, so this read decides
		// (invariants 4, 5: a job never goes out after it left the queue).
		fresh, err := q.ch.queue.Get(item.Offset)
		if err != nil {
			d.sink.release(d.pid, queueAck{q: q, d: d})
			q.mu.Lock()
			q.releaseLocked(d, errors.Is(err, storage.ErrNotFound))
			q.mu.Unlock()
			if !errors.Is(err, storage.ErrNotFound) {
				q.b.log.Error("reading a job to offer", "queue", q.ch.name, "offset", item.Offset, "error", err)
				return false
			}
			return true
		}
		item = fresh
	}
	w := d.worker
	if max := q.ch.cfg.MaxAttempts; max > 0 && int(item.Attempts) >= max {
		// invariant 15: attempt counts survive a restart, so a job whose
		// attempts are spent is dead-lettered, never offered once more.
		d.sink.release(d.pid, queueAck{q: q, d: d})
		q.mu.Lock()
		delete(q.byID, d.id)
		if w.holding == d {
			w.holding = nil
		}
		q.mu.Unlock()
		q.deadLetter(item.Offset, "attempts_exhausted", d)
		return true
	}
	q.mu.Lock()
	// Round-robin advances only on a handover: a pass that found no job
	// must not move it, or the choice would depend on how many ticks ran.
	q.last = w
	q.mu.Unlock()

	pk := q.b.deliveryPacket(&item.Record, q.ch, matched{qos: 1}, now)
	pk.PacketID = d.pid
	pk.Properties.ResponseTopic = "$saguin/queue/" + q.ch.name + "/response"
	pk.Properties.CorrelationData = []byte(d.id)
	pk.Properties.User = append(pk.Properties.User,
		packets.UserProperty{Key: "saguin-attempt", Val: strconv.FormatUint(uint64(item.Attempts)+1, 10)})

	q.delivered.Add(1)
	q.b.wg.Add(1)
	go func() {
		defer q.b.wg.Done()
		// A worker registered by a SUBSCRIBE still being answered gets its
		// SUBACK first.
		w.sess.waitSubscribing()
		q.written(d, writeOne(d.sink, &pk))
	}()
	return true
}
