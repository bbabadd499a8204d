package broker

import (
	"context"
	"log/slog"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/logging"
)

// The kinds of refusal the broker counts and rate-limits in its log. Each
// client's refusals of one kind write a line at most every
// logging.RefusalInterval; the rest are counted and summarized.
const (
	refusePublish     = "publish"      // a PUBLISH refused (PUBACK/PUBREC code, QoS 0 drop, 3.1.1 close)
	refusePublishRate = "publish rate" // refused for limits.publish_rate/publish_bytes: at debug
	refuseSubscribe   = "subscribe"    // SUBSCRIBE filters refused
	refuseConnect     = "connect"      // a CONNECT refused
	// refusePublishInflight: a QoS 2 publish past
	// broker.qos2.max_inflight_per_client, answered 0x97 like a full
	// channel but counted apart (saguin_publish_refused_total{reason="inflight allowance exceeded"}).
	refusePublishInflight = "publish inflight"
	// ignoredQueueAnswer: an ack or return that changed nothing (invariant
	// 3: logged rather than answered) — not a refusal, but a worker
	// repeating one would otherwise write a line per answer.
	ignoredQueueAnswer = "queue answer ignored"
	// abandonedQoS2Hold: a held QoS 2 publish dropped unreleased (session
	// ended, expired, dropped at start: qos2.go) — not a refusal either,
	// but a client holding and never releasing would otherwise write a
	// line per exchange. Counted in saguin_qos2_abandoned_total, not in a
	// refusal family.
	abandonedQoS2Hold = "qos2 hold abandoned"
	refusePacket      = logging.KindPacket // a packet the substrate refused, ending the connection
)

// publishRateReason begins the reason of a publish-rate refusal, which
// docs/channels.md "What a publish is answered" logs at debug; inflightReason that of a QoS 2
// publish past the per-client allowance (qos2.go).
const (
	publishRateReason = "publish rate exceeded"
	inflightReason    = "inflight allowance exceeded"
)

// refused counts one refusal given to cl and logs it, rate-limited per
// client and kind (docs/operations.md "Logs": refusals at warn). A refused
// CONNECT ends its connection; any other refusal that does is given by
// refusedClosing.
func (b *Broker) refused(level slog.Level, cl *mqtt.Client, kind string, code byte, msg string, args ...any) {
	b.refusals.Refused(logging.Refusal{Level: level, Client: cl.ID, Kind: kind, Code: code, Msg: msg, Args: args,
		ClientID: cl.ID, User: userOf(cl), Ends: kind == refuseConnect})
}

// refusedClosing is refused for a refusal the broker answers by ending
// the connection (a DISCONNECT, or a 3.1.1 close): the client is then one
// the operations listener lists as refused (refused_record.go).
func (b *Broker) refusedClosing(level slog.Level, cl *mqtt.Client, kind string, code byte, msg string, args ...any) {
	b.refusals.Refused(logging.Refusal{Level: level, Client: cl.ID, Kind: kind, Code: code, Msg: msg, Args: args,
		ClientID: cl.ID, User: userOf(cl), Ends: true})
}

// logPublishRefusal is the one line a refused PUBLISH writes (rate-limited
// per client): warn, or debug for a publish-rate refusal. It replaces the
// substrate's own line, an ERROR carrying the whole packet, which the
// substrate adapter drops (logging.Substrate). The payload is never
// logged, only its size; the topic and reason are bounded like every
// client-supplied value.
func (b *Broker) logPublishRefusal(cl *mqtt.Client, pk packets.Packet, code packets.Code) {
	level, kind := slog.LevelWarn, refusePublish
	switch {
	case strings.HasPrefix(code.Reason, publishRateReason):
		level, kind = slog.LevelDebug, refusePublishRate
	case strings.HasPrefix(code.Reason, inflightReason):
		kind = refusePublishInflight
	}
	refused := b.refused
	if pk.FixedHeader.Qos > 0 && cl.Properties.ProtocolVersion < 5 {
		// docs/channels.md "What a publish is answered": a 3.1.1 client, which has no reason codes, is
		// closed rather than answered (publish.go refuse, inbound.answer).
		refused = b.refusedClosing
	}
	refused(level, cl, kind, code.Code, "publish refused", "topic", pk.TopicName,
		"qos", pk.FixedHeader.Qos, "payload_bytes", len(pk.Payload), "reason", code.Reason)
}

// filterRefusals gathers the filters one SUBSCRIBE had refused one by one
// (docs/security.md "Every refusal, and its code"): how many under each code (a handful of codes: a fixed
// array, invariant 13 whatever the packet holds) and the first of them.
type filterRefusals struct {
	n           int
	byCode      [256]uint32
	first       string
	firstCode   byte
	firstReason string
}

func (r *filterRefusals) add(filter string, code byte, reason string) {
	if r.n == 0 {
		r.first, r.firstCode, r.firstReason = filter, code, reason
	}
	r.n++
	r.byCode[code]++
}

// logFilterRefusals is the one line a SUBSCRIBE whose filters were refused
// writes (docs/operations.md "Logs": refusals at warn), however many it refused,
// rate-limited per client with the other subscribe refusals: it names the
// count, the first refused filter, its code and why. Every refused filter
// is counted under its own code (saguin_subscriptions_refused_total). The
// code is the one that decided (a 3.1.1 SUBACK answers them all 0x80).
func (b *Broker) logFilterRefusals(cl *mqtt.Client, r *filterRefusals, filters int) {
	if r.n == 0 {
		return
	}
	var others []logging.CodeCount
	for code, n := range r.byCode {
		if n > 0 && byte(code) != r.firstCode {
			others = append(others, logging.CodeCount{Code: byte(code), Count: uint64(n)})
		}
	}
	b.refusals.Refused(logging.Refusal{Level: slog.LevelWarn, Client: cl.ID, Kind: refuseSubscribe,
		Code: r.firstCode, Count: uint64(r.byCode[r.firstCode]), Others: others,
		Msg:  "SUBSCRIBE filters refused",
		Args: []any{"refused", r.n, "filters", filters, "filter", r.first, "reason", r.firstReason}})
}

// refusalLoop writes, every logging.RefusalInterval, how many refusals the
// rate limit held back.
func (b *Broker) refusalLoop(ctx context.Context) {
	t := b.clock.NewTicker(logging.RefusalInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			b.refusals.Flush(false)
		}
	}
}

// RefusalCount is how many refusals of one kind ("publish", "publish
// rate", "subscribe", "connect", "packet", "queue answer ignored", "qos2
// hold abandoned") and reason code the broker gave since it started: what
// the refusal metrics (saguin_publish_refused_total,
// saguin_subscriptions_refused_total, …) will read. Every refusal is
// counted, logged or not.
type RefusalCount = logging.RefusalCount

// RefusalCounts is every refusal count, sorted by kind and code.
func (b *Broker) RefusalCounts() []RefusalCount { return b.refusals.Counts() }
