package broker

import (
	"strings"
	"testing"
	"unicode/utf8"

	"saguin.dev/broker/config"
)

// FuzzPointReadKey: a point read's key is a payload of any bytes (docs/channels.md "`latest`"). A key accepted is one topic within the limits, valid UTF-8 without
// NUL, no wildcard, outside the $ space; a refusal always carries a reason
// code the spec names for it (0x83 or 0x90) and a reason to read.
func FuzzPointReadKey(f *testing.F) {
	for _, s := range []string{"schemas/orders/v1", "", "a", "/", "//", "$saguin/kv/get", "$SYS/x", "a/+/b", "a/#",
		"#", "+", "a\x00b", "\xff\xfe", "ü/ß", strings.Repeat("a/", 40), strings.Repeat("x", 300), " ", "a//b"} {
		f.Add([]byte(s))
	}
	lim := config.Limits{MaxTopicLength: 256, MaxTopicLevels: 32}
	f.Fuzz(func(t *testing.T, p []byte) {
		key := string(p)
		code, refused := pointReadKeyRefusal(key, lim)
		if refused {
			if code.Code != 0x83 && code.Code != 0x90 {
				t.Fatalf("%q refused with %#x", key, code.Code)
			}
			if code.Reason == "" {
				t.Fatalf("%q refused without a reason", key)
			}
			return
		}
		switch {
		case key == "", len(key) > lim.MaxTopicLength, strings.Count(key, "/")+1 > lim.MaxTopicLevels:
			t.Fatalf("%q accepted past a bound", key)
		case !utf8.ValidString(key), strings.ContainsRune(key, 0), strings.ContainsAny(key, "+#"), key[0] == '$':
			t.Fatalf("%q accepted though it is not a topic a value can be held under", key)
		}
	})
}

// FuzzReservedRoute: a $saguin/ publish topic is client input. Whatever it
// routes to names its channel or queue as one whole, non-empty level, and
// spells the whole topic: no topic reaches a name it does not write out.
// A queue answer's verdict is exactly "ack" or "return".
func FuzzReservedRoute(f *testing.F) {
	for _, s := range []string{"$saguin/kv/get", "$saguin/consumer/events/seek", "$saguin/consumer//seek",
		"$saguin/consumer/a/b/seek", "$saguin/queue/jobs/response", "$saguin/queue/jobs/response/x",
		"$saguin/queue//response", "$saguin/queue/response", "$saguin/consumer/seek", "$saguin/", "$saguin/kv/get/"} {
		f.Add(s, []byte("ack"))
	}
	f.Add("$saguin/queue/jobs/response", []byte("ACK"))
	f.Add("$saguin/queue/jobs/response", []byte("return\n"))
	f.Fuzz(func(t *testing.T, tp string, payload []byte) {
		route, name := reservedRoute(tp)
		switch route {
		case routeNone:
			if name != "" {
				t.Fatalf("%q: no route but a name %q", tp, name)
			}
		case routePointRead:
			if tp != pointReadTopic || name != "" {
				t.Fatalf("%q routed to the point read (name %q)", tp, name)
			}
		case routeSeek, routeQueueAnswer:
			if name == "" || strings.Contains(name, "/") {
				t.Fatalf("%q routed with name %q", tp, name)
			}
			want := "$saguin/consumer/" + name + "/seek"
			if route == routeQueueAnswer {
				want = "$saguin/queue/" + name + "/response"
			}
			if tp != want {
				t.Fatalf("%q routed as %q", tp, want)
			}
		default:
			t.Fatalf("%q: route %d", tp, route)
		}
		if v := string(payload); isVerdict(v) != (v == "ack" || v == "return") {
			t.Fatalf("verdict %q judged %v", v, isVerdict(v))
		}
	})
}
