package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

// The registry is a latest channel; the data an append channel; devices
// write under their own prefix (an ACL confines them there once the broker
// reads one: rfcs/partition.md).
const config = `
broker:
  id: schemaregistry-test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  schemas:
    type: latest
    filter: "schemas/#"
  readings:
    type: append
    filter: "readings/#"
  state:
    type: latest
    filter: "state/#"
`

func dial(t *testing.T, b *brokertest.Broker, id string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, b.Address(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func next(t *testing.T, c *Client) *paho.Publish {
	t.Helper()
	select {
	case p := <-c.Msgs:
		return p
	case <-time.After(20 * time.Second):
		t.Fatal("no message within 20s")
		return nil
	}
}

func subscribe(t *testing.T, c *Client, filter string) {
	t.Helper()
	sa, err := c.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil || sa.Reasons[0] > 1 {
		t.Fatalf("subscribe %s: %v %v", filter, err, sa)
	}
}

// The documented flow with stock clients: register a schema in the latest
// channel, produce readings naming it, and a consumer decodes them with
// one point read for the lot (cached until the pointer changes).
func TestConsumerDecodesByThePointReadSchema(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), config))
	producer := dial(t, b, "acme-s1")
	if err := Register(ctx, producer, "schemas/acme/weather-v1", "station:string,temperature:float,humidity:int"); err != nil {
		t.Fatal(err)
	}
	consumer := dial(t, b, "consumer")
	subscribe(t, consumer, "readings/#")
	r := NewResolver(consumer, "schemas/#")
	for _, reading := range []string{"s1,21.5,40", "s1,22.0,41", "s1,22.5,39"} {
		if err := Produce(ctx, producer, "readings/acme/s1", "schemas/acme/weather-v1", []byte(reading)); err != nil {
			t.Fatal(err)
		}
	}
	want := []float64{21.5, 22.0, 22.5}
	for i := range want {
		msg := next(t, consumer)
		if msg.Properties.ContentType != ContentType {
			t.Fatalf("content type %q", msg.Properties.ContentType)
		}
		fields, err := r.Decode(ctx, msg)
		if err != nil {
			t.Fatalf("decode %q: %v", msg.Payload, err)
		}
		if fields["temperature"] != want[i] || fields["station"] != "s1" || fields["humidity"] == nil {
			t.Fatalf("reading %d decoded as %v", i, fields)
		}
	}
	if r.Reads != 1 {
		t.Fatalf("%d point reads for three readings of one schema; want 1 (cached)", r.Reads)
	}

	// A new version is a new topic: the pointer changes, one more read.
	if err := Register(ctx, producer, "schemas/acme/weather-v2", "station:string,temperature:float,humidity:int,raining:bool"); err != nil {
		t.Fatal(err)
	}
	if err := Produce(ctx, producer, "readings/acme/s1", "schemas/acme/weather-v2", []byte("s1,18.0,90,true")); err != nil {
		t.Fatal(err)
	}
	fields, err := r.Decode(ctx, next(t, consumer))
	if err != nil || fields["raining"] != true || r.Reads != 2 {
		t.Fatalf("v2 reading: %v %v after %d reads", fields, err, r.Reads)
	}

	// The registry is also a subscription away: the current schemas, as
	// state with RETAIN (a multi-get).
	lister := dial(t, b, "lister")
	subscribe(t, lister, "schemas/#")
	seen := map[string]bool{}
	for range 2 {
		p := next(t, lister)
		if !p.Retain {
			t.Fatalf("registry listing %s without RETAIN", p.Topic)
		}
		seen[p.Topic] = true
	}
	if !seen["schemas/acme/weather-v1"] || !seen["schemas/acme/weather-v2"] {
		t.Fatalf("registry listing: %v", seen)
	}
}

// Retiring a schema is a zero-length publish; a point read then answers
// "nothing there", exactly as for a schema never registered. A consumer
// that had it cached keeps decoding (the cache holds until the pointer
// changes); one that had not cannot.
func TestRetiredSchemaIsNoSchema(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), config))
	producer := dial(t, b, "acme-s1")
	if err := Register(ctx, producer, "schemas/acme/door-v1", "open:bool"); err != nil {
		t.Fatal(err)
	}
	early := dial(t, b, "early")
	subscribe(t, early, "readings/#")
	earlyR := NewResolver(early, "schemas/#")
	if err := Produce(ctx, producer, "readings/acme/door", "schemas/acme/door-v1", []byte("true")); err != nil {
		t.Fatal(err)
	}
	if _, err := earlyR.Decode(ctx, next(t, early)); err != nil {
		t.Fatal(err)
	}
	if err := Retire(ctx, producer, "schemas/acme/door-v1"); err != nil {
		t.Fatal(err)
	}
	if err := Produce(ctx, producer, "readings/acme/door", "schemas/acme/door-v1", []byte("false")); err != nil {
		t.Fatal(err)
	}
	if fields, err := earlyR.Decode(ctx, next(t, early)); err != nil || fields["open"] != false {
		t.Fatalf("cached schema: %v %v", fields, err)
	}

	late := dial(t, b, "late")
	subscribe(t, late, "readings/#") // replays both readings from the append channel
	lateR := NewResolver(late, "schemas/#")
	if _, err := lateR.Decode(ctx, next(t, late)); !errors.Is(err, ErrNoSchema) {
		t.Fatalf("retired schema: %v; want ErrNoSchema", err)
	}
	never := &paho.Publish{Topic: "readings/x", Properties: &paho.PublishProperties{
		User: paho.UserProperties{{Key: SchemaProperty, Value: "schemas/acme/never"}}}}
	if _, _, err := NewResolver(late, "schemas/#").SchemaOf(ctx, never); !errors.Is(err, ErrNoSchema) {
		t.Fatalf("never registered: %v; want ErrNoSchema", err)
	}
}

// A pointer is followed only inside the registry's filter: naming a latest
// channel of device state is refused by the consumer without a read. The
// broker reserves saguin-: a publisher's saguin-schema never arrives, so
// its message names no schema.
func TestPointerRules(t *testing.T) {
	ctx := context.Background()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), config))
	producer := dial(t, b, "acme-s1")
	consumer := dial(t, b, "consumer")
	subscribe(t, consumer, "readings/#")
	r := NewResolver(consumer, "schemas/#")

	if err := publish(ctx, producer, &paho.Publish{Topic: "state/acme/s1", QoS: 1, Payload: []byte("x:int")}); err != nil {
		t.Fatal(err)
	}
	if err := Produce(ctx, producer, "readings/acme/s1", "state/acme/s1", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Decode(ctx, next(t, consumer)); !errors.Is(err, ErrOutsideRegistry) || r.Reads != 0 {
		t.Fatalf("pointer outside the registry: %v after %d reads; want ErrOutsideRegistry and no read", err, r.Reads)
	}

	if err := publish(ctx, producer, &paho.Publish{Topic: "readings/acme/s1", QoS: 1, Payload: []byte("1"),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "saguin-schema", Value: "schemas/acme/weather-v1"}}}}); err != nil {
		t.Fatal(err)
	}
	msg := next(t, consumer)
	if msg.Properties.User.Get("saguin-schema") != "" {
		t.Fatal("a publisher's saguin-schema reached the consumer")
	}
	if _, err := r.Decode(ctx, msg); !errors.Is(err, ErrNoPointer) {
		t.Fatalf("saguin-schema message: %v; want ErrNoPointer", err)
	}

	// A point read of a key outside every latest channel is refused on the
	// PUBACK, never answered.
	if _, err := consumer.Get(ctx, "readings/acme/s1"); err == nil {
		t.Fatal("a point read of an append channel's topic was answered")
	}
}

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"schemas/#", "schemas/acme/v1", true},
		{"schemas/#", "schemas", true},
		{"schemas/#", "state/acme", false},
		{"iot/+/schemas/+", "iot/acme/schemas/v1", true},
		{"iot/+/schemas/+", "iot/acme/schemas/v1/x", false},
		{"#", "$SYS/x", false},
	} {
		if got := Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v", c.filter, c.topic, got)
		}
	}
}

func TestSchemaParseAndDecode(t *testing.T) {
	if _, err := ParseSchema("a:int,b"); err == nil {
		t.Fatal("a field without a type was accepted")
	}
	if _, err := ParseSchema("a:decimal"); err == nil {
		t.Fatal("an unknown type was accepted")
	}
	s, err := ParseSchema("a:int, b:string")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decode([]byte("1")); err == nil {
		t.Fatal("a payload with too few columns decoded")
	}
	if _, err := s.Decode([]byte("x,y")); err == nil {
		t.Fatal("a non-integer decoded as int")
	}
	if v, err := s.Decode([]byte("7,y")); err != nil || v["a"] != int64(7) || v["b"] != "y" {
		t.Fatalf("decode: %v %v", v, err)
	}
}
