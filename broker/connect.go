package broker

import (
	"fmt"
	"log/slog"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// checkConnect refuses, before anything of the session is touched, a
// CONNECT whose client identifier or Will the broker cannot take, and caps
// the keep-alive it asked for.
func (b *Broker) checkConnect(cl *mqtt.Client, pk packets.Packet) error {
	if reason, bad := b.clientIDRefusal(pk); bad {
		// configuration.md §3: 0x85 (3.1.1: 0x02, which the substrate maps).
		b.refused(slog.LevelWarn, cl, refuseConnect, packets.ErrClientIdentifierNotValid.Code,
			"CONNECT refused: client identifier", "reason", reason)
		code := withReason(packets.ErrClientIdentifierNotValid, reason)
		if cl.Properties.ProtocolVersion < 5 {
			code = packets.ErrClientIdentifierNotValid // mapped to 0x02 by its code alone
		}
		_ = b.mqtt.SendConnack(cl, code, false, nil)
		return code
	}
	if code, refused := b.willRefusal(pk); refused {
		return b.refuseWill(cl, code)
	}
	if pk.Connect.WillFlag && !b.willAllowed(cl, pk.Connect.WillTopic) {
		// A Will is a publish the client asks the broker to make for it:
		// it meets the client's own rules (RFC 0003, CONNACK 0x87).
		return b.refuseWill(cl, withReason(codeNotAuthorized, "Will topic is not one this client may publish to"))
	}
	b.capKeepalive(cl, pk)
	return nil
}

// capKeepalive applies limits.max_keepalive (configuration.md §1.5): an MQTT
// 5 client asking for more, or for none (0), is given the ceiling as Server
// Keep Alive on its CONNACK, and the substrate arms the read deadline from
// it. A silent client is then found within the ceiling, not never. MQTT
// 3.1.1 has no Server Keep Alive, so it is not applied there.
func (b *Broker) capKeepalive(cl *mqtt.Client, pk packets.Packet) {
	max := b.cfg.Broker.Limits.MaxKeepalive
	if max <= 0 || cl.Properties.ProtocolVersion < 5 {
		return
	}
	secs := uint16(max / time.Second)
	if pk.Connect.Keepalive == 0 || pk.Connect.Keepalive > secs {
		cl.State.Keepalive = secs
		cl.State.ServerKeepalive = true
	}
}

// clientIDRefusal decides a CONNECT's client identifier (configuration.md
// §3, 0x85): longer than limits.max_client_id_length (checked on the
// declared bytes, invariant 13), empty while asking to resume a session, or
// holding a control character (U+0001–U+001F, U+007F–U+009F) that would
// corrupt every log line naming the client.
func (b *Broker) clientIDRefusal(pk packets.Packet) (string, bool) {
	id := pk.Connect.ClientIdentifier
	if max := b.cfg.Broker.Limits.MaxClientIDLength; len(id) > max {
		return fmt.Sprintf("client identifier is %d bytes; limits.max_client_id_length is %d", len(id), max), true
	}
	if id == "" && !pk.Connect.Clean {
		return "an empty client identifier cannot resume a session: send one, or set Clean Start", true
	}
	for _, r := range id {
		if (r >= 0x01 && r <= 0x1F) || (r >= 0x7F && r <= 0x9F) {
			return fmt.Sprintf("client identifier holds the control character U+%04X", r), true
		}
	}
	return "", false
}
