package broker

import (
	"slices"
	"sync/atomic"

	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/metrics"
)

// metricsSource is the broker as the exporter's metrics.Source, kept off
// the Broker's own methods.
type metricsSource struct{ b *Broker }

// MetricsSnapshot fills s with the broker's numbers, at most once per
// min_scrape_interval. Every number is one the broker already holds
// (rfcs/metrics.md), copied under the lock that guards it, one lock at a time,
// with nothing formatted while one is held: a scrape never holds a lock a
// connection waits on for longer than a copy. The one figure counted here
// is the lowest stored position of each append channel (storage's
// LowestPosition, one pass).
func (m metricsSource) MetricsSnapshot(s *metrics.Snapshot) {
	b := m.b
	sessions := b.heldSessions()
	figs := make([]sessionFigures, len(sessions))
	for i, sess := range sessions {
		figs[i] = sess.figures()
	}
	b.brokerFigures(&s.Broker, figs)
	b.wireFigures(&s.Wire)
	b.deliveryFigures(&s.Delivery)
	b.refusalFigures(&s.Refusals)
	if b.closing.Load() {
		// The stores are closing: their figures are not read (the
		// operations listener stops before the broker closes).
		return
	}
	s.Channels = b.channelFigures(figs)
	s.Providers = b.providerFigures()
}

func (b *Broker) brokerFigures(f *metrics.BrokerFigures, sessions []sessionFigures) {
	lim := b.cfg.Broker.Limits
	f.Version, f.BrokerID = b.version, b.cfg.Broker.ID
	f.UptimeSeconds = b.clock.Now().Sub(b.started).Seconds()
	f.Connections = atomic.LoadInt64(&b.mqtt.Info.ClientsConnected)
	f.Subscriptions = atomic.LoadInt64(&b.mqtt.Info.Subscriptions)
	// The client table copied under its read lock; counted after.
	for _, cl := range b.mqtt.Clients.GetAll() {
		if cl.Net.Inline || cl.Closed() {
			continue
		}
		if cl.Properties.ProtocolVersion == 5 {
			f.ConnectionsV5++
		} else {
			f.ConnectionsV311++
		}
	}
	e := &b.events
	f.ConnectionsTotal = e.connectionsAccepted.Load()
	for c := range f.WillsPublished {
		f.WillsPublished[c] = e.willsPublished[c].Load()
	}
	f.WillsCancelled = e.willsCancelled.Load()
	f.SessionsRestored = e.sessionsRestored.Load()
	for c := range f.SessionsDropped {
		f.SessionsDropped[c] = e.sessionsDropped[c].Load()
	}
	f.SessionExpiryShortened = e.expiryShortened.Load()
	f.MaxSessionExpirySeconds = lim.MaxSessionExpiry.Seconds()
	if b.retained != nil {
		f.RetainedMessages = int64(b.retained.Len())
	}
	q := b.QoS2Stats()
	f.QoS2Held, f.QoS2Abandoned = int64(q.Held), q.Abandoned
	f.QoS2MaxInflightPerClient = int64(b.cfg.Broker.QoS2.MaxInflightPerClient)
	for _, st := range sessions {
		if st.offline {
			f.SessionsOffline++
		}
		if st.willWaiting {
			f.WillsWaiting++
		}
		f.SessionQueueMessages += st.queued
		f.SessionQueueBytes += st.queueBytes
	}
}

// sessionFigures is what one session adds to the broker's figures.
type sessionFigures struct {
	offline, willWaiting bool
	queued, queueBytes   int64
	partitioned          []string // filters declared with a partition slice
}

// figures copies the session's part of the catalogue: under s.mu, then
// under its outbox's lock (never both at once).
func (s *session) figures() sessionFigures {
	var f sessionFigures
	v := s.view()
	f.offline = v.cl == nil
	f.willWaiting = v.willWaiting
	for filter, m := range v.declared {
		if m.Declared() {
			f.partitioned = append(f.partitioned, filter)
		}
	}
	if o := s.outbox(); o != nil {
		f.queued, f.queueBytes = o.queueFigures()
	}
	return f
}

func (b *Broker) wireFigures(f *metrics.WireFigures) {
	if b.gate == nil {
		return
	}
	t := b.gate.wire.sum()
	f.BytesReceived, f.BytesSent = t.bytesIn, t.bytesOut
	f.PublishesReceived, f.DeliveriesSent = t.publishesIn, t.deliveriesOut
	// Refused for the session's bound; packet identifiers never run out
	// (deliveries.reserve stays within the client's Receive Maximum).
	f.DeliveriesRefused = uint64(b.fan.queueFull.Load())
}

func (b *Broker) deliveryFigures(f *metrics.DeliveryFigures) {
	fan := &b.fan
	if b.gate != nil {
		t := b.gate.wire.sum()
		f.BroadcastPublished, f.BroadcastUnmatched = t.broadcast, t.unmatched
	}
	f.DeliveriesDropped = uint64(fan.droppedQoS0.Load())
	f.DeliveriesExpired = uint64(fan.expired.Load())
	f.SharesHeld = b.events.sharesHeld.Load()
	f.SharesDrained = b.events.sharesDrained.Load()
	f.SharesDropped[metrics.ShareBacklogFull] = uint64(fan.shareFull.Load())
	f.SharesDropped[metrics.ShareNoMemberLeft] = uint64(fan.noneLeft.Load())
	f.SharesDropped[metrics.ShareExpired] = uint64(fan.shareExpire.Load())
	f.SharesDropped[metrics.ShareStorageFull] = uint64(fan.shareStorageFull.Load())
	f.SharesDropped[metrics.ShareMemberEnded] = uint64(fan.memberEnded.Load())
	f.SharesDropped[metrics.ShareNotAuthorized] = uint64(fan.shareNotAuthorized.Load())
	f.SessionDeliveriesDropped[metrics.DeliveryStorageFull] = uint64(fan.logFailed.Load() + fan.logStorageFull.Load())
	f.SessionDeliveriesDropped[metrics.DeliverySessionQueueFull] = uint64(fan.queueFull.Load())
	f.SessionDeliveriesDropped[metrics.DeliveryNoSharedMember] = uint64(fan.noMember.Load())
	f.SessionDeliveriesDropped[metrics.DeliveryTooLarge] = uint64(fan.tooLarge.Load())
}

// refusalFigures reads the refusal counts (every refusal is counted,
// logged or not: refusals.go) by the reason each stands for.
func (b *Broker) refusalFigures(f *metrics.RefusalFigures) {
	for _, c := range b.RefusalCounts() {
		switch c.Kind {
		case refuseConnect, logging.KindPacket:
			// A packet refused before the substrate read it ends its
			// connection: a connection ended for a refusal.
			f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.CodeName(c.Code), Count: c.Count})
		case refusePublish:
			f.Publishes = append(f.Publishes, metrics.ReasonCount{Reason: metrics.CodeName(c.Code), Count: c.Count})
		case refusePublishRate:
			f.Publishes = append(f.Publishes, metrics.ReasonCount{Reason: metrics.ReasonPublishRate, Count: c.Count})
		case refusePublishInflight:
			f.Publishes = append(f.Publishes, metrics.ReasonCount{Reason: metrics.ReasonInflightAllowance, Count: c.Count})
		case refuseSubscribe:
			f.Subscriptions = append(f.Subscriptions, metrics.ReasonCount{Reason: metrics.CodeName(c.Code), Count: c.Count})
		}
	}
	// Refusals no log line stands for: a socket closed at accept with the
	// overflow budget full, and CONNACKs the session store turned into a
	// refusal (ownership.go).
	if b.gate != nil {
		if n := b.gate.closedAtAccept.Load(); n > 0 {
			f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.CodeName(0x89), Count: n})
		}
	}
	if n := b.events.sessionStoreFull.Load(); n > 0 {
		f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.ReasonSessionStoreFull, Count: n})
	}
	if n := b.events.sessionStoreFailed.Load(); n > 0 {
		f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.CodeName(codeSessionStore.Code), Count: n})
	}
}

// channelFigures lists every configured channel in name order, each
// number read from the channel's store (its in-memory counters) or the
// broker's own counts.
func (b *Broker) channelFigures(sessions []sessionFigures) []metrics.ChannelFigures {
	partitioned := b.partitioned(sessions)
	names := make([]string, 0, len(b.channels))
	for name := range b.channels {
		names = append(names, name)
	}
	slices.Sort(names)
	lost := b.PositionLost()
	out := make([]metrics.ChannelFigures, 0, len(names))
	for _, name := range names {
		ch := b.channels[name]
		f := metrics.ChannelFigures{Name: name, Filter: ch.cfg.FilterAsWritten, Type: ch.cfg.Type,
			Provider: ch.cfg.Storage, Published: ch.published.Load(), RetentionRemoved: ch.removed.Load(),
			Superseded: ch.superseded.Load(), Partitioned: partitioned[name]}
		switch {
		case ch.log != nil:
			f.NextOffset, f.FloorOffset, f.Bytes = ch.log.Next(), ch.log.Floor(), ch.log.Bytes()
			f.Records = int64(f.NextOffset - f.FloorOffset)
			f.PositionLost = uint64(lost[name].Passings)
			low, n, err := ch.log.LowestPosition()
			if err != nil {
				b.log.Warn("metrics: reading the lowest stored position failed; the channel's position figures are left out of this scrape",
					"channel", name, "error", err)
			} else {
				f.LowestPosition, f.Positions = low, int64(n)
			}
		case ch.values != nil:
			f.Records = int64(ch.values.Len())
		case ch.queue != nil:
			f.Bytes = ch.queue.Bytes()
			f.Queue = b.engines[name].figures()
			f.Queue.RetainIgnored = ch.retainIgnored.Load()
		}
		out = append(out, f)
	}
	return out
}

// partitioned counts, per channel, the sessions with a subscription
// reaching it that declared a partition slice.
func (b *Broker) partitioned(sessions []sessionFigures) map[string]int64 {
	out := make(map[string]int64)
	for _, s := range sessions {
		seen := make(map[string]bool)
		for _, filter := range s.partitioned {
			for _, name := range b.resolver.Reaching(filter) {
				if !seen[name] {
					seen[name] = true
					out[name]++
				}
			}
		}
	}
	return out
}

// providerFigures lists the open providers in name order.
func (b *Broker) providerFigures() []metrics.ProviderFigures {
	names := make([]string, 0, len(b.providers))
	for name := range b.providers {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]metrics.ProviderFigures, 0, len(names))
	for _, name := range names {
		p := b.providers[name]
		c := p.Counters()
		f := metrics.ProviderFigures{Name: name, Type: c.Type, Bytes: p.Bytes(), MaxBytes: p.MaxBytes(), Errors: c.Errors}
		if cc := c.Commits; cc != nil {
			f.Commits = &metrics.CommitFigures{ByRecords: cc.ByRecords, ByInterval: cc.ByInterval,
				ByCommit: cc.ByCommit, Unbatched: cc.Unbatched, Records: cc.Records, MaxRecords: int64(cc.MaxRecords)}
		}
		out = append(out, f)
	}
	return out
}
