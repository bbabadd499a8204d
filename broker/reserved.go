package broker

import (
	"fmt"
	"log/slog"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
)

// publishReserved routes a PUBLISH under $saguin/. Exactly five topics are
// publishable (docs/channels.md "The `$saguin/` topics"); this broker serves four of them — point
// read (pointread.go), seek (seek.go), queue answers (below) and the
// hang-up (hangup.go) — and refuses the rest (the catalogue) by name
// rather than pretending.
func (b *Broker) publishReserved(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	t := pk.TopicName
	switch route, name := reservedRoute(t); route {
	case routePointRead:
		return b.pointRead(cl, pk) // pointread.go
	case routeSeek:
		return b.seek(cl, pk, name)
	case routeQueueAnswer:
		return b.queueAnswer(cl, pk, name)
	case routeHangUp:
		return b.hangUp(cl, pk) // hangup.go
	}
	return b.refuse(cl, pk, withReason(codeTopicInvalid,
		fmt.Sprintf("%s is not a topic clients may publish to under $saguin/", t)))
}

// The $saguin/ topics a client may publish to (docs/channels.md: seek, point read,
// queue answers).
const (
	routeNone = iota
	routePointRead
	routeSeek        // $saguin/consumer/<channel>/seek
	routeQueueAnswer // $saguin/queue/<queue>/response
	routeHangUp      // $saguin/sessions/disconnect
)

// reservedRoute reads a $saguin/ publish topic, which is client input: the
// channel or queue it names is one whole level, never empty and never
// holding a '/', so no topic can address a name it does not spell out.
func reservedRoute(t string) (int, string) {
	switch t {
	case pointReadTopic:
		return routePointRead, ""
	case hangUpTopic:
		return routeHangUp, ""
	}
	if rest, ok := strings.CutPrefix(t, "$saguin/consumer/"); ok {
		if name, ok := strings.CutSuffix(rest, "/seek"); ok && name != "" && !strings.Contains(name, "/") {
			return routeSeek, name
		}
	}
	if rest, ok := strings.CutPrefix(t, "$saguin/queue/"); ok {
		if name, ok := strings.CutSuffix(rest, "/response"); ok && name != "" && !strings.Contains(name, "/") {
			return routeQueueAnswer, name
		}
	}
	return routeNone, ""
}

// queueAnswer takes a worker's ack or return (docs/channels.md "Acknowledgement and
// return"). The PUBACK says only that the broker received the packet: the
// worker is never told whether its answer was applied (invariant 3).
func (b *Broker) queueAnswer(cl *mqtt.Client, pk packets.Packet, name string) (packets.Packet, error) {
	q := b.engines[name]
	if q == nil {
		return b.refuse(cl, pk, withReason(codeTopicInvalid, fmt.Sprintf("no queue is named %s", name)))
	}
	if why := b.reservedRefusal(cl, func(g *acl.Grants) bool { return g.MayConsume(name) }, "consume on queue "+name); why != "" {
		return b.refuse(cl, pk, withReason(codeNotAuthorized, why))
	}
	s := b.sessionOf(cl.ID)
	if s == nil || s.owner() != cl {
		b.refused(slog.LevelInfo, cl, ignoredQueueAnswer, 0, "queue answer ignored: connection does not own its session", "queue", name)
		return pk, packets.CodeSuccessIgnore
	}
	if len(pk.Properties.CorrelationData) == 0 {
		b.refused(slog.LevelInfo, cl, ignoredQueueAnswer, 0, "queue answer ignored: no Correlation Data", "queue", name)
		return pk, packets.CodeSuccessIgnore
	}
	if why, holder := q.answer(s, s.sink(b, cl), pk.Properties.CorrelationData, string(pk.Payload)); why != "" {
		args := []any{"queue", name}
		if holder != "" {
			args = append(args, "holder", holder)
		}
		b.refused(slog.LevelInfo, cl, ignoredQueueAnswer, 0, "queue answer ignored: "+why, args...)
	}
	return pk, packets.CodeSuccessIgnore
}
