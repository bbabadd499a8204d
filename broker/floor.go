package broker

import "sync/atomic"

// What retention takes from a reader (invariant 1). A reader's position on
// an append channel is passed when retention raises the channel's floor
// above it. These places find it so, and each restarts the reader where the
// rule says and tells the operator in one line:
//
//   - a SUBSCRIBE reaching a position the session kept without reading the
//     channel (startingPosition): it starts where a reader with no position
//     starts;
//   - a connected consumer's pump (consumer.go): it restarts at the floor,
//     and the consumer cannot be told — the one case the rule is written
//     with rather than around.
const (
	msgSubscribePassed = "stored position below the retention floor: restarting where a reader with no position starts"
	msgOvertaken       = "consumer overtaken by retention: restarting at the floor"
)

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
// floor it restarts from, and how many records went in between.
func (b *Broker) positionPassed(msg, client string, ch *channel, position, floor uint64) {
	lost := floor - position
	ch.lost.passings.Add(1)
	ch.lost.records.Add(int64(lost))
	b.log.Warn(msg, "client", client, "channel", ch.name, "position", position, "floor", floor, "lost_records", lost)
}
