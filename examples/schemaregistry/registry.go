// Command schemaregistry is a schema registry made of nothing but a Sagüin
// latest channel and a convention (docs/channels.md "Saying which schema
// deserializes a payload"), driven by a stock MQTT 5 client:
//
//	schemaregistry register -topic schemas/acme/weather-v1 -schema 'temperature:float,humidity:int'
//	schemaregistry retire   -topic schemas/acme/weather-v1
//	schemaregistry publish  -topic readings/acme/s1 -schema-topic schemas/acme/weather-v1 -m '21.5,40'
//	schemaregistry consume  -filter 'readings/#' -registry 'schemas/#'
//
// Register publishes the schema text to a topic of the latest channel;
// retire publishes a zero-length payload there, which is how a latest
// channel deletes. A producer says how its payload is serialized with
// Content Type and which schema with a User Property named schema, holding
// the schema's topic. A consumer reads that property, checks the pointer
// lands inside the registry's own filter (the ACL governs who may write a
// topic, never who may name one), point-reads it with $saguin/kv/get and
// caches the answer until the pointer changes.
//
// The schema language here is deliberately tiny — comma-separated
// name:type fields (string, int, float, bool) describing a CSV payload — so
// the example needs no library: Sagüin never parses a schema, and a real
// deployment puts Avro, Protobuf or JSON Schema text in the same place.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// SchemaProperty is the User Property naming a payload's schema topic. Not
// saguin-schema: the saguin- prefix is the broker's, and it drops it from
// every publish.
const SchemaProperty = "schema"

// ContentType is how this example serializes its payloads.
const ContentType = "text/csv"

// Errors a consumer meets.
var (
	// ErrNoPointer: the message names no schema.
	ErrNoPointer = errors.New("the message names no schema (no schema user property)")
	// ErrOutsideRegistry: the pointer names a topic outside the registry's
	// filter, which anybody may name and the registry does not hold.
	ErrOutsideRegistry = errors.New("the schema pointer lands outside the registry")
	// ErrNoSchema: the registry holds nothing there (never registered, or
	// retired: a point read answers both alike).
	ErrNoSchema = errors.New("no schema is registered at that topic")
)

// Field is one field of a schema.
type Field struct {
	Name string
	Type string // string, int, float or bool
}

// Schema is a parsed schema: the payload's CSV columns, in order.
type Schema []Field

// ParseSchema reads "name:type,name:type".
func ParseSchema(text string) (Schema, error) {
	var s Schema
	for part := range strings.SplitSeq(text, ",") {
		name, typ, ok := strings.Cut(strings.TrimSpace(part), ":")
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("schema field %q is not name:type", part)
		case typ != "string" && typ != "int" && typ != "float" && typ != "bool":
			return nil, fmt.Errorf("schema field %s has type %q; want string, int, float or bool", name, typ)
		}
		s = append(s, Field{Name: name, Type: typ})
	}
	return s, nil
}

// Decode reads a CSV payload by the schema.
func (s Schema) Decode(payload []byte) (map[string]any, error) {
	cols := strings.Split(string(payload), ",")
	if len(cols) != len(s) {
		return nil, fmt.Errorf("payload has %d columns; the schema has %d", len(cols), len(s))
	}
	out := make(map[string]any, len(s))
	for i, f := range s {
		v := strings.TrimSpace(cols[i])
		var err error
		switch f.Type {
		case "string":
			out[f.Name] = v
		case "int":
			out[f.Name], err = strconv.ParseInt(v, 10, 64)
		case "float":
			out[f.Name], err = strconv.ParseFloat(v, 64)
		case "bool":
			out[f.Name], err = strconv.ParseBool(v)
		}
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", f.Name, err)
		}
	}
	return out, nil
}

// Client is a stock paho MQTT 5 client with what a registry user needs: the
// messages it receives, and the answers to its point reads, told apart by
// Correlation Data.
type Client struct {
	*paho.Client
	// Msgs receives every message that is not a point-read answer.
	Msgs chan *paho.Publish

	answerTopic string
	mu          sync.Mutex
	seq         uint64
	waiting     map[string]chan *paho.Publish
}

// Dial connects a client with a clean session.
func Dial(ctx context.Context, addr, id string) (*Client, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Client{
		Msgs: make(chan *paho.Publish, 1024),
		// A point read's answer is written to this connection alone,
		// whatever topic it names: no subscription is needed for it.
		answerTopic: "schemaregistry/answers/" + id,
		waiting:     map[string]chan *paho.Publish{},
	}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn:     packets.NewThreadSafeConn(conn),
		ClientID: id,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			c.received(pr.Packet)
			return true, nil
		}},
	})
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return c, nil
}

func (c *Client) received(p *paho.Publish) {
	if p.Topic == c.answerTopic && p.Properties != nil {
		c.mu.Lock()
		ch := c.waiting[string(p.Properties.CorrelationData)]
		delete(c.waiting, string(p.Properties.CorrelationData))
		c.mu.Unlock()
		if ch != nil {
			ch <- p
			return
		}
	}
	select {
	case c.Msgs <- p:
	default: // a consumer that does not keep up loses messages here, not the broker
	}
}

// Close disconnects.
func (c *Client) Close() { _ = c.Disconnect(&paho.Disconnect{}) }

// Get point-reads one key: its value, or nil when the key holds none. A
// refusal (the key is not in a latest channel, say) is an error carrying
// the PUBACK's reason code.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	c.mu.Lock()
	c.seq++
	corr := strconv.FormatUint(c.seq, 10)
	answer := make(chan *paho.Publish, 1)
	c.waiting[corr] = answer
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.waiting, corr)
		c.mu.Unlock()
	}
	resp, err := c.Publish(ctx, &paho.Publish{Topic: "$saguin/kv/get", QoS: 1, Payload: []byte(key),
		Properties: &paho.PublishProperties{ResponseTopic: c.answerTopic, CorrelationData: []byte(corr)}})
	if err != nil && resp == nil {
		forget()
		return nil, fmt.Errorf("point read of %s: %w", key, err)
	}
	if resp.ReasonCode != 0 {
		forget()
		return nil, fmt.Errorf("point read of %s refused: reason code 0x%02x", key, resp.ReasonCode)
	}
	select {
	case p := <-answer:
		if len(p.Payload) == 0 {
			return nil, nil
		}
		return p.Payload, nil
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
}

// Register stores a schema's text at its topic in the registry channel.
// The topic is the schema's name, so a new version is a new topic. RETAIN
// is redundant on a latest channel, which keeps every topic's value; it is
// set so the same publish still keeps the schema on a plain MQTT broker.
func Register(ctx context.Context, c *Client, topic, text string) error {
	if _, err := ParseSchema(text); err != nil {
		return err
	}
	return publish(ctx, c, &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: []byte(text)})
}

// Retire deletes a schema: a zero-length publish is a latest channel's
// delete.
func Retire(ctx context.Context, c *Client, topic string) error {
	return publish(ctx, c, &paho.Publish{Topic: topic, QoS: 1, Retain: true})
}

// Produce publishes a payload saying how it is serialized (Content Type)
// and which schema reads it (the schema User Property, holding the
// schema's topic).
func Produce(ctx context.Context, c *Client, topic, schemaTopic string, payload []byte) error {
	return publish(ctx, c, &paho.Publish{Topic: topic, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ContentType: ContentType,
			User: paho.UserProperties{{Key: SchemaProperty, Value: schemaTopic}}}})
}

func publish(ctx context.Context, c *Client, p *paho.Publish) error {
	resp, err := c.Publish(ctx, p)
	if err != nil && resp == nil {
		return fmt.Errorf("publish %s: %w", p.Topic, err)
	}
	if resp.ReasonCode != 0 {
		return fmt.Errorf("publish %s refused: reason code 0x%02x", p.Topic, resp.ReasonCode)
	}
	return nil
}

// Resolver finds the schema a message names, through point reads, and
// caches each until the pointer changes (schemas are immutable per topic:
// a new version is a new topic).
type Resolver struct {
	c *Client
	// registry is the registry channel's filter: a pointer is followed only
	// where it lands inside it.
	registry string

	mu    sync.Mutex
	cache map[string]Schema
	// Reads counts point reads made (a cache hit makes none).
	Reads int
}

// NewResolver reads schemas from the registry whose filter is given.
func NewResolver(c *Client, registry string) *Resolver {
	return &Resolver{c: c, registry: registry, cache: map[string]Schema{}}
}

// SchemaOf returns the schema the message names.
func (r *Resolver) SchemaOf(ctx context.Context, msg *paho.Publish) (Schema, string, error) {
	var pointer string
	if msg.Properties != nil {
		pointer = msg.Properties.User.Get(SchemaProperty)
	}
	if pointer == "" {
		return nil, "", ErrNoPointer
	}
	if !Match(r.registry, pointer) {
		return nil, pointer, fmt.Errorf("%w: %s is not under %s", ErrOutsideRegistry, pointer, r.registry)
	}
	r.mu.Lock()
	s, ok := r.cache[pointer]
	r.mu.Unlock()
	if ok {
		return s, pointer, nil
	}
	text, err := r.c.Get(ctx, pointer)
	r.mu.Lock()
	r.Reads++
	r.mu.Unlock()
	if err != nil {
		return nil, pointer, err
	}
	if text == nil {
		return nil, pointer, fmt.Errorf("%w: %s", ErrNoSchema, pointer)
	}
	if s, err = ParseSchema(string(text)); err != nil {
		return nil, pointer, fmt.Errorf("schema at %s: %w", pointer, err)
	}
	r.mu.Lock()
	r.cache[pointer] = s
	r.mu.Unlock()
	return s, pointer, nil
}

// Decode is SchemaOf and Schema.Decode together.
func (r *Resolver) Decode(ctx context.Context, msg *paho.Publish) (map[string]any, error) {
	s, _, err := r.SchemaOf(ctx, msg)
	if err != nil {
		return nil, err
	}
	return s.Decode(msg.Payload)
}

// Match reports whether an MQTT topic filter matches a topic name: + one
// level, # every level after (and the parent), $ topics only by a filter
// that spells the $ level out.
func Match(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && !strings.HasPrefix(filter, "$") {
		return false
	}
	f, t := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, lvl := range f {
		if lvl == "#" {
			return true
		}
		if i >= len(t) || (lvl != "+" && lvl != t[i]) {
			return false
		}
	}
	return len(f) == len(t)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: schemaregistry register|retire|publish|consume [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	broker := fs.String("broker", "127.0.0.1:1883", "broker address host:port")
	topic := fs.String("topic", "", "schema topic (register, retire) or message topic (publish)")
	schema := fs.String("schema", "", "schema text, name:type,... (register)")
	schemaTopic := fs.String("schema-topic", "", "the schema's topic (publish)")
	message := fs.String("m", "", "CSV payload (publish)")
	filter := fs.String("filter", "#", "what to consume (consume)")
	registry := fs.String("registry", "schemas/#", "the registry channel's filter (consume)")
	_ = fs.Parse(os.Args[2:])

	ctx := context.Background()
	c, err := Dial(ctx, *broker, fmt.Sprintf("schemaregistry-%d", os.Getpid()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemaregistry:", err)
		os.Exit(1)
	}
	defer c.Close()
	switch os.Args[1] {
	case "register":
		err = Register(ctx, c, *topic, *schema)
	case "retire":
		err = Retire(ctx, c, *topic)
	case "publish":
		err = Produce(ctx, c, *topic, *schemaTopic, []byte(*message))
	case "consume":
		err = consume(ctx, c, *filter, *registry)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemaregistry:", err)
		os.Exit(1)
	}
}

// consume prints every message under filter decoded by its schema.
func consume(ctx context.Context, c *Client, filter, registry string) error {
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		return err
	}
	r := NewResolver(c, registry)
	for msg := range c.Msgs {
		fields, err := r.Decode(ctx, msg)
		if err != nil {
			fmt.Printf("%s: %v\n", msg.Topic, err)
			continue
		}
		fmt.Printf("%s: %v\n", msg.Topic, fields)
	}
	return nil
}
