package broker_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// answersConfig has one channel of each type (the queue brings its derived
// dead-letter channel jobs__dlq on jobs/__dlq/#) and small topic limits, so
// every topic form the sweep sends has a home.
const answersConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_topic_length: 64
    max_topic_levels: 6
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: "{{.Dir}}/snapshots"
channels:
  events:
    type: append
    filter: "events/#"
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
`

func answersBroker(t *testing.T) *brokertest.Broker {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		t.Fatal(err)
	}
	return brokertest.Start(t, brokertest.Config(t, dir, answersConfig))
}

// answersReplyTopic is the Response Topic the sweep's requests carry.
const answersReplyTopic = "replies/me"

// answerWithin is how long a publish may wait for its one answer.
const answerWithin = time.Second

// wireConn is one client connection written packet by packet at protocol
// level 4 (MQTT 3.1.1) or 5, so the test sees every byte the broker answers
// — including none, and the close.
type wireConn struct {
	t       *testing.T
	conn    net.Conn
	r       *bufio.Reader
	version byte
}

type wireConnect struct {
	version byte
	id      string
	durable bool // MQTT 5: Session Expiry 300 s; 3.1.1: Clean Session 0
	props   packets.Properties
	will    *packets.Packet // a Will to carry (topic, payload, properties)
}

// dialAt connects and returns the connection and the broker's first
// answer (the CONNACK, or the error when it closed instead).
func dialAt(t *testing.T, addr string, o wireConnect) (*wireConn, packets.Packet, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := &wireConn{t: t, conn: conn, r: bufio.NewReader(conn), version: o.version}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"),
			ClientIdentifier: o.id, Clean: !o.durable, Keepalive: 60},
		Properties: o.props,
	}
	if o.durable && o.version == 5 {
		pk.Properties.SessionExpiryInterval, pk.Properties.SessionExpiryIntervalFlag = 300, true
	}
	if w := o.will; w != nil {
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = w.TopicName
		pk.Connect.WillPayload = w.Payload
		pk.Connect.WillQos = w.FixedHeader.Qos
		pk.Connect.WillProperties = w.Properties
	}
	c.send(pk)
	ack, err := c.next(answerWithin)
	return c, ack, err
}

func (c *wireConn) send(pk packets.Packet) {
	c.t.Helper()
	pk.ProtocolVersion = c.version
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&buf)
	case packets.Publish:
		pk.Mods.AllowResponseInfo = true // encode Response Topic and Correlation Data
		err = pk.PublishEncode(&buf)
	case packets.Pubrel:
		pk.FixedHeader.Qos = 1
		err = pk.PubrelEncode(&buf)
	case packets.Pingreq:
		err = pk.PingreqEncode(&buf)
	default:
		c.t.Fatalf("wireConn cannot send packet type %d", pk.FixedHeader.Type)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// next reads the broker's next packet within d, passing over the answers
// of seeks and point reads: each is a PUBLISH written to the requester
// ahead of its PUBACK (on the seek reply topic, or the Response Topic), not
// a second acknowledgement.
func (c *wireConn) next(d time.Duration) (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	for {
		pk, err := brokertest.ReadPacket(c.r, c.version)
		if err != nil {
			return pk, err
		}
		if pk.FixedHeader.Type == packets.Publish &&
			(strings.HasSuffix(pk.TopicName, "/seek/reply") || pk.TopicName == answersReplyTopic) {
			continue
		}
		return pk, nil
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// closedErr reports whether err is the broker closing the connection.
func closedErr(err error) bool {
	return err != nil && !isTimeout(err) && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection reset"))
}

// quietThenPong sends PINGREQ and asserts the next packet is its PINGRESP:
// nothing else (a second acknowledgement, a late DISCONNECT) came between.
func (c *wireConn) quietThenPong(what string) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
	pk, err := c.next(answerWithin)
	if err != nil {
		c.t.Fatalf("%s: waiting for PINGRESP: %v", what, err)
	}
	if pk.FixedHeader.Type != packets.Pingresp {
		c.t.Fatalf("%s: a second answer: packet type %d id %d reason 0x%02x (%s), want only PINGRESP",
			what, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, pk.Properties.ReasonString)
	}
}

// disconnectAnswer marks a topic form answered DISCONNECT (MQTT 5) rather
// than PUBACK/PUBREC: a Protocol Error, at every QoS.
type disconnectAnswer struct{ code byte }

// topicForm is one topic a PUBLISH may carry and the answer it is owed.
type topicForm struct {
	name    string
	topic   string
	payload string
	props   packets.Properties // MQTT 5 only
	durable bool
	// v5 is the MQTT 5 PUBACK/PUBREC reason code; v311 whether 3.1.1
	// gets its plain acknowledgement (else its connection is closed).
	v5   byte
	v311 bool
	disc *disconnectAnswer
}

func publishTopicForms() []topicForm {
	long := "plain/" + strings.Repeat("x", 64-len("plain/"))
	rt := packets.Properties{ResponseTopic: answersReplyTopic}
	corr := packets.Properties{CorrelationData: []byte("d1")}
	return []topicForm{
		// Ordinary topics, one per channel type and broadcast.
		{name: "broadcast", topic: "plain/x", v5: 0x00, v311: true},
		{name: "append channel", topic: "events/x", v5: 0x00, v311: true},
		{name: "latest channel", topic: "state/x", v5: 0x00, v311: true},
		{name: "queue", topic: "jobs/x", v5: 0x00, v311: true},
		// limits.max_topic_length / max_topic_levels (docs/configuration.md "`broker.limits`").
		{name: "topic at max_topic_length", topic: long, v5: 0x00, v311: true},
		{name: "topic over max_topic_length", topic: long + "y", v5: 0x90},
		{name: "channel topic over max_topic_length", topic: "events/" + strings.Repeat("e", 58), v5: 0x90},
		{name: "topic at max_topic_levels", topic: "plain/a/b/c/d/e", v5: 0x00, v311: true},
		{name: "topic over max_topic_levels", topic: "plain/a/b/c/d/e/f", v5: 0x90},
		{name: "$SYS over max_topic_levels", topic: "$SYS/a/b/c/d/e/f", v5: 0x90},
		// The derived dead-letter channel: only the broker writes it.
		{name: "dead-letter topic", topic: "jobs/__dlq/x", v5: 0x87},
		{name: "dead-letter root", topic: "jobs/__dlq", v5: 0x87},
		// $SYS is the broker's (docs/channels.md "The `$saguin/` topics": 0x87) — exactly
		// $SYS, case-sensitive as every topic is.
		{name: "$SYS", topic: "$SYS", v5: 0x87},
		{name: "$SYS/x", topic: "$SYS/x", v5: 0x87},
		{name: "$SYS/broker/uptime", topic: "$SYS/broker/uptime", v5: 0x87},
		{name: "$sys/x is ordinary", topic: "$sys/x", v5: 0x00, v311: true},
		{name: "$Sys/x is ordinary", topic: "$Sys/x", v5: 0x00, v311: true},
		{name: "$SYSTEM/x is ordinary", topic: "$SYSTEM/x", v5: 0x00, v311: true},
		{name: "$SYSx is ordinary", topic: "$SYSx", v5: 0x00, v311: true},
		// $share/ is a subscription form; only the lower-case spelling.
		{name: "$share/g/x", topic: "$share/g/x", v5: 0x90},
		{name: "$share/x", topic: "$share/x", v5: 0x90},
		{name: "$share/", topic: "$share/", v5: 0x90},
		{name: "$share is ordinary", topic: "$share", v5: 0x00, v311: true},
		{name: "$Share/x is ordinary", topic: "$Share/x", v5: 0x00, v311: true},
		{name: "$SHARE/g/x is ordinary", topic: "$SHARE/g/x", v5: 0x00, v311: true},
		// The reserved $saguin/ space: five publishable topics, anything
		// else 0x90 (docs/channels.md "The `$saguin/` topics").
		{name: "$saguin/", topic: "$saguin/", v5: 0x90},
		{name: "$saguin/x", topic: "$saguin/x", v5: 0x90},
		{name: "$saguin/no/such/route", topic: "$saguin/no/such/route", v5: 0x90},
		{name: "$saguin is ordinary", topic: "$saguin", v5: 0x00, v311: true},
		{name: "$SAGUIN/x is ordinary", topic: "$SAGUIN/x", v5: 0x00, v311: true},
		{name: "$Saguin/kv/get is ordinary", topic: "$Saguin/kv/get", v5: 0x00, v311: true},
		{name: "point read", topic: "$saguin/kv/get", payload: "state/x", props: rt, v5: 0x00},
		{name: "point read without Response Topic", topic: "$saguin/kv/get", payload: "state/x", v5: 0x83},
		{name: "point read of an append topic", topic: "$saguin/kv/get", payload: "events/x", props: rt, v5: 0x90},
		{name: "point read of a broadcast topic", topic: "$saguin/kv/get", payload: "plain/x", props: rt, v5: 0x90},
		{name: "point read too deep", topic: "$saguin/kv/get", payload: "state/a/b/c/d/e/f", props: rt, v5: 0x90},
		{name: "$saguin/kv/get/x", topic: "$saguin/kv/get/x", payload: "state/x", props: rt, v5: 0x90},
		{name: "seek", topic: "$saguin/consumer/events/seek", payload: "0", durable: true, v5: 0x00, v311: true},
		{name: "seek without a durable session", topic: "$saguin/consumer/events/seek", payload: "0", v5: 0x83},
		{name: "seek malformed", topic: "$saguin/consumer/events/seek", payload: "soon", durable: true, v5: 0x83},
		{name: "seek beyond the end", topic: "$saguin/consumer/events/seek", payload: "99", durable: true, v5: 0x83},
		{name: "seek on the dead-letter channel", topic: "$saguin/consumer/jobs__dlq/seek", payload: "0", durable: true, v5: 0x00, v311: true},
		{name: "seek on an unknown channel", topic: "$saguin/consumer/nosuch/seek", payload: "0", durable: true, v5: 0x90},
		{name: "seek on a latest channel", topic: "$saguin/consumer/state/seek", payload: "0", durable: true, v5: 0x90},
		{name: "seek on a queue", topic: "$saguin/consumer/jobs/seek", payload: "0", durable: true, v5: 0x90},
		{name: "seek with an empty name", topic: "$saguin/consumer//seek", payload: "0", durable: true, v5: 0x90},
		{name: "seek with a two-level name", topic: "$saguin/consumer/a/b/seek", payload: "0", durable: true, v5: 0x90},
		{name: "seek reply topic", topic: "$saguin/consumer/events/seek/reply", payload: "0", v5: 0x90},
		{name: "$saguin/consumer/events", topic: "$saguin/consumer/events", payload: "0", v5: 0x90},
		{name: "queue subscription form", topic: "$saguin/queue/jobs", payload: "ack", v5: 0x90},
		{name: "queue answer (not current)", topic: "$saguin/queue/jobs/response", payload: "ack", props: corr, durable: true, v5: 0x00, v311: true},
		{name: "queue answer without Correlation Data", topic: "$saguin/queue/jobs/response", payload: "ack", v5: 0x00, v311: true},
		{name: "queue answer to an unknown queue", topic: "$saguin/queue/nosuch/response", payload: "ack", props: corr, v5: 0x90},
		{name: "queue answer to an append channel", topic: "$saguin/queue/events/response", payload: "ack", props: corr, v5: 0x90},
		{name: "queue answer to the dead-letter channel", topic: "$saguin/queue/jobs__dlq/response", payload: "ack", props: corr, v5: 0x90},
		{name: "queue answer with a deeper topic", topic: "$saguin/queue/jobs/response/x", payload: "ack", props: corr, v5: 0x90},
		{name: "hang-up request", topic: "$saguin/sessions/disconnect", payload: "x", props: rt, v5: 0x00},
		{name: "hang-up request without Response Topic", topic: "$saguin/sessions/disconnect", payload: "x", v5: 0x83},
		// Not served by this build: refused rather than pretended.
		{name: "catalogue (not served)", topic: "$saguin/catalogue/events", props: rt, v5: 0x90},
		// A wildcard in a PUBLISH topic is a Protocol Error (MQTT-3.3.2-2).
		{name: "single-level wildcard", topic: "plain/+", disc: &disconnectAnswer{0x82}},
		{name: "multi-level wildcard", topic: "plain/#", disc: &disconnectAnswer{0x82}},
		{name: "$SYS wildcard", topic: "$SYS/#", disc: &disconnectAnswer{0x82}},
	}
}

// Every QoS 1 and QoS 2 PUBLISH gets exactly one answer within a second,
// whatever its topic (issue 12 item 2; docs/channels.md "The `$saguin/` topics"; docs/channels.md "What a publish is answered"): MQTT 5
// the reason code §3.3 names on its PUBACK or PUBREC; 3.1.1, which has no
// reason codes, its plain acknowledgement when accepted and the connection
// closed — with nothing written — when refused. A refused QoS 2 exchange is
// over at its PUBREC: no state is left for a PUBREL (PUBCOMP 0x92). QoS 0
// is never answered, and a refused QoS 0 is dropped with the connection
// kept, on both versions. After the answer nothing more comes. A refusal
// carries a Reason String exactly when the client allowed one (Request
// Problem Information, MQTT-3.1.2-29; docs/channels.md "What a publish is answered").
func TestEveryPublishGetsOneAnswerWhateverItsTopic(t *testing.T) {
	b := answersBroker(t)
	n := 0
	for _, client := range []struct {
		name        string
		version     byte
		problemInfo bool
	}{{"v5", 5, true}, {"v5-no-problem-info", 5, false}, {"v311", 4, false}} {
		for _, qos := range []byte{0, 1, 2} {
			for _, f := range publishTopicForms() {
				n++
				what := fmt.Sprintf("%s QoS %d %s (%q)", client.name, qos, f.name, f.topic)
				id := fmt.Sprintf("sweep-%d", n)
				t.Run(fmt.Sprintf("%s/qos%d/%s", client.name, qos, f.name), func(t *testing.T) {
					oneAnswer(t, b.Address(), id, client.version, client.problemInfo, qos, f, what)
				})
			}
		}
	}
}

func oneAnswer(t *testing.T, addr, id string, version byte, problemInfo bool, qos byte, f topicForm, what string) {
	t.Helper()
	o := wireConnect{version: version, id: id, durable: f.durable}
	if version == 5 && !problemInfo {
		o.props = packets.Properties{RequestProblemInfo: 0, RequestProblemInfoFlag: true}
	}
	c, ack, err := dialAt(t, addr, o)
	if err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK: %+v %v", what, ack, err)
	}
	const pid = 7
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName: f.topic, Payload: []byte(f.payload)}
	if qos > 0 {
		pk.PacketID = pid
	}
	if version == 5 {
		pk.Properties = f.props
	}
	c.send(pk)

	if f.disc != nil {
		got, err := c.next(answerWithin)
		if version == 5 {
			if err != nil || got.FixedHeader.Type != packets.Disconnect || got.ReasonCode != f.disc.code {
				t.Fatalf("%s: got type %d reason 0x%02x (%v), want DISCONNECT 0x%02x", what,
					got.FixedHeader.Type, got.ReasonCode, err, f.disc.code)
			}
			got, err = c.next(answerWithin)
		}
		if !closedErr(err) {
			t.Fatalf("%s: after the refusal got type %d (%v), want the connection closed", what, got.FixedHeader.Type, err)
		}
		return
	}

	if qos == 0 {
		// Never answered; a refusal is a silent drop and the connection stays.
		c.quietThenPong(what)
		return
	}
	accepted := f.v5 == 0x00
	if version == 4 {
		accepted = f.v311
	}
	got, err := c.next(answerWithin)
	if version == 4 && !accepted {
		if !closedErr(err) {
			t.Fatalf("%s: got type %d reason 0x%02x (%v), want the connection closed with nothing sent",
				what, got.FixedHeader.Type, got.ReasonCode, err)
		}
		return
	}
	wantType := byte(packets.Puback)
	if qos == 2 {
		wantType = packets.Pubrec
	}
	wantCode := f.v5
	if version == 4 {
		wantCode = 0
	}
	if err != nil {
		t.Fatalf("%s: no answer within %v: %v", what, answerWithin, err)
	}
	if got.FixedHeader.Type != wantType || got.PacketID != pid || got.ReasonCode != wantCode {
		t.Fatalf("%s: got type %d id %d reason 0x%02x (%s), want type %d id %d reason 0x%02x", what,
			got.FixedHeader.Type, got.PacketID, got.ReasonCode, got.Properties.ReasonString, wantType, pid, wantCode)
	}
	if version == 5 && wantCode >= 0x80 && (got.Properties.ReasonString != "") != problemInfo {
		t.Fatalf("%s: refused 0x%02x with Reason String %q; the client allowed one: %v", what, wantCode,
			got.Properties.ReasonString, problemInfo)
	}
	if qos == 2 {
		// Accepted: PUBREL completes it. Refused: the exchange ended at
		// PUBREC, so the packet identifier is unknown (MQTT 5 §4.3.3).
		c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: pid})
		comp, err := c.next(answerWithin)
		wantComp := byte(0x00)
		if version == 5 && wantCode >= 0x80 {
			wantComp = 0x92
		}
		if err != nil || comp.FixedHeader.Type != packets.Pubcomp || comp.PacketID != pid || comp.ReasonCode != wantComp {
			t.Fatalf("%s: PUBREL answered type %d id %d reason 0x%02x (%v), want PUBCOMP 0x%02x", what,
				comp.FixedHeader.Type, comp.PacketID, comp.ReasonCode, err, wantComp)
		}
	}
	c.quietThenPong(what)
}

// A QoS 2 PUBLISH sent again while its exchange waits for PUBREL is
// answered PUBREC 0x00 again and held once (MQTT-4.3.3-10): not 0x91
// (Packet Identifier in use), which the substrate answered and which tells
// the publisher its message failed although it is held and is delivered at
// the PUBREL. On the same connection, and — the case a client library
// meets, resending with DUP after a reconnect — on a resumed session, for
// a channel, a broadcast topic and an ordinary '$' topic. The message
// arrives once.
func TestResentQoS2PublishIsAnsweredAgainAndHeldOnce(t *testing.T) {
	b := answersBroker(t)
	addr := b.Address()
	sub := connectClean(t, addr, "resent-sub")
	for _, f := range []string{"events/#", "plain/#", "$sys/#"} {
		sub.Subscribe(f, 2)
	}
	for _, tp := range []string{"events/r", "plain/r", "$sys/r"} {
		for _, reconnect := range []bool{false, true} {
			id := fmt.Sprintf("resent-%s-%v", strings.ReplaceAll(tp, "/", "_"), reconnect)
			c, ack, err := dialAt(t, addr, wireConnect{version: 5, id: id, durable: true})
			if err != nil || ack.ReasonCode != 0 {
				t.Fatalf("CONNACK %+v %v", ack, err)
			}
			payload := fmt.Sprintf("%s reconnect=%v", tp, reconnect)
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, PacketID: 9,
				TopicName: tp, Payload: []byte(payload)}
			c.send(pk)
			if got, err := c.next(answerWithin); err != nil || got.FixedHeader.Type != packets.Pubrec || got.ReasonCode != 0 {
				t.Fatalf("%s: first PUBREC: type %d reason %#x (%v)", payload, got.FixedHeader.Type, got.ReasonCode, err)
			}
			if reconnect {
				_ = c.conn.Close()
				c, ack, err = dialAt(t, addr, wireConnect{version: 5, id: id, durable: true})
				if err != nil || ack.ReasonCode != 0 || !ack.SessionPresent {
					t.Fatalf("%s: resuming: %+v %v", payload, ack, err)
				}
			}
			pk.FixedHeader.Dup = true
			c.send(pk)
			c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}})
			// Every PUBREC that comes before the PINGRESP is 0x00, and
			// the re-sent PUBLISH got one. (The substrate also sends a
			// resumed session, right after its CONNACK, the PUBREC it
			// was owed again; 0x00 too.)
			recs := 0
			for {
				got, err := c.next(answerWithin)
				if err != nil {
					t.Fatalf("%s: waiting for the answers: %v", payload, err)
				}
				if got.FixedHeader.Type == packets.Pingresp {
					break
				}
				if got.FixedHeader.Type != packets.Pubrec || got.PacketID != 9 || got.ReasonCode != 0 {
					t.Fatalf("%s: the re-sent PUBLISH was answered type %d id %d reason %#x (%s), want PUBREC 0x00",
						payload, got.FixedHeader.Type, got.PacketID, got.ReasonCode, got.Properties.ReasonString)
				}
				recs++
			}
			if want := 1; recs < want || (!reconnect && recs != want) || recs > 2 {
				t.Fatalf("%s: %d PUBRECs for the re-sent PUBLISH", payload, recs)
			}
			c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 9})
			if got, err := c.next(answerWithin); err != nil || got.FixedHeader.Type != packets.Pubcomp || got.ReasonCode != 0 {
				t.Fatalf("%s: PUBCOMP: type %d reason %#x (%v)", payload, got.FixedHeader.Type, got.ReasonCode, err)
			}
			c.quietThenPong(payload + ": after PUBCOMP")
			nextTopic(t, "the subscriber", sub.Next(wait), tp, payload)
		}
	}
	// Held once: the next message is this, not a second copy of any above.
	if r, err := sub.Publish(&paho.Publish{Topic: "plain/last", QoS: 1, Payload: []byte("last")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("PUBLISH plain/last: %+v %v", r, err)
	}
	nextTopic(t, "the subscriber", sub.Next(wait), "plain/last", "last")
}
