package logging

import (
	"context"
	"errors"
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Substrate is the logger to give mochi-mqtt (its Options.Logger): the
// broker's stream, every line marked component=substrate, with the
// substrate's records mapped so that info carries only the broker's own
// statements and a client's mistake is never more than one bounded line:
//
//   - every info record (added hook, attached listener, mochi mqtt
//     starting, stopping hook, …) is the substrate's machinery: debug;
//   - a record with no message (its listeners log every connection's end
//     that way, even a client's ordinary close) is a debug "connection
//     ended";
//   - "publish packet error", "publish packet rejected" and "packet
//     rejected" follow a refusal by the broker's own hook, which logged
//     it already, rate-limited: they are dropped (the first was an ERROR
//     carrying the whole packet);
//   - "error processing packet" (a packet the substrate refused, ending
//     the connection) is a refusal: one bounded warn line through refusals,
//     rate-limited per client;
//   - the keep-alive advice it gives every client asking for 5 s or less
//     is debug: nothing was refused.
//
// Values are bounded as everywhere (Bounded): a packet or Will becomes its
// summary, a byte slice its length.
func Substrate(l *slog.Logger, refusals *RefusalLog) *slog.Logger {
	h := Bounded(l.Handler()).WithAttrs([]slog.Attr{slog.String("component", "substrate")})
	return slog.New(&substrateHandler{inner: h, refusals: refusals})
}

// KindPacket is the refusal kind of a packet the substrate refused.
const KindPacket = "packet"

type substrateHandler struct {
	inner    slog.Handler
	refusals *RefusalLog
}

// Enabled: records are only ever demoted, so what the inner handler
// refuses at a level no mapping can raise; Handle checks again after
// mapping.
func (h *substrateHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *substrateHandler) Handle(ctx context.Context, r slog.Record) error {
	level, msg := r.Level, r.Message
	switch msg {
	case "publish packet error", "publish packet rejected", "packet rejected":
		return nil
	case "":
		level, msg = slog.LevelDebug, "connection ended"
	case mqtt.ErrMinimumKeepalive.Error():
		level = slog.LevelDebug
	case "error processing packet":
		if code, ok := recordCode(r); ok && code < packets.ErrUnspecifiedError.Code {
			// Not a refusal: a DISCONNECT 0x04 (with Will Message) ends
			// the connection through this path too.
			level, msg = slog.LevelDebug, "connection ended"
			break
		}
		if h.refusals != nil {
			h.refused(r)
			return nil
		}
		msg = "packet refused: connection closed"
	}
	if level == slog.LevelInfo {
		level = slog.LevelDebug
	}
	if !h.inner.Enabled(ctx, level) {
		return nil
	}
	out := slog.NewRecord(r.Time, level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.inner.Handle(ctx, out)
}

// refused logs the substrate's "error processing packet" as the refusal it
// is: warn, the client named, the error and a summary of the packet.
func (h *substrateHandler) refused(r slog.Record) {
	f := Refusal{Level: slog.LevelWarn, Kind: KindPacket, Msg: "packet refused: connection closed", Ends: true}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "client":
			f.Client = a.Value.String()
			f.ClientID = f.Client
		case "error":
			f.Code, _ = attrCode(a)
			f.Args = append(f.Args, a)
		case "pk", "packet":
			f.Args = append(f.Args, slog.Attr{Key: "packet", Value: a.Value})
		default:
			f.Args = append(f.Args, a)
		}
		return true
	})
	h.refusals.Refused(f)
}

func (h *substrateHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &substrateHandler{inner: h.inner.WithAttrs(as), refusals: h.refusals}
}

func (h *substrateHandler) WithGroup(name string) slog.Handler {
	return &substrateHandler{inner: h.inner.WithGroup(name), refusals: h.refusals}
}

// recordCode is the reason code of the record's error attribute, when it
// is a packets.Code.
func recordCode(r slog.Record) (code byte, ok bool) {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			code, ok = attrCode(a)
			return false
		}
		return true
	})
	return code, ok
}

func attrCode(a slog.Attr) (byte, bool) {
	var code packets.Code
	if err, ok := a.Value.Any().(error); ok && errors.As(err, &code) {
		return code.Code, true
	}
	return 0, false
}
