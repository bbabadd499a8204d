package broker

import (
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The substrate (mochi v2.7.9, server.go processPublish) drops a client's
// PUBLISH without a word when its own topic check (IsValidFilter with
// forPublish) fails: every topic whose first four bytes are "$SYS" in any
// letter case ($SYS/x, but also $sys/x, $SYSTEM/x) and "$share" in any case
// with fewer than three levels ($share/x, $Share/x, $share). A QoS 1 or 2
// publisher is then never answered and waits forever, and topics MQTT calls
// ordinary — topics are case-sensitive (MQTT 5 §4.7.3), so $sys/x is not
// $SYS — are lost. Sagüin decides every one of these topics itself, as
// configuration.md §2.3 and §3.3 say (publish.go): $SYS 0x87, $share/ 0x90,
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
