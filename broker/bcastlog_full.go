package broker

import (
	"errors"

	"saguin.dev/storage"
)

// The broadcast log at a full provider (rfcs/broadcast-log.md: log capped by provider max_bytes → oldest go except
// on-wire ones; rfcs/broadcast-log.md: the log yields
// room). The log has no bound of its own: when the provider refuses a
// write to it, or to a session window, the oldest logged messages no
// session has on the wire are removed — those a session still waits for
// stay in its outbox in memory, so they are delivered while the broker
// runs but no longer survive a restart — counted LogStorageFull, and the
// write is tried once more.

// withLogRoom runs write; if the provider refuses it for room, it removes
// up to need bytes of the log's oldest messages nobody has on the wire and
// runs it once more.
func (b *Broker) withLogRoom(need int64, write func() error) error {
	err := write()
	if err == nil || !errors.Is(err, storage.ErrFull) {
		return err
	}
	// invariant 13: at the bound the oldest logged messages nobody has on the wire give way; the log never grows past it.
	if !b.relieveLog(need) {
		return err
	}
	return write()
}

// relieveLog removes the oldest logged messages, at least need bytes of
// them, below every delivery on the wire and every message still being
// fanned out. It reports whether it removed any.
func (b *Broker) relieveLog(need int64) bool {
	l := b.fan.log
	l.relief.Lock()
	defer l.relief.Unlock()
	limit := min(l.watermark(), b.lowestOnWire())
	floor := l.log.Floor()
	var freed int64
	target := floor
	for target < limit && freed < need {
		recs, _, err := l.log.Read(target, bcastReadBatch)
		if err != nil || len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Offset >= limit || freed >= need {
				break
			}
			freed += r.Size()
			target = r.Offset + 1
		}
		if recs[len(recs)-1].Offset+1 > target {
			break // stopped inside the batch
		}
	}
	if target == floor {
		return false
	}
	olderThan, ok := l.trimBound(target)
	if !ok {
		return false
	}
	removed, _, err := l.log.Trim(olderThan, 0)
	if err != nil || removed == 0 {
		return false
	}
	b.fan.logStorageFull.Add(int64(removed))
	// Those a shared group's backlog still holds no longer survive a
	// restart with it.
	b.fan.shareStorageFull.Add(b.fan.shares.heldBetween(floor, target))
	now := b.clock.Now()
	if l.lastFullWarn.IsZero() || now.Sub(l.lastFullWarn) >= fanoutWarnEvery {
		l.lastFullWarn = now
		b.log.Warn("broadcast log gave up its oldest messages to a full provider: they no longer survive a restart",
			"removed", removed, "floor", l.log.Floor())
	}
	return true
}

// lowestOnWire is the lowest logged offset any session has on the wire
// (0 offsets aside); the log's next offset when none.
func (b *Broker) lowestOnWire() uint64 {
	low := b.fan.log.log.Next()
	for _, s := range b.heldSessions() {
		o := s.bcast.Load()
		if o == nil {
			continue
		}
		o.mu.Lock()
		for _, w := range o.onWire {
			if w.m.off != 0 {
				low = min(low, w.m.off)
			}
		}
		o.mu.Unlock()
	}
	return low
}
