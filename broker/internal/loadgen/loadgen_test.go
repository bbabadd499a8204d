package loadgen

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// startMochi runs a bare mochi-mqtt server on a free loopback port for the
// length of the test.
//
// Every subscriber in these tests receives at QoS 0 from mochi (a QoS 0
// subscription, or QoS 0 publishes): mochi v2.7.9's QoS 1 delivery path
// deadlocks (Inflight.NextImmediate read-locks twice, so a publisher's
// Inflight.Set queued in between blocks both), within about a second under
// load and at random below that. The QoS 1 subscriber path is tested
// against mosquitto instead.
func startMochi(t *testing.T) string {
	t.Helper()
	m, err := StartMochi()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(5 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return m.Addr()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A count-bounded broadcast run against a real broker: every acknowledged
// message reaches the subscriber exactly once, and the figures agree.
func TestPublishBroadcastCountsMatch(t *testing.T) {
	addr := startMochi(t)
	for _, window := range []int{1, 4} {
		t.Run(fmt.Sprintf("window%d", window), func(t *testing.T) {
			res, err := Publish(testCtx(t), PublishConfig{
				Addr:           addr,
				TopicPrefix:    fmt.Sprintf("bench/w%d", window),
				Publishers:     8,
				Window:         window,
				Messages:       3000,
				ClientIDPrefix: fmt.Sprintf("t-w%d", window),
				Subscribe:      true,
				SubscribeQoS0:  true,
				DrainTimeout:   5 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Acked != 3000 || res.Delivered != 3000 {
				t.Fatalf("acked %d, delivered %d; want 3000 each", res.Acked, res.Delivered)
			}
			var total uint64
			for _, n := range res.AckedBy {
				total += n
			}
			if total != 3000 || len(res.AckedBy) != 8 {
				t.Fatalf("per-publisher counts %v sum to %d", res.AckedBy, total)
			}
			if res.Rate() <= 0 || res.PublishRate() <= 0 {
				t.Fatalf("rates %v / %v", res.Rate(), res.PublishRate())
			}
		})
	}
}

// A duration-bounded run stops by itself and still accounts for every
// message in flight when the time ran out.
func TestPublishDurationBounded(t *testing.T) {
	addr := startMochi(t)
	res, err := Publish(testCtx(t), PublishConfig{
		Addr:          addr,
		TopicPrefix:   "bench/d",
		Publishers:    4,
		Window:        2,
		Duration:      300 * time.Millisecond,
		Subscribe:     true,
		SubscribeQoS0: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Acked == 0 || res.Delivered != res.Acked {
		t.Fatalf("acked %d, delivered %d", res.Acked, res.Delivered)
	}
}

// The subscriber check is what makes a run trustworthy, so it must catch a
// broker that sends a message nobody published into the run's topics.
func TestPublishDetectsForeignMessage(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	intruder, _, err := Dial(ctx, addr, ClientOptions{ClientID: "intruder"})
	if err != nil {
		t.Fatal(err)
	}
	defer disconnect(intruder)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = intruder.Publish(ctx, &paho.Publish{QoS: 0, Topic: "bench/f/p0", Payload: []byte("not a loadgen payload")})
			time.Sleep(time.Millisecond)
		}
	}()
	_, err = Publish(ctx, PublishConfig{
		Addr: addr, TopicPrefix: "bench/f", Publishers: 1, Duration: 300 * time.Millisecond,
		Subscribe: true, SubscribeQoS0: true, DrainTimeout: time.Second,
	})
	close(stop)
	<-done
	if err == nil || !strings.Contains(err.Error(), "from elsewhere") {
		t.Fatalf("want a foreign-message error, got %v", err)
	}
}

func TestPublishRefusesUnboundedRun(t *testing.T) {
	_, err := Publish(context.Background(), PublishConfig{Addr: "127.0.0.1:1", TopicPrefix: "x", Publishers: 1})
	if err == nil {
		t.Fatal("a run with neither a count nor a duration was accepted")
	}
}

// publishRecords publishes n messages shaped like channel deliveries, with
// offsets from offsets(i), into topic.
func publishRecords(t *testing.T, ctx context.Context, addr, topic string, n int, offsets func(i int) uint64) {
	t.Helper()
	c, _, err := Dial(ctx, addr, ClientOptions{ClientID: "records-" + topic})
	if err != nil {
		t.Fatal(err)
	}
	// Connected until the test ends: a client that sends DISCONNECT right
	// behind a burst of QoS 0 publishes loses the burst's tail now and
	// then (QoS 0 is at most once), and the reader would then wait for
	// records that were never published.
	t.Cleanup(func() { disconnect(c) })
	buf := make([]byte, DefaultPayload)
	for i := range n {
		encodePayload(buf, 7, 0, uint64(i))
		// QoS 0: see startMochi.
		_, err := c.Publish(ctx, &paho.Publish{QoS: 0, Topic: topic, Payload: buf, Properties: &paho.PublishProperties{
			User: paho.UserProperties{
				{Key: PropOffset, Value: strconv.FormatUint(offsets(i), 10)},
				{Key: PropID, Value: fmt.Sprintf("id-%d", i)},
				{Key: PropTimestamp, Value: "1700000000000"},
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestReaderConsecutiveOffsets(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	ledger := NewLedger()
	if err := ledger.Add(Result{Run: 7, AckedBy: []uint64{500}}); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(ctx, ReaderConfig{Addr: addr, ClientID: "reader-ok", Filter: "ch/#", Records: 500,
		Quiet: 100 * time.Millisecond, Observe: ledger.Observe})
	if err != nil {
		t.Fatal(err)
	}
	publishRecords(t, ctx, addr, "ch/a", 500, func(i int) uint64 { return uint64(i + 1) })
	res, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 500 || res.FirstOffset != 1 || res.LastOffset != 500 {
		t.Fatalf("read %+v", res)
	}
	if err := ledger.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestReaderDetectsGapAndRepeat(t *testing.T) {
	addr := startMochi(t)
	cases := map[string]struct {
		offsets func(i int) uint64
		want    string
	}{
		"gap":    {func(i int) uint64 { return uint64(i + 1 + i/50) }, "skipped"},
		"repeat": {func(i int) uint64 { return uint64(i + 1 - i/60) }, "delivered twice"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			r, err := OpenReader(ctx, ReaderConfig{Addr: addr, ClientID: "reader-" + name, Filter: "g/" + name + "/#",
				Records: 100, IdleTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			publishRecords(t, ctx, addr, "g/"+name+"/x", 100, c.offsets)
			_, err = r.Read(ctx)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error containing %q, got %v", c.want, err)
			}
		})
	}
}

func TestReaderQuietCatchesExtraRecords(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	r, err := OpenReader(ctx, ReaderConfig{Addr: addr, ClientID: "reader-extra", Filter: "e/#",
		Records: 10, Quiet: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	publishRecords(t, ctx, addr, "e/x", 12, func(i int) uint64 { return uint64(i + 1) })
	if _, err := r.Read(ctx); err == nil || !strings.Contains(err.Error(), "after the 10 expected") {
		t.Fatalf("want an extra-records error, got %v", err)
	}
}

// mosquittoPath is where Debian's package puts the broker; .ci/run installs
// it.
const mosquittoPath = "/usr/sbin/mosquitto"

// The QoS 1 subscriber path against a broker whose QoS 1 delivery works:
// counts match, nothing lost, nothing twice, per-publisher order kept. A run
// is at most 1,000 messages because mosquitto by default drops what a
// subscriber has queued past max_queued_messages (1,000): below that, any
// loss is the load generator's.
func TestPublishBroadcastQoS1Mosquitto(t *testing.T) {
	if _, err := exec.LookPath(mosquittoPath); err != nil {
		t.Fatalf("this test needs mosquitto (apt-get install mosquitto; .ci/run installs it): %v", err)
	}
	ctx := testCtx(t)
	m, err := StartMosquitto(ctx, mosquittoPath, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(5 * time.Second)
	if !strings.HasPrefix(m.Version, "mosquitto version") {
		t.Errorf("version %q", m.Version)
	}
	for _, c := range []struct{ window, rm int }{{1, 1024}, {4, 1024}, {4, 8}} {
		res, err := Publish(ctx, PublishConfig{
			Addr: m.Addr(), TopicPrefix: fmt.Sprintf("q1/w%d-rm%d", c.window, c.rm), Publishers: 8, Window: c.window,
			Messages: 1000, ClientIDPrefix: fmt.Sprintf("q1-w%d-rm%d", c.window, c.rm), Subscribe: true,
			ReceiveMaximum: uint16(c.rm),
		})
		if err != nil {
			t.Fatalf("%+v: %v\n%s", c, err, m.out)
		}
		if res.Acked != 1000 || res.Delivered != 1000 {
			t.Fatalf("%+v: acked %d, delivered %d; want 1000 each", c, res.Acked, res.Delivered)
		}
	}
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	b := NewTailBuffer(8)
	_, _ = b.Write([]byte("abcdef"))
	if b.String() != "abcdef" {
		t.Fatalf("%q", b.String())
	}
	_, _ = b.Write([]byte("ghij"))
	if got := b.String(); got != "[...]\ncdefghij" {
		t.Fatalf("%q", got)
	}
	_, _ = b.Write([]byte("0123456789"))
	if got := b.String(); got != "[...]\n23456789" {
		t.Fatalf("%q", got)
	}
}

// The gate lets max messages through, holds the next until a delivery, and
// reports a subscriber that stopped receiving instead of waiting forever.
func TestLagGate(t *testing.T) {
	ctx := testCtx(t)
	g := newLagGate(3)
	for range 3 {
		if err := g.wait(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	released := make(chan error, 1)
	go func() { released <- g.wait(ctx, 5*time.Second) }()
	select {
	case err := <-released:
		t.Fatalf("a fourth message went through with three undelivered (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.delivered()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err := g.wait(ctx, 30*time.Millisecond); err == nil || !strings.Contains(err.Error(), "3 messages behind") {
		t.Fatalf("want a stall error, got %v", err)
	}
}

// With the lag held to 10 — the leash make bench falls back to for
// mosquitto (saguin-bench's mosquittoFallbackLag) — a run far longer than
// mosquitto's queue is whole, or every message missing is one mosquitto
// said it dropped: the load generator loses, repeats and reorders nothing,
// and reports what the peer lost rather than a rate (the bench then lists
// the run under its reference failures). Whether mosquitto 2.0.11 drops at
// all at a given lag depends on scheduling: on a loaded 2-core machine it
// dropped 196 of 20,000 at a lag of 200 and 7 at a lag of 10, each time
// logging "Outgoing messages are being dropped", so the peer's wholeness is
// not what this guards; the lag itself is held by the gate (TestLagGate).
func TestPublishMaxLagAgainstMosquittoLosesOnlyWhatMosquittoDrops(t *testing.T) {
	if _, err := exec.LookPath(mosquittoPath); err != nil {
		t.Fatalf("this test needs mosquitto (apt-get install mosquitto; .ci/run installs it): %v", err)
	}
	ctx := testCtx(t)
	m, err := StartMosquitto(ctx, mosquittoPath, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(5 * time.Second)
	const total = 20000
	res, err := Publish(ctx, PublishConfig{
		Addr: m.Addr(), TopicPrefix: "lag", Publishers: 16, Window: 2, Messages: total,
		ClientIDPrefix: "lag", Subscribe: true, MaxLag: 10,
	})
	if res.Acked != total {
		t.Fatalf("acked %d, want %d: %v\n%s", res.Acked, total, err, m.out)
	}
	if err == nil {
		if res.Delivered != total {
			t.Fatalf("no error, yet delivered %d of %d", res.Delivered, total)
		}
		return
	}
	// Only losses, each of them mosquitto's: its own log says it dropped
	// outgoing messages for the subscriber.
	clean := fmt.Sprintf("%d acknowledged, %d received: %d lost, 0 duplicated, 0 never published, 0 from elsewhere, 0 out of order, 0 not acknowledged",
		total, res.Delivered, total-res.Delivered)
	if !strings.Contains(err.Error(), clean) {
		t.Fatalf("want only losses (%q), got %v", clean, err)
	}
	if !strings.Contains(m.out.String(), "Outgoing messages are being dropped for client lag-sub") {
		t.Fatalf("%d lost, but mosquitto's log says it dropped nothing: the loss is the load generator's\n%s", total-res.Delivered, m.out)
	}
	t.Logf("mosquitto dropped %d of %d at a lag of 10, and said so; the run reported it", total-res.Delivered, total)
}
