package broker_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// Raw packets for the refusals of issue 12 item 3 that the framer's check
// makes (rfcs/wire-validation.md): each is answered with the code MQTT 5
// and docs/security.md "Every refusal, and its code"/§3.5 give, before any state changes; MQTT
// 3.1.1 gets no DISCONNECT (a refused CONNECT is closed without CONNACK).

// wstr is an MQTT string or binary field: a two-byte length, then s.
func wstr(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

// wprops is a property section: its length (one byte: tests stay short),
// then the properties.
func wprops(p ...[]byte) []byte {
	var b []byte
	for _, x := range p {
		b = append(b, x...)
	}
	return append([]byte{byte(len(b))}, b...)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// connectPacket is a CONNECT at level with the given flags (Clean Start is
// the caller's), Keep Alive 60, the CONNECT properties (MQTT 5 only: nil
// at 3.1.1), the client id, then rest (Will properties, topic and payload,
// user name, password — whatever the flags say, raw).
func connectPacket(level, flags byte, props []byte, id string, rest ...[]byte) []byte {
	body := cat(wstr("MQTT"), []byte{level, flags, 0, 60}, props, wstr(id), cat(rest...))
	return append(fixedHeader(0x10, len(body)), body...)
}

// rawPublish is a PUBLISH with the fixed header's first byte given, its
// topic, a packet id (0: none, for QoS 0), properties (nil at 3.1.1) and
// payload.
func rawPublish(first byte, topic string, id uint16, props []byte, payload string) []byte {
	body := wstr(topic)
	if id != 0 {
		body = append(body, byte(id>>8), byte(id))
	}
	body = cat(body, props, []byte(payload))
	return append(fixedHeader(first, len(body)), body...)
}

// rawSubscribe is a SUBSCRIBE with packet id 1, properties (nil at 3.1.1)
// and filters given as (filter, options byte) pairs, raw.
func rawSubscribe(props []byte, filters ...[]byte) []byte {
	body := cat([]byte{0, 1}, props, cat(filters...))
	return append(fixedHeader(0x82, len(body)), body...)
}

// trailing is pk (a packet with a one-byte Remaining Length) with extra
// bytes after its last field, inside a Remaining Length that counts them.
func trailing(pk []byte, extra ...byte) []byte {
	body := append(append([]byte{}, pk[2:]...), extra...)
	return append(fixedHeader(pk[0], len(body)), body...)
}

func filterOpt(f string, opt byte) []byte { return append(wstr(f), opt) }

// TestWire_ConnectRefusals: CONNECTs MQTT calls malformed or protocol
// errors, each refused with its code (MQTT 5) or closed (3.1.1), never
// admitted.
func TestWire_ConnectRefusals(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	none := wprops()
	will := cat(wprops(), wstr("chat/w"), wstr("gone")) // MQTT 5 Will: no properties, topic, payload
	for _, tc := range []struct {
		name string
		pk   []byte
		code byte // MQTT 5 CONNACK code; 0: closed with nothing
	}{
		{"Session Expiry Interval given twice", connectPacket(5, 2, wprops([]byte{0x11, 0, 0, 0, 9}, []byte{0x11, 0, 0, 1, 0}), "dup"), 0x82},
		{"Receive Maximum given twice", connectPacket(5, 2, wprops([]byte{0x21, 0, 5}, []byte{0x21, 0, 6}), "dup2"), 0x82},
		{"Will QoS 1 without the Will flag", connectPacket(5, 2|0x08, none, "wq"), 0x81},
		{"Will QoS 3", connectPacket(5, 2|0x04|0x18, none, "wq3", will), 0x81},
		{"Will Retain without the Will flag", connectPacket(5, 2|0x20, none, "wr"), 0x82},
		{"reserved flag", connectPacket(5, 3, none, "res"), 0x81},
		{"Receive Maximum 0", connectPacket(5, 2, wprops([]byte{0x21, 0, 0}), "rm0"), 0x82},
		{"Maximum Packet Size 0", connectPacket(5, 2, wprops([]byte{0x27, 0, 0, 0, 0}), "mps0"), 0x82},
		{"Request Problem Information 2", connectPacket(5, 2, wprops([]byte{0x17, 2}), "rpi2"), 0x82},
		{"Request Response Information 2", connectPacket(5, 2, wprops([]byte{0x19, 2}), "rri2"), 0x82},
		{"Will Payload Format Indicator 2", connectPacket(5, 2|0x04, none, "wpfi",
			wprops([]byte{0x01, 2}), wstr("chat/w"), wstr("gone")), 0x82},
		{"Will Response Topic with a wildcard", connectPacket(5, 2|0x04, none, "wrt",
			wprops(cat([]byte{0x08}, wstr("replies/#"))), wstr("chat/w"), wstr("gone")), 0x82},
		{"Will property given twice", connectPacket(5, 2|0x04, none, "wdup",
			wprops([]byte{0x18, 0, 0, 0, 1}, []byte{0x18, 0, 0, 0, 2}), wstr("chat/w"), wstr("gone")), 0x82},
		{"a property not valid in CONNECT (Topic Alias)", connectPacket(5, 2, wprops([]byte{0x23, 0, 1}), "ta"), 0x81},
		{"Authentication Data without a method", connectPacket(5, 2, wprops(cat([]byte{0x16}, wstr("x"))), "ad"), 0x82},
		{"trailing bytes", trailing(connectPacket(5, 2, none, "trail"), 1, 2, 3), 0x81},
		{"user name not UTF-8", connectPacket(5, 2|0x80, none, "un", []byte{0, 2, 0xC3, 0x28}), 0x81},
		{"protocol level 6", connectPacket(6, 2, none, "v6"), 0x84},
		{"protocol level 0", connectPacket(0, 2, nil, "v0"), 0x84},
		{"Authentication Method", connectPacket(5, 2, wprops(cat([]byte{0x15}, wstr("SCRAM-SHA-1"))), "am"), 0x8C},
		// MQTT 3.1.1: the same faults close the connection, nothing sent
		// ([MQTT-3.1.4-1]).
		{"3.1.1 Will QoS without the Will flag", connectPacket(4, 2|0x10, nil, "wq311"), 0},
		{"3.1.1 Will Retain without the Will flag", connectPacket(4, 2|0x20, nil, "wr311"), 0},
		{"3.1.1 password without a user name", connectPacket(4, 2|0x40, nil, "pw311", wstr("secret")), 0},
		{"3.1.1 trailing bytes", trailing(connectPacket(4, 2, nil, "t311"), 9), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dialBytes(t, b.Address())
			r.write(tc.pk)
			if tc.code == 0 {
				r.closedSilently()
				return
			}
			r.connackedWith(tc.code)
		})
	}
	// The well-formed neighbours of those faults are admitted: a Will with
	// its flags, properties that may repeat, the defined values.
	for name, pk := range map[string][]byte{
		"Will QoS 1 retained with its flag": connectPacket(5, 2|0x04|0x08|0x20, none, "okwill", will),
		"two User Properties": connectPacket(5, 2, wprops(cat([]byte{0x26}, wstr("k"), wstr("v")),
			cat([]byte{0x26}, wstr("k"), wstr("w"))), "okuser"),
		"Request Problem Information 0, Receive Maximum 1": connectPacket(5, 2, wprops([]byte{0x17, 0}, []byte{0x21, 0, 1}), "okrpi"),
		"3.1.1 user name and password":                     connectPacket(4, 2|0xC0, nil, "ok311", wstr("u"), wstr("p")),
	} {
		r := dialBytes(t, b.Address())
		r.write(pk)
		v := byte(5)
		if pk[8] == 4 {
			v = 4
		}
		if ack, err := r.read(v); err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
			t.Errorf("%s: %s, want CONNACK 0x00", name, answered(ack, err))
		}
	}
	othersUnaffected(t, b, "after")
}

// invariant 17: a CONNECT carrying an Authentication Method is refused
// 0x8C (this build has no enhanced authentication, docs/security.md "Every refusal, and its code")
// — and, being refused, it leaves the live session of the same client id
// untouched: the connected client keeps its connection, its subscription
// and its session, and keeps being served. The substrate accepted such a
// CONNECT and took the session over.
func TestInvariant17_RefusedAuthenticationMethodLeavesTheLiveSession(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	dev := brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{SessionExpiry: 300})
	dev.Subscribe("chat/dev", 1)
	talker := brokertest.Connect(t, b.Address(), "talker", brokertest.ClientOptions{CleanStart: true})

	r := dialBytes(t, b.Address())
	r.write(connectPacket(5, 2, wprops(cat([]byte{0x15}, wstr("SCRAM-SHA-256"))), "dev")) // Clean Start, too
	r.connackedWith(0x8C)

	if _, err := talker.Publish(&paho.Publish{Topic: "chat/dev", QoS: 1, Payload: []byte("one")}); err != nil {
		t.Fatal(err)
	}
	if m := dev.Next(wait); string(m.Payload) != "one" {
		t.Fatalf("the live client after the refused CONNECT: %q", m.Payload)
	}
	if resp, err := dev.Publish(&paho.Publish{Topic: "events/dev", QoS: 1, Payload: []byte("x")}); err != nil || resp.ReasonCode != 0 {
		t.Fatalf("the live client's publish: %v %+v", err, resp)
	}
	select {
	case d := <-dev.Disconnects:
		t.Fatalf("the live client was disconnected: %+v", d)
	default:
	}
	dev.Close()
	again := brokertest.Connect(t, b.Address(), "dev", brokertest.ClientOptions{SessionExpiry: 300})
	if !again.Connack.SessionPresent {
		t.Fatal("the session did not survive the refused CONNECT (Session Present 0)")
	}
	if _, err := talker.Publish(&paho.Publish{Topic: "chat/dev", QoS: 1, Payload: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	if m := again.Next(wait); string(m.Payload) != "two" {
		t.Fatalf("the resumed subscription: %q", m.Payload)
	}
}

// firstIs asserts the next message c receives is payload: a refused
// publish that had been delivered would have arrived before it.
func firstIs(t *testing.T, c *brokertest.Client, payload string) {
	t.Helper()
	if m := c.Next(wait); string(m.Payload) != payload {
		t.Fatalf("received %q on %s, want %q first (a refused publish was delivered)", m.Payload, m.Topic, payload)
	}
}

// TestWire_PublishRefusals: PUBLISHes the check refuses, each answered
// DISCONNECT with its code and never stored or delivered; 3.1.1 closed.
func TestWire_PublishRefusals(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	watcher := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
	watcher.Subscribe("chat/#", 1)
	watcher.Subscribe("events/#", 1)
	talker := brokertest.Connect(t, b.Address(), "talker", brokertest.ClientOptions{CleanStart: true})
	for i, tc := range []struct {
		name  string
		pk    []byte
		code  byte
		v311  bool
		topic string // where it would have gone
	}{
		{"Content Type given twice", rawPublish(0x32, "chat/a", 1,
			wprops(cat([]byte{0x03}, wstr("a")), cat([]byte{0x03}, wstr("b"))), "dup"), 0x82, false, "chat/a"},
		{"Message Expiry Interval given twice, to a channel", rawPublish(0x32, "events/a", 1,
			wprops([]byte{0x02, 0, 0, 0, 5}, []byte{0x02, 0, 0, 0, 6}), "dup"), 0x82, false, "events/a"},
		{"Payload Format Indicator 2", rawPublish(0x32, "chat/b", 1, wprops([]byte{0x01, 2}), "pfi"), 0x82, false, "chat/b"},
		{"Response Topic with a wildcard", rawPublish(0x32, "chat/c", 1,
			wprops(cat([]byte{0x08}, wstr("replies/+"))), "rt"), 0x82, false, "chat/c"},
		{"a property not valid in PUBLISH (Receive Maximum)", rawPublish(0x32, "chat/d", 1,
			wprops([]byte{0x21, 0, 1}), "rm"), 0x81, false, "chat/d"},
		{"properties running past their length", rawPublish(0x32, "chat/e", 1,
			[]byte{2, 0x02, 0, 0, 0, 5}, "x"), 0x81, false, "chat/e"},
		{"Subscription Identifier from a client", rawPublish(0x32, "chat/f", 1, wprops([]byte{0x0B, 1}), "si"), 0x82, false, "chat/f"},
		{"both QoS bits set", rawPublish(0x36, "chat/g", 1, wprops(), "q3"), 0x81, false, "chat/g"},
		{"topic not UTF-8", rawPublish(0x32, "chat/\xC3\x28", 1, wprops(), "u"), 0x81, false, "chat/h"},
		// Pinned where the substrate already refused correctly.
		{"wildcard in the topic", rawPublish(0x32, "chat/+", 1, wprops(), "w"), 0x82, false, "chat/i"},
		{"Topic Alias 17", rawPublish(0x32, "chat/j", 1, wprops([]byte{0x23, 0, 17}), "ta"), 0x94, false, "chat/j"},
		{"3.1.1: both QoS bits set", rawPublish(0x36, "chat/k", 1, nil, "q3"), 0, true, "chat/k"},
		{"3.1.1: topic not UTF-8", rawPublish(0x32, "chat/\xff", 1, nil, "u"), 0, true, "chat/l"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r *rawConn
			if tc.v311 {
				r = connected311(t, b.Address(), "p311")
				r.write(tc.pk)
				r.closedSilently()
			} else {
				r = connected5(t, b.Address(), "p5")
				r.write(tc.pk)
				r.disconnectedWith(tc.code)
			}
			marker := "after-" + string(rune('a'+i))
			if _, err := talker.Publish(&paho.Publish{Topic: tc.topic, QoS: 1, Payload: []byte(marker)}); err != nil {
				t.Fatal(err)
			}
			firstIs(t, watcher, marker)
		})
	}
}

// Topic Alias mappings belong to one network connection (MQTT 5
// §3.3.2.3.4, [MQTT-3.3.2-7]). A PUBLISH with an empty topic naming an
// alias this connection never set is a Protocol Error (MQTT 5 §3.3.4:
// DISCONNECT 0x82) — whether the alias was never set at all (the
// substrate acknowledged such a QoS 1 publish with PUBACK 0x00 and stored
// it nowhere: an acknowledged publish lost) or set on an earlier connection
// of the same client (the substrate accepted it).
func TestWire_TopicAliasBelongsToOneConnection(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	watcher := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
	watcher.Subscribe("chat/#", 1)
	talker := brokertest.Connect(t, b.Address(), "talker", brokertest.ClientOptions{CleanStart: true})

	// On one connection, an alias set is used (no false refusal).
	r := connected5(t, b.Address(), "aliaser")
	r.write(rawPublish(0x32, "chat/aliased", 1, wprops([]byte{0x23, 0, 1}), "set"))
	if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != 0 {
		t.Fatalf("PUBLISH setting alias 1: %+v %v", pk, err)
	}
	firstIs(t, watcher, "set")
	r.write(rawPublish(0x32, "", 2, wprops([]byte{0x23, 0, 1}), "used"))
	if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != packets.Puback || pk.ReasonCode != 0 {
		t.Fatalf("PUBLISH using alias 1: %+v %v", pk, err)
	}
	if m := watcher.Next(wait); m.Topic != "chat/aliased" || string(m.Payload) != "used" {
		t.Fatalf("the aliased publish arrived as %s %q", m.Topic, m.Payload)
	}
	_ = r.conn.Close()

	// The same client on a new connection: alias 1 is not set here.
	r = connected5(t, b.Address(), "aliaser")
	r.write(rawPublish(0x32, "", 1, wprops([]byte{0x23, 0, 1}), "stale"))
	r.disconnectedWith(0x82)
	if _, err := talker.Publish(&paho.Publish{Topic: "chat/aliased", QoS: 1, Payload: []byte("marker1")}); err != nil {
		t.Fatal(err)
	}
	firstIs(t, watcher, "marker1")

	// An alias never set at all, QoS 1 and (as already refused) QoS 0.
	for _, first := range []byte{0x32, 0x30} {
		r = connected5(t, b.Address(), "fresh")
		id := uint16(1)
		if first == 0x30 {
			id = 0
		}
		r.write(rawPublish(first, "", id, wprops([]byte{0x23, 0, 2}), "lost"))
		r.disconnectedWith(0x82)
	}
	if _, err := talker.Publish(&paho.Publish{Topic: "chat/aliased", QoS: 1, Payload: []byte("marker2")}); err != nil {
		t.Fatal(err)
	}
	firstIs(t, watcher, "marker2")
}

// TestWire_SubscribeRefusals: SUBSCRIBEs the check refuses, before any
// filter of the packet is applied: the session they were sent on keeps no
// subscription from them.
func TestWire_SubscribeRefusals(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	talker := brokertest.Connect(t, b.Address(), "talker", brokertest.ClientOptions{CleanStart: true})
	for _, tc := range []struct {
		name string
		pk   []byte
		code byte
		v311 bool
	}{
		{"reserved Subscription Options bits", rawSubscribe(wprops(), filterOpt("chat/ok", 1), filterOpt("chat/r", 0x41)), 0x81, false},
		{"Subscription Identifier 0", rawSubscribe(wprops([]byte{0x0B, 0}), filterOpt("chat/ok", 1)), 0x82, false},
		{"Subscription Identifier given twice", rawSubscribe(wprops([]byte{0x0B, 1}, []byte{0x0B, 2}), filterOpt("chat/ok", 1)), 0x82, false},
		{"QoS 3 requested", rawSubscribe(wprops(), filterOpt("chat/ok", 1), filterOpt("chat/q", 3)), 0x82, false},
		{"a filter running past the packet", rawSubscribe(wprops(), filterOpt("chat/ok", 1), []byte{0, 9, 'c'}), 0x81, false},
		// Pinned where the SUBSCRIBE hook already refused correctly.
		{"Retain Handling 3", rawSubscribe(wprops(), filterOpt("chat/ok", 1), filterOpt("chat/rh", 0x31)), 0x82, false},
		{"no filter", rawSubscribe(wprops()), 0x82, false},
		{"3.1.1: reserved bits in the QoS byte", rawSubscribe(nil, filterOpt("chat/ok", 1), filterOpt("chat/r", 0x05)), 0, true},
		{"3.1.1: options byte missing", rawSubscribe(nil, filterOpt("chat/ok", 1), wstr("chat/m")), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A durable session, so a subscription the refused packet had
			// made would still be there when it comes back.
			var hello []byte
			v := byte(5)
			if tc.v311 {
				v = 4
				hello = connectPacket(4, 0, nil, "sub")
			} else {
				hello = connectPacket(5, 2, wprops([]byte{0x11, 0, 0, 1, 0}), "sub")
			}
			r := dialBytes(t, b.Address())
			r.write(hello)
			if ack, err := r.read(v); err != nil || ack.ReasonCode != 0 {
				t.Fatalf("CONNACK %+v %v", ack, err)
			}
			r.write(tc.pk)
			if tc.v311 {
				r.closedSilently()
			} else {
				r.disconnectedWith(tc.code)
			}
			back := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{SessionExpiry: 300})
			if _, err := talker.Publish(&paho.Publish{Topic: "chat/ok", QoS: 1, Payload: []byte("probe")}); err != nil {
				t.Fatal(err)
			}
			back.Subscribe("chat/marker", 1)
			if _, err := talker.Publish(&paho.Publish{Topic: "chat/marker", QoS: 1, Payload: []byte("marker")}); err != nil {
				t.Fatal(err)
			}
			firstIs(t, back, "marker")
			back.Close()
			// Ended for the next case.
			brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true}).Close()
		})
	}
}

// TestWire_OtherPacketRefusals: PINGREQ with a body, AUTH (this build has
// no enhanced authentication: any AUTH is a Protocol Error,
// docs/security.md "Every refusal, and its code"), a packet only a server sends.
func TestWire_OtherPacketRefusals(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	for _, tc := range []struct {
		name string
		pk   []byte
		code byte
		v311 bool
	}{
		{"PINGREQ with a body", []byte{0xC0, 1, 0}, 0x81, false},
		{"AUTH without a method", []byte{0xF0, 2, 0x19, 0}, 0x82, false},
		{"AUTH with a method", cat([]byte{0xF0, 16, 0x19, 14, 0x15}, wstr("SCRAM-SHA-1")), 0x82, false},
		{"SUBACK from a client", []byte{0x90, 3, 0, 1, 0}, 0x82, false},
		{"PUBACK running past its length", []byte{0x40, 1, 0}, 0x81, false},
		{"DISCONNECT properties running past their length", []byte{0xE0, 3, 0, 5, 0x11}, 0x81, false},
		{"3.1.1: PINGREQ with a body", []byte{0xC0, 1, 0}, 0, true},
		{"3.1.1: packet type 15", []byte{0xF0, 0}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.v311 {
				r := connected311(t, b.Address(), "o311")
				r.write(tc.pk)
				r.closedSilently()
				return
			}
			r := connected5(t, b.Address(), "o5")
			r.write(tc.pk)
			r.disconnectedWith(tc.code)
		})
	}
	// A PINGREQ as MQTT defines it is answered.
	r := connected5(t, b.Address(), "pinger")
	r.write([]byte{0xC0, 0})
	if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("PINGREQ: %+v %v", pk, err)
	}
	othersUnaffected(t, b, "after")
}

// An MQTT 5 DISCONNECT whose body is its reason code alone is valid (MQTT
// 5 §3.14.2.2: the property length may be left out). The substrate reads a
// reason code only from a body of two bytes or more, so "disconnect, and
// publish my Will" (0x04) was taken as 0x00 and the Will discarded.
func TestWire_DisconnectWithWillReasonAloneKeepsTheWill(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	watcher := brokertest.Connect(t, b.Address(), "watcher", brokertest.ClientOptions{CleanStart: true})
	watcher.Subscribe("chat/#", 1)
	r := dialBytes(t, b.Address())
	r.write(connectPacket(5, 2|0x04|0x08, wprops(), "dier", wprops(), wstr("chat/will"), wstr("dier gone")))
	if ack, err := r.read(5); err != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", ack, err)
	}
	r.write([]byte{0xE0, 1, 0x04})
	if m := watcher.Next(wait); m.Topic != "chat/will" || string(m.Payload) != "dier gone" {
		t.Fatalf("after DISCONNECT 0x04: %s %q, want the Will", m.Topic, m.Payload)
	}
}

// A client refused at the door and reconnecting in a loop writes one line,
// not a line per attempt: the door's refusals go through the refusal log,
// rate-limited by the host they came from (no client id is known yet), and
// every one is counted.
func TestWire_DoorRefusalsAreRateLimitedAndCounted(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	const attempts = 50
	for i := range attempts {
		r := dialBytes(t, b.Address())
		r.write(connectPacket(5, 2, wprops(cat([]byte{0x15}, wstr("SCRAM-SHA-1"))), fmt.Sprintf("am%d", i)))
		r.connackedWith(0x8C)
	}
	othersUnaffected(t, b, "after the loop")
	if n := strings.Count(b.Log.String(), `level=WARN msg="CONNECT refused"`); n != 1 {
		t.Fatalf("%d refused CONNECTs from one host wrote %d WARN lines, want 1 within the rate limit", attempts, n)
	}
	var counted uint64
	for _, c := range b.RefusalCounts() {
		if c.Kind == "packet" && c.Code == 0x8C {
			counted = c.Count
		}
	}
	if counted != attempts {
		t.Fatalf("refusals counted for 0x8C: %d, want %d", counted, attempts)
	}
}
