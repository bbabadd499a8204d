package broker

import (
	"bytes"
	"errors"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// hook connects the substrate's events to the broker. It is only the
// adapter: each method translates one substrate event into a call on the
// broker's own functions (the session's lifecycle in session_lifecycle.go,
// a publish in publish.go and inbound.go, the CONNECT's checks in
// connect.go) and answers in the substrate's terms — which error stops the
// substrate, which marks a packet ignored.
type hook struct {
	mqtt.HookBase
	b *Broker
}

func (h *hook) ID() string { return "saguin" }

func (h *hook) Provides(e byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPacketRead, mqtt.OnPublish,
		mqtt.OnSessionEstablish, mqtt.OnSessionEstablished,
		mqtt.OnDisconnect, mqtt.OnUnsubscribed, mqtt.OnClientExpired, mqtt.OnPacketEncode,
		mqtt.OnRetainMessage, mqtt.OnPacketSent,
	}, []byte{e})
}

// OnPacketEncode corrects one substrate behaviour: with Request Problem
// Information 0 it drops User Properties from every packet, PUBLISH
// included. MQTT-3.1.2-29 forbids Reason Strings and User Properties only on
// packets other than PUBLISH, CONNACK and DISCONNECT; on a PUBLISH they are
// the publisher's headers and Sagüin's saguin-* labels, and must arrive.
func (h *hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if pk.FixedHeader.Type == packets.Publish {
		pk.Mods.DisallowProblemInfo = false
		pk.Properties.ReasonString = ""
	}
	if pk.FixedHeader.Type == packets.Connack {
		pk = h.b.correctConnack(cl, pk) // ownership.go: Session Present as stored and as ended
	}
	pk = h.b.connackPromises(cl, pk) // admission.go: Maximum Packet Size, Topic Alias Maximum
	return pk
}

// OnConnect refuses, before anything of the session is touched, a CONNECT
// whose client identifier or Will the broker cannot take (connect.go).
func (h *hook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		// From here a panic on this connection's goroutine has broker
		// state to leave consistent (listener.go).
		cc.client.Store(cl)
	}
	return h.b.checkConnect(cl, pk)
}

// The substrate's own gates admit everything: authentication is done in
// OnConnect (checkConnect, auth.go) and the ACL is asked by Sagüin's own
// paths (permissions.go), at CONNECT, at each packet and at every delivery
// (docs/configuration.md "The ACL file", rfcs/acl.md).
// The topic of a PUBLISH may reach OnACLCheck marked (substrate_topics.go):
// a check written here judges unmarked(topic).
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool { return true }
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool     { return true }

// OnPacketRead takes the packets Sagüin answers itself before the substrate
// sees them.
func (h *hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.b.panicTopic != "" {
		h.b.panicIfNamed(pk) // a fault-injection build only (Options.PanicTopic)
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if pk.FixedHeader.Qos == 2 {
			// Its PUBREC, a repeat's included, leaves after the PUBACKs
			// owed before it (inbound.go).
			if in, busy := h.b.busyInbound(cl); busy {
				in.settle()
			}
		}
		if h.b.answerRepeat(cl, pk) {
			return noopPacket, nil // a QoS 2 PUBLISH sent again (substrate_topics.go)
		}
		// Past the substrate's silent drop of $SYS-like and short $share
		// topics, so publish answers them (substrate_topics.go).
		return markForSubstrate(pk), nil
	case packets.Subscribe, packets.Unsubscribe, packets.Pubrel, packets.Disconnect:
		// These act after the connection's earlier publishes: a SUBSCRIBE
		// sees them stored, a PUBREL's release and PUBCOMP come after
		// their PUBACKs, a DISCONNECT closes after them (inbound.go).
		// PINGREQ and the acknowledgements of the broker's deliveries are
		// never held behind a commit.
		if in, busy := h.b.busyInbound(cl); busy {
			in.settle()
		}
	}
	switch pk.FixedHeader.Type {
	case packets.Connect:
		noteConnect(cl, pk) // refused_record.go: a refusal before OnConnect names the client
	case packets.Subscribe:
		// invariant 17: only the owner changes the session, and a takeover
		// waits for a SUBSCRIBE in progress (ownership.go).
		release, owner := h.b.ownerTurn(cl)
		if !owner {
			return pk, packets.ErrRejectPacket
		}
		defer release()
		out, err := h.b.subscribe(cl, pk)
		if err != nil {
			// A refused SUBSCRIBE (Retain Handling 3, a shared filter with
			// No Local, no filter: already answered DISCONNECT 0x82) must go
			// no further: the substrate acts on the packet after any other
			// hook error — it subscribed the packet's valid filters, a state
			// change the refusal was to prevent — and ends the connection
			// only on ErrRejectPacket.
			return out, errors.Join(packets.ErrRejectPacket, err)
		}
		return out, nil
	case packets.Unsubscribe:
		// The substrate removes filters by client id: a replaced
		// connection's UNSUBSCRIBE would take the new owner's.
		if !h.b.owns(cl) {
			return pk, packets.ErrRejectPacket
		}
	case packets.Puback, packets.Pubrec, packets.Pubcomp:
		// Each answers an exchange the broker started (MQTT 5 §4.3): the
		// session's deliveries end it, write the PUBREL a PUBREC asks for,
		// and free its window slot (deliveries.go). The substrate never
		// sees them: its in-flight table holds only the client's own QoS 2
		// exchanges, which these would have reached under the same number.
		// invariant 17: only the owner's acknowledgements change the
		// session.
		if s := h.b.sessionOf(cl.ID); s != nil && s.owner() == cl {
			s.deliv.ack(h.b, s, cl, pk)
		}
		return noopPacket, nil
	case packets.Pubrel:
		// A held channel publish is released and PUBCOMP'd here (qos2.go).
		out, err := h.b.pubrel(cl, pk)
		if err != nil {
			// invariant 18: a PUBREL refused here (a release refused for
			// room or failed by the store, already answered DISCONNECT;
			// a connection taken over; a PUBCOMP that could not be
			// written) must go no further. The substrate acts on the
			// packet after any other hook error: its processPubrel
			// records a PUBCOMP 0x00 for the packet id and writes it,
			// now or to the resumed session, though nothing was
			// released. Only ErrRejectPacket stops it (and ends the
			// connection).
			return out, errors.Join(packets.ErrRejectPacket, err)
		}
		return out, nil
	case packets.Disconnect:
		// invariant 18: a clean DISCONNECT's positions are stored before the
		// connection is closed, so a consumer that acknowledged and left is
		// not sent the same records again.
		h.b.disconnecting(cl, pk)
	}
	return pk, nil
}

// OnPacketSent closes a connection once a DISCONNECT has been written to
// it. Passive disconnect (rfcs/0006) keeps the substrate from closing the
// socket before the client could read the reason code, but it then never
// closes it at all — a session taken over (0x8E) or a client past a limit
// (0x93) would stay connected. The bytes are written by now, so closing
// loses nothing.
func (h *hook) OnPacketSent(cl *mqtt.Client, pk packets.Packet, b []byte) {
	if pk.FixedHeader.Type == packets.Disconnect {
		cl.Stop(packets.Code{Code: pk.ReasonCode, Reason: "disconnected by the broker"})
	}
}

// OnRetainMessage discards the substrate's in-memory copy of a retained
// value: Sagüin keeps retained values on a provider (publish stored it before
// this runs), and a second, unbounded copy in memory would be invariant 13
// broken quietly.
func (h *hook) OnRetainMessage(cl *mqtt.Client, pk packets.Packet, r int64) {
	if r > 0 {
		h.b.mqtt.Topics.RetainMessage(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true},
			TopicName:   pk.TopicName,
		})
	}
}

func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	// Before anything reads the topic (substrate_topics.go). The substrate
	// goes on with its own copy, still marked, only to acknowledge it: every
	// answer receivePublish gives marks it ignored or refused, so it fans
	// out and retains nothing of it.
	pk.TopicName = unmarked(pk.TopicName)
	return h.b.receivePublish(cl, pk)
}

// OnSessionEstablish runs after CONNECT passed every check and before the
// substrate looks at the session: the moment the new connection claims it
// (session_lifecycle.go).
func (h *hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.b.establishSession(cl, pk)
}

// OnSessionEstablished runs after the CONNACK is written: the session's
// senders start serving the new connection only now (session_lifecycle.go).
func (h *hook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	// The substrate's send quota defers deliveries and later sends them from
	// the read loop through Inflight.NextImmediate, which takes the table's
	// read lock twice: a write to the table from any other goroutine in
	// between (a QoS 2 hold dropped by the expiry sweep is one) deadlocks
	// the read loop. A zero maximum turns the machinery off; the substrate
	// makes no deliveries, and Sagüin's keep the client's Receive Maximum
	// themselves (deliveries.go). This runs before the read loop starts.
	cl.State.Inflight.ResetSendQuota(0)
	h.b.sessionEstablished(cl)
}

func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		cc.ending.Store(true) // a panic from here on does not run this again (listener.go)
	}
	h.b.connectionGone(cl, expire) // session_lifecycle.go
	if f := h.b.afterTeardown.Load(); f != nil {
		(*f)(cl) // a test's pause where the substrate's own cleanup follows
	}
}

func (h *hook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	filters := make([]string, len(pk.Filters))
	for i, f := range pk.Filters {
		filters[i] = f.Filter
	}
	h.b.unsubscribed(cl, filters)
}

// OnClientExpired: the session's expiry passed while it was away. Its
// positions go now, not at the next start, or a replacement device with the
// same client id would inherit them (docs/channels.md "`append`").
func (h *hook) OnClientExpired(cl *mqtt.Client) {
	h.b.endSession(cl.ID, nil)
}
