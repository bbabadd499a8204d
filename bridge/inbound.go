package bridge

import (
	"context"
	"slices"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// Causes an inbound record is acknowledged without being stored, each
// counted (docs/bridge.md "What crosses, inbound").
const (
	CauseNoRule     = "no_rule"    // no in rule's filter matches its topic
	CauseUnmappable = "unmappable" // its mapped name is empty or starts with $
	CauseQueueFull  = "queue_full" // a QoS 0 record past one Receive Maximum waiting
	// CauseNeverAccepted: the broker refused it for good (too deep, too
	// long, too many headers, not granted).
	CauseNeverAccepted = "never_accepted"
)

// Causes lists every cause a link counts, the closed label set of
// saguin_bridge_unstored_total.
var Causes = []string{CauseNoRule, CauseUnmappable, CauseNeverAccepted, CauseQueueFull}

// received is one PUBLISH handed off by paho's callback, with the
// connection it arrived on: it is acknowledged on that connection only.
type received struct {
	pub *paho.Publish
	cli *paho.Client
	at  time.Time // when it arrived: the oldest unacknowledged one's age is a figure
}

// onPublish is paho's callback: it only hands the record off (paho calls
// it from its one reading goroutine, in receive order). A QoS 1/2 record
// always has room — the peer may send at most our Receive Maximum of them
// unacknowledged, and the inbox holds that many — while a QoS 0 one beyond
// one Receive Maximum waiting is dropped and counted: MQTT gives QoS 0 no
// flow control to hold the peer back with.
func (l *Link) onPublish(pr paho.PublishReceived) (bool, error) {
	// The connection a record arrives on is the current one — unless it is
	// the one that ended last: paho may still hand over what that
	// connection read before it died, and it must not become current
	// again (its acknowledgements would name, on the next connection,
	// another record, and the next connection's would wait behind them).
	if pr.Client != l.ended.Load() {
		l.current.Store(pr.Client)
	}
	r := received{pub: pr.Packet, cli: pr.Client, at: time.Now()}
	l.stats.received.Add(1)
	if r.pub.QoS == 0 {
		if l.qos0Waiting.Add(1) > int64(l.cfg.ReceiveMaximum) {
			l.qos0Waiting.Add(-1)
			l.unstored(CauseQueueFull)
			return true, nil
		}
	}
	select {
	case l.inbox <- r:
	case <-l.stop:
	}
	return true, nil
}

// storeInbound is the link's one inbound goroutine: each record mapped
// by the first in rule that matches it, stored through Local, and only then
// acknowledged, in receive order (paho sends the acknowledgements in that
// order every ack_interval).
func (l *Link) storeInbound(ctx context.Context) {
	recent := newRecentlyStored(int(l.cfg.ReceiveMaximum))
	for {
		var r received
		select {
		case <-ctx.Done():
			return
		case r = <-l.inbox:
		}
		if r.pub.QoS == 0 {
			l.qos0Waiting.Add(-1)
		}
		// Records are settled in receive order, so the one being settled
		// is the oldest not yet acknowledged.
		l.settling.Store(r.at.UnixNano())
		l.settleInbound(ctx, r, recent)
		l.settling.Store(0)
	}
}

func (l *Link) settleInbound(ctx context.Context, r received, recent *recentlyStored) {
	rec, cause := l.mapInbound(r.pub)
	if cause != "" {
		l.unstored(cause)
		l.ack(r)
		return
	}
	key := keyOf(r.pub.PacketID, r.pub.Topic, r.pub.Payload)
	if r.pub.QoS > 0 && r.pub.Duplicate() && recent.has(key) {
		// Stored already; our acknowledgement was lost with the
		// connection. Acknowledge again, store nothing.
		l.stats.duplicates.Add(1)
		l.ack(r)
		return
	}
	wait := retryFirst
	for {
		outcome, why := l.local.Store(ctx, rec)
		switch outcome {
		case Stored:
			l.stats.stored.Add(1)
			if r.pub.QoS > 0 {
				recent.add(key)
			}
			l.ack(r)
			return
		case Never:
			if !slices.Contains(Causes, why) {
				// The label set is closed (saguin_bridge_unstored_total).
				why = CauseNeverAccepted
			}
			l.unstored(why)
			l.ack(r)
			return
		}
		// Retry: not acknowledged, so the peer holds at most our Receive
		// Maximum unacknowledged; the record is tried again, never dropped.
		l.stats.retries.Add(1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, retryLast)
	}
}

// Retrying a record the broker could not hold now: from 10ms, doubling, to
// at most a second between tries.
const (
	retryFirst = 10 * time.Millisecond
	retryLast  = time.Second
)

// ack acknowledges r on the connection it came on, and only while that
// connection is the current one: after a reconnection the peer resends it
// (with DUP) and it is acknowledged then — an old connection's
// acknowledgement could name, by its packet identifier, another record of
// the new one (paho.golang's session state is shared between them). paho
// sends acknowledgements in receive order, so one for a later record waits
// for the earlier ones.
func (l *Link) ack(r received) {
	if r.pub.QoS == 0 || r.cli != l.current.Load() {
		return
	}
	if err := r.cli.Ack(r.pub); err != nil {
		l.log.Debug("bridge: acknowledgement not sent", "bridge", l.cfg.Name, "packet_id", r.pub.PacketID, "error", err)
	}
}

// mapInbound finds the first in (or both) rule whose filter matches the
// record's topic, in written order, and builds the record to store under
// the rule's name; or the cause it cannot be.
func (l *Link) mapInbound(p *paho.Publish) (Record, string) {
	for _, rule := range l.inRules {
		topic, ok, err := rule.Map(p.Topic)
		if !ok {
			continue
		}
		if err != nil {
			return Record{}, CauseUnmappable
		}
		rec := Record{Topic: topic, Payload: p.Payload, QoS: p.QoS, Retain: p.Retain, Bridge: l.cfg.Name}
		if pr := p.Properties; pr != nil {
			rec.ContentType, rec.ResponseTopic, rec.CorrelationData = pr.ContentType, pr.ResponseTopic, pr.CorrelationData
			rec.PayloadFormat, rec.MessageExpiry = pr.PayloadFormat, pr.MessageExpiry
			for _, u := range pr.User {
				if u.Key == IDProperty && rec.ID == "" {
					rec.ID = u.Value
					continue
				}
				rec.User = append(rec.User, UserProperty{Key: u.Key, Value: u.Value})
			}
		}
		return rec, ""
	}
	return Record{}, CauseNoRule
}

func (l *Link) unstored(cause string) {
	l.stats.mu.Lock()
	l.stats.unstored[cause]++
	l.stats.mu.Unlock()
}

// inRule reports whether r brings records in.
func inRule(r *Rule) bool { return r.Direction == In || r.Direction == Both }

// subscription is the SUBSCRIBE option set for an in rule: QoS 2 so each
// record comes at the QoS it was published with, Retain As Published so a
// retained value stays one here, Retain Handling 1 so a subscription the
// peer still holds sends no retained values again, and No Local on a both
// rule so what we publish there does not come back.
func subscription(r *Rule) paho.SubscribeOptions {
	return paho.SubscribeOptions{Topic: r.Filter, QoS: 2, RetainAsPublished: true, RetainHandling: 1, NoLocal: r.Direction == Both}
}
