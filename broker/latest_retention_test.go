package broker_test

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

// waitLog waits until the broker has logged a line containing s (a sweep
// runs on its own goroutine once the fake clock's ticker fires).
func waitLog(t *testing.T, b *brokertest.Broker, s string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !b.Log.Contains(s) {
		if time.Now().After(deadline) {
			t.Fatalf("the broker never logged %q", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// retention_period expires a quiet topic's value: past the period it is
// not served — to a subscriber or a point read — even before the sweep
// reaches it, and the age sweep removes it; a topic written since stays.
func TestLatestRetentionPeriodExpiresQuietValues(t *testing.T) {
	b, clk := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/quiet", "old")
	clk.Advance(30 * time.Minute)
	set(t, pub, "state/busy", "fresh")
	clk.Advance(31 * time.Minute) // quiet is 61 minutes old, busy 31

	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("state/#", 1)
	expect(t, c, "state/busy", "fresh", true)
	c.Quiet(200 * time.Millisecond)
	if got, code := pointRead(t, pub, "state/quiet", "r1"); code != 0 || len(got.Payload) != 0 {
		t.Fatalf("point read of an expired value: %q code 0x%02x; want an empty answer", got.Payload, code)
	}
	waitLog(t, b, `msg="retention removed latest values" broker=test channel=state values=1`)
	if got, _ := pointRead(t, pub, "state/busy", "r2"); string(got.Payload) != "fresh" {
		t.Fatalf("the value written since was removed: %q", got.Payload)
	}
}

// A deletion is kept as a tombstone for deletion_retention_period (a day
// by default), on its own clock rather than retention_period's: a
// saguin-deletions subscriber is shown it after two hours, not after a day.
func TestLatestDeletionRetentionPeriod(t *testing.T) {
	b, clk := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/gone", "v")
	set(t, pub, "state/gone", "")
	deletions := paho.UserProperties{{Key: "saguin-deletions", Value: ""}}

	clk.Advance(2 * time.Hour) // past retention_period (1h), inside the day
	c := brokertest.Connect(t, b.Address(), "c1", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, c, deletions, paho.SubscribeOptions{Topic: "state/#", QoS: 1})
	if p := expect(t, c, "state/gone", "", true); offsetOf(t, p) != 2 {
		t.Fatalf("tombstone offset %d, want 2", offsetOf(t, p))
	}

	clk.Advance(23 * time.Hour) // 25 hours old
	waitLog(t, b, `msg="retention removed latest values" broker=test channel=state values=1`)
	c = brokertest.Connect(t, b.Address(), "c2", brokertest.ClientOptions{CleanStart: true})
	subscribeOpts(t, c, deletions, paho.SubscribeOptions{Topic: "state/#", QoS: 1})
	c.Quiet(300 * time.Millisecond)
	// The counter is not given back (invariant 9).
	set(t, pub, "state/gone", "again")
	if got, _ := pointRead(t, pub, "state/gone", "r"); got.Properties.User.Get("saguin-offset") != "3" {
		t.Fatalf("value after the tombstone went has offset %s, want 3", got.Properties.User.Get("saguin-offset"))
	}
}

// Invariant 2: a publisher's Message Expiry never removes a latest value.
// An hour past its 5 s expiry (inside retention_period) it is still served
// to a subscriber and a point read, carrying saguin-expires and no
// remaining interval; the age sweep that ran meanwhile left it.
func TestInvariant02_MessageExpiryNeverRemovesALatestValue(t *testing.T) {
	b, clk := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	exp := uint32(5)
	setWith(t, pub, &paho.Publish{Topic: "state/reading", QoS: 1, Payload: []byte("21.5"),
		Properties: &paho.PublishProperties{MessageExpiry: &exp}})
	clk.Advance(50 * time.Minute)
	waitLog(t, b, "retention sweeps")
	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("state/#", 1)
	p := expect(t, c, "state/reading", "21.5", true)
	want := fmt.Sprint(latestStart.Add(5 * time.Second).UnixMilli())
	if p.Properties.User.Get("saguin-expires") != want {
		t.Fatalf("saguin-expires %q, want %s", p.Properties.User.Get("saguin-expires"), want)
	}
	if p.Properties.MessageExpiry != nil && *p.Properties.MessageExpiry != 0 {
		t.Fatalf("a run-out expiry delivered as %d", *p.Properties.MessageExpiry)
	}
	if got, code := pointRead(t, pub, "state/reading", "r"); code != 0 || string(got.Payload) != "21.5" {
		t.Fatalf("point read after the publisher's expiry: %q code 0x%02x", got.Payload, code)
	}
}

// A latest channel survives a graceful restart on sqlite and on memory
// (its snapshot): values, tombstones and the offset counter (invariant 9).
func TestLatestSurvivesRestart(t *testing.T) {
	for _, tc := range []struct{ name, provider string }{{"sqlite", sqliteProvider}, {"memory", memoryProvider}} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := latestRig(t, tc.provider)
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			set(t, pub, "state/a", "1")
			set(t, pub, "state/b", "1")
			set(t, pub, "state/b", "")
			b.Restart()

			c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true})
			subscribeOpts(t, c, paho.UserProperties{{Key: "saguin-deletions", Value: "1"}},
				paho.SubscribeOptions{Topic: "state/#", QoS: 1})
			got := expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": ""})
			if offsetOf(t, got["state/a"]) != 1 || offsetOf(t, got["state/b"]) != 3 {
				t.Fatalf("offsets after restart: a %d, b %d; want 1, 3", offsetOf(t, got["state/a"]), offsetOf(t, got["state/b"]))
			}
			pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			set(t, pub, "state/c", "1")
			if p := expect(t, c, "state/c", "1", false); offsetOf(t, p) != 4 {
				t.Fatalf("first offset after restart %d, want 4", offsetOf(t, p))
			}
		})
	}
}

// A durable session restored at a start has lost its mark (memory only):
// it resumes, without a new SUBSCRIBE, to the full current state with
// RETAIN, then changes. On sqlite and memory.
func TestLatestRestoredSessionGetsFullStateAtResume(t *testing.T) {
	for _, tc := range []struct{ name, provider string }{{"sqlite", sqliteProvider}, {"memory", memoryProvider}} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := latestRig(t, tc.provider)
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			set(t, pub, "state/a", "1")
			set(t, pub, "state/b", "1")
			opts := brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600}
			c := brokertest.Connect(t, b.Address(), "dev", opts)
			c.Subscribe("state/#", 1)
			expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": "1"})
			time.Sleep(50 * time.Millisecond)
			c.Close()
			b.Restart()

			opts.CleanStart = false
			c = brokertest.Connect(t, b.Address(), "dev", opts)
			if !c.Connack.SessionPresent {
				t.Fatal("the durable session did not survive the restart")
			}
			expectSet(t, c, true, map[string]string{"state/a": "1", "state/b": "1"})
			pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			set(t, pub, "state/b", "2")
			expect(t, c, "state/b", "2", false)
			c.Quiet(200 * time.Millisecond)
		})
	}
}

// Stock mosquitto_sub, MQTT 5 and 3.1.1, is served a latest channel's state
// with the retained flag set (and, on 5, the saguin-* labels), then a
// change with it clear.
func TestMosquittoSubReceivesLatestState(t *testing.T) {
	if _, err := exec.LookPath("mosquitto_sub"); err != nil {
		t.Fatal("mosquitto_sub is not installed (Debian package mosquitto-clients; .ci/run installs it)")
	}
	b, _ := latestRig(t, sqliteProvider)
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	set(t, pub, "state/door", "open")
	set(t, pub, "state/lamp", "on")
	host, port, _ := strings.Cut(b.Address(), ":")
	for _, v := range []string{"5", "311"} {
		format := "%r %t %p"
		if v == "5" {
			format += " %P"
		}
		cmd := exec.Command("mosquitto_sub", "-h", host, "-p", port, "-V", v, "-q", "1", "-i", "mosq"+v,
			"-t", "state/#", "-C", "3", "-W", "20", "-F", format)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		var got []string
		for len(got) < 2 && lines.Scan() {
			got = append(got, lines.Text())
		}
		change := "closed-" + v
		set(t, pub, "state/door", change)
		for lines.Scan() {
			got = append(got, lines.Text())
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("mosquitto_sub -V %s: %v (printed %q)", v, err, got)
		}
		if len(got) != 3 {
			t.Fatalf("mosquitto_sub -V %s printed %q", v, got)
		}
		// The state comes in either order; the change comes after it.
		if strings.HasPrefix(got[0], "1 state/lamp") {
			got[0], got[1] = got[1], got[0]
		}
		want := []string{"1 state/door open ", "1 state/lamp on ", "0 state/door " + change + " "}
		for i, w := range want {
			line := got[i] + " "
			if !strings.HasPrefix(line, w) {
				t.Fatalf("mosquitto_sub -V %s line %d: %q, want it to begin %q", v, i, got[i], w)
			}
			if v == "5" && !strings.Contains(line, "saguin-offset:") {
				t.Fatalf("mosquitto_sub -V 5 line %d lacks saguin-offset: %q", i, got[i])
			}
			if v == "311" && strings.Contains(line, "saguin-") {
				t.Fatalf("a 3.1.1 subscriber was sent properties: %q", got[i])
			}
		}
		// Next round's door value is this round's change.
		set(t, pub, "state/door", "open")
	}
}
