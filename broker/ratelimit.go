package broker

import (
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// tokenBucket is a rate with a burst: tokens refill at rate per second up
// to burst. It holds no clock of its own; every call says what time it is,
// so tests drive it with made-up instants (no sleeping).
type tokenBucket struct {
	rate, burst float64
	tokens      float64
	at          time.Time // when tokens was last brought up to date
}

func newTokenBucket(rate, burst float64, now time.Time) *tokenBucket {
	return &tokenBucket{rate: rate, burst: burst, tokens: burst, at: now}
}

func (b *tokenBucket) refill(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.at = now
	}
}

// wait takes one token if there is one (0), or says how long until there is
// (nothing taken).
func (b *tokenBucket) wait(now time.Time) time.Duration {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}

// allows reports whether cost fits what is left. A cost larger than the
// whole burst fits a full bucket (docs/configuration.md "`broker.limits`" publish_bytes: "a message
// larger than the whole budget is admitted (goes into deficit)"), so a
// budget below the message size slows a client down instead of silencing
// it for ever.
func (b *tokenBucket) allows(now time.Time, cost float64) bool {
	b.refill(now)
	return cost <= b.tokens || (cost > b.burst && b.tokens >= b.burst)
}

// take spends cost, going into deficit if it is more than is left.
func (b *tokenBucket) take(cost float64) { b.tokens -= cost }

// full reports whether the bucket has refilled: it is then no different
// from a new one and need not be kept.
func (b *tokenBucket) full(now time.Time) bool {
	b.refill(now)
	return b.tokens >= b.burst
}

// publishBudgets are the per-client limits.publish_rate and
// limits.publish_bytes budgets. A budget follows the client id, not the
// connection, so reconnecting does not refill it (docs/configuration.md "`broker.limits`"); once it
// has refilled it is dropped, which is what bounds the map (invariant 13):
// an entry lives at most until its deficit is paid back, so the map holds
// the ids that published within the last refill time, no more.
type publishBudgets struct {
	rate  int   // messages per second, 0 = no bound
	bytes int64 // bytes per second, 0 = no bound

	mu     sync.Mutex
	byID   map[string]*clientBudget
	pruned time.Time
}

type clientBudget struct {
	// rate and bytesRate are the figures the buckets were made for.
	rate      int
	bytesRate int64
	msgs      *tokenBucket // nil where that limit is unset
	bytes     *tokenBucket
}

// budgetFigures are the publish figures one client is held to: the
// broker-wide limits, or its ACL entry's (docs/configuration.md "`broker.limits`": figures follow the
// user name, the budget follows the client id).
type budgetFigures struct {
	rate  int   // messages per second, 0 = no bound
	bytes int64 // bytes per second, 0 = no bound
}

func (f budgetFigures) bounded() bool { return f.rate > 0 || f.bytes > 0 }

// admit charges one message of size bytes to id held to figures f, or
// reports that it is over either budget (nothing charged then: a refused
// message costs nothing). Burst: one second's worth of each
// (rfcs/limits.md). A budget made for other figures (a reload changed the
// user's limits, or the id now connects as another user) is made again
// for these, keeping what was spent: a change of figures never refills it.
func (p *publishBudgets) admit(id string, size int, now time.Time, f budgetFigures) (ok bool, which string) {
	if !f.bounded() {
		return true, ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID == nil {
		p.byID = make(map[string]*clientBudget)
	}
	// invariant 13: a refilled budget is dropped, so the map holds only ids within a refill time.
	if now.Sub(p.pruned) >= time.Second {
		p.pruned = now
		for k, cb := range p.byID {
			if (cb.msgs == nil || cb.msgs.full(now)) && (cb.bytes == nil || cb.bytes.full(now)) {
				delete(p.byID, k)
			}
		}
	}
	cb := p.byID[id]
	if cb == nil || cb.rate != f.rate || cb.bytesRate != f.bytes {
		next := &clientBudget{rate: f.rate, bytesRate: f.bytes}
		if f.rate > 0 {
			next.msgs = newTokenBucket(float64(f.rate), float64(f.rate), now)
			if cb != nil && cb.msgs != nil {
				cb.msgs.refill(now)
				next.msgs.tokens = min(next.msgs.tokens, cb.msgs.tokens)
			}
		}
		if f.bytes > 0 {
			next.bytes = newTokenBucket(float64(f.bytes), float64(f.bytes), now)
			if cb != nil && cb.bytes != nil {
				cb.bytes.refill(now)
				next.bytes.tokens = min(next.bytes.tokens, cb.bytes.tokens)
			}
		}
		cb = next
		p.byID[id] = cb
	}
	if cb.msgs != nil && !cb.msgs.allows(now, 1) {
		return false, "publish_rate"
	}
	if cb.bytes != nil && !cb.bytes.allows(now, float64(size)) {
		return false, "publish_bytes"
	}
	if cb.msgs != nil {
		cb.msgs.take(1)
	}
	if cb.bytes != nil {
		cb.bytes.take(float64(size))
	}
	return true, ""
}

// held is how many client ids have a budget not yet refilled (tests).
func (p *publishBudgets) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}

// overPublishBudget is the publish path's rate check, made before topic
// resolution, authorisation and storage (docs/configuration.md "`broker.limits`": a client over its
// rate costs the broker nothing more). Over ⇒ 0x97 on the PUBACK/PUBREC,
// the connection left alone; QoS 0 is dropped (refuse). The size charged
// is the message as stored: topic, payload and User Properties.
func (b *Broker) overPublishBudget(cl *mqtt.Client, pk packets.Packet) (packets.Packet, bool, error) {
	// A Will is published by the broker for a client that is gone, on a
	// stand-in with no socket: the budget bounds what a live connection
	// sends, and a Will was bounded when its CONNECT was (rfcs/limits.md).
	if cl.Net.Conn == nil || b.gate == nil {
		return pk, false, nil
	}
	figures, source := budgetFigures{rate: b.gate.pub.rate, bytes: b.gate.pub.bytes}, "limits."
	if g, all := b.grantsOf(cl); !all && g != nil {
		// The ACL resolved the entry's limits against broker.limits.
		pl := g.PublishLimits()
		figures = budgetFigures{rate: pl.Rate, bytes: pl.Bytes}
		if pl.FromEntry {
			source = "the ACL entry's limits."
		}
	}
	if !figures.bounded() {
		return pk, false, nil
	}
	size := len(pk.TopicName) + len(pk.Payload)
	for _, u := range pk.Properties.User {
		size += len(u.Key) + len(u.Val)
	}
	ok, which := b.gate.pub.admit(cl.ID, size, b.clock.Now(), figures)
	if ok {
		return pk, false, nil
	}
	which = source + which
	b.gate.refusedRate.Add(1)
	code := withReason(codeQuotaExceeded, publishRateReason+": "+which)
	if pk.FixedHeader.Qos == 1 && cl.Properties.ProtocolVersion >= 5 {
		// The PUBACK is written here rather than by the substrate, which
		// logged every refusal code a hook returns at error level with the
		// whole packet (logging.Substrate now drops that line). Rate
		// refusals are logged at debug (docs/configuration.md "`broker.limits`"), rate-limited per
		// client like every refusal (logPublishRefusal).
		b.logPublishRefusal(cl, pk, code)
		if b.answerInTurn(cl, pk, code) {
			return pk, true, packets.ErrRejectPacket // after the answers owed before it (inbound.go)
		}
		_ = cl.WritePacket(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Puback},
			PacketID:    pk.PacketID,
			ReasonCode:  code.Code,
			Properties:  packets.Properties{ReasonString: code.Reason},
		})
		return pk, true, packets.ErrRejectPacket
	}
	out, err := b.refuse(cl, pk, code)
	return out, true, err
}
