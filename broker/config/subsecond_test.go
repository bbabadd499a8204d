package config

import (
	"strings"
	"testing"
)

// docs/configuration.md "How values are written": every duration key is held in whole seconds but the few
// that honour milliseconds. A fractional value ("1.5s") is refused with a
// spelling to write instead, and that spelling is one the key takes: whole
// seconds, rounded, on a whole-second key (never "1500ms", which the same
// key would then refuse); milliseconds on a sub-second key.

// durationKey is one duration key and what makes a configuration using it
// loadable (a block it needs, a key it is judged against).
type durationKey struct {
	path    string
	context []patch
	// written is the fractional value the test writes, and want the
	// spelling the refusal must suggest (accepted when written).
	written, want string
}

// wholeSecondKeys is every duration key the loader reads in whole
// seconds.
var wholeSecondKeys = []durationKey{
	{path: "broker.storage.default_retention_period", written: "1.5s", want: "2s"},
	{path: "broker.retained.retention_period", written: "1.5s", want: "2s"},
	{path: "broker.qos2.expires_after", written: "1.5s", want: "2s"},
	{path: "broker.share.expires_after", written: "1.4s", want: "1s"},
	{path: "broker.limits.max_session_expiry", written: "2.5s", want: "3s"},
	{path: "broker.limits.max_keepalive", written: "1.5s", want: "2s"},
	{path: "broker.limits.connect_timeout", written: "1.5s", want: "2s"},
	{path: "broker.limits.connect_timeout", written: "0.4s", want: "1s"}, // never rounded to 0
	{path: "broker.operations.min_scrape_interval", written: "60.5s", want: "61s",
		context: []patch{p("broker.operations.listen.tcp", m("address", "127.0.0.1:9090"))}},
	{path: "channels.orders.retention_period", written: "1.5s", want: "2s"},
	{path: "channels.state.retention_period", written: "1.5s", want: "2s"},
	{path: "channels.state.deletion_retention_period", written: "1.5s", want: "2s"},
	{path: "channels.jobs.visibility_timeout", written: "1.5s", want: "2s"},
	{path: "channels.jobs.job_expires_after", written: "40.5s", want: "41s"}, // longer than the 30s lease
	{path: "channels.jobs.retry.backoff_base", written: "1.5s", want: "2s",
		context: []patch{p("channels.jobs.retry.backoff", "linear")}},
	{path: "channels.jobs.dlq_retention_period", written: "1.5s", want: "2s"},
}

// subSecondKeys is every duration key the loader honours milliseconds on
// (the fifth, a bridge's ack_interval, is in no configuration this build
// loads: bridges are refused whole).
var subSecondKeys = []durationKey{
	{path: "broker.session.ack_commit_interval", written: "0.5s", want: "500ms"},
	{path: "broker.limits.write_timeout", written: "1.5s", want: "1500ms"},
	{path: "broker.storage.providers.main.flush_interval", written: "0.25s", want: "250ms"},
	{path: "broker.storage.providers.main.publish_commit_interval", written: "0.005s", want: "5ms",
		context: []patch{p("broker.storage.providers.main.publish_commit_max_records", 100)}},
}

func TestFractionalDurationHintIsOneTheKeyTakes(t *testing.T) {
	check := func(t *testing.T, k durationKey, wantText string) {
		t.Helper()
		dir := t.TempDir()
		with := func(value string) []patch {
			return append(append([]patch(nil), k.context...), p(k.path, value))
		}
		expectOne(t, findings(t, build(t, dir, with(k.written)...)), k.path, wantText)
		// The suggestion is a value the key takes.
		mustLoad(t, build(t, dir, with(k.want)...))
	}
	for _, k := range wholeSecondKeys {
		t.Run(k.path+"="+k.written, func(t *testing.T) {
			check(t, k, "held in whole seconds; write "+k.want)
			list := findings(t, build(t, t.TempDir(), append(append([]patch(nil), k.context...), p(k.path, k.written))...))
			if s := list[0].String(); strings.Contains(s, "ms") {
				t.Errorf("a whole-second key is told to write milliseconds: %s", s)
			}
		})
	}
	for _, k := range subSecondKeys {
		t.Run(k.path+"="+k.written, func(t *testing.T) {
			check(t, k, "whole numbers only; write "+k.want)
		})
	}
	// A fraction that is whole seconds in a smaller unit is spelled so on
	// either kind of key.
	t.Run("whole seconds in a smaller unit", func(t *testing.T) {
		dir := t.TempDir()
		expectOne(t, findings(t, build(t, dir, p("broker.limits.connect_timeout", "1.5m"))),
			"broker.limits.connect_timeout", "whole numbers only; write 90s")
		expectOne(t, findings(t, build(t, dir, p("broker.limits.connect_timeout", "0.1m"))),
			"broker.limits.connect_timeout", "whole numbers only; write 6s")
	})
	// Milliseconds are the smallest unit: a fraction of one is rounded.
	t.Run("fraction of a millisecond", func(t *testing.T) {
		expectOne(t, findings(t, build(t, t.TempDir(), p("broker.session.ack_commit_interval", "12.5ms"))),
			"broker.session.ack_commit_interval", "milliseconds are the smallest unit; write 13ms")
	})
}
