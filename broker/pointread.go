package broker

import (
	"errors"
	"fmt"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/config"
	"saguin.dev/broker/topic"
)

// pointReadTopic is where a client asks for one latest value (docs/channels.md "`latest`"
// "Point read"): the payload names the topic, the answer goes to the
// Response Topic.
const pointReadTopic = "$saguin/kv/get"

// pointReadKeyRefusal judges a point read's key, which is client input (a
// payload of any bytes): bounds first, on its declared length, then its
// form (invariant 13; docs/channels.md "`latest`"). A key it accepts is one topic a value
// can be held under: within the limits, valid UTF-8 without NUL, no
// wildcard, outside the reserved $ space.
func pointReadKeyRefusal(key string, lim config.Limits) (packets.Code, bool) {
	switch {
	case key == "":
		return withReason(codeImplementation, "a point read names the topic to read in its payload, which is empty"), true
	case len(key) > lim.MaxTopicLength:
		return withReason(codeTopicInvalid,
			fmt.Sprintf("the key is %d bytes; limits.max_topic_length is %d", len(key), lim.MaxTopicLength)), true
	case topic.Levels(key) > lim.MaxTopicLevels:
		return withReason(codeTopicInvalid,
			fmt.Sprintf("the key has %d levels; limits.max_topic_levels is %d", topic.Levels(key), lim.MaxTopicLevels)), true
	case strings.ContainsAny(key, "+#"):
		return withReason(codeTopicInvalid, "the key holds a wildcard; a point read names one topic"), true
	case strings.HasPrefix(key, "$"):
		return withReason(codeTopicInvalid, "the key is in the reserved $ space, which holds no channel's value"), true
	}
	if err := topic.ValidTopic(key); err != nil {
		return withReason(codeTopicInvalid, "the key is not a topic: "+err.Error()), true
	}
	return packets.Code{}, false
}

// pointRead answers a read of one key of a latest channel. The answer is
// written only to the asking connection, on its Response Topic: it is not
// published, needs no subscription, a third party on the same topic sees
// nothing, and the caller never becomes a subscriber. Every refusal is on
// the PUBACK, never on the Response Topic, which only ever carries answers:
// 0x83 when the request cannot be acted on, 0x90 when the key is not a
// topic this broker has a value for. A QoS 0 read is dropped: there is no
// PUBACK to carry a refusal, and an answer that may or may not come is not
// one a client can tell from a refusal (rfcs/latest-channel.md).
func (b *Broker) pointRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Qos == 0 {
		b.log.Debug("point read at QoS 0 dropped", "client", cl.ID)
		return pk, packets.ErrRejectPacket
	}
	rt := pk.Properties.ResponseTopic
	if rt == "" {
		return b.refuse(cl, pk, withReason(codeImplementation,
			"a point read needs a Response Topic: the answer has nowhere else to go"))
	}
	if err := topic.ValidTopic(rt); err != nil {
		return b.refuse(cl, pk, withReason(codeImplementation,
			fmt.Sprintf("the Response Topic %q is not a topic an answer can be sent on", rt)))
	}
	key := string(pk.Payload)
	if code, refused := pointReadKeyRefusal(key, b.cfg.Broker.Limits); refused {
		return b.refuse(cl, pk, code)
	}
	name, ok := b.resolver.Resolve(key)
	if !ok {
		return b.refuse(cl, pk, withReason(codeTopicInvalid,
			"no channel holds the key: it is a broadcast topic, which keeps no value to read"))
	}
	ch := b.channels[name]
	if ch.values == nil {
		return b.refuse(cl, pk, withReason(codeTopicInvalid,
			fmt.Sprintf("the key is in channel %s, a %s channel; a point read reaches latest channels only", name, ch.cfg.Type)))
	}
	if why := b.reservedRefusal(cl, func(g *acl.Grants) bool { return g.MayRead(key, name) }, "read of this key on channel "+name); why != "" {
		return b.refuse(cl, pk, withReason(codeNotAuthorized, why))
	}
	rec, found, err := ch.values.Get(key)
	if err != nil {
		b.log.Error("point read: reading the value failed", "channel", name, "client", cl.ID, "error", err)
		return b.refuse(cl, pk, withReason(codeImplementation, fmt.Sprintf("channel %s could not be read", name)))
	}

	now := b.clock.Now()
	corr := pk.Properties.CorrelationData
	if len(corr) == 0 {
		// Every answer carries Correlation Data: the caller's, else the
		// key, so several reads in flight can be told apart.
		corr = []byte(key)
	}
	var reply packets.Packet
	if found && !isTombstone(&rec) && latestServable(ch, &rec, now) {
		// The value as a subscriber would get it, labels included, on the
		// caller's Response Topic with the caller's Correlation Data.
		reply = b.deliveryPacket(&rec, ch, matched{}, now)
		reply.Properties.ResponseTopic = ""
	} else {
		// No value, a deletion, or a value past retention_period: the
		// same empty answer, as if never set.
		reply = packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}}
	}
	reply.TopicName = rt
	reply.FixedHeader.Qos, reply.FixedHeader.Retain = 0, false
	reply.Properties.CorrelationData = corr
	if err := cl.WritePacket(reply); err != nil {
		if errors.Is(err, packets.ErrPacketTooLarge) {
			return b.refuse(cl, pk, withReason(codeImplementation,
				"the value is larger than this client's Maximum Packet Size"))
		}
		b.log.Debug("point read answer not written", "client", cl.ID, "error", err)
	}
	return pk, packets.CodeSuccessIgnore
}
