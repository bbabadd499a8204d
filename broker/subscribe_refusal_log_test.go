package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// subscribeLogsConfig is logsConfig with a queue, whose consuming form a
// 3.1.1 client is refused.
const subscribeLogsConfig = logsConfig + `  jobs:
    type: queue
    filter: "jobs/#"
`

// refusedSubscribeLines is the WARN lines naming client id.
func refusedSubscribeLines(t *testing.T, b *brokertest.Broker, id string) []logLine {
	t.Helper()
	var out []logLine
	for _, l := range checkLogLines(t, b.Log.String()) {
		if l.get("client") == id && l.get("level") == "WARN" {
			out = append(out, l)
		}
	}
	return out
}

// subscribeRefused is how many refused filters the broker counted under
// code (saguin_subscriptions_refused_total).
func subscribeRefused(b *brokertest.Broker, code byte) uint64 {
	for _, c := range b.RefusalCounts() {
		if c.Kind == "subscribe" && c.Code == code {
			return c.Count
		}
	}
	return 0
}

// subackOf sends a raw SUBSCRIBE and returns its SUBACK's codes.
func subackOf(t *testing.T, c *rawConn, v byte, pk []byte) []byte {
	t.Helper()
	c.write(pk)
	ack, err := c.read(v)
	if err != nil || ack.FixedHeader.Type != packets.Suback {
		t.Fatalf("SUBACK: %+v %v", ack, err)
	}
	return ack.ReasonCodes
}

// TestLogRefusedSubscribeFiltersAreOneWarnLine: filters a SUBSCRIBE has
// refused one by one (docs/security.md "Every refusal, and its code") are a refusal given to a client:
// one WARN line for the packet (docs/operations.md "Logs") naming how many were
// refused, the first of them, its code and why — however many filters it
// refused — and each refused filter counted under its own code. The line
// goes through the refusal rate limit: the same client's next refused
// SUBSCRIBE within the interval is counted, and said by the summary once
// the interval has passed. A 3.1.1 client's refusals (SUBACK 0x80) are
// logged under the code that decided them.
func TestLogRefusedSubscribeFiltersAreOneWarnLine(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), subscribeLogsConfig), brokertest.WithClock(fake))

	v5 := dialBytes(t, b.Address())
	v5.write(connectPacket(5, 2, wprops(), "picky"))
	if ack, err := v5.read(5); err != nil || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v %v", ack, err)
	}
	codes := subackOf(t, v5, 5, rawSubscribe(wprops(),
		filterOpt("$SYS/#", 1), filterOpt("ok/#", 1), filterOpt("$saguin/nothing", 1), filterOpt("a/#/b", 1)))
	if string(codes) != string([]byte{0x87, 0x01, 0x87, 0x8F}) {
		t.Fatalf("SUBACK codes % x, want 87 01 87 8f", codes)
	}
	lines := refusedSubscribeLines(t, b, "picky")
	if len(lines) != 1 {
		t.Fatalf("%d WARN lines for the refused SUBSCRIBE, want 1: %v", len(lines), lines)
	}
	l := lines[0]
	if l.get("refused") != "3" || l.get("filters") != "4" || l.get("filter") != "$SYS/#" || l.get("code") != "0x87" ||
		!strings.Contains(l.get("reason"), "$SYS") {
		t.Errorf("refused SUBSCRIBE line: %s; want refused=3 filters=4 filter=$SYS/# code=0x87 and the reason", l.raw)
	}
	if n87, n8f := subscribeRefused(b, 0x87), subscribeRefused(b, 0x8F); n87 != 2 || n8f != 1 {
		t.Errorf("refused filters counted: 0x87 %d, 0x8F %d; want 2 and 1 (%+v)", n87, n8f, b.RefusalCounts())
	}

	// Within the interval: counted, not logged; then summarized.
	codes = subackOf(t, v5, 5, rawSubscribe(wprops(), filterOpt("$SYS/broker/uptime", 1), filterOpt("x/#/y", 0)))
	if string(codes) != string([]byte{0x87, 0x8F}) {
		t.Fatalf("second SUBACK codes % x, want 87 8f", codes)
	}
	if n := len(refusedSubscribeLines(t, b, "picky")); n != 1 {
		t.Errorf("the second refused SUBSCRIBE within the interval wrote a line: %d WARN lines", n)
	}
	if n87, n8f := subscribeRefused(b, 0x87), subscribeRefused(b, 0x8F); n87 != 3 || n8f != 2 {
		t.Errorf("refused filters counted: 0x87 %d, 0x8F %d; want 3 and 2", n87, n8f)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fake.Advance(time.Minute)
		var found *logLine
		for _, l := range refusedSubscribeLines(t, b, "picky") {
			if l.get("suppressed") != "" {
				found = &l
			}
		}
		if found != nil {
			if found.get("suppressed") != "2" || found.get("kind") != "subscribe" {
				t.Errorf("summary line: %s; want kind=subscribe suppressed=2 (the filters not logged)", found.raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line says how many refusals were not logged:\n%s", b.Log.Tail(10))
		}
		time.Sleep(10 * time.Millisecond)
	}

	// 3.1.1: a queue form, refused 0x80 on the wire, logged with why.
	old := dialBytes(t, b.Address())
	old.write(connectPacket(4, 2, nil, "old-worker"))
	if ack, err := old.read(4); err != nil || ack.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK %+v %v", ack, err)
	}
	codes = subackOf(t, old, 4, rawSubscribe(nil, filterOpt("$saguin/queue/jobs", 1)))
	if string(codes) != string([]byte{0x80}) {
		t.Fatalf("3.1.1 SUBACK codes % x, want 80", codes)
	}
	lines = refusedSubscribeLines(t, b, "old-worker")
	if len(lines) != 1 || lines[0].get("filter") != "$saguin/queue/jobs" || lines[0].get("code") != "0x8F" ||
		!strings.Contains(lines[0].get("reason"), "MQTT 5") {
		t.Errorf("3.1.1 refused queue form: %v; want one line filter=$saguin/queue/jobs code=0x8F naming MQTT 5", lines)
	}

	// A SUBSCRIBE whose filters are all granted writes no WARN line.
	codes = subackOf(t, old, 4, rawSubscribe(nil, filterOpt("fine/#", 1)))
	if string(codes) != string([]byte{0x01}) || len(refusedSubscribeLines(t, b, "old-worker")) != 1 {
		t.Errorf("a granted SUBSCRIBE: codes % x, %d WARN lines; want 01 and still 1", codes, len(refusedSubscribeLines(t, b, "old-worker")))
	}
}
