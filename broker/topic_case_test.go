package broker_test

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// connectClean is a paho.golang MQTT 5 client with a new session that
// asks for Reason Strings.
func connectClean(t *testing.T, addr, id string) *brokertest.Client {
	t.Helper()
	return brokertest.Connect(t, addr, id, brokertest.ClientOptions{CleanStart: true, ProblemInfo: true})
}

// nextTopic waits for c's next message and checks its topic and payload.
func nextTopic(t *testing.T, who string, m *paho.Publish, topic, payload string) {
	t.Helper()
	if m.Topic != topic || string(m.Payload) != payload {
		t.Fatalf("%s got %q on %q, want %q on %q", who, m.Payload, m.Topic, payload, topic)
	}
}

// Topics are case-sensitive (MQTT 5 §4.7.3): $sys/x, $Sys/x and $SYSTEM/x
// are ordinary broadcast topics — subscribed, published at every QoS and on
// both protocol versions, retained and delivered like any — while $SYS/x
// stays the broker's (SUBACK and PUBACK 0x87, docs/security.md "Every refusal, and its code"; docs/channels.md "What a publish is answered").
// Like every topic beginning with '$', they are reached only by filters
// that spell their first level out: neither '#' nor a shared '#' gets them
// (MQTT-4.7.2-1). A topic alias set on $sys/x carries it.
func TestTopicsAreCaseSensitiveDollarSysIsOrdinary(t *testing.T) {
	b := answersBroker(t)
	addr := b.Address()
	sub := connectClean(t, addr, "sys-sub")
	for _, f := range []string{"$sys/x", "$Sys/#", "$SYSTEM/+"} {
		if sa := sub.Subscribe(f, 2); sa.Reasons[0] != 2 {
			t.Fatalf("SUBSCRIBE %s granted %#x, want QoS 2", f, sa.Reasons[0])
		}
	}
	for _, f := range []string{"$SYS/#", "$SYS/x", "$SYS"} {
		sa, err := sub.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f, QoS: 1}}})
		if err != nil || len(sa.Reasons) != 1 || sa.Reasons[0] != 0x87 {
			t.Fatalf("SUBSCRIBE %s: %v %v, want 0x87", f, sa, err)
		}
	}
	wild := connectClean(t, addr, "wild")
	wild.Subscribe("#", 1)
	shared := connectClean(t, addr, "shared")
	shared.Subscribe("$share/g/#", 1)

	pub := connectClean(t, addr, "sys-pub")
	for qos := byte(0); qos <= 2; qos++ {
		for _, tp := range []string{"$sys/x", "$Sys/y", "$SYSTEM/z"} {
			payload := tp + " at QoS " + string('0'+qos)
			r, err := pub.Publish(&paho.Publish{Topic: tp, QoS: qos, Payload: []byte(payload)})
			if err != nil || (qos > 0 && r.ReasonCode != 0) {
				t.Fatalf("PUBLISH %s QoS %d: %+v %v", tp, qos, r, err)
			}
			nextTopic(t, "the $sys subscriber", sub.Next(wait), tp, payload)
		}
		// paho reports a refusal as an error beside the response.
		if r, err := pub.Publish(&paho.Publish{Topic: "$SYS/x", QoS: max(qos, 1), Payload: []byte("no")}); r == nil || r.ReasonCode != 0x87 {
			t.Fatalf("PUBLISH $SYS/x: %+v %v, want PUBACK/PUBREC 0x87", r, err)
		}
	}
	// MQTT 3.1.1 (mosquitto_pub -V mqttv311) publishes to $sys/x like any topic.
	pub311(t, addr, "$sys/x", "from 3.1.1")
	nextTopic(t, "the $sys subscriber", sub.Next(wait), "$sys/x", "from 3.1.1")

	// Neither '#' nor '$share/g/#' reaches a '$' topic: the next thing both
	// get is the plain publish that follows every $ one above.
	if r, err := pub.Publish(&paho.Publish{Topic: "plain/after", QoS: 1, Payload: []byte("sentinel")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("PUBLISH plain/after: %+v %v", r, err)
	}
	nextTopic(t, "the # subscriber", wild.Next(wait), "plain/after", "sentinel")
	nextTopic(t, "the $share/g/# member", shared.Next(wait), "plain/after", "sentinel")

	// Retained: kept and served on $sys/x like any broadcast topic.
	if r, err := pub.Publish(&paho.Publish{Topic: "$sys/kept", QoS: 1, Retain: true, Payload: []byte("held")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("retained PUBLISH $sys/kept: %+v %v", r, err)
	}
	late := connectClean(t, addr, "late")
	late.Subscribe("$sys/kept", 1)
	m := late.Next(wait)
	nextTopic(t, "a later $sys/kept subscriber", m, "$sys/kept", "held")
	if !m.Retain {
		t.Fatal("the retained value on $sys/kept came without RETAIN")
	}

	// A Topic Alias set on $sys/x names $sys/x: the empty-topic publish
	// that uses it is delivered there. One set on $SYS/x is refused as
	// $SYS/x is, whichever packet carries it.
	c, ack, err := dialAt(t, addr, wireConnect{version: 5, id: "alias"})
	if err != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", ack, err)
	}
	aliased := func(pid, alias uint16, topic, payload string, code byte) {
		t.Helper()
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: pid,
			TopicName: topic, Payload: []byte(payload),
			Properties: packets.Properties{TopicAlias: alias, TopicAliasFlag: true}})
		got, err := c.next(answerWithin)
		if err != nil || got.FixedHeader.Type != packets.Puback || got.PacketID != pid || got.ReasonCode != code {
			t.Fatalf("aliased PUBLISH %q alias %d: type %d id %d reason %#x (%v), want PUBACK %#x",
				topic, alias, got.FixedHeader.Type, got.PacketID, got.ReasonCode, err, code)
		}
	}
	aliased(1, 1, "$sys/x", "set", 0)
	nextTopic(t, "the $sys subscriber", sub.Next(wait), "$sys/x", "set")
	aliased(2, 1, "", "used", 0)
	nextTopic(t, "the $sys subscriber", sub.Next(wait), "$sys/x", "used")
	aliased(3, 2, "$SYS/x", "set", 0x87)
	aliased(4, 2, "", "used", 0x87)
	c.quietThenPong("after the aliased publishes")
	// Nothing else reached the $sys subscriber: the next is this.
	if r, err := pub.Publish(&paho.Publish{Topic: "$sys/x", QoS: 1, Payload: []byte("last")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("PUBLISH $sys/x: %+v %v", r, err)
	}
	nextTopic(t, "the $sys subscriber", sub.Next(wait), "$sys/x", "last")
}
