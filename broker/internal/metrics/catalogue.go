// Package metrics is Sagüin's metric catalogue and its exposition (docs/operations.md "The routes"; docs/operations.md "Metrics"): the one place every family is named with its type,
// labels and help text, the collector that turns a Snapshot of the
// broker's numbers into those families through prometheus/client_golang,
// and the handler that serves them, recomputed at most once per
// broker.operations.min_scrape_interval. It does not know the broker: the
// broker fills a Snapshot through Source.
package metrics

// Kind is a family's Prometheus type. The catalogue has counters and
// gauges only: no histogram or timer is kept on a hot path (docs/operations.md "Metrics", "Not there, on purpose").
type Kind int

const (
	Counter Kind = iota
	Gauge
)

func (k Kind) String() string {
	if k == Counter {
		return "counter"
	}
	return "gauge"
}

// Family is one name of the catalogue.
type Family struct {
	Name   string
	Kind   Kind
	Labels []string
	Help   string
	// read emits the family's series from a snapshot: one emit per series,
	// label values in the order of Labels. A family with nothing to show
	// (no refusal of that kind yet, no stored position) emits nothing and
	// is absent from the exposition: a zero there would lie.
	read func(s *Snapshot, emit func(v float64, labels ...string))
}

// Label names.
const (
	labelChannel  = "channel"
	labelProvider = "provider"
	labelReason   = "reason"
	labelCause    = "cause"
	labelBridge   = "bridge"
)

// broadcastChannel is the channel label saguin_published_total gives the
// publishes no channel claims.
const broadcastChannel = "broadcast"

// Catalogue is the closed catalogue (docs/operations.md "Metrics"), in its order.
func Catalogue() []Family {
	var out []Family
	for _, part := range [][]Family{brokerFamilies(), wireFamilies(), deliveryFamilies(),
		channelFamilies(), queueFamilies(), storageFamilies(), bridgeFamilies(), runtimeFamilies()} {
		out = append(out, part...)
	}
	return out
}

// one is a family of one unlabelled series.
func one(name string, kind Kind, help string, value func(s *Snapshot) float64) Family {
	return Family{Name: name, Kind: kind, Help: help, read: func(s *Snapshot, emit func(float64, ...string)) {
		emit(value(s))
	}}
}

// brokerFamilies: docs/operations.md "Metrics", "The broker".
func brokerFamilies() []Family {
	return []Family{
		{Name: "saguin_build_info", Kind: Gauge, Labels: []string{"version", "broker_id"},
			Help: "Always 1; its labels name the build running and the broker's configured id.",
			read: func(s *Snapshot, emit func(float64, ...string)) { emit(1, s.Broker.Version, s.Broker.BrokerID) }},
		one("saguin_uptime_seconds", Gauge, "Seconds since the broker started.",
			func(s *Snapshot) float64 { return s.Broker.UptimeSeconds }),
		one("saguin_connections", Gauge, "Clients connected now, as the MQTT engine counts them.",
			func(s *Snapshot) float64 { return float64(s.Broker.Connections) }),
		{Name: "saguin_connections_by_protocol", Kind: Gauge, Labels: []string{"protocol"},
			Help: "Clients connected now by MQTT version (5 or 3.1.1), counted from the client table at the recompute.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				emit(float64(s.Broker.ConnectionsV5), protocolV5)
				emit(float64(s.Broker.ConnectionsV311), protocolV311)
			}},
		one("saguin_connections_total", Counter, "Connections accepted (CONNACK success) since the broker started.",
			func(s *Snapshot) float64 { return float64(s.Broker.ConnectionsTotal) }),
		one("saguin_sessions_offline", Gauge, "Sessions held with no connection, those restored at the start included.",
			func(s *Snapshot) float64 { return float64(s.Broker.SessionsOffline) }),
		{Name: "saguin_wills_published_total", Kind: Counter, Labels: []string{labelCause},
			Help: "Wills published, by why: immediate, delayed, session_ended, start.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for c := range WillCause(willCauses) {
					emit(float64(s.Broker.WillsPublished[c]), c.String())
				}
			}},
		one("saguin_wills_cancelled_total", Counter, "Wills cancelled because their session resumed within the Will Delay Interval.",
			func(s *Snapshot) float64 { return float64(s.Broker.WillsCancelled) }),
		one("saguin_wills_waiting", Gauge, "Wills waiting out their Will Delay Interval now (kept across a restart).",
			func(s *Snapshot) float64 { return float64(s.Broker.WillsWaiting) }),
		one("saguin_sessions_restored_total", Counter, "Stored sessions put back at the start (moves once, at the start).",
			func(s *Snapshot) float64 { return float64(s.Broker.SessionsRestored) }),
		{Name: "saguin_sessions_dropped_total", Kind: Counter, Labels: []string{labelCause},
			Help: "Sessions the session store could not keep, by why: storage_full, expired_while_stopped, subscription_refused.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for c := range SessionDropCause(sessionDropCauses) {
					emit(float64(s.Broker.SessionsDropped[c]), c.String())
				}
			}},
		one("saguin_session_queue_messages", Gauge, "Broadcast deliveries sessions hold unsent or unacknowledged (not channel backlog).",
			func(s *Snapshot) float64 { return float64(s.Broker.SessionQueueMessages) }),
		one("saguin_session_queue_bytes", Gauge, "What those deliveries weigh as limits.session_queue_bytes counts it.",
			func(s *Snapshot) float64 { return float64(s.Broker.SessionQueueBytes) }),
		one("saguin_retained_messages", Gauge, "Retained messages in the broker's retained store.",
			func(s *Snapshot) float64 { return float64(s.Broker.RetainedMessages) }),
		one("saguin_qos2_held", Gauge, "QoS 2 publishes received (PUBREC sent) and not yet released by their PUBREL.",
			func(s *Snapshot) float64 { return float64(s.Broker.QoS2Held) }),
		one("saguin_qos2_abandoned_total", Counter, "QoS 2 publishes held and dropped unreleased: session ended, aged past broker.qos2.expires_after, or dropped at the start.",
			func(s *Snapshot) float64 { return float64(s.Broker.QoS2Abandoned) }),
		one("saguin_qos2_max_inflight_per_client", Gauge, "The configured broker.qos2.max_inflight_per_client.",
			func(s *Snapshot) float64 { return float64(s.Broker.QoS2MaxInflightPerClient) }),
		one("saguin_subscriptions", Gauge, "Subscriptions held, as the MQTT engine counts them.",
			func(s *Snapshot) float64 { return float64(s.Broker.Subscriptions) }),
		one("saguin_session_expiry_shortened_total", Counter, "CONNECTs whose Session Expiry Interval was capped to limits.max_session_expiry.",
			func(s *Snapshot) float64 { return float64(s.Broker.SessionExpiryShortened) }),
		one("saguin_max_session_expiry_seconds", Gauge, "The configured limits.max_session_expiry.",
			func(s *Snapshot) float64 { return s.Broker.MaxSessionExpirySeconds }),
	}
}

// wireFamilies: docs/operations.md "Metrics", "The wire", the whole broker over every MQTT door.
func wireFamilies() []Family {
	return []Family{
		one("saguin_bytes_received_total", Counter, "Bytes read from MQTT connections.",
			func(s *Snapshot) float64 { return float64(s.Wire.BytesReceived) }),
		one("saguin_bytes_sent_total", Counter, "Bytes written to MQTT connections.",
			func(s *Snapshot) float64 { return float64(s.Wire.BytesSent) }),
		one("saguin_publishes_received_total", Counter, "PUBLISH packets received from clients, refused ones included.",
			func(s *Snapshot) float64 { return float64(s.Wire.PublishesReceived) }),
		one("saguin_deliveries_sent_total", Counter, "PUBLISH packets written to subscribers, queue redeliveries and resends included.",
			func(s *Snapshot) float64 { return float64(s.Wire.DeliveriesSent) }),
		one("saguin_deliveries_refused_total", Counter, "Broadcast deliveries refused because the subscriber reached limits.session_queue_bytes or ran out of packet identifiers.",
			func(s *Snapshot) float64 { return float64(s.Wire.DeliveriesRefused) }),
	}
}

// reasons emits one series per reason, summing a reason listed twice.
func reasons(list func(s *Snapshot) []ReasonCount) func(*Snapshot, func(float64, ...string)) {
	return func(s *Snapshot, emit func(float64, ...string)) {
		sum := make(map[string]uint64)
		var order []string
		for _, r := range list(s) {
			if _, seen := sum[r.Reason]; !seen {
				order = append(order, r.Reason)
			}
			sum[r.Reason] += r.Count
		}
		for _, reason := range order {
			emit(float64(sum[reason]), reason)
		}
	}
}

// deliveryFamilies: docs/operations.md "Metrics", "Publishing and delivery".
func deliveryFamilies() []Family {
	return []Family{
		{Name: "saguin_published_total", Kind: Counter, Labels: []string{labelChannel},
			Help: "Records stored by publishers, by channel; publishes no channel claims under channel=\"broadcast\".",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for _, ch := range s.Channels {
					emit(float64(ch.Published), ch.Name)
				}
				emit(float64(s.Delivery.BroadcastPublished), broadcastChannel)
			}},
		{Name: "saguin_connections_refused_total", Kind: Counter, Labels: []string{labelReason},
			Help: "Connections refused or ended for a refusal, by reason (the MQTT 5 name of the code answered).",
			read: reasons(func(s *Snapshot) []ReasonCount { return s.Refusals.Connections })},
		{Name: "saguin_publish_refused_total", Kind: Counter, Labels: []string{labelReason},
			Help: "PUBLISH packets refused, by reason (the MQTT 5 name of the code answered, or publish rate exceeded, inflight allowance exceeded, rejected).",
			read: reasons(func(s *Snapshot) []ReasonCount { return s.Refusals.Publishes })},
		{Name: "saguin_subscriptions_refused_total", Kind: Counter, Labels: []string{labelReason},
			Help: "Subscription filters refused in a SUBACK, by reason (the MQTT 5 name, before 3.1.1 answers every one 0x80).",
			read: reasons(func(s *Snapshot) []ReasonCount { return s.Refusals.Subscriptions })},
		one("saguin_broadcast_unmatched_total", Counter, "Publishes no subscription and no channel matched.",
			func(s *Snapshot) float64 { return float64(s.Delivery.BroadcastUnmatched) }),
		one("saguin_deliveries_dropped_total", Counter, "QoS 0 broadcast deliveries dropped because the subscriber's outbound queue was full.",
			func(s *Snapshot) float64 { return float64(s.Delivery.DeliveriesDropped) }),
		one("saguin_deliveries_expired_total", Counter, "Deliveries dropped because their Message Expiry Interval ran out before they were written.",
			func(s *Snapshot) float64 { return float64(s.Delivery.DeliveriesExpired) }),
		one("saguin_shares_held_total", Counter, "Deliveries put on a shared group's backlog.",
			func(s *Snapshot) float64 { return float64(s.Delivery.SharesHeld) }),
		one("saguin_shares_drained_total", Counter, "Deliveries a shared group's backlog handed to a member.",
			func(s *Snapshot) float64 { return float64(s.Delivery.SharesDrained) }),
		{Name: "saguin_shares_dropped_total", Kind: Counter, Labels: []string{labelCause},
			Help: "Messages shared groups dropped, by why: backlog_full, no_member_left, expired, storage_full, member_ended, not_authorized.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for c := range ShareDropCause(shareDropCauses) {
					emit(float64(s.Delivery.SharesDropped[c]), c.String())
				}
			}},
		{Name: "saguin_session_deliveries_dropped_total", Kind: Counter, Labels: []string{labelCause},
			Help: "Deliveries owed to sessions and dropped, by why: storage_full, session_queue_full, no_shared_member, packet_ids_exhausted, too_large.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for c := range SessionDeliveryDropCause(sessionDeliveryDropCauses) {
					emit(float64(s.Delivery.SessionDeliveriesDropped[c]), c.String())
				}
			}},
	}
}

// perChannel is a family with one series per channel of the given types.
func perChannel(name string, kind Kind, help string, value func(ch *ChannelFigures) (float64, bool), types ...string) Family {
	return Family{Name: name, Kind: kind, Labels: []string{labelChannel}, Help: help,
		read: func(s *Snapshot, emit func(float64, ...string)) {
			for i := range s.Channels {
				ch := &s.Channels[i]
				if !isOneOf(ch.Type, types) {
					continue
				}
				if v, ok := value(ch); ok {
					emit(v, ch.Name)
				}
			}
		}}
}

func isOneOf(t string, types []string) bool {
	for _, x := range types {
		if t == x {
			return true
		}
	}
	return false
}

func always(v float64) (float64, bool) { return v, true }

// channelFamilies: docs/operations.md "Metrics", "Channels". A family shows only the channels that
// have its number.
func channelFamilies() []Family {
	return []Family{
		{Name: "saguin_channel_info", Kind: Gauge, Labels: []string{labelChannel, "filter", "type", labelProvider},
			Help: "Always 1: one series per configured channel, derived dead-letter channels included.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for _, ch := range s.Channels {
					emit(1, ch.Name, ch.Filter, ch.Type, ch.Provider)
				}
			}},
		perChannel("saguin_channel_records", Gauge, "Records held: next minus floor on an append channel, values held on a latest channel.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.Records)) }, TypeAppend, TypeLatest),
		perChannel("saguin_channel_bytes", Gauge, "Bytes the channel's records weigh against its bounds.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.Bytes)) }, TypeAppend, TypeQueue),
		perChannel("saguin_channel_next_offset", Gauge, "The offset the channel's next record will take.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.NextOffset)) }, TypeAppend),
		perChannel("saguin_channel_floor_offset", Gauge, "The oldest offset the channel still holds.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.FloorOffset)) }, TypeAppend),
		perChannel("saguin_channel_retention_removed_total", Counter, "Records retention removed from the channel.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.RetentionRemoved)) }, TypeAppend, TypeLatest),
		perChannel("saguin_channel_consumer_position_min", Gauge, "The lowest stored durable consumer position; absent while none is stored.",
			func(ch *ChannelFigures) (float64, bool) { return float64(ch.LowestPosition), ch.Positions > 0 }, TypeAppend),
		perChannel("saguin_channel_consumers", Gauge, "Durable consumers with a stored position.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.Positions)) }, TypeAppend),
		perChannel("saguin_channel_partitioned_consumers", Gauge, "Sessions whose subscription to the channel declared a partition slice.",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.Partitioned)) }, TypeAppend, TypeLatest),
		perChannel("saguin_channel_position_lost_total", Counter, "Times retention raised the floor past a stored consumer position (invariant 1).",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.PositionLost)) }, TypeAppend),
		perChannel("saguin_latest_superseded_total", Counter, "Values replaced by a newer one before a subscriber that was behind got them (not a loss).",
			func(ch *ChannelFigures) (float64, bool) { return always(float64(ch.Superseded)) }, TypeLatest),
	}
}

// queueFamilies: docs/operations.md "Metrics", "Queues".
func queueFamilies() []Family {
	q := func(name string, kind Kind, help string, value func(q *QueueFigures) float64) Family {
		return perChannel(name, kind, help, func(ch *ChannelFigures) (float64, bool) {
			return value(&ch.Queue), true
		}, TypeQueue)
	}
	return []Family{
		q("saguin_queue_depth", Gauge, "Jobs not yet resolved, out with a worker or not.",
			func(q *QueueFigures) float64 { return float64(q.Depth) }),
		q("saguin_queue_inflight", Gauge, "Jobs out with a worker now.",
			func(q *QueueFigures) float64 { return float64(q.Inflight) }),
		q("saguin_queue_delivered_total", Counter, "Jobs handed to a worker.",
			func(q *QueueFigures) float64 { return float64(q.Delivered) }),
		q("saguin_queue_acknowledged_total", Counter, "Deliveries a worker answered ack.",
			func(q *QueueFigures) float64 { return float64(q.Acknowledged) }),
		q("saguin_queue_returned_total", Counter, "Deliveries handed back: a worker's return, its session's end, a write that failed.",
			func(q *QueueFigures) float64 { return float64(q.Returned) }),
		q("saguin_queue_redelivered_total", Counter, "Deliveries taken back when their visibility timeout ran out.",
			func(q *QueueFigures) float64 { return float64(q.Redelivered) }),
		q("saguin_queue_dead_lettered_total", Counter, "Jobs moved to the dead-letter channel.",
			func(q *QueueFigures) float64 { return float64(q.DeadLettered) }),
		q("saguin_queue_expired_total", Counter, "Jobs dead-lettered because job_expires_after passed.",
			func(q *QueueFigures) float64 { return float64(q.Expired) }),
		q("saguin_queue_retain_ignored_total", Counter, "Retained publishes taken as ordinary jobs, their retain flag dropped.",
			func(q *QueueFigures) float64 { return float64(q.RetainIgnored) }),
	}
}

// storageFamilies: docs/operations.md "Metrics", "Storage".
func storageFamilies() []Family {
	per := func(name string, kind Kind, help string, value func(p *ProviderFigures) (float64, bool)) Family {
		return Family{Name: name, Kind: kind, Labels: []string{labelProvider}, Help: help,
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for i := range s.Providers {
					if v, ok := value(&s.Providers[i]); ok {
						emit(v, s.Providers[i].Name)
					}
				}
			}}
	}
	return []Family{
		{Name: "saguin_provider_info", Kind: Gauge, Labels: []string{labelProvider, "type"},
			Help: "Always 1: one series per open storage provider, with its type.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for _, p := range s.Providers {
					emit(1, p.Name, p.Type)
				}
			}},
		per("saguin_provider_bytes", Gauge, "Bytes the provider holds (sqlite: the database file, free pages included, the WAL not).",
			func(p *ProviderFigures) (float64, bool) { return float64(p.Bytes), true }),
		per("saguin_provider_max_bytes", Gauge, "The provider's configured max_bytes (0: unbounded).",
			func(p *ProviderFigures) (float64, bool) { return float64(p.MaxBytes), true }),
		per("saguin_storage_errors_total", Counter, "Storage calls that failed and WAL fsyncs that failed; absent until the first.",
			func(p *ProviderFigures) (float64, bool) { return float64(p.Errors), p.Errors > 0 }),
		{Name: "saguin_storage_commits_total", Kind: Counter, Labels: []string{labelProvider, "closed_by"},
			Help: "Publish transactions (sqlite) by what closed them: records, interval, commit, unbatched.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for _, p := range s.Providers {
					if c := p.Commits; c != nil {
						emit(float64(c.ByRecords), p.Name, closedByRecords)
						emit(float64(c.ByInterval), p.Name, closedByInterval)
						emit(float64(c.ByCommit), p.Name, closedByCommit)
						emit(float64(c.Unbatched), p.Name, closedByUnbatched)
					}
				}
			}},
		per("saguin_storage_committed_records_total", Counter, "Records those publish transactions carried (sqlite).",
			func(p *ProviderFigures) (float64, bool) {
				if p.Commits == nil {
					return 0, false
				}
				return float64(p.Commits.Records), true
			}),
		per("saguin_provider_publish_commit_max_records", Gauge, "The configured publish_commit_max_records (sqlite; 256 when absent, 0 with publish_commit_interval: none).",
			func(p *ProviderFigures) (float64, bool) {
				if p.Commits == nil {
					return 0, false
				}
				return float64(p.Commits.MaxRecords), true
			}),
	}
}

// runtimeFamilies: docs/operations.md "Metrics", "The Go runtime", from runtime/metrics (runtime.go).
func runtimeFamilies() []Family {
	r := func(name string, kind Kind, help string, value func(r *RuntimeFigures) float64) Family {
		return one(name, kind, help, func(s *Snapshot) float64 { return value(&s.Runtime) })
	}
	return []Family{
		r("saguin_go_heap_live_bytes", Gauge, "Heap bytes live at the last garbage collection (/gc/heap/live:bytes).",
			func(r *RuntimeFigures) float64 { return r.HeapLiveBytes }),
		r("saguin_go_heap_goal_bytes", Gauge, "The heap size the next garbage collection aims at (/gc/heap/goal:bytes).",
			func(r *RuntimeFigures) float64 { return r.HeapGoalBytes }),
		r("saguin_go_gc_cycles_total", Counter, "Garbage collections completed (/gc/cycles/total:gc-cycles).",
			func(r *RuntimeFigures) float64 { return r.GCCycles }),
		r("saguin_go_gc_cpu_seconds_total", Counter, "CPU seconds spent collecting garbage (/cpu/classes/gc/total:cpu-seconds).",
			func(r *RuntimeFigures) float64 { return r.GCCPUSeconds }),
		r("saguin_go_gc_assist_cpu_seconds_total", Counter, "CPU seconds goroutines spent assisting the collector (/cpu/classes/gc/mark/assist:cpu-seconds).",
			func(r *RuntimeFigures) float64 { return r.GCAssistCPUSeconds }),
		r("saguin_go_stack_bytes", Gauge, "Bytes of goroutine stacks (/memory/classes/heap/stacks:bytes).",
			func(r *RuntimeFigures) float64 { return r.StackBytes }),
		r("saguin_go_allocated_bytes_total", Counter, "Bytes allocated on the heap (/gc/heap/allocs:bytes).",
			func(r *RuntimeFigures) float64 { return r.AllocatedBytes }),
		r("saguin_go_allocated_objects_total", Counter, "Objects allocated on the heap (/gc/heap/allocs:objects).",
			func(r *RuntimeFigures) float64 { return r.AllocatedObjects }),
		r("saguin_go_gogc_percent", Gauge, "GOGC as the runtime reads it (/gc/gogc:percent; -1 when off).",
			func(r *RuntimeFigures) float64 { return r.GOGCPercent }),
		r("saguin_go_memory_limit_bytes", Gauge, "GOMEMLIMIT as the runtime reads it (/gc/gomemlimit:bytes; the largest int64 when unset).",
			func(r *RuntimeFigures) float64 { return r.MemoryLimitBytes }),
	}
}

// bridgeFamilies: docs/operations.md "Metrics", "Bridges": one series per
// configured bridge (label bridge), none without bridges. The out half's
// families (sent, loops skipped, unsent) read 0 until a link has out
// rules, which this build refuses: true zeros, not missing figures.
func bridgeFamilies() []Family {
	per := func(name string, kind Kind, help string, value func(b *BridgeFigures) float64) Family {
		return Family{Name: name, Kind: kind, Labels: []string{labelBridge}, Help: help,
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for i := range s.Bridges {
					emit(value(&s.Bridges[i]), s.Bridges[i].Name)
				}
			}}
	}
	byCause := func(name, help string, causes []string, counts func(b *BridgeFigures) map[string]uint64) Family {
		return Family{Name: name, Kind: Counter, Labels: []string{labelBridge, labelCause}, Help: help,
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for i := range s.Bridges {
					m := counts(&s.Bridges[i])
					for _, c := range causes {
						emit(float64(m[c]), s.Bridges[i].Name, c)
					}
				}
			}}
	}
	flag := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	return []Family{
		{Name: "saguin_bridge_info", Kind: Gauge, Labels: []string{labelBridge, "peer"},
			Help: "Always 1: one series per configured bridge, with the peer it links to.",
			read: func(s *Snapshot, emit func(float64, ...string)) {
				for _, b := range s.Bridges {
					emit(1, b.Name, b.Peer)
				}
			}},
		per("saguin_bridge_connected", Gauge, "1 while the link to the peer is up, 0 while it is down.",
			func(b *BridgeFigures) float64 { return flag(b.Connected) }),
		per("saguin_bridge_stopped", Gauge, "1 when the link halted itself rather than retry; 0 otherwise.",
			func(b *BridgeFigures) float64 { return flag(b.Stopped) }),
		per("saguin_bridge_received_total", Counter, "Records received from the peer.",
			func(b *BridgeFigures) float64 { return float64(b.Received) }),
		byCause("saguin_bridge_unstored_total", "Records received from the peer and not stored (lost at this hop), by cause: no_rule, unmappable, never_accepted, queue_full.",
			BridgeUnstoredCauses, func(b *BridgeFigures) map[string]uint64 { return b.Unstored }),
		per("saguin_bridge_sent_total", Counter, "Records sent to the peer.",
			func(b *BridgeFigures) float64 { return float64(b.Sent) }),
		per("saguin_bridge_loops_skipped_total", Counter, "Records not sent to the peer because they arrived over a bridge.",
			func(b *BridgeFigures) float64 { return float64(b.LoopsSkipped) }),
		byCause("saguin_bridge_unsent_total", "Records not sent to the peer, by cause: peer_refused, broadcast_refused, unmappable, live_queue_full, superseded (superseded is no loss).",
			BridgeUnsentCauses, func(b *BridgeFigures) map[string]uint64 { return b.Unsent }),
		per("saguin_bridge_reconnects_total", Counter, "Connections to the peer after the first.",
			func(b *BridgeFigures) float64 { return float64(b.Reconnects) }),
		per("saguin_bridge_oldest_unacknowledged_seconds", Gauge, "How long the oldest record received from the peer has waited to be stored and acknowledged; 0 when none waits.",
			func(b *BridgeFigures) float64 { return b.OldestUnacknowledgedSeconds }),
	}
}
