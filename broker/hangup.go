package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
)

// hangUpTopic is the operator's hang-up as an MQTT publish (docs/channels.md "The `$saguin/` topics"):
// the payload names the client id whose connection the broker ends. It is
// not an operations-listener route on purpose: it is gated by the ACL, like
// everything a client asks, and answered on the wire like a point read.
const hangUpTopic = "$saguin/sessions/disconnect"

// The answers written to the requester's Response Topic.
const (
	hungUp       = "hung-up"
	noSuchClient = "no-such-client"
)

// hangUp serves a publish to $saguin/sessions/disconnect (docs/channels.md "The `$saguin/` topics"; docs/channels.md "What a publish is answered"): the client named by the payload is sent DISCONNECT 0x98 and its
// connection ends (within write_timeout: the DISCONNECT is a write like any
// other); its session is left as its expiry says — this ends a
// connection, not a session. The requester needs the broker: sessions
// grant's disconnect verb (0x87), a Response Topic for the answer and a
// payload naming someone else (0x83); the answer, hung-up or
// no-such-client, is written to it alone before its PUBACK. At QoS 0 the
// hang-up is done and answered all the same, and a refusal is silent. A
// 3.1.1 client cannot carry a Response Topic: refused, which closes its
// connection at QoS 1 and 2 (refuse).
func (b *Broker) hangUp(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Properties.ProtocolVersion < 5 {
		// 3.1.1 has no Response Topic to answer on: refused, which closes
		// a 3.1.1 connection at QoS 1 and 2 and drops a QoS 0 publish
		// silently, as every refusal does (refuse).
		return b.refuse(cl, pk, withReason(codeImplementation, "a hang-up is answered on a Response Topic, which MQTT 3.1.1 cannot carry"))
	}
	if why := b.reservedRefusal(cl, (*acl.Grants).MayDisconnect, "disconnect on broker: sessions"); why != "" {
		return b.refuse(cl, pk, withReason(codeNotAuthorized, why))
	}
	rt := pk.Properties.ResponseTopic
	target := string(pk.Payload)
	switch {
	case rt == "":
		return b.refuse(cl, pk, withReason(codeImplementation, "a hang-up needs a Response Topic: the answer has nowhere else to go"))
	case target == "":
		return b.refuse(cl, pk, withReason(codeImplementation, "the payload names no client id"))
	case target == cl.ID:
		return b.refuse(cl, pk, withReason(codeImplementation, "a client cannot hang itself up this way; send DISCONNECT"))
	}
	answer := noSuchClient
	if victim, ok := b.mqtt.Clients.Get(target); ok && !victim.Net.Inline && victim.Net.Conn != nil && !victim.Closed() {
		b.log.Info("client hung up by an operator's request", "client", target, "by", cl.ID)
		if victim.Properties.ProtocolVersion == 5 {
			_ = b.mqtt.DisconnectClient(victim, packets.ErrAdministrativeAction)
		}
		victim.Stop(packets.ErrAdministrativeAction)
		answer = hungUp
	}
	out := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   rt,
		Payload:     []byte(answer),
		Properties:  packets.Properties{CorrelationData: pk.Properties.CorrelationData},
	}
	// Written to the requester alone, never published.
	if err := cl.WritePacket(out); err != nil {
		b.log.Debug("hang-up answer not written", "client", cl.ID, "error", err)
	}
	if answer == noSuchClient {
		b.log.Debug("hang-up: no such client connected", "client", cl.ID, "target", target)
	}
	return pk, packets.CodeSuccessIgnore
}
