package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// Shared groups over append and latest channels (docs/channels.md "Shared subscriptions",
// rfcs/broadcast-log.md): a group is served what is
// stored after it began — append: new records only, no replay, no
// offsets, no position moved; latest: changes only, no state pass — split
// one member per record like broadcast. A record a group with a member
// whose session outlives its connection is owed at QoS 1/2 is copied once
// into the broadcast log, before its publisher is answered, and served
// from there to groups only: sessions' own subscriptions are never matched
// against the copy (they have the channel itself).

// shareChannelRecord hands a stored channel record to the $share/ groups
// whose filter matches its topic. Called on the publisher's goroutine after
// the record is stored and before the PUBACK; it waits for nothing a
// subscriber does (invariant 16).
func (b *Broker) shareChannelRecord(rec storage.Record) {
	subs := b.subscribers(rec.Topic)
	if len(subs.Shared) == 0 {
		return
	}
	m := msgFromRecord(rec)
	m.off = 0 // the record's offset is the channel's, not the log's
	// As decoded, payload and Correlation Data are slices of the packet's
	// buffer: copied, so the buffer is not held (fanout.go).
	m.payload = append([]byte(nil), rec.Payload...)
	if len(rec.CorrelationData) > 0 {
		m.props.CorrelationData = append([]byte(nil), rec.CorrelationData...)
	}
	// The record's Message ID travels as saguin-id (docs/channels.md "What a publish is answered"); offsets
	// do not (a group has none).
	m.props.User = append(m.props.User, packets.UserProperty{Key: "saguin-id", Val: rec.MessageID})
	m.measure()
	b.fanOutMsg(m, &mqtt.Subscribers{Shared: subs.Shared}, true)
}

// channelTopic reports whether a channel claims topic: a logged message on
// one is a copy made for shared groups only.
func (b *Broker) channelTopic(topic string) bool {
	_, ok := b.resolver.Resolve(topic)
	return ok
}
