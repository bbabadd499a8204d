package config

import (
	"strings"
	"time"
)

// parsed is the broker: block while it is being read, with what the
// channel checks need beside the Broker itself.
type parsed struct {
	Broker
	providers     map[string]Provider
	providerOrder []string
	limitsOK      limitsValid
	// storageOK: broker.storage parsed well enough for channel defaults.
	storageOK bool
	// named records which providers something names (inert-provider warning).
	named map[string]bool
	// memoryBounds is each memory provider's max_bytes as written, in
	// file order (wordsize.go).
	memoryBounds []memoryBound
}

// Defaults of the other broker blocks (docs/configuration.md "`broker`").
const (
	DefaultQoS2MaxInflight      = 20
	DefaultQoS2ExpiresAfter     = 5 * time.Minute
	DefaultAckCommitInterval    = 200 * time.Millisecond
	DefaultMinScrapeInterval    = 60 * time.Second
	DefaultDefaultListenAddress = ":1883"
)

func (l *loader) broker(v val, present bool) *parsed {
	p := &parsed{
		providers: map[string]Provider{},
		named:     map[string]bool{},
		Broker: Broker{
			LogLevel:           "info",
			MinProtocolVersion: 4,
			QoS2:               QoS2{MaxInflightPerClient: DefaultQoS2MaxInflight, ExpiresAfter: DefaultQoS2ExpiresAfter},
			Session:            Session{AckCommitInterval: DefaultAckCommitInterval},
		},
	}
	p.Limits, p.limitsOK = defaultLimits(), limitsValid{true, true, true, true, true}
	if !present {
		return p
	}
	m, ok := l.mapOf(v)
	if !ok {
		return p
	}

	if kv, has := m.get("id"); has {
		if s, good := l.str(kv, "the broker's name, used in log lines and saguin_build_info"); good {
			if strings.TrimSpace(s) == "" {
				l.add(kv, "it is empty; write the broker's name, used in log lines and saguin_build_info{broker_id}")
			}
			p.ID = s
		}
	} else {
		m.missing("id", "write the broker's name, used in log lines and saguin_build_info{broker_id}")
	}
	if kv, has := m.get("log_level"); has {
		if s, good := l.enum(kv, []string{"debug", "info", "warn", "error"}, "omit the key for info"); good {
			p.LogLevel = s
		}
	}
	if kv, has := m.get("pid_file"); has {
		if s, good := l.absPath(kv, "the pid file"); good {
			p.PIDFile = s
		}
	}

	lv, hasLimits := m.get("limits")
	p.Limits, p.limitsOK = l.limits(lv, hasLimits)

	mqttV, hasMQTT := m.get("mqtt")
	l.mqtt(mqttV, hasMQTT, p)
	if ov, has := m.get("operations"); has {
		p.Operations = l.operations(ov, p)
	}
	l.checkDoors(p)

	sv, hasStorage := m.get("storage")
	l.storage(sv, hasStorage, p, m)

	if rv, has := m.get("retained"); has {
		l.retained(rv, p)
	}
	if qv, has := m.get("qos2"); has {
		l.qos2(qv, p)
	}
	if shv, has := m.get("share"); has {
		l.share(shv, p)
	}
	if sev, has := m.get("session"); has {
		l.session(sev, p)
	}
	if p.Retained.Storage == "" {
		p.Retained.Storage = p.DefaultProvider
	}
	if p.Session.Storage == "" {
		p.Session.Storage = p.DefaultProvider
	}
	p.named[p.Retained.Storage] = true
	p.named[p.Session.Storage] = true
	m.refuse("log_file", "there is no log file; the broker logs to stdout only (redirect it, or let the service manager collect it); remove the key")
	m.finish("id", "log_level", "pid_file", "mqtt", "operations", "limits", "storage", "retained", "qos2", "share", "session")
	return p
}

// providerRef reads a key naming a provider, checking it exists.
func (l *loader) providerRef(v val, p *parsed) (string, bool) {
	s, ok := l.str(v, "a provider name")
	if !ok {
		return "", false
	}
	if _, exists := p.providers[s]; !exists {
		if len(p.providerOrder) == 0 {
			// The missing providers are a finding already; one mistake, one finding.
			return "", false
		}
		{
			l.add(v, "no provider has this name; the providers are %s (define more under broker.storage.providers)", orList(p.providerOrder))
		}
		return "", false
	}
	return s, true
}

func (l *loader) retained(v val, p *parsed) {
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	if kv, has := m.get("storage"); has {
		if s, good := l.providerRef(kv, p); good {
			p.Retained.Storage = s
		}
	}
	if kv, has := m.get("retention_period"); has {
		d, none, good := l.duration(kv, durKey{none: true, zeroFix: zeroRetention})
		if good && !none {
			p.Retained.RetentionPeriod = d
		}
	}
	for _, k := range []string{"retention_bytes", "max_bytes"} {
		m.refuse(k, "the retained store is bounded by its provider's max_bytes, not by a key of its own; remove it (and set max_bytes on the provider named by broker.retained.storage)")
	}
	m.finish("storage", "retention_period")
}

func (l *loader) qos2(v val, p *parsed) {
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	if kv, has := m.get("max_inflight_per_client"); has {
		if n, good := l.integer(kv, 1, 65535, "it is a count of held exactly-once publishes per client, from 1 to 65535"); good {
			p.QoS2.MaxInflightPerClient = int(n)
		}
	}
	if kv, has := m.get("expires_after"); has {
		d, _, good := l.duration(kv, durKey{
			noneFix: "a held exactly-once publish must expire (invariant 13); write a duration like 5m",
			zeroFix: "zero would drop every held publish before its PUBREL; write a duration like 5m",
		})
		if good {
			p.QoS2.ExpiresAfter = d
		}
	}
	m.refuse("max_bytes", "held exactly-once publishes count against their channel's provider max_bytes; there is no separate bound and no way to switch QoS 2 off; remove the key")
	m.finish("max_inflight_per_client", "expires_after")
}

func (l *loader) share(v val, p *parsed) {
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	if kv, has := m.get("expires_after"); has {
		d, none, good := l.duration(kv, durKey{
			none:    true,
			zeroFix: "zero would drop every shared backlog at once; write a duration like 1h, or none to keep it while a member's session lives",
		})
		if good && !none {
			p.Share.ExpiresAfter = d
		}
	}
	m.finish("expires_after")
}

func (l *loader) session(v val, p *parsed) {
	m, ok := l.mapOf(v)
	if !ok {
		return
	}
	if kv, has := m.get("storage"); has {
		if s, good := l.providerRef(kv, p); good {
			p.Session.Storage = s
		}
	}
	if kv, has := m.get("ack_commit_interval"); has {
		d, _, good := l.duration(kv, durKey{
			subSecond: true,
			noneFix:   "acknowledgements are always written within a bound (invariant 18); write a duration from 10ms to 1s",
			min:       10 * time.Millisecond,
			max:       time.Second,
			rangeFix:  "it is from 10ms to 1s",
			zeroFix:   "it is from 10ms to 1s",
		})
		if good {
			p.Session.AckCommitInterval = d
		}
	}
	m.refuse("max_bytes", "sessions count against the max_bytes of the provider named by broker.session.storage; there is no separate bound; remove the key")
	m.finish("storage", "ack_commit_interval")
}
