package broker

import (
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/wire"
)

// The substrate (mochi v2.7.9, server.go processPublish) drops a client's
// PUBLISH without a word when its own topic check (IsValidFilter with
// forPublish) fails: every topic whose first four bytes are "$SYS" in any
// letter case ($SYS/x, but also $sys/x, $SYSTEM/x) and "$share" in any case
// with fewer than three levels ($share/x, $Share/x, $share). A QoS 1 or 2
// publisher is then never answered and waits forever, and topics MQTT calls
// ordinary — topics are case-sensitive (MQTT 5 §4.7.3), so $sys/x is not
// $SYS — are lost. Sagüin decides every one of these topics itself, as
// docs/channels.md "The `$saguin/` topics"; docs/channels.md "What a publish is answered" say (publish.go): $SYS 0x87, $share/ 0x90,
// the rest ordinary.
//
// To get them past that check, and still through the substrate's ordinary
// path (packet identifier in use, Receive Maximum, topic alias, the QoS 2
// state PUBREL completes), OnPacketRead puts substrateMark in front of the
// topic and OnPublish takes it off before anything looks at the topic. The
// mark is a NUL, which no topic a client sends can hold (MQTT-1.5.4-2; the
// substrate's decoder refuses it), so a marked topic is never a client's.
const substrateMark = "\x00"

// markForSubstrate marks a client PUBLISH whose topic the substrate would
// drop unanswered. A topic holding a wildcard is left alone: the
// substrate's validation refuses it first, as the Protocol Error MQTT-3.3.2-2
// makes it (DISCONNECT 0x82). An empty topic (a Topic Alias in use) is left
// alone too; the topic its alias names was marked when it was set.
func markForSubstrate(pk packets.Packet) packets.Packet {
	t := pk.TopicName
	if t == "" || strings.ContainsAny(t, "+#") || mqtt.IsValidFilter(t, true) {
		return pk
	}
	pk.TopicName = substrateMark + t
	return pk
}

// unmarked is a topic as the client sent it.
func unmarked(topic string) string {
	return strings.TrimPrefix(topic, substrateMark)
}

// answerRepeat answers a QoS 2 PUBLISH sent again while its exchange waits
// for PUBREL (the substrate keeps the exchange's PUBREC in flight): PUBREC
// 0x00 once more, and nothing held or delivered twice (MQTT-4.3.3-10). The
// substrate answers it PUBREC 0x91 (Packet Identifier in use), which tells
// a client resending after a reconnect that its message failed, though it is
// held and delivered at the PUBREL. It reports whether it answered; the
// packet then goes on to the substrate as noopPacket (qos2.go). A packet
// the substrate's validation refuses is left to it.
func (b *Broker) answerRepeat(cl *mqtt.Client, pk packets.Packet) bool {
	if pk.FixedHeader.Qos != 2 || pk.PublishValidate(wire.TopicAliasMaximum) != packets.CodeSuccess {
		return false
	}
	if held, ok := cl.State.Inflight.Get(pk.PacketID); !ok || held.FixedHeader.Type != packets.Pubrec {
		return false
	}
	if p := pk.Properties; p.TopicAliasFlag && p.TopicAlias > 0 && pk.TopicName != "" {
		// The alias it sets is set, as the substrate would have: a client
		// resending on a new connection sets its aliases afresh.
		cl.State.TopicAliases.Inbound.Set(p.TopicAlias, markForSubstrate(pk).TopicName)
	}
	b.log.Debug("QoS 2 PUBLISH sent again before its PUBREL: PUBREC again, held once", "client", cl.ID, "packet_id", pk.PacketID)
	// Only an accepted exchange has its PUBREC in flight: the answer is 0x00.
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: pk.PacketID})
	return true
}
