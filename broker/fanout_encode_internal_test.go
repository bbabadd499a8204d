package broker

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"pgregory.net/rapid"
)

// A broadcast delivery copied from the message's encoding for another
// subscriber (fanout_encode.go) is byte for byte what encodeDelivery makes
// for that subscriber: for random messages (topic, payload, QoS, RETAIN,
// Payload Format, Content Type, Response Topic, Correlation Data, User
// Properties, an expiry or none) and random subscribers (protocol level,
// granted QoS, Retain As Published, a Subscription Identifier or none,
// Packet Identifier, DUP, Maximum Packet Size, the second they are served
// in), in the order the senders happen to serve them.
func TestBroadcastEncodingCopiedEqualsEncoded(t *testing.T) {
	b := &Broker{}
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rapid.Check(t, func(rt *rapid.T) {
		qos := byte(rapid.IntRange(0, 2).Draw(rt, "qos"))
		topic := rapid.StringMatching(`[a-z0-9/]{1,12}`).Draw(rt, "topic")
		if rapid.Bool().Draw(rt, "longTopic") {
			topic += string(bytes.Repeat([]byte("t"), rapid.IntRange(100, 300).Draw(rt, "topicPad")))
		}
		payload := bytes.Repeat([]byte{rapid.Byte().Draw(rt, "fill")}, rapid.IntRange(0, 20000).Draw(rt, "payloadLen"))
		pk := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: rapid.Bool().Draw(rt, "retain")},
			TopicName:   topic,
			Payload:     payload,
		}
		p := &pk.Properties
		if rapid.Bool().Draw(rt, "format") {
			p.PayloadFormatFlag, p.PayloadFormat = true, byte(rapid.IntRange(0, 1).Draw(rt, "formatValue"))
		}
		p.ContentType = rapid.SampledFrom([]string{"", "text/plain", "application/json"}).Draw(rt, "contentType")
		p.ResponseTopic = rapid.SampledFrom([]string{"", "reply/to", "reply/+"}).Draw(rt, "responseTopic")
		p.CorrelationData = rapid.SliceOfN(rapid.Byte(), 0, 20).Draw(rt, "correlation")
		for i, n := 0, rapid.IntRange(0, 3).Draw(rt, "users"); i < n; i++ {
			p.User = append(p.User, packets.UserProperty{Key: fmt.Sprint("k", i), Val: rapid.StringMatching(`[a-z]{0,300}`).Draw(rt, "userValue")})
		}
		if rapid.Bool().Draw(rt, "expires") {
			p.MessageExpiryInterval = uint32(rapid.IntRange(1, 5).Draw(rt, "expiry"))
		}
		m := newBroadcastMsg("pub", pk, base)
		// As many entries hold it as the sessions it is fanned out to
		// (0 and 1 keep no encoding).
		m.held.Store(int32(rapid.IntRange(0, 40).Draw(rt, "held")))
		for i, n := 0, rapid.IntRange(1, 16).Draw(rt, "subscribers"); i < n; i++ {
			v := rapid.SampledFrom([]byte{3, 4, 5}).Draw(rt, "version")
			sub := packets.Subscription{Filter: topic, Qos: byte(rapid.IntRange(0, 2).Draw(rt, "granted")),
				RetainAsPublished: rapid.Bool().Draw(rt, "rap")}
			if rapid.IntRange(0, 4).Draw(rt, "hasID") == 0 {
				sub.Identifier = rapid.IntRange(1, 268_435_455).Draw(rt, "id")
			}
			now := base.Add(time.Duration(rapid.IntRange(0, 6000).Draw(rt, "elapsedMs")) * time.Millisecond)
			e := owed{m: m, qos: min(m.qos, sub.Qos)}
			one, _, outcome := shapeBroadcast(e, map[string]packets.Subscription{topic: sub}, nil, "sub", v, now)
			if outcome != shapeDeliver {
				continue
			}
			if one.FixedHeader.Qos > 0 {
				one.PacketID = uint16(rapid.IntRange(1, 65535).Draw(rt, "pid"))
			}
			one.FixedHeader.Dup = rapid.Bool().Draw(rt, "dup")
			var maxSize uint32
			if rapid.Bool().Draw(rt, "limited") {
				maxSize = uint32(rapid.IntRange(1, len(payload)+len(topic)+600).Draw(rt, "maxSize"))
			}
			prefix := bytes.Repeat([]byte{0xAA}, rapid.IntRange(0, 5).Draw(rt, "prefix"))
			want, got := bytes.NewBuffer(bytes.Clone(prefix)), bytes.NewBuffer(bytes.Clone(prefix))
			a, c := one, one
			wantErr := encodeDelivery(want, &a, v, maxSize)
			gotErr := b.encodeBroadcast(got, m, &c, v, maxSize)
			if !errors.Is(gotErr, wantErr) || (wantErr == nil) != (gotErr == nil) {
				rt.Fatalf("subscriber %d (v%d): error %v, want %v", i, v, gotErr, wantErr)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				rt.Fatalf("subscriber %d (v%d qos %d pid %d dup %v expiry %d ids %v):\n got % x\nwant % x", i, v,
					one.FixedHeader.Qos, one.PacketID, one.FixedHeader.Dup, one.Properties.MessageExpiryInterval,
					one.Properties.SubscriptionIdentifier, head(got.Bytes()), head(want.Bytes()))
			}
		}
	})
	// The equivalence is about copies: some were made.
	if st := b.BroadcastEncodes(); st.Copied == 0 || st.Encoded == 0 {
		t.Fatalf("encodings %+v: no copy was compared", st)
	}
}

func head(p []byte) []byte { return p[:min(len(p), 64)] }

// Invariant 13: a message keeps at most one encoding per entry holding it
// beyond the one paying for the message (waiting, or on the wire at QoS
// 1/2), and no more than encodedShapes; they go as the entries let go, all
// of them when one is left; and an encoding whose allocation one entry's
// charge does not cover is never kept.
func TestInvariant13_BroadcastEncodingsPaidForByHoldingEntries(t *testing.T) {
	b, _ := outboxRig(t, 1<<20)
	outboxes := make([]*outbox, 3)
	m := testMsg(b, 1, 100)
	for i := range outboxes {
		o := b.outboxOf(newSession(fmt.Sprint("s", i)))
		o.live = true
		outboxes[i] = o
		if !o.enqueue(b, m, 1, "", false) {
			t.Fatalf("outbox %d refused the message", i)
		}
	}
	kept := func() int {
		e := m.enc.Load()
		if e == nil {
			return -1
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.n
	}
	// Four shapes asked for (3.1.1 and 5, QoS 0 and 1): three entries hold
	// the message, so two are kept.
	for _, v := range []byte{4, 5} {
		for _, q := range []byte{0, 1} {
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: q}, TopicName: m.topic,
				Payload: m.payload, Properties: m.props, PacketID: uint16(q)}
			if err := b.encodeBroadcast(new(bytes.Buffer), m, &pk, v, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := kept(); n != 2 {
		t.Fatalf("held by 3 entries: %d encodings kept, want 2", n)
	}
	// On the wire at QoS 1 it is still held (and charged).
	if !outboxes[0].take(0, 1, false) {
		t.Fatal("take")
	}
	if n := kept(); n != 2 {
		t.Fatalf("one of 3 entries on the wire: %d encodings kept, want 2", n)
	}
	outboxes[0].acked(0) // the entry taken as seq 0 (under packet id 1)
	if n := kept(); n != 1 {
		t.Fatalf("held by 2 entries: %d encodings kept, want 1", n)
	}
	if !outboxes[1].take(0, 0, true) {
		t.Fatal("take")
	}
	if n := kept(); n != -1 {
		t.Fatalf("held by 1 entry: encodings %d, want none at all", n)
	}

	// 40,960 bytes of payload take five allocator pages, charged as such;
	// its encoding takes a sixth, which no entry's charge covers.
	big := testMsg(b, 1, 40960)
	for i, o := range outboxes {
		if !o.enqueue(b, big, 1, "", false) {
			t.Fatalf("outbox %d refused the large message", i)
		}
	}
	before := b.BroadcastEncodes()
	for i := 1; i <= 2; i++ {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: big.topic,
			Payload: big.payload, PacketID: uint16(i)}
		if err := b.encodeBroadcast(new(bytes.Buffer), big, &pk, 4, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := b.BroadcastEncodes(); st.Encoded-before.Encoded != 2 || st.Copied != before.Copied {
		t.Fatalf("a message whose encoding no charge covers: %+v then %+v, want two encodings and no copy", before, st)
	}
}
