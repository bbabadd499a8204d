package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// Broadcast fan-out (rfcs/fanout.md): every broadcast delivery goes through
// the subscriber's own outbox and sender. These tests drive it over the
// wire; fanout_internal_test.go tests the outbox's bound on its own.

// fanoutConfig: broadcast everywhere but events/#, a small session queue so
// its bound is reached in a few hundred messages, and a write_timeout long
// enough that a subscriber the test reads late is not cut meanwhile.
const fanoutConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 4KiB
    session_queue_bytes: 64KiB
    write_timeout: 60s
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
channels:
  events:
    type: append
    filter: "events/#"
`

// wireReader reads packets off a raw connection the test dialled.
type wireReader struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func (w *wireReader) send(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
	w.t.Helper()
	pk.ProtocolVersion = 5
	var buf bytes.Buffer
	if err := enc(&pk, &buf); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.conn.Write(buf.Bytes()); err != nil {
		w.t.Fatal(err)
	}
}

// next reads one packet (PUBLISH, PUBACK, SUBACK, CONNACK decoded) or
// returns the read error, a timeout after d.
func (w *wireReader) next(d time.Duration) (packets.Packet, error) {
	_ = w.conn.SetReadDeadline(time.Now().Add(d))
	return brokertest.ReadPacket(w.r, 5)
}

func (w *wireReader) must(d time.Duration) packets.Packet {
	w.t.Helper()
	pk, err := w.next(d)
	if err != nil {
		w.t.Fatalf("read: %v", err)
	}
	return pk
}

func dialWire(t *testing.T, addr, id string) *wireReader {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w := &wireReader{t: t, conn: conn, r: bufio.NewReader(conn)}
	w.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 60}},
		(*packets.Packet).ConnectEncode)
	if ack := w.must(wait); ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", ack)
	}
	return w
}

// subscribeWith sends one SUBSCRIBE carrying Subscription Identifier id (0:
// none) and waits for its SUBACK.
func (w *wireReader) subscribeWith(pid uint16, id int, sub packets.Subscription) {
	w.t.Helper()
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: pid,
		Filters: packets.Subscriptions{sub}}
	if id > 0 {
		pk.Properties.SubscriptionIdentifier = []int{id}
	}
	w.send(pk, (*packets.Packet).SubscribeEncode)
	if ack := w.must(wait); ack.FixedHeader.Type != packets.Suback || ack.ReasonCodes[0] >= 0x80 {
		w.t.Fatalf("SUBACK: %+v", ack)
	}
}

// publishCollect sends a QoS 1 PUBLISH and reads until its PUBACK, returning
// the deliveries that arrived meanwhile (a client's own message may come
// before or after its PUBACK).
func (w *wireReader) publishCollect(pid uint16, topic, payload string) []packets.Packet {
	w.t.Helper()
	w.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: pid,
		TopicName: topic, Payload: []byte(payload)}, (*packets.Packet).PublishEncode)
	var got []packets.Packet
	for {
		pk := w.must(wait)
		if pk.FixedHeader.Type == packets.Puback && pk.PacketID == pid {
			return got
		}
		if pk.FixedHeader.Type == packets.Publish {
			got = append(got, pk)
		}
	}
}

// nextPublish reads up to the next PUBLISH, acknowledging it at QoS 1.
func (w *wireReader) nextPublish() packets.Packet {
	w.t.Helper()
	for {
		pk := w.must(wait)
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		if pk.FixedHeader.Qos == 1 {
			w.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID},
				(*packets.Packet).PubackEncode)
		}
		return pk
	}
}

// Subscription Identifiers and No Local are decided per subscription on
// broadcast (MQTT-3.3.4-3, -4; MQTT-3.8.3-3). One client holds status/#
// (identifier 7, No Local, QoS 1) and status/door (identifier 9, QoS 0).
// Another client's message reaches both: one copy, both identifiers, QoS 1.
// Its own message on status/door reaches it through status/door alone
// (identifier 9, QoS 0), which the substrate's merged No Local withheld
// altogether; its own message on status/window matches only the No Local
// subscription and is not sent at all.
func TestBroadcastSubscriptionIdentifiersAndNoLocalPerSubscription(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig))
	a := dialWire(t, b.Address(), "a")
	a.subscribeWith(1, 7, packets.Subscription{Filter: "status/#", Qos: 1, NoLocal: true})
	a.subscribeWith(2, 9, packets.Subscription{Filter: "status/door", Qos: 0})
	other := dialWire(t, b.Address(), "other")

	other.publishCollect(1, "status/door", "from other")
	pk := a.nextPublish()
	if string(pk.Payload) != "from other" || pk.FixedHeader.Qos != 1 || fmt.Sprint(pk.Properties.SubscriptionIdentifier) != "[7 9]" {
		t.Fatalf("another client's message: %q qos %d ids %v; want qos 1 ids [7 9]", pk.Payload, pk.FixedHeader.Qos, pk.Properties.SubscriptionIdentifier)
	}

	got := a.publishCollect(3, "status/door", "own door")
	if len(got) == 0 {
		got = append(got, a.nextPublish())
	}
	if pk := got[0]; string(pk.Payload) != "own door" || pk.FixedHeader.Qos != 0 || fmt.Sprint(pk.Properties.SubscriptionIdentifier) != "[9]" {
		t.Fatalf("own message on status/door: %q qos %d ids %v; want qos 0 ids [9]", pk.Payload, pk.FixedHeader.Qos, pk.Properties.SubscriptionIdentifier)
	}

	// Its own status/window would be queued ahead of the fence that
	// follows it: the fence arriving first shows it was never sent.
	if got := a.publishCollect(4, "status/window", "own window"); len(got) > 0 {
		t.Fatalf("own message delivered through a No Local subscription: %q", got[0].Payload)
	}
	other.publishCollect(2, "status/door", "fence")
	if pk := a.nextPublish(); string(pk.Payload) != "fence" {
		t.Fatalf("next delivery %q on %s, want the fence", pk.Payload, pk.TopicName)
	}
}

// Invariant 13: a QoS 0 subscriber that falls behind is shed at its
// outbound buffer, and every message is accounted for exactly once: what it
// is sent, in order, plus what was counted dropped, is what was published.
func TestInvariant13_BroadcastQoS0ShedAndCounted(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig))
	conn := dialDeaf(t, b.Address(), "slow", 0) // reads nothing until told
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 20000
	payload := strings.Repeat("x", 200)
	for i := 0; i < n; i++ {
		if _, err := pub.Publish(&paho.Publish{Topic: "status/x", QoS: 0,
			Payload: []byte(fmt.Sprintf("%06d%s", i, payload))}); err != nil {
			t.Fatal(err)
		}
	}
	// The broker handles one client's packets in order: this PUBACK means
	// every publish above was fanned out, so the drop count is final.
	if _, err := pub.Publish(&paho.Publish{Topic: "fence/x", QoS: 1}); err != nil {
		t.Fatal(err)
	}
	dropped := b.BroadcastStats().DroppedQoS0
	if dropped == 0 {
		t.Fatal("20,000 messages to a subscriber not reading and none dropped")
	}
	w := &wireReader{t: t, conn: conn, r: bufio.NewReader(conn)}
	received, last := int64(0), -1
	for received+dropped < n {
		pk := w.must(wait)
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		var seq int
		if _, err := fmt.Sscanf(string(pk.Payload[:6]), "%d", &seq); err != nil || seq <= last {
			t.Fatalf("delivery %d after %d: out of order or unreadable (%v)", seq, last, err)
		}
		last = seq
		received++
	}
	if pk, err := w.next(300 * time.Millisecond); err == nil {
		t.Fatalf("more than was published: a %d packet (%q) after %d received and %d dropped", pk.FixedHeader.Type, pk.Payload, received, dropped)
	}
	t.Logf("%d published: %d received, %d dropped and counted", n, received, dropped)
}

// A subscriber that keeps up loses no QoS 1 message under load: four
// publishers at once, every message received once, in each publisher's
// order, nothing given up at the session's bound. "Keeps up" is made exact
// rather than left to the machine's speed: the publishers never let it fall
// more than keepUpLag messages behind, which the default
// limits.session_queue_bytes holds whole at any message size this test
// sends.
func TestBroadcastQoS1NeverLostForASubscriberThatKeepsUp(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), queueConfig)) // default session_queue_bytes
	const publishers, each, keepUpLag = 4, 2500, 200
	sub := brokertest.Connect(t, b.Address(), "sub", brokertest.ClientOptions{CleanStart: true, Buffer: publishers*each + 10})
	sub.Subscribe("status/#", 1)
	var published, received atomic.Int64
	var failed atomic.Bool // the collector gave up: publishers stop waiting on it
	collected := make(chan error, 1)
	go func() {
		next := make([]int, publishers)
		for got := 0; got < publishers*each; got++ {
			var m *paho.Publish
			select {
			case m = <-sub.Msgs:
			case <-time.After(wait):
				collected <- fmt.Errorf("nothing received for %s after %d messages", wait, got)
				return
			}
			var p, i int
			if _, err := fmt.Sscanf(m.Topic, "status/p%d", &p); err != nil || p < 0 || p >= publishers {
				collected <- fmt.Errorf("topic %s", m.Topic)
				return
			}
			if _, err := fmt.Sscanf(string(m.Payload), "%d", &i); err != nil || i != next[p] || m.QoS != 1 {
				collected <- fmt.Errorf("publisher %d: got message %q at QoS %d, want %d at QoS 1 (lost, repeated or out of order)",
					p, m.Payload, m.QoS, next[p])
				return
			}
			next[p]++
			received.Add(1)
		}
		collected <- nil
	}()
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for p := 0; p < publishers; p++ {
		c := brokertest.Connect(t, b.Address(), fmt.Sprintf("pub%d", p), brokertest.ClientOptions{CleanStart: true})
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				for published.Load()-received.Load() >= keepUpLag {
					if failed.Load() {
						return
					}
					time.Sleep(time.Millisecond)
				}
				published.Add(1)
				resp, err := c.Publish(&paho.Publish{Topic: fmt.Sprintf("status/p%d", p), QoS: 1, Payload: []byte(fmt.Sprint(i))})
				if err != nil || resp.ReasonCode != 0 {
					errs <- fmt.Errorf("publisher %d message %d: %v %+v", p, i, err, resp)
					return
				}
			}
		}(p)
	}
	if err := <-collected; err != nil {
		failed.Store(true)
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sub.Quiet(200 * time.Millisecond)
	if st := b.BroadcastStats(); st.QueueFull != 0 || st.DroppedQoS0 != 0 {
		t.Fatalf("drops counted for a subscriber that kept up: %+v", st)
	}
}

// QoS 1 broadcast owed to a session while it is away waits for it within
// its bound and is sent, in order, when it resumes; QoS 0 is not owed to a
// session away (MQTT 5 §4.1).
func TestBroadcastOwedWhileAwayIsSentOnResume(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig))
	s := brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	s.Subscribe("status/#", 1)
	s.Close()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i, qos := range []byte{1, 0, 1, 1} {
		if _, err := pub.Publish(&paho.Publish{Topic: "status/x", QoS: qos, Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	s = brokertest.Connect(t, b.Address(), "s", brokertest.ClientOptions{SessionExpiry: 600})
	if !s.Connack.SessionPresent {
		t.Fatal("session not resumed")
	}
	for _, want := range []string{"0", "2", "3"} {
		if m := s.Next(wait); string(m.Payload) != want {
			t.Fatalf("resumed: got %q, want %q", m.Payload, want)
		}
	}
	s.Quiet(200 * time.Millisecond)
}

// A shared group's messages are split one per message among its connected
// members in turn, in client-id order: none twice, none lost.
func TestBroadcastSharedGroupTakesTurns(t *testing.T) {
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig))
	m1 := brokertest.Connect(t, b.Address(), "m1", brokertest.ClientOptions{CleanStart: true})
	m2 := brokertest.Connect(t, b.Address(), "m2", brokertest.ClientOptions{CleanStart: true})
	m1.Subscribe("$share/g/status/#", 1)
	m2.Subscribe("$share/g/status/#", 1)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 10
	for i := 0; i < n; i++ {
		if _, err := pub.Publish(&paho.Publish{Topic: "status/x", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		c := m1
		if i%2 == 1 {
			c = m2
		}
		if m := c.Next(wait); string(m.Payload) != fmt.Sprint(i) {
			t.Fatalf("message %d went elsewhere: member got %q", i, m.Payload)
		}
	}
	m1.Quiet(200 * time.Millisecond)
	m2.Quiet(10 * time.Millisecond)
}
