package broker

import (
	"fmt"
	"slices"
	"sync/atomic"
)

// What retention takes from a reader (invariant 1). A reader's position on
// an append channel is passed when retention raises the channel's floor
// above it. There are three places that can find it so, and each restarts
// the reader where the rule says and tells the operator in one line:
//
//   - a resuming CONNECT (claimSession): the session is discarded and the
//     client told by Session Present 0 (docs/channels.md "Sessions and Session Present");
//   - a SUBSCRIBE reaching a position the session kept without reading the
//     channel (startingPosition): it starts where a reader with no position
//     starts;
//   - a connected consumer's pump (consumer.go): it restarts at the floor,
//     and the consumer cannot be told — the one case the rule is written
//     with rather than around.
//
// Each place is a passing: its line, and how /v1/operations/position-lost
// files it (position_record.go) — the kind of reader, and whether the
// reader was told.
var (
	resumePassed = passing{msg: "stored position below the retention floor: session discarded, answered Session Present 0",
		kind: lostSession, told: true}
	subscribePassed = passing{msg: "stored position below the retention floor: restarting where a reader with no position starts",
		kind: lostSession}
	overtakenPassed = passing{msg: "consumer overtaken by retention: restarting at the floor", kind: lostConsumer}
)

// passing is one of the places a passed position is found.
type passing struct {
	msg  string
	kind string // lostSession or lostConsumer
	told bool   // the reader learns of it (Session Present 0)
}

// positionLoss is one channel's count of passed positions since start.
type positionLoss struct {
	passings atomic.Int64
	records  atomic.Int64
}

// PositionLoss is what retention took from the readers of one append
// channel since the broker started (invariant 1).
type PositionLoss struct {
	// Passings is how many times the floor passed a reader's position, each
	// reported by one log line: saguin_channel_position_lost_total{channel}.
	Passings int64
	// Records is the sum, over those passings, of the records between the
	// reader's position and the floor: records it was never sent.
	Records int64
}

// PositionLost reports, for every append channel (dead-letter channels
// included; zero where nothing was lost), what retention took from its
// readers since start. In memory only, as the metric is.
func (b *Broker) PositionLost() map[string]PositionLoss {
	out := make(map[string]PositionLoss, len(b.channels))
	for name, ch := range b.channels {
		if ch.log == nil {
			continue
		}
		out[name] = PositionLoss{Passings: ch.lost.passings.Load(), Records: ch.lost.records.Load()}
	}
	return out
}

// positionPassed counts one passing and tells the operator: the client, the
// channel, the offset the reader would have been sent next (position), the
// floor it restarts from, and how many records went in between. The
// operations listener's record keeps it too.
func (b *Broker) positionPassed(p passing, client string, ch *channel, position, floor uint64) {
	lost := floor - position
	ch.lost.passings.Add(1)
	ch.lost.records.Add(int64(lost))
	b.positionsLost.add(lostPassing{reader: "mqtt:" + client, channel: ch.name, kind: p.kind, told: p.told,
		position: position, floor: floor}, b.clock.Now())
	b.log.Warn(p.msg, "client", client, "channel", ch.name, "position", position, "floor", floor, "lost_records", lost)
}

// passedPosition is one of a session's positions retention has passed.
type passedPosition struct {
	ch              *channel
	position, floor uint64
}

// passedPositions lists the positions of the away session s that retention
// has passed, channel by channel in name order: a consumer's own position
// (its pump is stopped, so it no longer moves) or, on a channel the session
// holds no consumer of, the position it stored. A consumer restored at a
// start keeps its stored position as it was, below the floor or not, so
// this finds it (sessionstore.go).
func (b *Broker) passedPositions(s *session) ([]passedPosition, error) {
	cons := s.consumersByChannel()
	names := make([]string, 0, len(b.channels))
	for name, ch := range b.channels {
		if ch.log != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var out []passedPosition
	for _, name := range names {
		ch := b.channels[name]
		var pos uint64
		if c := cons[name]; c != nil {
			c.mu.Lock()
			pos = c.positionLocked()
			c.mu.Unlock()
		} else {
			p, ok, err := ch.log.Position(s.reader())
			if err != nil {
				return nil, fmt.Errorf("position on channel %s: %w", name, err)
			}
			if !ok {
				continue
			}
			pos = p.Offset
		}
		// invariant 1: a position retention passed is found and reported, never served as if nothing happened.
		if floor := ch.log.Floor(); pos < floor {
			out = append(out, passedPosition{ch: ch, position: pos, floor: floor})
		}
	}
	return out, nil
}
