package broker

import (
	"fmt"
	"log/slog"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
)

// checkConnect refuses, before anything of the session is touched, a
// CONNECT whose client identifier or Will the broker cannot take, and caps
// the keep-alive it asked for.
func (b *Broker) checkConnect(cl *mqtt.Client, pk packets.Packet) error {
	if reason, bad := b.clientIDRefusal(pk); bad {
		// docs/security.md "Every refusal, and its code": 0x85 (3.1.1: 0x02, which the substrate maps).
		b.refused(slog.LevelWarn, cl, refuseConnect, packets.ErrClientIdentifierNotValid.Code,
			"CONNECT refused: client identifier", "reason", reason)
		code := withReason(packets.ErrClientIdentifierNotValid, reason)
		if cl.Properties.ProtocolVersion < 5 {
			code = packets.ErrClientIdentifierNotValid // mapped to 0x02 by its code alone
		}
		_ = b.mqtt.SendConnack(cl, code, false, nil)
		return code
	}
	// Who the client is, before anything else about it is judged: a
	// client that fails authentication learns nothing more (docs/security.md "Every refusal, and its code": features are checked only after authentication).
	ca, err := b.admitIdentity(cl, pk)
	if err != nil {
		return err
	}
	if code, refused := b.willRefusal(pk); refused {
		return b.refuseWill(cl, code)
	}
	g, all := b.grantsOf(cl)
	if pk.Connect.WillFlag && !all {
		if code, refused := willFeatureRefusal(g, pk, b.resolver); refused {
			return b.refuseWill(cl, code)
		}
	}
	if pk.Connect.WillFlag && !b.willAllowed(cl, pk.Connect.WillTopic) {
		// A Will is a publish the client asks the broker to make for it:
		// it meets the client's own rules (docs/channels.md, CONNACK 0x87).
		return b.refuseWill(cl, withReason(codeNotAuthorized, "Will topic is not one this client may publish to"))
	}
	if !all && g.Denies(acl.Persistent) {
		// docs/security.md "A feature the ACL denies": accepted, with a session that ends with the
		// connection — Session Expiry 0 on the CONNACK (MQTT 5), made
		// clean (3.1.1).
		ca.notPersistent = true
		cl.Properties.Props.SessionExpiryInterval = 0
		cl.Properties.Clean = true
	}
	b.capKeepalive(cl, pk)
	return nil
}

// admitIdentity authenticates the CONNECT and, under an ACL, checks that
// the identity may use this client id (docs/configuration.md "The ACL file" client_ids, 0x86).
// The identity is kept on the connection for every later question.
func (b *Broker) admitIdentity(cl *mqtt.Client, pk packets.Packet) (*connAuth, error) {
	a := b.auth.Load()
	ca, r := b.authenticate(cl, pk, a)
	if r != nil {
		return nil, b.refuseAuthentication(cl, r)
	}
	if a.rules != nil {
		g := a.rules.For(ca.user, ca.clientID)
		if !g.ClientIDAllowed() {
			return nil, b.refuseAuthentication(cl, &authRefusal{code: packets.ErrBadUsernameOrPassword,
				reason: "the ACL's client_ids for this user do not admit this client id"})
		}
		ca.grants.Store(&grantsAt{gen: a.gen, g: g})
		for _, w := range g.Withheld() {
			// Once per connection: the rule would have widened past this
			// client's own name (docs/configuration.md "The ACL file").
			b.log.Warn("ACL rule withheld for this client: substituting its name would widen it",
				"client", cl.ID, "user", ca.user, "role", w.Grant.Role, "rule", w.Grant.Subject, "reason", w.Reason)
		}
	}
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		cc.auth.Store(ca)
	}
	return ca, nil
}

// willFeatureRefusal applies the ACL's feature denials to a Will (docs/security.md "A feature the ACL denies"): no Will at all (0x87), no QoS 2 Will (0x9B), no retained Will on
// a broadcast topic (0x9A).
func willFeatureRefusal(g *acl.Grants, pk packets.Packet, r interface{ Resolve(string) (string, bool) }) (packets.Code, bool) {
	c := pk.Connect
	switch {
	case g.Denies(acl.Will):
		return withReason(codeNotAuthorized, "this client may not leave a Will"), true
	case c.WillQos == 2 && g.Denies(acl.QoS2):
		return withReason(packets.ErrQosNotSupported, "this client may not publish at QoS 2"), true
	case c.WillRetain && g.Denies(acl.Retained):
		if _, channel := r.Resolve(c.WillTopic); !channel {
			return withReason(packets.ErrRetainNotSupported, "this client may not retain a message on a broadcast topic"), true
		}
	}
	return packets.Code{}, false
}

// capKeepalive applies limits.max_keepalive (docs/configuration.md "`broker.limits`"): an MQTT
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

// clientIDRefusal decides a CONNECT's client identifier (docs/security.md "Every refusal, and its code", 0x85): longer than limits.max_client_id_length (checked on the
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
