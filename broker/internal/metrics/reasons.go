package metrics

import "fmt"

// The reason label of the refusal counters (docs/operations.md "Metrics", "Publishing and delivery") is the name MQTT
// 5 gives the reason code answered, in lower case, plus a few of Sagüin's
// own where one code covers refusals an operator tells apart. A code has
// one byte, so the label has at most 256 values plus these.
const (
	// ReasonPublishRate: refused for limits.publish_rate or publish_bytes
	// (answered quota exceeded).
	ReasonPublishRate = "publish rate exceeded"
	// ReasonInflightAllowance: a QoS 2 publish past
	// broker.qos2.max_inflight_per_client (answered quota exceeded).
	ReasonInflightAllowance = "inflight allowance exceeded"
	// ReasonRejected: refused with no reason code.
	ReasonRejected = "rejected"
	// ReasonSessionStoreFull: a CONNECT whose Will the session store has
	// no room for (answered quota exceeded).
	ReasonSessionStoreFull = "session store full"
)

// CodeName is the reason label of an MQTT 5 reason code: its name in the
// MQTT 5 specification (§2.4), lower case. 0 is ReasonRejected (a
// refusal counted without a code); a code MQTT does not name keeps its
// number.
func CodeName(code byte) string {
	switch code {
	case 0x00:
		return ReasonRejected
	case 0x80:
		return "unspecified error"
	case 0x81:
		return "malformed packet"
	case 0x82:
		return "protocol error"
	case 0x83:
		return "implementation specific error"
	case 0x84:
		return "unsupported protocol version"
	case 0x85:
		return "client identifier not valid"
	case 0x86:
		return "bad user name or password"
	case 0x87:
		return "not authorized"
	case 0x88:
		return "server unavailable"
	case 0x89:
		return "server busy"
	case 0x8A:
		return "banned"
	case 0x8B:
		return "server shutting down"
	case 0x8C:
		return "bad authentication method"
	case 0x8D:
		return "keep alive timeout"
	case 0x8E:
		return "session taken over"
	case 0x8F:
		return "topic filter invalid"
	case 0x90:
		return "topic name invalid"
	case 0x91:
		return "packet identifier in use"
	case 0x92:
		return "packet identifier not found"
	case 0x93:
		return "receive maximum exceeded"
	case 0x94:
		return "topic alias invalid"
	case 0x95:
		return "packet too large"
	case 0x96:
		return "message rate too high"
	case 0x97:
		return "quota exceeded"
	case 0x98:
		return "administrative action"
	case 0x99:
		return "payload format invalid"
	case 0x9A:
		return "retain not supported"
	case 0x9B:
		return "qos not supported"
	case 0x9C:
		return "use another server"
	case 0x9D:
		return "server moved"
	case 0x9E:
		return "shared subscriptions not supported"
	case 0x9F:
		return "connection rate exceeded"
	case 0xA0:
		return "maximum connect time"
	case 0xA1:
		return "subscription identifiers not supported"
	case 0xA2:
		return "wildcard subscriptions not supported"
	}
	return fmt.Sprintf("code 0x%02x", code)
}
