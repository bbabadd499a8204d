package broker_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker"
)

// TestLogQoS2AbandonFloodIsRateLimitedAndCounted: a hostile client that
// holds QoS 2 publishes and never releases them — every Clean Start ends
// its session and abandons the holds of the last one — writes its first
// `held QoS 2 publish abandoned` line and, once the interval has passed,
// one line saying how many more there were: not a line per exchange
// (operations.md "No client can make the log large"). Every abandoned
// exchange is still counted in saguin_qos2_abandoned_total.
func TestLogQoS2AbandonFloodIsRateLimitedAndCounted(t *testing.T) {
	const (
		rounds   = 25
		perRound = 20 // broker.qos2.max_inflight_per_client below
		total    = rounds * perRound
	)
	cfg := strings.Replace(qos2Config, "{{.Provider}}", "        type: memory\n        snapshot_dir: none", 1)
	cfg = strings.Replace(cfg, "{{.Extra}}", "", 1)
	cfg = strings.Replace(cfg, "max_inflight_per_client: 2", "max_inflight_per_client: "+strconv.Itoa(perRound), 1)
	rig := newMetricsRig(t, cfg)
	b := rig.b
	before := len(b.Log.String())

	for round := 0; round < rounds; round++ {
		// Clean Start: the session this client id had ends, and with it
		// the holds the previous round left unreleased.
		c, _ := q2Dial(t, b.Address(), "hostile", true, 600)
		for pid := uint16(1); pid <= perRound; pid++ {
			c.hold(pid, "events/x", "never released", 0x00)
		}
		c.drop()
	}
	q2Dial(t, b.Address(), "hostile", true, 600) // ends the last round's session
	waitQoS2(t, b, broker.QoS2Stats{Held: 0, Abandoned: total})

	abandonLines := func() (n int, summary *logLine) {
		for _, l := range checkLogLines(t, b.Log.String()[before:]) {
			switch {
			case l.get("msg") == "held QoS 2 publish abandoned" && l.get("client") == "hostile":
				n++
			case l.get("msg") == "refusals not logged" && l.get("client") == "hostile":
				summary = &l
			}
		}
		return n, summary
	}
	// The clock has not moved: one interval, so one line for the client.
	if n, _ := abandonLines(); n != 1 {
		t.Errorf("%d abandoned exchanges wrote %d `held QoS 2 publish abandoned` lines for the client; want 1", total, n)
	}
	// At the shipped log level (info) the flood is what an operator reads;
	// the test runs at debug, whose per-connection lines are not the
	// client's mistake.
	var infoLines, infoBytes int
	for _, l := range checkLogLines(t, b.Log.String()[before:]) {
		if l.get("level") != "DEBUG" {
			infoLines, infoBytes = infoLines+1, infoBytes+len(l.raw)+1
		}
	}
	t.Logf("%d abandoned exchanges: %d lines, %d bytes at info and above", total, infoLines, infoBytes)
	if infoBytes > 2048 {
		t.Errorf("%d abandoned exchanges wrote %d lines, %d bytes at info and above; want at most 2 KiB:\n%s",
			total, infoLines, infoBytes, b.Log.Tail(10))
	}

	// The metric counts every one, logged or not. fresh moves the clock
	// past the refusal interval too, so the summary line is due.
	f := rig.fresh()
	if got, _ := f.value("saguin_qos2_abandoned_total"); got != total {
		t.Errorf("saguin_qos2_abandoned_total = %v, want %d", got, total)
	}
	deadline := time.Now().Add(wait)
	for {
		n, summary := abandonLines()
		if summary != nil {
			if n != 1 || summary.get("suppressed") != strconv.Itoa(total-1) || summary.get("level") != "INFO" ||
				summary.get("kind") == "" {
				t.Errorf("after the interval: %d abandon lines and summary %s; want 1 line and an INFO summary with a kind and suppressed=%d",
					n, summary.raw, total-1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line says how many abandoned exchanges were not logged:\n%s", b.Log.Tail(10))
		}
		rig.clk.Advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
}
