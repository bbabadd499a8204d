// Package logging is the broker's one log stream (docs/operations.md "Logs"):
// log/slog's text handler, key=value lines, with every value bounded so
// that nothing a client sends can make a line long — a topic, a client
// identifier, a payload or a whole packet handed to the logger by mistake.
// The substrate (mochi-mqtt) logs through an adapter (substrate.go) that
// demotes its internals to debug; repeated refusals from one client are
// rate-limited and counted by RefusalLog (refusals.go).
package logging

import (
	"context"
	"encoding"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Bounds, in bytes as the line shows them (a byte the text handler escapes
// counts as its escape). A value longer than its bound is cut there and
// ends with "…(cut from N bytes)".
const (
	// ClientValueMax bounds the attributes that carry what a client sent
	// (clientKeys): a client identifier, a topic, a filter, a reason that
	// quotes them.
	ClientValueMax = 200
	// ValueMax bounds every other attribute.
	ValueMax = 1024
	// MessageMax bounds a message.
	MessageMax = 256
)

// clientKeys are the attribute keys whose values a client chooses, whole
// or in part. A new call site logging client input uses one of them.
var clientKeys = map[string]bool{
	"client": true, "holder": true, "topic": true, "filter": true, "filters": true, "group": true,
	"property": true, "key": true, "response_topic": true, "payload": true, "username": true,
	"remote": true, "old_remote": true, "new_remote": true, "reason": true, "detail": true,
	"will_topic": true,
}

// New is the broker's logger: slog text to w (stdout in production), at
// the level level holds (a *slog.LevelVar, so SIGUSR1 can change it), every
// value bounded.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(Bounded(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})))
}

// LevelOf is the level a broker.log_level value names (debug, info, warn,
// error; the configuration loader refuses any other, and anything else is
// info here).
func LevelOf(name string) slog.Level {
	switch name {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Bounded wraps h so that every attribute and message reaching it is
// bounded. Wrapping a handler that is already bounded returns it.
func Bounded(h slog.Handler) slog.Handler {
	if _, ok := h.(*boundedHandler); ok {
		return h
	}
	return &boundedHandler{inner: h}
}

type boundedHandler struct{ inner slog.Handler }

func (h *boundedHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *boundedHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Cut(r.Message, MessageMax), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(boundAttr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h *boundedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	bs := make([]slog.Attr, len(as))
	for i, a := range as {
		bs[i] = boundAttr(a)
	}
	return &boundedHandler{inner: h.inner.WithAttrs(bs)}
}

func (h *boundedHandler) WithGroup(name string) slog.Handler {
	return &boundedHandler{inner: h.inner.WithGroup(name)}
}

// boundAttr is a with its value bounded: strings cut, groups walked,
// packets and byte slices summarized, anything else rendered and cut.
func boundAttr(a slog.Attr) slog.Attr {
	max := ValueMax
	if clientKeys[a.Key] {
		max = ClientValueMax
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Cut(v.String(), max))
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, x := range g {
			out[i] = boundAttr(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		return slog.Attr{Key: a.Key, Value: boundAny(v.Any(), max)}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// boundAny renders a value of any type within max. A packet or a Will
// becomes a summary (its type, topic, sizes) and a byte slice its length:
// their contents are the client's and can be megabytes (the substrate once
// logged a refused 1 MB payload as a decimal byte list, four bytes of log
// per byte sent). A struct of any other type is named, never dumped.
func boundAny(x any, max int) slog.Value {
	switch v := x.(type) {
	case nil:
		return slog.StringValue("<nil>")
	case error:
		return slog.StringValue(Cut(v.Error(), max))
	case packets.Packet:
		return PacketSummary(&v)
	case *packets.Packet:
		if v == nil {
			return slog.StringValue("<nil>")
		}
		return PacketSummary(v)
	case mqtt.Will:
		return willSummary(&v)
	case *mqtt.Will:
		if v == nil {
			return slog.StringValue("<nil>")
		}
		return willSummary(v)
	case []byte:
		return slog.StringValue(fmt.Sprintf("<%d bytes>", len(v)))
	case fmt.Stringer:
		return slog.StringValue(Cut(v.String(), max))
	case encoding.TextMarshaler:
		b, err := v.MarshalText()
		if err != nil {
			return slog.StringValue("<" + reflect.TypeOf(x).String() + ": " + Cut(err.Error(), max) + ">")
		}
		return slog.StringValue(Cut(string(b), max))
	}
	t := reflect.TypeOf(x)
	k := t.Kind()
	if k == reflect.Pointer {
		k = t.Elem().Kind()
	}
	if k == reflect.Struct {
		return slog.StringValue("<" + t.String() + ">")
	}
	return slog.StringValue(Cut(fmt.Sprintf("%+v", x), max))
}

// PacketSummary is what a log line says about a packet: its type, packet
// identifier, QoS, topic (bounded) and sizes — never its payload or
// properties.
func PacketSummary(pk *packets.Packet) slog.Value {
	as := []slog.Attr{slog.String("type", packetName(pk.FixedHeader.Type))}
	if pk.PacketID != 0 {
		as = append(as, slog.Int("id", int(pk.PacketID)))
	}
	if pk.FixedHeader.Type == packets.Publish {
		as = append(as, slog.Int("qos", int(pk.FixedHeader.Qos)),
			slog.String("topic", Cut(pk.TopicName, ClientValueMax)),
			slog.Int("payload_bytes", len(pk.Payload)))
	}
	if n := len(pk.Filters); n > 0 {
		as = append(as, slog.Int("filters", n), slog.String("filter", Cut(pk.Filters[0].Filter, ClientValueMax)))
	}
	as = append(as, slog.Int("remaining", pk.FixedHeader.Remaining))
	return slog.GroupValue(as...)
}

func willSummary(w *mqtt.Will) slog.Value {
	return slog.GroupValue(slog.String("topic", Cut(w.TopicName, ClientValueMax)),
		slog.Int("qos", int(w.Qos)), slog.Bool("retain", w.Retain), slog.Int("payload_bytes", len(w.Payload)))
}

func packetName(t byte) string {
	if n, ok := packets.PacketNames[t]; ok {
		return strings.ToUpper(n)
	}
	return "type " + strconv.Itoa(int(t))
}

// Cut bounds s to max bytes as the text handler shows them (an escaped
// byte or rune counts as its escape), cutting on a rune boundary and
// marking the cut with the full length. A string within max is returned
// as it is.
func Cut(s string, max int) string {
	width := 0
	for i, r := range s {
		w := shownWidth(s[i:], r)
		if width+w > max {
			return s[:i] + "…(cut from " + strconv.Itoa(len(s)) + " bytes)"
		}
		width += w
	}
	return s
}

// shownWidth is how many bytes the text handler writes for the rune r at
// the start of s, once the value is quoted (strconv.Quote's escapes).
func shownWidth(s string, r rune) int {
	switch {
	case r == utf8.RuneError:
		if _, size := utf8.DecodeRuneInString(s); size == 1 {
			return 4 // \xNN
		}
		return 3
	case r == '"' || r == '\\' || r == '\a' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t' || r == '\v':
		return 2
	case r < utf8.RuneSelf && unicode.IsPrint(r):
		return 1
	case r < utf8.RuneSelf:
		return 4 // \xNN
	case unicode.IsPrint(r):
		return utf8.RuneLen(r)
	case r < 0x10000:
		return 6 // \uNNNN
	}
	return 10 // \UNNNNNNNN
}
