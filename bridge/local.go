package bridge

import "context"

// Local is what a link needs of the broker it serves, defined here by the
// link's use of it; the broker implements it (the arrow points broker →
// bridge, never back).
type Local interface {
	// Store publishes rec through the broker's ordinary publish path —
	// channel resolution, every bound, the ACL for the bridge's identity —
	// and returns once the outcome is known: Stored when the record is
	// held as a QoS 1/2 publish would be before its PUBACK, Retry when it
	// cannot be held now but may be later (a full channel: the link holds
	// the peer back by not acknowledging), Never when it can never be
	// (too deep, too large, refused for good), with the cause to count.
	// Store is called from one goroutine per link, in receive order.
	Store(ctx context.Context, rec Record) (Outcome, string)
}

// Record is one message crossing the link.
type Record struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
	// ID is the record's saguin-id: adopted from the peer when it sent
	// one (a Sagüin peer), else "" for the broker to give one.
	ID string
	// Properties the record carries across, as MQTT 5 names them.
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	PayloadFormat   *byte
	MessageExpiry   *uint32
	User            []UserProperty
	// Bridge names the link it came over: a record that arrived over a
	// bridge never goes out over one (loop prevention).
	Bridge string
}

// UserProperty is one MQTT 5 User Property, in order.
type UserProperty struct{ Key, Value string }

// Outcome is what Store made of a record.
type Outcome uint8

const (
	// Stored: held; the link acknowledges it to the peer.
	Stored Outcome = iota + 1
	// Retry: not held now (a full channel); the link tries again and holds
	// the peer back meanwhile.
	Retry
	// Never: can never be held; the link acknowledges it so the flow goes
	// on, and counts it with its cause.
	Never
)

// IDProperty is the User Property carrying a record's identity across
// brokers (docs/bridge.md).
const IDProperty = "saguin-id"
