package broker

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"saguin.dev/storage"
)

// settleRetained runs at start (docs/configuration.md "`broker.retained`"): a broadcast
// retained value whose topic a channel now claims — the configuration
// gained a channel, or a filter widened — is no longer the retained
// store's. Into a latest channel it is moved (the channel is that topic's
// store now); into an append, queue or dead-letter channel it is
// discarded, since those channels hold records, not a topic's value, and
// a retained value is not a record anyone published to them. Left where
// it was, it would be hidden while the channel claims the topic and come
// back, stale, the day the channel goes.
//
// A value is moved unless the latest channel already holds a newer one
// for its topic (a clock set back), and a value past its own Message
// Expiry is discarded rather than moved: a latest channel keeps values by
// retention alone (invariant 2), so moving it would bring it back to life.
//
// A move the latest channel's provider has no room for is a start-up
// error naming the channel, the provider and how many values did not
// move; nothing is dropped to make the start succeed, and what did not
// move stays in the retained store for the next start.
func (b *Broker) settleRetained() error {
	// The claimed topics, then each value read again: the store is not
	// written while it is scanned. Bounded by the retained store itself,
	// which its provider's max_bytes bounds (invariant 13).
	var topics []string
	if err := b.retained.Scan(func(rec storage.Record) bool {
		if _, claimed := b.resolver.Resolve(rec.Topic); claimed {
			topics = append(topics, rec.Topic)
		}
		return true
	}); err != nil {
		return fmt.Errorf("reading the retained store: %w", err)
	}
	if len(topics) == 0 {
		return nil
	}
	type tally struct{ moved, older, expired, discarded, notMoved int }
	tallies := map[string]*tally{}
	now := b.clock.Now()
	for _, topic := range topics {
		name, _ := b.resolver.Resolve(topic)
		ch := b.channels[name]
		t := tallies[name]
		if t == nil {
			t = &tally{}
			tallies[name] = t
		}
		rec, ok, err := b.retained.Get(topic)
		if err != nil {
			return fmt.Errorf("reading the retained value of %s: %w", topic, err)
		}
		if !ok {
			continue
		}
		drop := func(count *int) error {
			if _, err := b.retained.Remove(topic); err != nil {
				return fmt.Errorf("removing the retained value of %s: %w", topic, err)
			}
			*count++
			return nil
		}
		switch {
		case ch.values == nil:
			err = drop(&t.discarded)
		case retainedExpired(&rec, now):
			err = drop(&t.expired)
		default:
			var cur storage.Record
			var has bool
			if cur, has, err = ch.values.Get(topic); err != nil {
				return fmt.Errorf("channel %s: reading %s: %w", name, topic, err)
			}
			if has && !cur.Timestamp.Before(rec.Timestamp) {
				err = drop(&t.older)
				break
			}
			if t.notMoved > 0 {
				t.notMoved++ // the provider is full already: counted, not tried
				break
			}
			if _, err = ch.values.Put(asLatestValue(rec)); err != nil {
				if !errors.Is(err, storage.ErrFull) {
					return fmt.Errorf("channel %s: moving the retained value of %s: %w", name, topic, err)
				}
				t.notMoved++
				err = nil
				break
			}
			err = drop(&t.moved)
		}
		if err != nil {
			return err
		}
	}

	names := make([]string, 0, len(tallies))
	for n := range tallies {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		t, ch := tallies[name], b.channels[name]
		if ch.values == nil {
			kind := ch.cfg.Type
			if ch.cfg.DeadLetterOf != "" {
				kind = "dead-letter"
			}
			b.log.Warn("retained values discarded: their topics belong to a channel that is not latest",
				"channel", name, "type", kind, "values", t.discarded)
			continue
		}
		b.log.Info("retained values moved into a latest channel", "channel", name, "provider", ch.cfg.Storage,
			"values", t.moved, "older_than_the_channels", t.older, "expired", t.expired)
		if t.notMoved > 0 {
			errs = append(errs, fmt.Errorf("retained values cannot move into latest channel %s: storage provider %s is full, %d values not moved (they stay in the retained store, unserved); raise the provider's max_bytes or make room in it, or take their topics out of the channel's filter",
				name, ch.cfg.Storage, t.notMoved))
		}
	}
	return errors.Join(errs...)
}

// asLatestValue is a retained value as a latest channel stores a publish:
// its own offset to come, no saguin-* headers (a channel adds its own at
// delivery), everything the publisher sent kept.
func asLatestValue(rec storage.Record) storage.Record {
	rec.Offset = 0
	// invariant 10: a client's saguin-* headers never pass for the channel's own.
	kept := rec.Headers[:0:0]
	for _, h := range rec.Headers {
		if !strings.HasPrefix(h.Name, reservedPrefix) {
			kept = append(kept, h)
		}
	}
	rec.Headers = kept
	return rec
}
