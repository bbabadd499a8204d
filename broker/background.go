package broker

import (
	"context"
	"time"
)

// flushLoop stores the positions that moved, every
// broker.session.ack_commit_interval (invariant 18's first exception: an
// acknowledgement is taken for writing within the interval, not as it is
// read, so no client's window waits behind a store write).
func (b *Broker) flushLoop(ctx context.Context) {
	t := b.clock.NewTicker(b.cfg.Broker.Session.AckCommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			b.flushPositions(false)
		}
	}
}

func (b *Broker) flushPositions(force bool) {
	for _, s := range b.heldSessions() {
		b.flushSession(s, force)
	}
}

// sizeSweepInterval: the size sweep decides how far above retention_bytes a
// channel may sit, so it is frequent and fixed (docs/channels.md "When retention
// removes").
const sizeSweepInterval = time.Second

// ageSweepInterval is a tenth of the shortest deadline any channel
// configured (retention periods and job_expires_after), floored at 1s.
func (b *Broker) ageSweepInterval() time.Duration {
	var shortest time.Duration
	for _, ch := range b.channels {
		// A latest channel's deletion_retention_period is the same sweep's
		// deadline too (latest.go).
		for _, d := range []time.Duration{ch.cfg.RetentionPeriod, ch.cfg.JobExpiresAfter, ch.cfg.DeletionRetentionPeriod} {
			if d > 0 && (shortest == 0 || d < shortest) {
				shortest = d
			}
		}
	}
	iv := shortest / 10
	if iv < time.Second {
		iv = time.Second
	}
	return iv
}

func (b *Broker) sweepLoop(ctx context.Context) {
	ageEvery := b.ageSweepInterval()
	b.log.Info("retention sweeps", "age_every", ageEvery, "size_every", sizeSweepInterval)
	age := b.clock.NewTicker(ageEvery)
	defer age.Stop()
	size := b.clock.NewTicker(sizeSweepInterval)
	defer size.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-age.C():
			b.sweepAge()
		case <-size.C():
			b.sweepSize()
		}
	}
}

// sweepAge removes records past their channel's retention_period. The floor
// moves in the same transaction as the deletion (the store's Trim keeps
// invariant 1); consumers are woken so one overtaken learns of it.
func (b *Broker) sweepAge() {
	b.sweepRetained()
	b.sweepLatest() // values past retention_period, tombstones past deletion_retention_period
	for _, q := range b.engines {
		q.sweepExpired()
	}
	now := b.clock.Now()
	for _, ch := range b.channels {
		if ch.log == nil || ch.cfg.RetentionPeriod <= 0 {
			continue
		}
		b.trim(ch, now.Add(-ch.cfg.RetentionPeriod), 0)
	}
}

// sweepSize removes the oldest records of channels over retention_bytes.
func (b *Broker) sweepSize() {
	for _, ch := range b.channels {
		if ch.log == nil || ch.cfg.RetentionBytes <= 0 || ch.log.Bytes() <= ch.cfg.RetentionBytes {
			continue
		}
		b.trim(ch, time.Time{}, ch.cfg.RetentionBytes)
	}
}

func (b *Broker) trim(ch *channel, olderThan time.Time, maxBytes int64) {
	removed, freed, err := ch.log.Trim(olderThan, maxBytes)
	if err != nil {
		// Retention may be refused and is retried at the next tick.
		b.log.Warn("retention sweep failed; retried at the next tick", "channel", ch.name, "error", err)
		return
	}
	if removed > 0 {
		ch.removed.Add(uint64(removed))
		b.log.Info("retention removed records", "channel", ch.name, "records", removed, "bytes", freed,
			"floor", ch.log.Floor())
		ch.floorRaised() // invariant 1: an overtaken consumer restarts at the floor (consumer.go)
	}
}
