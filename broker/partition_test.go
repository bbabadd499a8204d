package broker_test

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/partition"
)

// declare subscribes c to filter with the saguin-filter values given and
// returns the SUBACK.
func declare(t *testing.T, c *brokertest.Client, filter string, values ...string) *paho.Suback {
	t.Helper()
	props := &paho.SubscribeProperties{}
	for _, v := range values {
		props.User = append(props.User, paho.UserProperty{Key: "saguin-filter", Value: v})
	}
	sa, err := c.SubscribeWith(&paho.Subscribe{Properties: props,
		Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil && sa == nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	return sa
}

// topicsFor are n topics under prefix.
func topicsFor(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s/dev-%03d", prefix, i)
	}
	return out
}

// collect reads n messages from c and returns their topics, sorted.
func collect(t *testing.T, c *brokertest.Client, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		got = append(got, c.Next(wait).Topic)
	}
	c.Quiet(200 * time.Millisecond)
	sort.Strings(got)
	return got
}

// sliceOf is the subset of topics in slice (partitions, index), sorted.
func sliceOf(topics []string, partitions, index uint32) []string {
	var out []string
	for _, tp := range topics {
		if partition.SliceOf(tp, partitions) == index {
			out = append(out, tp)
		}
	}
	sort.Strings(out)
	return out
}

func equalTopics(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Three members of a 3-way space each receive exactly their slice of an
// append channel — replayed records and live ones — and together every
// record once (rfcs/partition.md); a member holding
// two slices repeats the property and receives their union.
func TestPartitionSlicesAnAppendChannelReplayAndLive(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	topics := topicsFor("events", 30)
	for _, tp := range topics[:20] {
		pub1(t, pub, tp, "replayed")
	}
	members := make([]*brokertest.Client, 3)
	for i := range members {
		members[i] = brokertest.Connect(t, b.Address(), fmt.Sprintf("m%d", i), brokertest.ClientOptions{CleanStart: true})
		if sa := declare(t, members[i], "events/#", fmt.Sprintf("topic_hash(3, %d)", i)); sa.Reasons[0] != 1 {
			t.Fatalf("member %d: SUBACK 0x%02x", i, sa.Reasons[0])
		}
	}
	both := brokertest.Connect(t, b.Address(), "both", brokertest.ClientOptions{CleanStart: true})
	declare(t, both, "events/#", "topic_hash(3, 0)", "topic_hash(3,2)")
	for _, tp := range topics[20:] {
		pub1(t, pub, tp, "live")
	}
	for i, m := range members {
		want := sliceOf(topics, 3, uint32(i))
		if got := collect(t, m, len(want)); !equalTopics(got, want) {
			t.Errorf("member %d received %v, want its slice %v", i, got, want)
		}
	}
	want := append(sliceOf(topics, 3, 0), sliceOf(topics, 3, 2)...)
	sort.Strings(want)
	if got := collect(t, both, len(want)); !equalTopics(got, want) {
		t.Errorf("the two-slice member received %v, want %v", got, want)
	}
}

// latest takes the predicate on both halves: the state pass and the
// changes.
func TestPartitionSlicesBothHalvesOfALatestChannel(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	topics := topicsFor("state", 24)
	for _, tp := range topics {
		set(t, pub, tp, "v1")
	}
	m := brokertest.Connect(t, b.Address(), "m", brokertest.ClientOptions{CleanStart: true})
	declare(t, m, "state/#", "topic_hash(4, 1)")
	want := sliceOf(topics, 4, 1)
	if got := collect(t, m, len(want)); !equalTopics(got, want) {
		t.Fatalf("state pass %v, want %v", got, want)
	}
	for _, tp := range topics {
		set(t, pub, tp, "v2")
	}
	if got := collect(t, m, len(want)); !equalTopics(got, want) {
		t.Fatalf("changes %v, want %v", got, want)
	}
}

// The retained pass of the broadcast retained store is a current-state
// pass and takes the slice too.
func TestPartitionSlicesTheRetainedPass(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	topics := topicsFor("status", 24)
	for _, tp := range topics {
		if code := retainPublish(t, pub, tp, []byte("up"), 0); code != 0 {
			t.Fatalf("retained publish: 0x%02x", code)
		}
	}
	m := brokertest.Connect(t, b.Address(), "m", brokertest.ClientOptions{CleanStart: true})
	declare(t, m, "status/#", "topic_hash(2, 0)")
	want := sliceOf(topics, 2, 0)
	if got := collect(t, m, len(want)); !equalTopics(got, want) {
		t.Fatalf("retained pass %v, want %v", got, want)
	}
}

// Refusals: a malformed declaration refuses every filter of the packet with
// 0x83 and the reason on the SUBACK; on $share/ and $saguin/queue/ only that
// filter is refused; a client that asked for no problem information gets
// the code without the reason.
func TestPartitionRefusals(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true, ProblemInfo: true})
	sa, _ := c.SubscribeWith(&paho.Subscribe{
		Properties:    &paho.SubscribeProperties{User: paho.UserProperties{{Key: "saguin-filter", Value: "topic_hash(1, 8)"}}},
		Subscriptions: []paho.SubscribeOptions{{Topic: "events/#", QoS: 1}, {Topic: "state/#", QoS: 1}}})
	if sa == nil || len(sa.Reasons) != 2 || sa.Reasons[0] != 0x83 || sa.Reasons[1] != 0x83 {
		t.Fatalf("malformed declaration: %+v", sa)
	}
	if sa.Properties == nil || sa.Properties.ReasonString == "" {
		t.Fatalf("no Reason String naming the rule: %+v", sa.Properties)
	}
	sa, _ = c.SubscribeWith(&paho.Subscribe{
		Properties: &paho.SubscribeProperties{User: paho.UserProperties{{Key: "saguin-filter", Value: "topic_hash(3, 0)"}}},
		Subscriptions: []paho.SubscribeOptions{{Topic: "$share/g/events/#", QoS: 1}, {Topic: "$saguin/queue/jobs", QoS: 1},
			{Topic: "events/#", QoS: 1}}})
	if sa == nil || len(sa.Reasons) != 3 || sa.Reasons[0] != 0x83 || sa.Reasons[1] != 0x83 || sa.Reasons[2] != 1 {
		t.Fatalf("declaration on $share/ and a queue: %+v", sa)
	}
	sa, _ = c.SubscribeWith(&paho.Subscribe{
		Properties: &paho.SubscribeProperties{User: paho.UserProperties{
			{Key: "saguin-filter", Value: "topic_hash(4, 0)"}, {Key: "saguin-filter", Value: "topic_hash(6, 1)"}}},
		Subscriptions: []paho.SubscribeOptions{{Topic: "events/a", QoS: 1}}})
	if sa == nil || sa.Reasons[0] != 0x83 {
		t.Fatalf("two partition counts on one SUBSCRIBE: %+v", sa)
	}
	// A client that asked for no problem information gets the code alone.
	quiet := brokertest.Connect(t, b.Address(), "quiet", brokertest.ClientOptions{CleanStart: true})
	sa, _ = quiet.SubscribeWith(&paho.Subscribe{
		Properties:    &paho.SubscribeProperties{User: paho.UserProperties{{Key: "saguin-filter", Value: "topic_hash(0, 0)"}}},
		Subscriptions: []paho.SubscribeOptions{{Topic: "events/#", QoS: 1}}})
	if sa == nil || sa.Reasons[0] != 0x83 || (sa.Properties != nil && sa.Properties.ReasonString != "") {
		t.Fatalf("Request Problem Information 0: %+v %+v", sa, sa.Properties)
	}
}

// A declaration lasts as long as the session: after a restart the resumed
// session is still served its slice only.
func TestPartitionDeclarationSurvivesRestart(t *testing.T) {
	b, _ := latestRig(t, sqliteProvider)
	m := brokertest.Connect(t, b.Address(), "m", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	declare(t, m, "events/#", "topic_hash(2, 1)")
	m.Close()
	b.Restart()
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	m = brokertest.Connect(t, b.Address(), "m", brokertest.ClientOptions{SessionExpiry: 3600})
	if !m.Connack.SessionPresent {
		t.Fatal("session not restored")
	}
	topics := topicsFor("events", 20)
	for _, tp := range topics {
		pub1(t, pub, tp, "x")
	}
	want := sliceOf(topics, 2, 1)
	if got := collect(t, m, len(want)); !equalTopics(got, want) {
		t.Fatalf("after the restart: %v, want %v", got, want)
	}
}

// Two subscribers on one filter declaring different partition counts are
// named in a log line.
func TestPartitionDisagreementIsLogged(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	a := brokertest.Connect(t, b.Address(), "a", brokertest.ClientOptions{CleanStart: true})
	declare(t, a, "events/#", "topic_hash(3, 0)")
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	declare(t, c, "events/#", "topic_hash(4, 0)")
	if !b.Log.Contains("partition spaces disagree") {
		t.Fatal("no log line for two partition counts on one filter")
	}
}

// Live broadcast takes the slice too: each member of a 2-way space receives
// only the broadcast topics in its slice.
func TestPartitionSlicesLiveBroadcast(t *testing.T) {
	b, _ := latestRig(t, memoryProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	members := make([]*brokertest.Client, 2)
	for i := range members {
		members[i] = brokertest.Connect(t, b.Address(), fmt.Sprintf("m%d", i), brokertest.ClientOptions{CleanStart: true})
		declare(t, members[i], "plain/#", fmt.Sprintf("topic_hash(2, %d)", i))
	}
	topics := topicsFor("plain", 20)
	for _, tp := range topics {
		pub1(t, pub, tp, "live")
	}
	for i, m := range members {
		want := sliceOf(topics, 2, uint32(i))
		if got := collect(t, m, len(want)); !equalTopics(got, want) {
			t.Errorf("member %d received %v, want %v", i, got, want)
		}
	}
}
