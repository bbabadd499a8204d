package broker

import (
	"fmt"
	"log/slog"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
)

// The ACL's questions, asked where each packet is judged (docs/configuration.md "The ACL file"):
// CONNECT (connect.go: the identity, client_ids, the Will, the features),
// PUBLISH (publishRefusal), SUBSCRIBE (subscribeRefusal), the $saguin/
// requests (seek, point read, queue answers), and every delivery on every
// route (permit). Structural refusals come first everywhere; the ACL may
// only narrow. Without an acl_file none of this is asked (grantsOf).

// mayPublishTo is the write question for a topic: write on the channel
// that holds it (delete, for a latest channel's zero-length publish), or a
// topic: rule for a broadcast topic.
func (b *Broker) mayPublishTo(g *acl.Grants, t string, empty bool) bool {
	name, ok := b.resolver.Resolve(t)
	if !ok {
		return g.MayWrite(t, "")
	}
	if empty {
		if ch := b.channels[name]; ch != nil && ch.cfg.Type == "latest" {
			return g.MayDelete(t, name)
		}
	}
	return g.MayWrite(t, name)
}

// publishFeatureRefusal applies the ACL's feature denials to a PUBLISH,
// before anything else of it is judged (docs/channels.md "What a publish is answered"; docs/security.md "A feature the ACL denies"): a QoS 2
// publish from a client denied qos2 ends the connection with 0x9B. It
// reports whether the publish was refused (the connection is then ending).
func (b *Broker) publishFeatureRefusal(cl *mqtt.Client, g *acl.Grants, pk packets.Packet) bool {
	if pk.FixedHeader.Qos == 2 && g.Denies(acl.QoS2) {
		b.disconnectFor(cl, withReason(packets.ErrQosNotSupported, "this client may not publish at QoS 2"), pk.TopicName)
		return true
	}
	return false
}

// disconnectFor ends a connection for what one of its packets asked (a
// feature the ACL denies): MQTT 5 DISCONNECT with the code, a 3.1.1 close
// (it has no server DISCONNECT). One bounded line.
func (b *Broker) disconnectFor(cl *mqtt.Client, code packets.Code, topic string) {
	b.refusedClosing(slog.LevelWarn, cl, refusePublish, code.Code, "DISCONNECT: the client asked for what the ACL denies it",
		"topic", topic, "reason", code.Reason)
	if cl.Properties.ProtocolVersion == 5 {
		_ = b.mqtt.DisconnectClient(cl, code)
	}
	cl.Stop(code)
}

// publishACLRefusal judges a PUBLISH to a broadcast topic (channel "") or
// to a channel: a retained broadcast publish from a client denied retained
// ends the connection (0x9A, any QoS); a topic the client may not write is
// refused 0x87 (3.1.1: closed). ok false: the answer is decided (out, err).
func (b *Broker) publishACLRefusal(cl *mqtt.Client, pk packets.Packet, channel string) (out packets.Packet, err error, ok bool) {
	g, all := b.grantsOf(cl)
	if all {
		return pk, nil, true
	}
	if g == nil {
		out, err = b.refuse(cl, pk, withReason(codeNotAuthorized, "the connection has no identity"))
		return out, err, false
	}
	if channel == "" && pk.FixedHeader.Retain && g.Denies(acl.Retained) {
		b.disconnectFor(cl, withReason(packets.ErrRetainNotSupported, "this client may not retain a message on a broadcast topic"), pk.TopicName)
		return pk, packets.ErrRejectPacket, false
	}
	t := pk.TopicName
	if !b.mayPublishTo(g, t, len(pk.Payload) == 0) {
		why := "the ACL grants this client no write here"
		if channel != "" {
			why = fmt.Sprintf("the ACL grants this client no %s on channel %s here", writeVerb(b, channel, len(pk.Payload) == 0), channel)
		}
		out, err = b.refuse(cl, pk, withReason(codeNotAuthorized, why))
		return out, err, false
	}
	return pk, nil, true
}

func writeVerb(b *Broker, channel string, empty bool) string {
	if ch := b.channels[channel]; empty && ch != nil && ch.cfg.Type == "latest" {
		return "delete"
	}
	return "write"
}

// reservedRefusal asks the verb a $saguin/ request rides on (docs/channels.md "The `$saguin/` topics"): seek on the append channel, consume on the queue, read of the
// key on the latest channel. "" when allowed.
func (b *Broker) reservedRefusal(cl *mqtt.Client, ask func(*acl.Grants) bool, what string) string {
	g, all := b.grantsOf(cl)
	if all || (g != nil && ask(g)) {
		return ""
	}
	return "the ACL grants this client no " + what
}

// subscribeRefusal is the ACL's part of judging one SUBSCRIBE filter the
// configuration already granted (filterCode): the code it is refused with
// and why, or the QoS it is granted (qos2 denied: at most 1).
func (b *Broker) subscribeRefusal(g *acl.Grants, f packets.Subscription, granted byte) (byte, string) {
	if g == nil {
		return subackNotAuthorized, "the connection has no identity"
	}
	if g.Denies(acl.QoS2) && granted > 1 {
		granted = 1 // docs/security.md "A feature the ACL denies": a QoS 2 subscription is granted as 1
	}
	filter := f.Filter
	if name, ok := strings.CutPrefix(filter, "$saguin/queue/"); ok {
		if !g.MayConsume(name) {
			return subackNotAuthorized, "the ACL grants this client no consume on queue " + name
		}
		return granted, ""
	}
	if _, ok := seekReplyChannel(filter); ok {
		// Seek replies are written to the seeking connection only; the
		// seek itself is what needs the verb.
		return granted, ""
	}
	if rest, ok := strings.CutPrefix(filter, "$share/"); ok {
		_, filter, _ = strings.Cut(rest, "/")
	}
	if err := g.CheckSubscribe(filter); err != nil {
		return subackNotAuthorized, err.Error()
	}
	return granted, ""
}

// permit is the one permission function every delivery passes, on every
// route, before anything is reserved for it.
//
// invariant 16: asked per delivery, not only at SUBSCRIBE: a grant
// withdrawn by a reload stops the next delivery to a live session — a
// durable consumer resumed without a SUBSCRIBE included — and the refused
// route stalls (append, latest), returns the job unspent (queue) or does not
// send (broadcast), each as deliveries.go says. It may be called with a
// consumer's or a queue's lock held, so it takes no lock; a test may stand
// in for it (SetDeliveryPermit).
func (b *Broker) permit(cl *mqtt.Client, r route, topic string) bool {
	if f := b.permitTest.Load(); f != nil {
		return (*f)(cl.ID, r.String(), topic)
	}
	g, all := b.grantsOf(cl)
	if all {
		return true
	}
	if g == nil {
		return false
	}
	channel, _ := b.resolver.Resolve(topic)
	if r == routeQueue {
		return g.MayConsume(channel)
	}
	return g.MayRead(topic, channel)
}
