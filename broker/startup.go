package broker

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"saguin.dev/broker/config"
)

// The startup statements (docs/operations.md "A start"): what the broker promises,
// said once at start in the order it takes each step, so an operator reads
// from the log what this instance keeps, for how long, and who may reach
// it — without the configuration file at hand.

// logStorageDeclared says what each provider is before anything is opened:
// the ones no channel, session store or retained store names (inert:
// nothing is created for them), the bounded ones, and whether anything is
// durable at all.
func (b *Broker) logStorageDeclared() {
	used := map[string]bool{b.cfg.Broker.Session.Storage: true, b.cfg.Broker.Retained.Storage: true}
	for _, ch := range b.cfg.Channels {
		used[ch.Storage] = true
	}
	names := make([]string, 0, len(b.cfg.Providers))
	for n := range b.cfg.Providers {
		names = append(names, n)
	}
	sort.Strings(names)
	durable := false
	var memoryBound int64
	memoryBounded := 0
	for _, n := range names {
		p := b.cfg.Providers[n]
		if !used[n] {
			b.log.Info("storage declared and unused: nothing is created for it", "provider", n, "type", p.Type)
			continue
		}
		if p.Type == "sqlite" || p.SnapshotDir != "" {
			durable = true
		}
		if p.MaxBytes > 0 {
			b.log.Info("storage bounded", "provider", n, "type", p.Type, "max_bytes", p.MaxBytes)
			if p.Type == "memory" {
				memoryBound += p.MaxBytes
				memoryBounded++
			}
		}
	}
	if memoryBounded > 1 {
		// Memory providers share the process: their bounds add up.
		b.log.Info("memory storage declared", "providers", memoryBounded, "max_bytes_total", memoryBound)
	}
	if !durable {
		b.log.Warn("no storage provider keeps anything: every channel is discarded at shutdown")
	}
}

// logPromises says, once storage is open, what the retained store, QoS 2
// and sessions keep (docs/operations.md "A start" items 4–6).
func (b *Broker) logPromises() {
	r := b.cfg.Broker.Retained
	if r.RetentionPeriod > 0 {
		b.log.Info("retained messages on broadcast topics are kept until their topic goes quiet",
			"provider", r.Storage, "retention_period", r.RetentionPeriod)
	} else {
		b.log.Info("retained messages on broadcast topics are kept until replaced or deleted", "provider", r.Storage)
	}
	q := b.cfg.Broker.QoS2
	b.log.Info("exactly-once publishing is offered", "max_inflight_per_client", q.MaxInflightPerClient, "expires_after", q.ExpiresAfter)
	s := b.cfg.Broker.Session
	b.log.Info("sessions are kept", "provider", s.Storage, "durability", durability(b.cfg.Providers[s.Storage]),
		"ack_commit_interval", s.AckCommitInterval, "max_session_expiry", b.cfg.Broker.Limits.MaxSessionExpiry)
}

// durability says what a provider keeps across a stop (invariant 14).
func durability(p config.Provider) string {
	switch {
	case p.Type == "sqlite":
		return fmt.Sprintf("a crash and kill -9; a power cut may lose about the last flush_interval (%s)", p.FlushInterval)
	case p.SnapshotDir != "":
		return "a graceful shutdown only (snapshot)"
	}
	return "nothing across a restart"
}

// logServing is the broker's one line once every door serves (docs/operations.md "A start" item 8): version, broker id, doors with their layers, protocols, how
// each door authenticates, and the channels; then one line per queue with
// how a worker consumes and answers it.
func (b *Broker) logServing(doors []string) {
	protocols := "3.1.1, 5"
	if b.cfg.Broker.MinProtocolVersion >= 5 {
		protocols = "5"
	}
	var auth []string
	for _, l := range b.cfg.Broker.Listeners {
		auth = append(auth, l.Name+": "+clientAuthentication(l))
	}
	var chans []string
	for _, ch := range b.cfg.Channels {
		chans = append(chans, ch.Name+" ("+ch.Type+")")
	}
	b.log.Info("saguin listening", "version", b.version, "listeners", strings.Join(doors, "; "), "protocols", protocols,
		"client_authentication", strings.Join(auth, "; "), "channels", strings.Join(chans, ", "))
	for _, ch := range b.cfg.Channels {
		if ch.Type != "queue" {
			continue
		}
		b.log.Info("queue ready", "channel", ch.Name, "subscribe", "$saguin/queue/"+ch.Name,
			"respond", "$saguin/queue/"+ch.Name+"/response", "visibility_timeout_s", int64(ch.VisibilityTimeout/time.Second),
			"max_attempts", ch.MaxAttempts, "backoff", ch.Backoff, "backoff_base_s", int64(ch.BackoffBase/time.Second))
	}
}

// clientAuthentication is how a door decides who a client is (docs/configuration.md "`broker.mqtt`"; docs/security.md "1. Certificates"): a required certificate, an optional one, a password file,
// anonymous clients — joined with "+" where several apply.
func clientAuthentication(l config.Listener) string {
	var ways []string
	if l.TLS != nil && l.TLS.ClientCAFile != "" {
		if l.TLS.RequireCertificate {
			ways = append(ways, "certificate")
		} else {
			ways = append(ways, "certificate (optional)")
		}
	}
	if l.ProxyProtocol {
		ways = append(ways, "proxied certificate")
	}
	if l.PasswordFile != "" {
		ways = append(ways, "password")
	}
	if l.AllowAnonymous && !certificateRequired(l) {
		ways = append(ways, "anonymous")
	}
	if len(ways) == 0 {
		return "none admitted"
	}
	return strings.Join(ways, "+")
}
