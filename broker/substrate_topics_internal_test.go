package broker

import (
	"strings"
	"testing"
	"unicode/utf8"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// FuzzSubstrateMark: for any topic a client can send (valid UTF-8, no NUL,
// no wildcard), the topic the substrate sees passes its own check, so it
// reaches OnPublish instead of being dropped unanswered, and unmarking
// gives back exactly what the client sent. A topic the substrate already
// passes is handed on untouched.
func FuzzSubstrateMark(f *testing.F) {
	for _, s := range []string{"$SYS", "$SYS/x", "$sys/x", "$SYSTEM", "$Sys", "$SY", "$share", "$share/", "$share/x",
		"$Share/x", "$SHARE/g/x", "$share/g/x", "$saguin/kv/get", "plain/x", "a", "/", "ü/$SYS", "$", "$$SYS"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		if topic == "" || !utf8.ValidString(topic) || strings.ContainsRune(topic, 0) || strings.ContainsAny(topic, "+#") {
			return // not a topic the substrate's decoder and validation let through
		}
		out := markForSubstrate(packets.Packet{TopicName: topic}).TopicName
		if !mqtt.IsValidFilter(out, true) {
			t.Fatalf("%q handed on as %q, which the substrate drops", topic, out)
		}
		if unmarked(out) != topic {
			t.Fatalf("%q handed on as %q, unmarked %q", topic, out, unmarked(out))
		}
		if mqtt.IsValidFilter(topic, true) && out != topic {
			t.Fatalf("%q passes the substrate but was marked", topic)
		}
	})
}
