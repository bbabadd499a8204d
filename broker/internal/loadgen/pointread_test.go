package loadgen

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	mpackets "github.com/mochi-mqtt/server/v2/packets"

	"github.com/eclipse/paho.golang/packets"
)

// The hand-encoded request is the PUBLISH paho's decoder reads.
func TestEncodePointReadMatchesPaho(t *testing.T) {
	corr := make([]byte, correlationSize)
	encodePayload(corr, 1, 2, 3)
	long := strings.Repeat("k", 300) // a remaining length past one VBI byte
	for _, key := range []string{"state/t7", long} {
		raw := encodePointRead(nil, 0xABCD, "replies/c1", corr, key)
		p, err := packets.ReadPacket(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			t.Fatal(err)
		}
		pub, ok := p.Content.(*packets.Publish)
		if !ok {
			t.Fatalf("decoded a %T", p.Content)
		}
		if pub.Topic != PointReadTopic || pub.QoS != 1 || pub.PacketID != 0xABCD || string(pub.Payload) != key ||
			pub.Properties.ResponseTopic != "replies/c1" || !bytes.Equal(pub.Properties.CorrelationData, corr) || pub.Retain || pub.Duplicate {
			t.Fatalf("decoded %+v with %+v", pub, pub.Properties)
		}
	}
	for _, n := range []int{0, 127, 128, 16383, 16384, 2097152} {
		if got := len(appendVBI(nil, n)); got != vbiLen(n) {
			t.Errorf("vbiLen(%d) = %d, encoded in %d", n, vbiLen(n), got)
		}
	}
}

// kvDouble stands in for the broker side of a point read, on a mochi
// server: it answers a read of $saguin/kv/get from mochi's retained store,
// on the Response Topic, with the caller's Correlation Data - or, per mode,
// answers the way a broken broker would, so the load generator's checks
// are seen to catch each fault.
type kvDouble struct {
	mqtt.HookBase
	server *mqtt.Server
	mode   string
	reads  atomic.Int32
}

func (h *kvDouble) ID() string { return "kv-double" }

func (h *kvDouble) Provides(b byte) bool { return b == mqtt.OnPublish }

func (h *kvDouble) OnPublish(cl *mqtt.Client, pk mpackets.Packet) (mpackets.Packet, error) {
	if pk.TopicName != PointReadTopic {
		return pk, nil
	}
	n := h.reads.Add(1)
	key := string(pk.Payload)
	var value []byte
	if msgs := h.server.Topics.Messages(key); len(msgs) == 1 {
		value = msgs[0].Payload
	}
	corr := pk.Properties.CorrelationData
	switch {
	case h.mode == "refuse" && n == 5:
		return pk, mpackets.ErrTopicNameInvalid // 0x90: "no value here"
	case h.mode == "silent" && n == 5:
		return pk, mpackets.CodeSuccessIgnore
	case h.mode == "wrong-value" && n == 5:
		if other := h.server.Topics.Messages("kv/t10"); len(other) == 1 {
			value = other[0].Payload
		}
	case h.mode == "empty" && n == 5:
		value = nil
	case h.mode == "key-as-correlation":
		corr = []byte(key)
	}
	reply := mpackets.Packet{
		FixedHeader: mpackets.FixedHeader{Type: mpackets.Publish},
		TopicName:   pk.Properties.ResponseTopic,
		Payload:     value,
		Properties:  mpackets.Properties{CorrelationData: corr},
	}
	if err := cl.WritePacket(reply); err != nil {
		return pk, err
	}
	if h.mode == "twice" && n == 5 {
		_ = cl.WritePacket(reply)
	}
	return pk, mpackets.CodeSuccessIgnore // acknowledged 0x00, not published
}

func startKVDouble(t *testing.T, mode string) string {
	t.Helper()
	s := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AddHook(&kvDouble{server: s, mode: mode}, nil); err != nil {
		t.Fatal(err)
	}
	l := listeners.NewTCP(listeners.Config{ID: "kv", Address: "127.0.0.1:0"})
	if err := s.AddListener(l); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	m := &Mochi{server: s, addr: l.Address(), id: "kv"}
	t.Cleanup(func() {
		// Bounded, as every mochi the tests start: see Mochi.Close.
		if err := m.Close(5 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return m.Addr()
}

// Every read of a well-behaved double completes, by count and by time.
func TestPointReadsAccountForEveryRead(t *testing.T) {
	addr := startKVDouble(t, "")
	ctx := testCtx(t)
	fill, err := FillTopics(ctx, FillConfig{Addr: addr, Topics: TopicSet{Prefix: "kv", Count: 50, PayloadSize: 48}, Retain: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := PointReads(ctx, PointReadConfig{Addr: addr, Keys: fill.Topics, Clients: 1, Reads: 120, Quiet: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reads != 120 || res.Rate() <= 0 {
		t.Fatalf("%+v", res)
	}
	// Several clients at once.
	res, err = PointReads(ctx, PointReadConfig{Addr: addr, Keys: fill.Topics, Clients: 4, Duration: 200 * time.Millisecond, ClientIDPrefix: "kv4"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reads == 0 || res.Clients != 4 {
		t.Fatalf("%+v", res)
	}
}

// Each way a broker can get a point read wrong fails the run.
func TestPointReadsDetectFaults(t *testing.T) {
	for mode, want := range map[string]string{
		"refuse":             "PUBACK reason 0x90",
		"silent":             "no answer and PUBACK within",
		"wrong-value":        "answered with the value of topic 10",
		"empty":              "answered with no value",
		"twice":              "read 4 of kv/t4 answered twice",
		"key-as-correlation": "Correlation Data of a request not in flight",
	} {
		t.Run(mode, func(t *testing.T) {
			addr := startKVDouble(t, mode)
			ctx := testCtx(t)
			fill, err := FillTopics(ctx, FillConfig{Addr: addr, Topics: TopicSet{Prefix: "kv", Count: 20, PayloadSize: 32}, Retain: true, Publishers: 1, Window: 1})
			if err != nil {
				t.Fatal(err)
			}
			_, err = PointReads(ctx, PointReadConfig{Addr: addr, Keys: fill.Topics, Clients: 1, Reads: 10,
				AckTimeout: 300 * time.Millisecond, Quiet: 100 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("want %q, got %v", want, err)
			}
		})
	}
}

func TestPointReadsRefuseUnboundedRuns(t *testing.T) {
	ts := TopicSet{Prefix: "k", Count: 1, PayloadSize: 16}
	for _, c := range []PointReadConfig{
		{Addr: "x", Keys: ts, Clients: 1},
		{Addr: "x", Keys: ts, Clients: 0, Reads: 1},
		{Addr: "x", Keys: ts, Clients: maxPublishers + 1, Reads: 1},
		{Addr: "x", Keys: TopicSet{Prefix: "k"}, Clients: 1, Reads: 1},
	} {
		if _, err := PointReads(testCtx(t), c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
