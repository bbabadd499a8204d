package broker

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/storage"
)

// seekTarget is a parsed seek payload (docs/channels.md "`append`" "Seek").
type seekTarget struct {
	kind   int // seekOffset, seekFloor, seekHead, seekTime
	offset uint64
	at     time.Time
}

const (
	seekOffset = iota
	seekFloor
	seekHead
	seekTime
)

var errMalformedSeek = errors.New("malformed")

// parseSeek reads a seek payload. A bare integer is always an offset; a
// duration (with or without a leading '-') means "that long ago"; anything
// else must be a strict RFC 3339 timestamp. Bounded: payloads longer than
// any valid form are refused before parsing.
func parseSeek(payload []byte, now time.Time) (seekTarget, error) {
	if len(payload) == 0 || len(payload) > 64 {
		return seekTarget{}, errMalformedSeek
	}
	s := string(payload)
	switch s {
	case "0":
		return seekTarget{kind: seekFloor}, nil
	case "-1":
		return seekTarget{kind: seekHead}, nil
	}
	if s[0] >= '0' && s[0] <= '9' && strings.IndexFunc(s, notDigit) < 0 {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			return seekTarget{}, errMalformedSeek
		}
		return seekTarget{kind: seekOffset, offset: n}, nil
	}
	if d, ok := parseAgo(s); ok {
		return seekTarget{kind: seekTime, at: now.Add(-d)}, nil
	}
	if strings.HasPrefix(s, "-") {
		// Any other negative is refused: -1 is the only negative offset.
		return seekTarget{}, errMalformedSeek
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.Contains(s, "T") {
		return seekTarget{}, errMalformedSeek
	}
	return seekTarget{kind: seekTime, at: at}, nil
}

func notDigit(r rune) bool { return r < '0' || r > '9' }

// parseAgo reads "12h", "-12h", "90m", "7d", "30s": a whole number and one
// unit, meaning that long ago.
func parseAgo(s string) (time.Duration, bool) {
	s = strings.TrimPrefix(s, "-")
	if len(s) < 2 {
		return 0, false
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 's':
		unit = time.Second
	case 'm':
		unit = time.Minute
	case 'h':
		unit = time.Hour
	case 'd':
		unit = 24 * time.Hour
	default:
		return 0, false
	}
	digits := s[:len(s)-1]
	if strings.IndexFunc(digits, notDigit) >= 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > int64((1<<63-1)/unit) {
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// seek moves the publishing session's own position on an append channel
// (docs/channels.md "`append`"). It never deletes records, never moves the floor and never
// moves anyone else.
func (b *Broker) seek(cl *mqtt.Client, pk packets.Packet, name string) (packets.Packet, error) {
	ch, ok := b.channels[name]
	if !ok {
		return b.refuse(cl, pk, withReason(codeTopicInvalid, fmt.Sprintf("seek: no channel is named %s", name)))
	}
	if ch.log == nil {
		return b.refuse(cl, pk, withReason(codeTopicInvalid,
			fmt.Sprintf("seek: %s is a %s channel; only append channels take a seek", name, ch.cfg.Type)))
	}
	if why := b.reservedRefusal(cl, func(g *acl.Grants) bool { return g.MaySeek(name) }, "seek on channel "+name); why != "" {
		return b.refuse(cl, pk, withReason(codeNotAuthorized, why))
	}

	reply := func(payload string, extra ...packets.UserProperty) {
		to := pk.Properties.ResponseTopic
		if to == "" {
			to = "$saguin/consumer/" + name + "/seek/reply"
		}
		out := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Publish},
			TopicName:   to,
			Payload:     []byte(payload),
			Properties:  packets.Properties{CorrelationData: pk.Properties.CorrelationData, User: extra},
		}
		// Written only to the seeking session, never published.
		if err := cl.WritePacket(out); err != nil {
			b.log.Debug("seek reply not written", "client", cl.ID, "error", err)
		}
	}
	refused := func(payload, why string, extra ...packets.UserProperty) (packets.Packet, error) {
		reply(payload, extra...)
		return b.refuse(cl, pk, withReason(codeImplementation, "seek refused: "+why))
	}

	s := b.sessionOf(cl.ID)
	if s == nil || s.owner() != cl || !s.isDurable() {
		return refused("no-session", "seek needs a durable session (Session Expiry Interval > 0) owned by this connection")
	}
	target, err := parseSeek(pk.Payload, b.clock.Now())
	if err != nil {
		return refused("malformed", "payload is not 0, -1, an offset, a duration or an RFC 3339 time")
	}

	floor, next := ch.log.Floor(), ch.log.Next()
	var pos uint64
	switch target.kind {
	case seekFloor:
		pos = floor
	case seekHead:
		pos = next
	case seekOffset:
		pos = target.offset
	case seekTime:
		pos, err = b.offsetAt(ch.log, target.at)
		if err != nil {
			if errors.Is(err, storage.ErrBelowFloor) {
				return refused("below-floor", "that moment is below the retention floor",
					packets.UserProperty{Key: "saguin-floor", Val: strconv.FormatUint(floor, 10)})
			}
			reply("storage")
			b.log.Error("seek: time lookup failed", "channel", name, "error", err)
			return b.refuse(cl, pk, withReason(codeImplementation, "seek: storage read failed"))
		}
	}
	// Out of range is refused, never clamped.
	if pos < floor {
		return refused("below-floor", "offset is below the retention floor",
			packets.UserProperty{Key: "saguin-floor", Val: strconv.FormatUint(floor, 10)})
	}
	if pos > next {
		return refused("beyond-end", "offset is beyond the channel's next offset",
			packets.UserProperty{Key: "saguin-next", Val: strconv.FormatUint(next, 10)})
	}

	if err := b.moveConsumer(s, ch, pos, func() { reply(strconv.FormatUint(pos, 10)) }); err != nil {
		b.log.Error("seek: position write failed", "client", cl.ID, "channel", name, "error", err)
		reply("storage")
		return b.refuse(cl, pk, withReason(codeImplementation, "seek: position write failed"))
	}
	return pk, packets.CodeSuccessIgnore
}

// offsetAt is the earliest held offset whose timestamp is at or after t
// (scanning, since wall clocks step back). A moment older than the oldest
// survivor is served from the start only while nothing was ever removed; once
// the floor has moved, it asks for records that are gone (invariant 1).
func (b *Broker) offsetAt(log storage.AppendLog, t time.Time) (uint64, error) {
	off, found, err := log.FirstAtOrAfter(t)
	if err != nil {
		return 0, err
	}
	floor := log.Floor()
	if !found {
		// Nothing held is that recent: a future moment reads from the head;
		// a past one on a channel retention has emptied asks for gone data.
		if floor > 1 && floor == log.Next() && !t.After(b.clock.Now()) {
			return 0, storage.ErrBelowFloor
		}
		return log.Next(), nil
	}
	if floor > 1 && off == floor {
		oldest, _, err := log.Read(floor, 1)
		if err != nil {
			return 0, err
		}
		if len(oldest) == 1 && t.Before(oldest[0].Timestamp) {
			return 0, storage.ErrBelowFloor
		}
	}
	return off, nil
}

// moveConsumer sets a session's position on a channel: the era ends (acks of
// deliveries already in flight are ignored), the position is stored at once,
// and written tells the client before any record from the new position
// flows. A session not yet reading the channel starts there when it does.
func (b *Broker) moveConsumer(s *session, ch *channel, pos uint64, written func()) error {
	c, durable, expiry := s.seekTarget(ch.name)

	if durable {
		if err := ch.log.SavePosition(storage.Position{Reader: s.reader(), Offset: pos,
			LastSeen: b.clock.Now(), Expiry: expiry}); err != nil {
			return err
		}
	}
	if c == nil {
		written()
		return nil
	}
	c.seekTo(pos, written)
	return nil
}
