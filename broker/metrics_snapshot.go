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
// LowestPosition, one pass). Each type's numbers are read through the view
// it builds of itself (session.figures, gate.view, fanout.counts,
// eventCounts.view, channel.view, queueEngine.figures): this file selects
// no field of another type that keeps a lock or an atomic
// (rfcs/delivery-seam.md "The session behind methods").
func (m metricsSource) MetricsSnapshot(s *metrics.Snapshot) {
	b := m.b
	sessions := b.heldSessions()
	figs := make([]sessionFigures, len(sessions))
	for i, sess := range sessions {
		figs[i] = sess.figures()
	}
	var g gateView // all zero without a gate
	if b.gate != nil {
		g = b.gate.view()
	}
	fan, events := b.fan.counts(), b.events.view()
	b.brokerFigures(&s.Broker, figs, events)
	b.wireFigures(&s.Wire, g, fan)
	b.deliveryFigures(&s.Delivery, g, fan, events)
	b.refusalFigures(&s.Refusals, g, events)
	s.Bridges = b.bridgeFigures()
	if b.closing.Load() {
		// The stores are closing: their figures are not read (the
		// operations listener stops before the broker closes).
		return
	}
	s.Channels = b.channelFigures(figs)
	s.Providers = b.providerFigures()
}

func (b *Broker) brokerFigures(f *metrics.BrokerFigures, sessions []sessionFigures, e eventFigures) {
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
	f.ConnectionsTotal = e.connectionsAccepted
	f.WillsPublished = e.willsPublished
	f.WillsCancelled = e.willsCancelled
	f.SessionsRestored = e.sessionsRestored
	f.SessionsDropped = e.sessionsDropped
	f.SessionExpiryShortened = e.expiryShortened
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

func (b *Broker) wireFigures(f *metrics.WireFigures, g gateView, fan fanoutCounts) {
	if b.gate == nil {
		return
	}
	t := g.wire
	f.BytesReceived, f.BytesSent = t.bytesIn, t.bytesOut
	f.PublishesReceived, f.DeliveriesSent = t.publishesIn, t.deliveriesOut
	// Refused for the session's bound; packet identifiers never run out
	// (deliveries.reserve stays within the client's Receive Maximum).
	f.DeliveriesRefused = uint64(fan.queueFull)
}

func (b *Broker) deliveryFigures(f *metrics.DeliveryFigures, g gateView, fan fanoutCounts, e eventFigures) {
	if b.gate != nil {
		f.BroadcastPublished, f.BroadcastUnmatched = g.wire.broadcast, g.wire.unmatched
	}
	f.DeliveriesDropped = uint64(fan.droppedQoS0)
	f.DeliveriesExpired = uint64(fan.expired)
	f.SharesHeld = e.sharesHeld
	f.SharesDrained = e.sharesDrained
	f.SharesDropped[metrics.ShareBacklogFull] = uint64(fan.shareFull)
	f.SharesDropped[metrics.ShareNoMemberLeft] = uint64(fan.noneLeft)
	f.SharesDropped[metrics.ShareExpired] = uint64(fan.shareExpire)
	f.SharesDropped[metrics.ShareStorageFull] = uint64(fan.shareStorageFull)
	f.SharesDropped[metrics.ShareMemberEnded] = uint64(fan.memberEnded)
	f.SharesDropped[metrics.ShareNotAuthorized] = uint64(fan.shareNotAuthorized)
	f.SessionDeliveriesDropped[metrics.DeliveryStorageFull] = uint64(fan.logFailed + fan.logStorageFull)
	f.SessionDeliveriesDropped[metrics.DeliverySessionQueueFull] = uint64(fan.queueFull)
	f.SessionDeliveriesDropped[metrics.DeliveryNoSharedMember] = uint64(fan.noMember)
	f.SessionDeliveriesDropped[metrics.DeliveryTooLarge] = uint64(fan.tooLarge)
}

// refusalFigures reads the refusal counts (every refusal is counted,
// logged or not: refusals.go) by the reason each stands for.
func (b *Broker) refusalFigures(f *metrics.RefusalFigures, g gateView, e eventFigures) {
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
	if n := g.closedAtAccept; n > 0 {
		f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.CodeName(0x89), Count: n})
	}
	if n := e.sessionStoreFull; n > 0 {
		f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.ReasonSessionStoreFull, Count: n})
	}
	if n := e.sessionStoreFailed; n > 0 {
		f.Connections = append(f.Connections, metrics.ReasonCount{Reason: metrics.CodeName(codeSessionStore.Code), Count: n})
	}
}

// channelFigures lists every configured channel in name order, each
// number read from the channel's view (channel.view: its own counters and
// its store's in-memory ones) or the broker's own counts.
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
		v := ch.view()
		f := metrics.ChannelFigures{Name: name, Filter: v.filter, Type: v.typ,
			Provider: v.provider, Published: v.published, RetentionRemoved: v.removed,
			Superseded: v.superseded, Partitioned: partitioned[name]}
		switch v.store {
		case appendStore:
			f.NextOffset, f.FloorOffset, f.Bytes = v.next, v.floor, v.bytes
			f.Records = int64(f.NextOffset - f.FloorOffset)
			f.PositionLost = uint64(lost[name].Passings)
			low, n, err := ch.lowestPosition()
			if err != nil {
				b.log.Warn("metrics: reading the lowest stored position failed; the channel's position figures are left out of this scrape",
					"channel", name, "error", err)
			} else {
				f.LowestPosition, f.Positions = low, int64(n)
			}
		case latestStore:
			f.Records = int64(v.values)
		case queueStore:
			f.Bytes = v.bytes
			f.Queue = b.engines[name].figures()
			f.Queue.RetainIgnored = v.retainIgnored
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
