package broker_test

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

// The five MQTT 5 publish properties a record keeps reach its reader
// (docs/channels.md "What a publish is answered"). The pump encodes deliveries itself,
// and the encoder drops Response Topic and Correlation Data unless told it
// may write them: found when a Will's properties went missing.
func TestAppendDeliveryCarriesThePublishProperties(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	pf := byte(1)
	if _, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("x"),
		Properties: &paho.PublishProperties{ContentType: "text/plain", ResponseTopic: "replies/a",
			CorrelationData: []byte("c-1"), PayloadFormat: &pf}}); err != nil {
		t.Fatal(err)
	}
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("events/#", 1)
	p := c.Next(wait).Properties
	if p.ContentType != "text/plain" || p.ResponseTopic != "replies/a" || string(p.CorrelationData) != "c-1" ||
		p.PayloadFormat == nil || *p.PayloadFormat != 1 {
		t.Fatalf("delivered properties: %+v", p)
	}
}

// The same for a latest channel's deliveries, state pass and changes: the
// latest pump encodes its own batches too. The change is published only
// once the state pass has arrived: a value published earlier may
// legitimately supersede the state before it is written (the subscriber is
// then sent only the newer value, docs/channels.md "`latest`"), which made this test fail
// about one run in eight while proving nothing wrong.
func TestLatestDeliveryCarriesThePublishProperties(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publish := func(payload string) {
		t.Helper()
		if _, err := pub.Publish(&paho.Publish{Topic: "state/door", QoS: 1, Payload: []byte(payload),
			Properties: &paho.PublishProperties{ContentType: "text/plain", ResponseTopic: "replies/door",
				CorrelationData: []byte("c-" + payload)}}); err != nil {
			t.Fatal(err)
		}
	}
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	check := func(want string, retain bool) {
		t.Helper()
		p := c.Next(wait)
		if string(p.Payload) != want || p.Retain != retain || p.Properties.ContentType != "text/plain" ||
			p.Properties.ResponseTopic != "replies/door" || string(p.Properties.CorrelationData) != "c-"+want {
			t.Fatalf("delivered %q retain=%v with properties %+v; want %q retain=%v with the publisher's properties",
				p.Payload, p.Retain, p.Properties, want, retain)
		}
	}
	publish("open")
	c.Subscribe("state/#", 1)
	check("open", true) // the state pass
	publish("shut")
	check("shut", false) // a change
}
