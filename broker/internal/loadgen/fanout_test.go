package loadgen

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

func TestPercentile(t *testing.T) {
	ms := time.Millisecond
	s := []time.Duration{1 * ms, 2 * ms, 3 * ms, 4 * ms, 5 * ms, 6 * ms, 7 * ms, 8 * ms, 9 * ms, 10 * ms}
	for p, want := range map[float64]time.Duration{50: 5 * ms, 99: 10 * ms, 100: 10 * ms, 10: 1 * ms, 11: 2 * ms, 1: 1 * ms} {
		if got := percentile(s, p); got != want {
			t.Errorf("p%v = %s, want %s", p, got, want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("percentile of nothing")
	}
	r := FanOutResult{Complete: []time.Duration{9 * ms, 1 * ms, 5 * ms}}
	if r.MedianComplete() != 5*ms {
		t.Errorf("median %s", r.MedianComplete())
	}
}

// Every round reaches every subscriber once; a sample per subscriber and
// round, and the figures are ordered.
func TestFanOutMochi(t *testing.T) {
	addr := startMochi(t)
	res, err := FanOut(testCtx(t), FanOutConfig{Addr: addr, TopicPrefix: "fan", Subscribers: 60, Rounds: 3, WarmUp: true, QoS: 0,
		AckTimeout: 5 * time.Second, Quiet: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Complete) != 3 || len(res.Latencies) != 180 || res.Subscribers != 60 {
		t.Fatalf("%d rounds, %d samples", len(res.Complete), len(res.Latencies))
	}
	if p50, p99 := res.Percentile(50), res.Percentile(99); p50 <= 0 || p50 > p99 || p99 > res.Latencies[len(res.Latencies)-1] {
		t.Fatalf("p50 %s, p99 %s", p50, p99)
	}
	for _, c := range res.Complete {
		if c < res.Latencies[0] {
			t.Fatalf("a round completed (%s) before its first delivery (%s)", c, res.Latencies[0])
		}
	}
}

// The QoS 1 subscriber path, against mosquitto.
func TestFanOutQoS1Mosquitto(t *testing.T) {
	if _, err := exec.LookPath(mosquittoPath); err != nil {
		t.Fatalf("this test needs mosquitto (apt-get install mosquitto; .ci/run installs it): %v", err)
	}
	ctx := testCtx(t)
	m, err := StartMosquitto(ctx, mosquittoPath, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(5 * time.Second)
	res, err := FanOut(ctx, FanOutConfig{Addr: m.Addr(), TopicPrefix: "fan", Subscribers: 100, Rounds: 2, QoS: 1})
	if err != nil {
		t.Fatalf("%v\n%s", err, m.out)
	}
	if len(res.Latencies) != 200 {
		t.Fatalf("%d samples", len(res.Latencies))
	}
}

// A broker that delivers a round twice (here: a client echoing every
// message back onto the topic), or without the labels asked for, fails the
// run.
func TestFanOutDetectsDuplicatesAndMissingLabels(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	if _, err := FanOut(ctx, FanOutConfig{Addr: addr, TopicPrefix: "lab", Subscribers: 5, Rounds: 1, Labels: true}); err == nil ||
		!strings.Contains(err.Error(), "5 without the saguin-* labels") {
		t.Errorf("labels: %v", err)
	}

	echo, _, err := Dial(ctx, addr, ClientOptions{ClientID: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	defer disconnect(echo)
	echoed := make(chan struct{}, 1)
	echo.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		topic, payload := pr.Packet.Topic, append([]byte(nil), pr.Packet.Payload...)
		go func() {
			// Published from another goroutine: the handler runs on paho's
			// read loop.
			_, _ = echo.Publish(ctx, &paho.Publish{QoS: 0, Topic: topic, Payload: payload})
			select {
			case echoed <- struct{}{}:
			default:
			}
		}()
		return true, nil
	})
	// No Local: the echo must not hear itself and echo again.
	if _, err := echo.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "dup/#", QoS: 0, NoLocal: true}}}); err != nil {
		t.Fatal(err)
	}
	_, err = FanOut(ctx, FanOutConfig{Addr: addr, TopicPrefix: "dup", Subscribers: 5, Rounds: 3, Quiet: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "twice or out of turn") {
		t.Fatalf("want a duplicate error, got %v", err)
	}
	select {
	case <-echoed:
	default:
		t.Fatal("the echo never echoed: the test proved nothing")
	}
}

func TestFanOutRefusesUnboundedRuns(t *testing.T) {
	ctx := testCtx(t)
	for _, c := range []FanOutConfig{
		{Addr: "x", TopicPrefix: "p", Subscribers: MaxFanOut + 1, Rounds: 1},
		{Addr: "x", TopicPrefix: "p", Subscribers: 1, Rounds: 0},
		{Addr: "x", TopicPrefix: "p", Subscribers: 1, Rounds: maxFanOutRounds + 1},
		{Addr: "x", TopicPrefix: "p", Subscribers: 1, Rounds: 1, QoS: 2},
	} {
		if _, err := FanOut(ctx, c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
