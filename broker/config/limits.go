package config

import (
	"fmt"
	"math"
	"time"
)

// Defaults of broker.limits. Those marked "decided" are docs/configuration.md open
// points; rfcs/0002-configuration-decisions.md gives the reasons.
const (
	DefaultMaxMessageSize    = 1 << 20 // decided: 1MiB, as bridge.md quotes
	DefaultMaxTopicLength    = 1024    // decided
	DefaultMaxTopicLevels    = 200
	DefaultMaxClientIDLength = 256
	DefaultMaxHeaderCount    = 32      // decided
	DefaultMaxHeaderBytes    = 8 << 10 // decided: 8KiB
	DefaultMaxConnections    = 10000   // decided
	DefaultMaxSubscriptions  = 10000
	DefaultMaxSessionExpiry  = 30 * Day
	DefaultWriteTimeout      = 5 * time.Second
	DefaultConnectTimeout    = 10 * time.Second
	DefaultMaxConnectSize    = 100 << 10 // or max_message_size if smaller
	DefaultMaxConnectRate    = 500
	DefaultSessionQueueBytes = 1 << 20 // or max_message_size if larger

	// MaxPacketSize is the largest packet MQTT can frame (a four-byte
	// variable-length integer).
	MaxPacketSize = 268435455
	// maxSessionExpirySeconds: MQTT's Session Expiry Interval is a four-byte
	// integer whose top value means "never"; a cap must be below it.
	maxSessionExpirySeconds = math.MaxUint32 - 1
)

// limitsValid records which limits parsed, so cross-checks that depend on
// a limit stay quiet when that limit is itself a finding (one mistake, one
// finding).
type limitsValid struct {
	messageSize, headerBytes, topicLength, topicLevels, connections bool
}

func defaultLimits() Limits {
	return Limits{
		MaxMessageSize:    DefaultMaxMessageSize,
		MaxTopicLength:    DefaultMaxTopicLength,
		MaxTopicLevels:    DefaultMaxTopicLevels,
		MaxClientIDLength: DefaultMaxClientIDLength,
		MaxHeaderCount:    DefaultMaxHeaderCount,
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		MaxConnections:    DefaultMaxConnections,
		MaxSubscriptions:  DefaultMaxSubscriptions,
		MaxSessionExpiry:  DefaultMaxSessionExpiry,
		WriteTimeout:      DefaultWriteTimeout,
		ConnectTimeout:    DefaultConnectTimeout,
		MaxConnectSize:    min(DefaultMaxConnectSize, DefaultMaxMessageSize),
		MaxConnectRate:    DefaultMaxConnectRate,
		SessionQueueBytes: max(DefaultSessionQueueBytes, DefaultMaxMessageSize),
	}
}

// limits reads broker.limits (docs/configuration.md "`broker.limits`").
func (l *loader) limits(v val, present bool) (Limits, limitsValid) {
	lim := defaultLimits()
	ok := limitsValid{true, true, true, true, true}
	if !present {
		return lim, ok
	}
	m, isMap := l.mapOf(v)
	if !isMap {
		return lim, ok
	}
	intKey := func(key string, lo, hi int64, fix string, dst *int) bool {
		kv, has := m.get(key)
		if !has {
			return true
		}
		n, good := l.integer(kv, lo, hi, fix)
		if good {
			*dst = int(n)
		}
		return good
	}

	if kv, has := m.get("max_message_size"); has {
		n, _, good := l.size(kv, sizeKey{
			noneFix:  "max_message_size is always bounded; write a size like 1MiB, at most 268435455 bytes (MQTT's largest packet)",
			zeroFix:  "a zero message size admits nothing; write a size like 1MiB",
			min:      1,
			max:      MaxPacketSize,
			rangeFix: "MQTT cannot frame a packet larger than 268435455 bytes (256MiB less one byte); write 256MiB or less, minus a byte",
		})
		ok.messageSize = good
		if good {
			lim.MaxMessageSize = n
		}
	}
	ok.topicLength = intKey("max_topic_length", 1, 65535,
		"it is a byte count from 1 to 65535 (MQTT's longest topic)", &lim.MaxTopicLength)
	if kv, has := m.get("max_topic_levels"); has {
		if s, _ := kv.scalarText(); s == "none" {
			l.add(kv, "max_topic_levels is always bounded; write a number of levels, 1 or more (default %d)", DefaultMaxTopicLevels)
			ok.topicLevels = false
		} else {
			ok.topicLevels = intKey("max_topic_levels", 1, 65535,
				fmt.Sprintf("it is a number of levels from 1 to 65535 (default %d)", DefaultMaxTopicLevels), &lim.MaxTopicLevels)
		}
	}
	intKey("max_client_id_length", 23, 65535,
		"it is from 23 to 65535: MQTT obliges a broker to accept client ids of 23 bytes", &lim.MaxClientIDLength)
	intKey("max_header_count", 0, 65535,
		"it is a number of User Properties from 0 to 65535", &lim.MaxHeaderCount)
	if kv, has := m.get("max_header_bytes"); has {
		n, _, good := l.size(kv, sizeKey{
			noneFix:  "max_header_bytes is always bounded; write a size like 8KiB",
			max:      MaxPacketSize,
			rangeFix: "it is at most 268435455 bytes, MQTT's largest packet",
		})
		ok.headerBytes = good
		if good {
			lim.MaxHeaderBytes = n
		}
	}
	ok.connections = intKey("max_connections", 1, math.MaxInt32,
		"it is a number of connections, 1 or more", &lim.MaxConnections)
	intKey("max_subscriptions", 1, math.MaxInt32,
		"it is a number of subscriptions per client, 1 or more", &lim.MaxSubscriptions)
	// invariant 13: no "none": a session a client never returns to still ends.
	if kv, has := m.get("max_session_expiry"); has {
		d, _, good := l.duration(kv, durKey{
			noneFix:  "a session that never expires is not bounded (invariant 13); write a duration like 30d",
			max:      maxSessionExpirySeconds * time.Second,
			rangeFix: "MQTT's Session Expiry Interval holds at most 4294967294 seconds (about 136 years); write less",
		})
		if good {
			lim.MaxSessionExpiry = d
		}
	}
	if kv, has := m.get("max_keepalive"); has {
		d, none, good := l.duration(kv, durKey{
			none:     true,
			zeroFix:  "a keep-alive ceiling of zero would switch keep-alive off for everyone; write a duration like 5m, or none for no ceiling",
			max:      65535 * time.Second,
			rangeFix: "longer than MQTT can express, which is 65535 seconds or about 18 hours; write `none` for no ceiling",
		})
		if good && !none {
			lim.MaxKeepalive = d
		}
	}
	if kv, has := m.get("publish_rate"); has {
		if s, _ := kv.scalarText(); s == "none" {
			lim.PublishRate = 0
		} else if n, good := l.integer(kv, 1, math.MaxInt32,
			"it is messages per second, 1 or more; omit the key (or write none) for no bound"); good {
			lim.PublishRate = int(n)
		}
	}
	if kv, has := m.get("publish_bytes"); has {
		n, none, good := l.size(kv, sizeKey{
			none:    true,
			zeroFix: "a zero byte rate admits nothing; write a size per second like 1MiB, or none for no bound",
		})
		if good && !none {
			lim.PublishBytes = n
		}
	}
	if kv, has := m.get("write_timeout"); has {
		d, none, good := l.duration(kv, durKey{
			none:      true,
			subSecond: true,
			zeroFix:   "a zero write timeout would disconnect every client on its first write; write a duration like 5s, or none for no ceiling",
		})
		if good {
			lim.WriteTimeout = d
			if none {
				lim.WriteTimeout = 0
			}
		}
	}
	if kv, has := m.get("connect_timeout"); has {
		d, _, good := l.duration(kv, durKey{
			noneFix:  "connect_timeout is always bounded (a socket that never sends CONNECT would hold its slot); write a duration of 1s or more",
			min:      time.Second,
			rangeFix: "it is at least 1s",
		})
		if good {
			lim.ConnectTimeout = d
		}
	}
	connectSizeSet := false
	if kv, has := m.get("max_connect_size"); has {
		n, _, good := l.size(kv, sizeKey{
			noneFix:  "max_connect_size is always bounded; write a size like 100KiB",
			zeroFix:  "a zero CONNECT size admits no client; write a size like 100KiB",
			min:      1,
			rangeFix: "it is at least 1 byte",
		})
		if good {
			lim.MaxConnectSize = n
			connectSizeSet = true
			if ok.messageSize && n > lim.MaxMessageSize {
				l.add(kv, "it may not exceed broker.limits.max_message_size (%s); lower it, or raise max_message_size",
					FormatBytes(lim.MaxMessageSize))
			}
		}
	}
	if !connectSizeSet {
		lim.MaxConnectSize = min(DefaultMaxConnectSize, lim.MaxMessageSize)
	}
	if kv, has := m.get("max_connect_rate"); has {
		if s, _ := kv.scalarText(); s == "none" {
			lim.MaxConnectRate = 0
		} else if n, good := l.integer(kv, 1, math.MaxInt32,
			"it is connections per second per listener, 1 or more, or none for no bound"); good {
			lim.MaxConnectRate = int(n)
		}
	}
	queueSet := false
	// invariant 13: no "none": what a session is owed is always bounded.
	if kv, has := m.get("session_queue_bytes"); has {
		n, _, good := l.size(kv, sizeKey{
			noneFix: "a session's queue is always bounded (invariant 13); write a size like 1MiB, at least max_message_size",
			zeroFix: "a session queue must hold at least one message; write a size at least broker.limits.max_message_size",
		})
		if good {
			lim.SessionQueueBytes = n
			queueSet = true
			if ok.messageSize && n < lim.MaxMessageSize {
				l.add(kv, "it is below broker.limits.max_message_size (%s), so a largest message could never be queued; write %s or more",
					FormatBytes(lim.MaxMessageSize), FormatBytes(lim.MaxMessageSize))
			}
		}
	}
	if !queueSet {
		lim.SessionQueueBytes = max(DefaultSessionQueueBytes, lim.MaxMessageSize)
	}
	m.finish("max_message_size", "max_topic_length", "max_topic_levels", "max_client_id_length",
		"max_header_count", "max_header_bytes", "max_connections", "max_subscriptions",
		"max_session_expiry", "max_keepalive", "publish_rate", "publish_bytes", "write_timeout",
		"connect_timeout", "max_connect_size", "max_connect_rate", "session_queue_bytes")
	return lim, ok
}
