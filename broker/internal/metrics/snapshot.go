package metrics

// Snapshot is every number the catalogue shows, copied out of the broker
// at one recompute (docs/operations.md "Metrics": copied under the broker's locks,
// formatted outside them). The broker fills it through Source; the Go
// runtime's figures are read here (runtime.go). Counters are since the
// process started; gauges are as the broker holds them now.
type Snapshot struct {
	Broker    BrokerFigures
	Wire      WireFigures
	Delivery  DeliveryFigures
	Refusals  RefusalFigures
	Channels  []ChannelFigures
	Providers []ProviderFigures
	Bridges   []BridgeFigures
	Runtime   RuntimeFigures
}

// BridgeFigures are one bridge's figures (docs/operations.md "Metrics",
// "Bridges").
type BridgeFigures struct {
	Name, Peer string
	Connected  bool
	// Stopped: the link halted itself (it never does in this build: a
	// record over our limit is not sent to us, see docs/bridge.md).
	Stopped                      bool
	Received, Sent, LoopsSkipped uint64
	Reconnects                   uint64
	Unstored                     map[string]uint64 // by BridgeUnstoredCauses
	Unsent                       map[string]uint64 // by BridgeUnsentCauses
	OldestUnacknowledgedSeconds  float64
}

// BridgeUnstoredCauses are the closed causes of saguin_bridge_unstored_total.
var BridgeUnstoredCauses = []string{"no_rule", "unmappable", "never_accepted", "queue_full"}

// BridgeUnsentCauses are the closed causes of saguin_bridge_unsent_total.
var BridgeUnsentCauses = []string{"peer_refused", "broadcast_refused", "unmappable", "live_queue_full", "superseded"}

// BrokerFigures are the broker's own figures (docs/operations.md "Metrics", "The broker").
type BrokerFigures struct {
	Version  string
	BrokerID string
	// UptimeSeconds is measured on the broker's clock from its start.
	UptimeSeconds float64
	// Connections is the substrate's own count of connected clients.
	Connections int64
	// ConnectionsV5 and ConnectionsV311 split the connected clients by
	// protocol, counted from the client table at the recompute.
	ConnectionsV5, ConnectionsV311 int64
	ConnectionsTotal               uint64
	SessionsOffline                int64
	WillsPublished                 [willCauses]uint64 // by WillCause
	WillsCancelled                 uint64
	WillsWaiting                   int64
	SessionsRestored               uint64
	SessionsDropped                [sessionDropCauses]uint64 // by SessionDropCause
	SessionQueueMessages           int64
	SessionQueueBytes              int64
	RetainedMessages               int64
	QoS2Held                       int64
	QoS2Abandoned                  uint64
	QoS2MaxInflightPerClient       int64
	Subscriptions                  int64
	SessionExpiryShortened         uint64
	MaxSessionExpirySeconds        float64
}

// WireFigures are the whole broker's traffic (docs/operations.md "Metrics", "The wire").
type WireFigures struct {
	BytesReceived, BytesSent          uint64
	PublishesReceived, DeliveriesSent uint64
	DeliveriesRefused                 uint64
}

// DeliveryFigures are what broadcast delivery did (docs/operations.md "Metrics", "Publishing and delivery").
type DeliveryFigures struct {
	BroadcastPublished       uint64
	BroadcastUnmatched       uint64
	DeliveriesDropped        uint64
	DeliveriesExpired        uint64
	SharesHeld               uint64
	SharesDrained            uint64
	SharesDropped            [shareDropCauses]uint64           // by ShareDropCause
	SessionDeliveriesDropped [sessionDeliveryDropCauses]uint64 // by SessionDeliveryDropCause
}

// RefusalFigures are the refusals by reason (docs/operations.md "Metrics", "Publishing and delivery"). A reason is
// a name of the closed vocabulary (CodeName, and the few extras the broker
// adds); a reason listed twice is summed.
type RefusalFigures struct {
	Connections   []ReasonCount
	Publishes     []ReasonCount
	Subscriptions []ReasonCount
}

// ReasonCount is how many refusals one reason stands for.
type ReasonCount struct {
	Reason string
	Count  uint64
}

// Channel types, as the configuration writes them.
const (
	TypeAppend = "append"
	TypeLatest = "latest"
	TypeQueue  = "queue"
)

// ChannelFigures are one configured channel's figures (docs/operations.md "Metrics", "Channels"; docs/operations.md "Metrics", "Queues"). Which of them become series depends on Type: a figure a channel
// of that type does not have is left out, not shown as zero.
type ChannelFigures struct {
	Name     string
	Filter   string // as written, braces kept
	Type     string // TypeAppend, TypeLatest or TypeQueue
	Provider string
	// Published counts records stored in the channel by publishers (a
	// dead-letter channel's moves are not publishes).
	Published uint64
	// Records: append, next − floor; latest, the values held.
	Records int64
	// Bytes: append and queue.
	Bytes int64
	// NextOffset and FloorOffset: append.
	NextOffset, FloorOffset uint64
	// RetentionRemoved: append and latest.
	RetentionRemoved uint64
	// Positions is how many durable positions are stored (append), and
	// LowestPosition the lowest of them (meaningless when Positions is 0).
	Positions      int64
	LowestPosition uint64
	// Partitioned counts sessions whose subscription reaching the
	// channel declared a partition slice (append and latest).
	Partitioned  int64
	PositionLost uint64 // append
	Superseded   uint64 // latest
	Queue        QueueFigures
}

// QueueFigures are a queue channel's figures (docs/operations.md "Metrics", "Queues").
type QueueFigures struct {
	Depth, Inflight int64
	Delivered       uint64
	Acknowledged    uint64
	Returned        uint64
	Redelivered     uint64
	DeadLettered    uint64
	Expired         uint64
	RetainIgnored   uint64
}

// ProviderFigures are one storage provider's figures (docs/operations.md "Metrics", "Storage").
type ProviderFigures struct {
	Name     string
	Type     string // "memory" or "sqlite"
	Bytes    int64
	MaxBytes int64
	Errors   uint64
	// Commits is nil for a provider without publish transactions.
	Commits *CommitFigures
}

// CommitFigures are a provider's publish transactions (sqlite).
type CommitFigures struct {
	ByRecords, ByInterval, ByCommit, Unbatched uint64
	Records                                    uint64
	MaxRecords                                 int64
}

// RuntimeFigures are the Go runtime's, read with runtime/metrics at the
// recompute (docs/operations.md "Metrics", "The Go runtime").
type RuntimeFigures struct {
	HeapLiveBytes, HeapGoalBytes     float64
	GCCycles                         float64
	GCCPUSeconds, GCAssistCPUSeconds float64
	StackBytes                       float64
	AllocatedBytes, AllocatedObjects float64
	GOGCPercent, MemoryLimitBytes    float64
}
