package loadgen

import (
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

func TestTopicSetNamesAndValues(t *testing.T) {
	ts := TopicSet{Prefix: "state/x", Count: 120, Run: 9, PayloadSize: 40}
	if err := ts.valid(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 7, 119} {
		got, ok := ts.index([]byte(ts.Topic(i)))
		if !ok || got != i {
			t.Errorf("index(%s) = %d, %v", ts.Topic(i), got, ok)
		}
	}
	for _, topic := range []string{"state/x/t120", "state/x/t", "state/x/t01", "state/x/t1a", "state/y/t1", "state/x/t99999999", "state/x/t-1"} {
		if i, ok := ts.index([]byte(topic)); ok {
			t.Errorf("index(%s) = %d, accepted", topic, i)
		}
	}
	scratch := make([]byte, ts.PayloadSize)
	v := make([]byte, ts.PayloadSize)
	ts.value(v, 7)
	if err := ts.checkValue(7, v, scratch); err != nil {
		t.Fatal(err)
	}
	if err := ts.checkValue(8, v, scratch); err == nil || !strings.Contains(err.Error(), "the value of topic 7") {
		t.Errorf("topic 7's value accepted for topic 8: %v", err)
	}
	if err := ts.checkValue(7, v[:20], scratch); err == nil {
		t.Error("a truncated value accepted")
	}
	other := TopicSet{Prefix: ts.Prefix, Count: ts.Count, Run: 10, PayloadSize: ts.PayloadSize}
	other.value(v, 7)
	if err := ts.checkValue(7, v, scratch); err == nil || !strings.Contains(err.Error(), "not from this run") {
		t.Errorf("another run's value accepted: %v", err)
	}
	for _, bad := range []TopicSet{{Count: 1, PayloadSize: 16}, {Prefix: "p", Count: 0, PayloadSize: 16},
		{Prefix: "p", Count: MaxTopics + 1, PayloadSize: 16}, {Prefix: "p", Count: 1, PayloadSize: 8}} {
		if bad.valid() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// Retained values filled into mochi are read back whole by a new
// subscriber (QoS 0: see startMochi).
func TestFillAndReadStateMochi(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	fill, err := FillTopics(ctx, FillConfig{Addr: addr, Topics: TopicSet{Prefix: "st", Count: 2000, PayloadSize: 64}, Retain: true})
	if err != nil {
		t.Fatal(err)
	}
	if fill.Topics.Run == 0 || fill.Topics.Count != 2000 || fill.Rate() <= 0 {
		t.Fatalf("fill %+v", fill)
	}
	res, err := ReadState(ctx, StateConfig{Addr: addr, ClientID: "state-reader", Topics: fill.Topics, QoS: 0, Quiet: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Values != 2000 || res.Rate() <= 0 {
		t.Fatalf("read %+v", res)
	}
}

// The QoS 1 path, against mosquitto; 500 values stay under its default
// max_queued_messages (1,000), past which it drops by design.
func TestReadStateQoS1Mosquitto(t *testing.T) {
	if _, err := exec.LookPath(mosquittoPath); err != nil {
		t.Fatalf("this test needs mosquitto (apt-get install mosquitto; .ci/run installs it): %v", err)
	}
	ctx := testCtx(t)
	m, err := StartMosquitto(ctx, mosquittoPath, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop(5 * time.Second)
	fill, err := FillTopics(ctx, FillConfig{Addr: m.Addr(), Topics: TopicSet{Prefix: "st", Count: 500, PayloadSize: DefaultPayload}, Retain: true})
	if err != nil {
		t.Fatalf("%v\n%s", err, m.out)
	}
	res, err := ReadState(ctx, StateConfig{Addr: m.Addr(), ClientID: "state-q1", Topics: fill.Topics, QoS: 1, ReceiveMaximum: 64})
	if err != nil {
		t.Fatalf("%v\n%s", err, m.out)
	}
	if res.Values != 500 {
		t.Fatalf("read %+v", res)
	}
}

// A state that differs from what was filled fails the read, naming how.
func TestReadStateDetectsWrongState(t *testing.T) {
	addr := startMochi(t)
	ctx := testCtx(t)
	fill, err := FillTopics(ctx, FillConfig{Addr: addr, Topics: TopicSet{Prefix: "w", Count: 100, PayloadSize: 32}, Retain: true, Publishers: 2, Window: 2})
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := Dial(ctx, addr, ClientOptions{ClientID: "spoiler"})
	if err != nil {
		t.Fatal(err)
	}
	defer disconnect(c)
	// mochi acknowledges a publish before it hands it to its subscribers,
	// so a reader subscribing right behind the PUBACK may be sent the value
	// twice: by the retained pass and live. The spoiler hears its own
	// publish before going on: by then mochi has listed that publish's
	// subscribers, and a later reader is not among them.
	// (It may also hear the fill's last values, late for the same reason.)
	heard := make(chan string, 256)
	c.AddOnPublishReceived(func(pr paho.PublishReceived) (bool, error) {
		select {
		case heard <- pr.Packet.Topic:
		default:
		}
		return true, nil
	})
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "w/#", QoS: 0, RetainHandling: 2}}}); err != nil {
		t.Fatal(err)
	}
	retain := func(topic string, payload []byte) {
		t.Helper()
		if _, err := c.Publish(ctx, &paho.Publish{QoS: 1, Retain: true, Topic: topic, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case got := <-heard:
				if got == topic {
					return
				}
			case <-ctx.Done():
				t.Fatal("the spoiler never heard its own publish")
			}
		}
	}
	read := func(id string, ts TopicSet, labels bool) error {
		_, err := ReadState(ctx, StateConfig{Addr: addr, ClientID: id, Topics: ts, Labels: labels, IdleTimeout: 300 * time.Millisecond, Quiet: 50 * time.Millisecond})
		return err
	}

	// One topic more than the broker holds: missing, named.
	more := fill.Topics
	more.Count = 101
	if err := read("r-missing", more, false); err == nil || !strings.Contains(err.Error(), "1 missing") || !strings.Contains(err.Error(), "first missing: w/t100") {
		t.Errorf("missing value: %v", err)
	}
	// A Sagüin state pass carries labels; a bare retained message does not.
	if err := read("r-labels", fill.Topics, true); err == nil || !strings.Contains(err.Error(), "100 without the saguin-* labels") {
		t.Errorf("labels: %v", err)
	}
	// Another topic's value under t5.
	v := make([]byte, 32)
	fill.Topics.value(v, 6)
	retain("w/t5", v)
	err = read("r-wrong", fill.Topics, false)
	for _, want := range []string{"1 missing", "1 wrong", "topic w/t5 carried the value of topic 6"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	// A stray topic under the filter, t5 set right again.
	fill.Topics.value(v, 5)
	retain("w/t5", v)
	retain("w/stray", v)
	err = read("r-stray", fill.Topics, false)
	for _, want := range []string{"0 missing", "1 not of the set", `a value on "w/stray"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// fakeStatePackets encodes PUBLISH packets the way a broker would send a
// state pass, for fakeBroker.
func fakeStatePackets(t *testing.T, ts TopicSet, order []int, retain func(i int) bool, offset func(i int) int) []byte {
	t.Helper()
	var buf bytes.Buffer
	for k, i := range order {
		v := make([]byte, ts.PayloadSize)
		ts.value(v, i)
		p := &packets.Publish{QoS: 1, PacketID: uint16(k + 1), Retain: retain(i), Topic: ts.Topic(i), Payload: v, Properties: &packets.Properties{
			User: []packets.User{{Key: PropOffset, Value: strconv.Itoa(offset(i))}, {Key: PropID, Value: fmt.Sprint("id", i)}, {Key: PropTimestamp, Value: "1700000000000"}},
		}}
		if _, err := p.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// What no real broker at hand will do on demand - a value twice, one
// without RETAIN, two values with one offset - is caught all the same.
func TestReadStateDetectsBadPass(t *testing.T) {
	ts := TopicSet{Prefix: "f", Count: 10, Run: 3, PayloadSize: 24}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	always := func(int) bool { return true }
	own := func(i int) int { return i + 1 }
	cases := []struct {
		name   string
		order  []int
		retain func(int) bool
		offset func(int) int
		want   string
	}{
		{"whole", all, always, own, ""},
		{"twice", append([]int{4}, all...), always, own, "1 sent twice"},
		{"unretained", all, func(i int) bool { return i != 2 }, own, "1 without RETAIN"},
		{"offsets", all, always, func(i int) int { return 1 + i%9 }, "1 repeated offsets"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := fakeBroker(t, fakeStatePackets(t, ts, c.order, c.retain, c.offset))
			res, err := ReadState(testCtx(t), StateConfig{Addr: addr, ClientID: "fake-" + c.name, Topics: ts, QoS: 1, Labels: true,
				IdleTimeout: time.Second, Quiet: 100 * time.Millisecond})
			if c.want == "" {
				if err != nil || res.Values != 10 {
					t.Fatalf("%+v, %v", res, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want %q, got %v", c.want, err)
			}
		})
	}
}

func TestFillRefusesUnboundedSets(t *testing.T) {
	ctx := testCtx(t)
	for _, ts := range []TopicSet{{Prefix: "x", Count: MaxTopics + 1, PayloadSize: 16}, {Prefix: "x", Count: 0, PayloadSize: 16}} {
		if _, err := FillTopics(ctx, FillConfig{Addr: "127.0.0.1:1", Topics: ts}); err == nil {
			t.Errorf("%+v accepted", ts)
		}
	}
}
