package broker_test

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

// notUTF8 is a payload no UTF-8 decoder accepts (a lone continuation
// byte, then a truncated sequence).
var notUTF8 = []byte{'o', 'k', 0x80, 0xe2, 0x82}

// utf8Format is the Payload Format Indicator 1: UTF-8 Encoded Character
// Data (MQTT 5 §3.3.2.3.2).
var utf8Format = packets.Properties{PayloadFormat: 1, PayloadFormatFlag: true}

// A PUBLISH whose Payload Format Indicator says UTF-8 and whose payload is
// not well-formed UTF-8 is refused PUBACK/PUBREC 0x99 (MQTT 5 §3.3.2.3.2
// lets the receiver check; docs/channels.md "What a publish is answered"), with a Reason String,
// on every kind of topic, and is stored nowhere: not in a channel, not in
// a queue, not as a retained value, not delivered. QoS 0 is dropped. A
// refused QoS 2 exchange ends at its PUBREC. A well-formed payload with the
// indicator goes through and arrives with the indicator kept. MQTT 3.1.1
// carries no indicator: any payload is accepted.
func TestPayloadFormatIndicatorUTF8IsChecked(t *testing.T) {
	b := answersBroker(t)
	addr := b.Address()
	sub := connectClean(t, addr, "pfi-sub")
	for _, f := range []string{"events/#", "state/#", "plain/#"} {
		sub.Subscribe(f, 2)
	}
	// A SUBSCRIBE's retained pass runs after its SUBACK is written: a
	// retained publish landing in between would reach sub twice, live and
	// from the store. sub's own PUBLISH is read after that pass is done.
	if r, err := sub.Publish(&paho.Publish{Topic: "plain/ready", QoS: 1, Payload: []byte("ready")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("PUBLISH plain/ready: %+v %v", r, err)
	}
	nextTopic(t, "the subscriber", sub.Next(wait), "plain/ready", "ready")
	w := connectClean(t, addr, "pfi-worker")
	if sa := w.Subscribe("$saguin/queue/jobs", 1); sa.Reasons[0] != 1 {
		t.Fatalf("queue subscription granted %#x", sa.Reasons[0])
	}

	c, ack, err := dialAt(t, addr, wireConnect{version: 5, id: "pfi-pub"})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", ack, err)
	}
	pid := uint16(0)
	send := func(topic string, qos byte, retain bool, payload []byte, props packets.Properties) {
		t.Helper()
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
			TopicName: topic, Payload: payload, Properties: props}
		if qos > 0 {
			pid++
			pk.PacketID = pid
		}
		c.send(pk)
	}
	for _, tp := range []string{"events/a", "state/a", "plain/a", "jobs/a", "$saguin/consumer/events/seek"} {
		for qos := byte(1); qos <= 2; qos++ {
			send(tp, qos, true, notUTF8, utf8Format)
			want := byte(packets.Puback)
			if qos == 2 {
				want = packets.Pubrec
			}
			got, err := c.next(answerWithin)
			if err != nil || got.FixedHeader.Type != want || got.PacketID != pid || got.ReasonCode != 0x99 ||
				got.Properties.ReasonString == "" {
				t.Fatalf("%s QoS %d with Payload Format Indicator 1 and a payload not UTF-8: type %d id %d reason %#x %q (%v), want type %d reason 0x99 with a Reason String",
					tp, qos, got.FixedHeader.Type, got.PacketID, got.ReasonCode, got.Properties.ReasonString, err, want)
			}
			if qos == 2 {
				c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: pid})
				if comp, err := c.next(answerWithin); err != nil || comp.FixedHeader.Type != packets.Pubcomp || comp.ReasonCode != 0x92 {
					t.Fatalf("%s: PUBREL after a refused PUBREC: type %d reason %#x (%v), want PUBCOMP 0x92",
						tp, comp.FixedHeader.Type, comp.ReasonCode, err)
				}
			}
		}
		send(tp, 0, true, notUTF8, utf8Format)
	}
	c.quietThenPong("after the refusals")

	// Nothing refused was kept: what each subscriber, the worker and a
	// later subscriber get first is the well-formed publish that follows.
	text := []byte("grüße, 温度 ok")
	for _, tp := range []string{"events/a", "state/a", "plain/a", "jobs/a"} {
		send(tp, 1, tp == "plain/a", text, utf8Format)
		if got, err := c.next(answerWithin); err != nil || got.FixedHeader.Type != packets.Puback || got.ReasonCode != 0 {
			t.Fatalf("%s with Payload Format Indicator 1 and a UTF-8 payload: type %d reason %#x (%v), want PUBACK 0x00",
				tp, got.FixedHeader.Type, got.ReasonCode, err)
		}
	}
	keptFormat := func(who string, m *paho.Publish, topic string) {
		t.Helper()
		nextTopic(t, who, m, topic, string(text))
		if m.Properties == nil || m.Properties.PayloadFormat == nil || *m.Properties.PayloadFormat != 1 {
			t.Fatalf("%s: %s arrived without Payload Format Indicator 1: %+v", who, topic, m.Properties)
		}
	}
	// Each channel and broadcast delivers on its own (no order between
	// them): the first message on each topic is the well-formed one.
	seen := map[string]bool{}
	for range 3 {
		m := sub.Next(wait)
		if seen[m.Topic] {
			t.Fatalf("the subscriber got a second message on %s: %q", m.Topic, m.Payload)
		}
		seen[m.Topic] = true
		keptFormat("the subscriber", m, m.Topic)
	}
	for _, tp := range []string{"events/a", "state/a", "plain/a"} {
		if !seen[tp] {
			t.Fatalf("the subscriber got nothing on %s", tp)
		}
	}
	keptFormat("the worker", w.Next(wait), "jobs/a")
	late := connectClean(t, addr, "pfi-late")
	late.Subscribe("plain/a", 1)
	m := late.Next(wait)
	keptFormat("a later subscriber (the retained value)", m, "plain/a")

	// MQTT 3.1.1 has no Payload Format Indicator: the same bytes are
	// accepted.
	c4, ack, err := dialAt(t, addr, wireConnect{version: 4, id: "pfi-311"})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK %+v %v", ack, err)
	}
	c4.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
		TopicName: "plain/b", Payload: notUTF8})
	if got, err := c4.next(answerWithin); err != nil || got.FixedHeader.Type != packets.Puback || got.PacketID != 1 {
		t.Fatalf("3.1.1 publish of bytes not UTF-8: type %d (%v), want PUBACK", got.FixedHeader.Type, err)
	}
	if m := sub.Next(wait); m.Topic != "plain/b" || string(m.Payload) != string(notUTF8) {
		t.Fatalf("the subscriber got %q on %s, want the 3.1.1 bytes on plain/b", m.Payload, m.Topic)
	}
}

// A Will whose Payload Format Indicator says UTF-8 and whose payload is not
// is refused CONNACK 0x99 (MQTT 5 §3.1.3.2.3 lets the Server check, §3.2.2.2
// names the code): the Will could never be delivered as what it claims to
// be. Refused, the CONNECT changes nothing of the live session its client
// id holds (invariant 17). A well-formed Will with the indicator is armed
// and published with it kept.
func TestWillPayloadFormatIndicatorUTF8IsChecked(t *testing.T) {
	b := answersBroker(t)
	addr := b.Address()
	sub := connectClean(t, addr, "will-sub")
	sub.Subscribe("plain/#", 1)
	live := connectClean(t, addr, "device")

	badWill := &packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, TopicName: "plain/will",
		Payload: notUTF8, Properties: utf8Format}
	_, ack, err := dialAt(t, addr, wireConnect{version: 5, id: "device", will: badWill})
	if err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0x99 || ack.Properties.ReasonString == "" {
		t.Fatalf("CONNECT with a Will not UTF-8 under Payload Format Indicator 1: type %d reason %#x %q (%v), want CONNACK 0x99 with a Reason String",
			ack.FixedHeader.Type, ack.ReasonCode, ack.Properties.ReasonString, err)
	}
	// invariant 17: the live connection still owns its session and is served.
	if r, err := live.Publish(&paho.Publish{Topic: "plain/live", QoS: 1, Payload: []byte("still here")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("the live connection after the refused CONNECT: %+v %v", r, err)
	}
	nextTopic(t, "the subscriber", sub.Next(wait), "plain/live", "still here")
	select {
	case d := <-live.Disconnects:
		t.Fatalf("the live connection was disconnected (%#x) by a refused CONNECT", d.ReasonCode)
	default:
	}

	goodWill := &packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, TopicName: "plain/will",
		Payload: []byte("gone — adiós"), Properties: utf8Format}
	wc, ack, err := dialAt(t, addr, wireConnect{version: 5, id: "armed", will: goodWill})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNECT with a UTF-8 Will: %+v %v", ack, err)
	}
	_ = wc.conn.Close() // no DISCONNECT: the Will is published
	m := sub.Next(wait)
	nextTopic(t, "the subscriber", m, "plain/will", "gone — adiós")
	if m.Properties == nil || m.Properties.PayloadFormat == nil || *m.Properties.PayloadFormat != 1 {
		t.Fatalf("the Will arrived without Payload Format Indicator 1: %+v", m.Properties)
	}
}
