package broker_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/clock"
)

// migrateConfig is a broker whose channels are {{.Channels}}; the retained
// store and the channels live on {{.Provider}} unless a channel says
// otherwise. A small memory provider is there for the full-provider case.
const migrateConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 4KiB
    max_header_bytes: 1KiB
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
{{.Provider}}
      small:
        type: memory
        snapshot_dir: none
        max_bytes: 12KiB
  session:
    storage: main
channels:
  events:
    type: append
    filter: "events/#"
{{.Channels}}`

// The channels that come to claim the broadcast topics retained values
// were stored under.
const claimingChannels = `  readings:
    type: latest
    filter: "sensors/#"
  logs:
    type: append
    filter: "logs/#"
  work:
    type: queue
    filter: "work/#"
    visibility_timeout: 30s
`

func writeMigrateConfig(t *testing.T, dir, provider, channels string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(migrateConfig, "{{.Provider}}", provider, 1)
	return brokertest.Config(t, dir, strings.Replace(text, "{{.Channels}}", channels, 1))
}

// retainedReceived subscribes a new session to filter and returns what the
// retained pass (or a latest channel's current-state pass) sends it.
func retainedReceived(t *testing.T, addr, id, filter string) map[string]string {
	t.Helper()
	c := brokertest.Connect(t, addr, id, brokertest.ClientOptions{CleanStart: true})
	c.Subscribe(filter, 1)
	got := map[string]string{}
	for {
		select {
		case p := <-c.Msgs:
			got[p.Topic] = string(p.Payload)
		case <-time.After(500 * time.Millisecond):
			c.Close()
			return got
		}
	}
}

// docs/configuration.md "`broker.retained`": when a channel comes to claim a broadcast topic
// the retained store holds a value for, the start settles it — into a
// latest channel it is moved (served by the channel from now on), into an
// append or queue channel it is discarded; each counted in the log. It is
// never left hidden in the retained store, to come back when the channel
// goes. Both providers.
func TestRetainedValueOnATopicAChannelNowClaimsIsMovedOrDiscardedAtStart(t *testing.T) {
	for _, pc := range []struct{ name, provider string }{{"memory", memoryProvider}, {"sqlite", sqliteProvider}} {
		t.Run(pc.name, func(t *testing.T) {
			dir := t.TempDir()
			b := brokertest.Start(t, writeMigrateConfig(t, dir, pc.provider, ""))
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			for topic, payload := range map[string]string{"sensors/t1": "21.5", "sensors/t2": "19.0", "logs/a": "boot", "work/w1": "job", "status/s": "up"} {
				if code := retainPublish(t, pub, topic, []byte(payload), 0); code != 0 {
					t.Fatalf("retained publish %s: 0x%02x", topic, code)
				}
			}
			pub.Close()
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}

			// The channels claim the topics now.
			b = brokertest.Start(t, writeMigrateConfig(t, dir, pc.provider, claimingChannels))
			log := b.Log.String()
			for _, want := range [][]string{
				{`msg="retained values moved into a latest channel"`, "channel=readings", "provider=main", "values=2"},
				{`msg="retained values discarded: their topics belong to a channel that is not latest"`, "channel=logs", "type=append", "values=1"},
				{`msg="retained values discarded: their topics belong to a channel that is not latest"`, "channel=work", "type=queue", "values=1"},
			} {
				if !logHasLine(log, want...) {
					t.Errorf("the start does not log a line with %q:\n%s", want, lineContaining(log, "retained values"))
				}
			}
			if got := retainedReceived(t, b.Address(), "r1", "sensors/#"); got["sensors/t1"] != "21.5" || got["sensors/t2"] != "19.0" || len(got) != 2 {
				t.Errorf("the latest channel serves %v, want the two moved values", got)
			}
			if got := retainedReceived(t, b.Address(), "r2", "status/#"); got["status/s"] != "up" {
				t.Errorf("a retained value on a topic still broadcast is gone: %v", got)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}

			// The channels go again: nothing comes back from the retained
			// store — the values were moved or discarded, not hidden.
			b = brokertest.Start(t, writeMigrateConfig(t, dir, pc.provider, ""))
			for _, f := range []string{"sensors/#", "logs/#", "work/#"} {
				if got := retainedReceived(t, b.Address(), "r3", f); len(got) != 0 {
					t.Errorf("retained values under %s came back once no channel claimed them: %v", f, got)
				}
			}
			if got := retainedReceived(t, b.Address(), "r4", "status/#"); got["status/s"] != "up" {
				t.Errorf("the broadcast retained value is gone: %v", got)
			}
		})
	}
}

// A latest channel already holding a newer value for the topic keeps it:
// the older retained value is discarded, not moved over it.
func TestRetainedValueOlderThanTheLatestChannelsIsDiscarded(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	latest := "  readings:\n    type: latest\n    filter: \"sensors/#\"\n"
	// The channel holds sensors/t1 = "new", written at noon.
	b := brokertest.Start(t, writeMigrateConfig(t, dir, sqliteProvider, latest), brokertest.WithClock(clk))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "sensors/t1", []byte("new"), 0); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	pub.Close()
	_ = b.Close()
	// Without the channel, a retained value stamped an hour earlier (a
	// clock set back).
	earlier := clock.NewFake(clk.Now().Add(-time.Hour))
	b = brokertest.Start(t, writeMigrateConfig(t, dir, sqliteProvider, ""), brokertest.WithClock(earlier))
	pub = brokertest.Connect(t, b.Address(), "pub2", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "sensors/t1", []byte("old"), 0); code != 0 {
		t.Fatalf("publish: 0x%02x", code)
	}
	pub.Close()
	_ = b.Close()

	b = brokertest.Start(t, writeMigrateConfig(t, dir, sqliteProvider, latest), brokertest.WithClock(clk))
	if want := []string{`msg="retained values moved into a latest channel"`, "channel=readings", "values=0", "older_than_the_channels=1"}; !logHasLine(b.Log.String(), want...) {
		t.Errorf("the start does not log a line with %q:\n%s", want, lineContaining(b.Log.String(), "retained values"))
	}
	if got := retainedReceived(t, b.Address(), "r", "sensors/#"); got["sensors/t1"] != "new" {
		t.Errorf("the latest channel serves %v, want its own newer value", got)
	}
}

// docs/configuration.md "`broker.retained`": a move into a latest channel whose provider is
// full is a start-up error naming the channel, the provider and how many
// values could not move — nothing is dropped to make the start succeed.
func TestRetainedMoveIntoAFullProviderIsAStartupError(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, writeMigrateConfig(t, dir, sqliteProvider, ""))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	big := bytes.Repeat([]byte("x"), 3000)
	for _, topic := range []string{"sensors/a", "sensors/b", "sensors/c", "sensors/d"} {
		if code := retainPublish(t, pub, topic, big, 0); code != 0 {
			t.Fatalf("retained publish %s: 0x%02x", topic, code)
		}
	}
	pub.Close()
	_ = b.Close()

	cfgPath := writeMigrateConfig(t, dir, sqliteProvider, "  readings:\n    type: latest\n    filter: \"sensors/#\"\n    storage: small\n")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := broker.New(cfg, broker.Options{Build: "test", Logger: discardLogger()})
	if err == nil {
		_ = nb.Close()
		t.Fatal("the broker started though the retained values could not all move into the latest channel")
	}
	for _, want := range []string{"readings", "small", "full", "not moved"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the start-up error does not say %q: %v", want, err)
		}
	}
}

func lineContaining(log, s string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
