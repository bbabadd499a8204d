package broker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

const retentionConfig = `
broker:
  id: test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: 1h
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  events:
    type: append
    filter: "events/#"
`

// seekReply sends a seek and returns the reply payload and its user
// properties, plus the PUBACK reason code.
func seekReply(t *testing.T, c *brokertest.Client, channel, payload string) (string, paho.UserProperties, byte) {
	t.Helper()
	resp, err := c.Publish(&paho.Publish{Topic: "$saguin/consumer/" + channel + "/seek", QoS: 1, Payload: []byte(payload),
		Properties: &paho.PublishProperties{ResponseTopic: "my/reply", CorrelationData: []byte("corr-1")}})
	if err != nil && resp == nil {
		t.Fatalf("seek publish: %v", err)
	}
	for {
		p := c.Next(wait)
		if p.Topic != "my/reply" {
			continue // a record of the channel
		}
		if string(p.Properties.CorrelationData) != "corr-1" {
			t.Fatalf("seek reply correlation data %q", p.Properties.CorrelationData)
		}
		return string(p.Payload), p.Properties.User, resp.ReasonCode
	}
}

// Invariant 9: offsets are never reused, including on a channel retention
// has emptied, across a restart. Invariant 1: the floor is stored, so the
// emptied channel's floor is where the deletions left it, not 1.
func TestInvariant09_OffsetsContinueAfterRetentionEmptiesAndRestart(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	cfg := brokertest.Config(t, t.TempDir(), retentionConfig)
	b := brokertest.Start(t, cfg, brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := 1; i <= 10; i++ {
		if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil || r.ReasonCode != 0 {
			t.Fatalf("publish %d: %v %v", i, err, r)
		}
	}
	pub.Close()

	// Two hours later every record is past its 1h retention; the sweep that
	// runs at start-up removes them all.
	clk.Advance(2 * time.Hour)
	b.Restart()

	c := brokertest.Connect(t, b.Address(), "c", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	if got, _, code := seekReply(t, c, "events", "0"); got != "11" || code != 0 {
		t.Fatalf("seek 0 on the emptied channel: reply %q code 0x%02x, want floor 11", got, code)
	}
	c.Close()
	b.Restart()

	c = brokertest.Connect(t, b.Address(), "c2", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	c.Subscribe("events/#", 1)
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("after")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("publish after emptying: %v %v", err, r)
	}
	p := c.Next(wait)
	if off := p.Properties.User.Get("saguin-offset"); off != "11" {
		t.Fatalf("first record after retention emptied the channel has offset %s, want 11 (offsets never reused)", off)
	}
}

// Invariant 1: a durable consumer whose stored position retention has
// passed is never served the oldest survivor as if nothing happened: it
// restarts where a reader with no position starts, and the operator is told
// how many records it lost.
func TestInvariant01_StoredPositionBelowFloorIsNeverServedAsIfNothingHappened(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	cfg := brokertest.Config(t, t.TempDir(), retentionConfig)
	b := brokertest.Start(t, cfg, brokertest.WithClock(clk))

	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	c := brokertest.Connect(t, b.Address(), "slow", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 86400, ManualAck: true})
	c.Subscribe("events/#", 1)
	if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("old-1")}); err != nil || r.ReasonCode != 0 {
		t.Fatal(err, r)
	}
	p := c.Next(wait)
	if err := c.Ack(p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	c.Close() // position 2 stored at the clean DISCONNECT

	for i := 2; i <= 5; i++ {
		if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte(fmt.Sprintf("old-%d", i))}); err != nil || r.ReasonCode != 0 {
			t.Fatal(err, r)
		}
	}
	clk.Advance(2 * time.Hour) // all five are past retention
	b.Restart()                // the start-up sweep removes them: floor 6
	pub = brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte("new-6")}); err != nil || r.ReasonCode != 0 {
		t.Fatal(err, r)
	}

	c = brokertest.Connect(t, b.Address(), "slow", brokertest.ClientOptions{CleanStart: false, SessionExpiry: 86400})
	if c.Connack.SessionPresent {
		t.Fatal("resumed below the floor with Session Present 1: the consumer is not told it lost records")
	}
	c.Subscribe("events/#", 1)
	p = c.Next(wait)
	if string(p.Payload) != "new-6" || p.Properties.User.Get("saguin-offset") != "6" {
		t.Fatalf("consumer below the floor was served %q at offset %s, want new-6 at 6",
			p.Payload, p.Properties.User.Get("saguin-offset"))
	}
	if !b.Log.Contains("stored position below the retention floor") {
		t.Fatalf("the operator was not told the consumer lost records; log:\n%s", b.Log)
	}
}

// Seek: every payload form and refusal of docs/channels.md "`append`".
func TestSeekPayloadFormsAndRefusals(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	cfg := brokertest.Config(t, t.TempDir(), strings.Replace(retentionConfig, "1h", "none", 1))
	b := brokertest.Start(t, cfg, brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := 1; i <= 6; i++ {
		if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: []byte(fmt.Sprint(i))}); err != nil || r.ReasonCode != 0 {
			t.Fatal(err, r)
		}
		clk.Advance(time.Hour) // record i stored at 12:00 + (i-1)h
	}
	// now = 18:00
	c := brokertest.Connect(t, b.Address(), "seeker", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 600})
	cases := []struct {
		payload, reply string
		code           byte
		prop, propVal  string
	}{
		{"0", "1", 0, "", ""},
		{"-1", "7", 0, "", ""},
		{"4", "4", 0, "", ""},
		{"7", "7", 0, "", ""},
		{"8", "beyond-end", 0x83, "saguin-next", "7"},
		{"3h", "4", 0, "", ""},   // 15:00: record 4
		{"-90m", "5", 0, "", ""}, // 16:30: earliest at or after is record 6? no: record 5 at 16:00 < 16:30
		{"2026-11-01T13:30:00Z", "3", 0, "", ""},
		{"2026-11-01", "malformed", 0x83, "", ""},
		{"-2", "malformed", 0x83, "", ""},
		{"abc", "malformed", 0x83, "", ""},
		{"2026-11-02T00:00:00Z", "7", 0, "", ""}, // the future: from the head
	}
	// -90m from 18:00 is 16:30; records are at 12,13,14,15,16,17: the
	// earliest at or after 16:30 is record 6 (17:00).
	cases[6].reply = "6"
	for _, tc := range cases {
		got, props, code := seekReply(t, c, "events", tc.payload)
		if got != tc.reply || code != tc.code {
			t.Errorf("seek %q: reply %q code 0x%02x, want %q 0x%02x", tc.payload, got, code, tc.reply, tc.code)
		}
		if tc.prop != "" && props.Get(tc.prop) != tc.propVal {
			t.Errorf("seek %q: %s = %q, want %q", tc.payload, tc.prop, props.Get(tc.prop), tc.propVal)
		}
	}

	// A non-durable session may not seek.
	nd := brokertest.Connect(t, b.Address(), "nd", brokertest.ClientOptions{CleanStart: true})
	if got, _, code := seekReply(t, nd, "events", "0"); got != "no-session" || code != 0x83 {
		t.Fatalf("seek without a durable session: %q 0x%02x", got, code)
	}
	// Seek on an unknown channel is refused on the PUBACK with 0x90.
	r, _ := c.Publish(&paho.Publish{Topic: "$saguin/consumer/nope/seek", QoS: 1, Payload: []byte("0")})
	if r == nil || r.ReasonCode != 0x90 {
		t.Fatalf("seek on an unknown channel: %v", r)
	}

	// The session's stored position is where the last seek put it (the
	// head); seek 0 rewinds it, then a seek moves a reading consumer.
	if got, _, _ := seekReply(t, c, "events", "0"); got != "1" {
		t.Fatalf("seek 0: %q", got)
	}
	c.Subscribe("events/#", 1)
	for i := 1; i <= 6; i++ {
		c.Next(wait)
	}
	if got, _, _ := seekReply(t, c, "events", "5"); got != "5" {
		t.Fatalf("seek 5: %q", got)
	}
	for want := 5; want <= 6; want++ {
		p := c.Next(wait)
		if p.Properties.User.Get("saguin-offset") != fmt.Sprint(want) {
			t.Fatalf("after seek 5, got offset %s want %d", p.Properties.User.Get("saguin-offset"), want)
		}
	}
}

// Invariant 14: a snapshot that fails its integrity check is a start-up
// error naming the file — never an empty start, which would be
// indistinguishable from a fresh install and destroy the evidence.
func TestInvariant14_CorruptSnapshotRefusesStartNamingTheFile(t *testing.T) {
	cfgPath := configWith(t, memoryProvider)
	proc := brokertest.StartProcess(t, cfgPath)
	pub := brokertest.Connect(t, proc.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishN(t, pub, "events/x", 1, 10)
	pub.Close()
	proc.Term()

	dir := filepath.Join(filepath.Dir(cfgPath), "snapshots")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var snap string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".snapshot") && strings.Contains(e.Name(), "events") {
			snap = filepath.Join(dir, e.Name())
		}
	}
	if snap == "" {
		t.Fatalf("no snapshot of channel events in %s: %v", dir, entries)
	}
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(snap, data, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := brokertest.Run(t, "--config", cfgPath)
	if code == 0 {
		t.Fatalf("broker started on a corrupt snapshot:\n%s", out)
	}
	if !strings.Contains(out, filepath.Base(snap)) {
		t.Fatalf("start-up error does not name the snapshot file %s:\n%s", snap, out)
	}
}

// --check-config reports every finding at once, each naming its key.
func TestCheckConfigReportsAllThreeMistakes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	bad := `
broker:
  id: test
  log_level: verbose
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
    colour: blue
  Bad/Name:
    type: append
`
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := brokertest.Run(t, "--check-config", path)
	if code == 0 {
		t.Fatalf("--check-config accepted a bad file:\n%s", out)
	}
	for _, want := range []string{"broker.log_level", "colour", "Bad/Name"} {
		if !strings.Contains(out, want) {
			t.Errorf("--check-config output does not name %q:\n%s", want, out)
		}
	}
}

// Invariant 2: resolution, retention and eviction are distinct — a
// publisher's Message Expiry never removes an append record. An hour after
// a 5-second expiry ran out (retention sweeps included) the record is still
// replayed, carrying saguin-expires for the reader to judge, with no expiry
// of its own left for the client library to drop it by.
func TestInvariant02_MessageExpiryNeverRemovesAnAppendRecord(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	exp := uint32(5)
	if resp, err := pub.Publish(&paho.Publish{Topic: "events/x", QoS: 1, Payload: []byte("stale"),
		Properties: &paho.PublishProperties{MessageExpiry: &exp}}); err != nil || resp.ReasonCode != 0 {
		t.Fatal(err, resp)
	}
	for i := 0; i < 60; i++ {
		clk.Advance(time.Minute) // every sweep ticker fires meanwhile
	}
	c := brokertest.Connect(t, b.Address(), "reader", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("events/#", 1)
	p := c.Next(wait)
	if string(p.Payload) != "stale" || p.Properties.User.Get("saguin-expires") == "" {
		t.Fatalf("expired record: %q saguin-expires=%q", p.Payload, p.Properties.User.Get("saguin-expires"))
	}
	if p.Properties.MessageExpiry != nil && *p.Properties.MessageExpiry != 0 {
		t.Fatalf("a run-out expiry delivered as %d", *p.Properties.MessageExpiry)
	}
}
