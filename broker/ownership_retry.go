package broker

import (
	"sort"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// Invariant 18's second exception: a clean DISCONNECT has no answer to
// refuse it with, and its client closes the connection whether or not the
// broker does (MQTT-3.14.4-2). Where the session store refuses what the
// DISCONNECT changed — its Will withdrawn, its expiry — the broker closes all
// the same, keeps what was asked in memory (the session), and writes the
// record again every second (on the broker's clock, with the Will loop's
// tick) until it lands. A crash before then loses it, and the log names the
// client. The same holds for the record written when a connection ends
// without a DISCONNECT, and after a Will fired.
//
// Positions need nothing here: one the store refused stays dirty on its
// consumer and the position flusher writes it again at every
// broker.session.ack_commit_interval, away sessions included.

// storeSessionOrRetry stores session s with connection cl's subscriptions;
// a refusal is logged, naming the client and what was asked, and queued for
// the retry.
func (b *Broker) storeSessionOrRetry(s *session, cl *mqtt.Client, at string) {
	err := b.storeSessionOf(s, cl)
	b.claims.mu.Lock()
	defer b.claims.mu.Unlock()
	if err == nil {
		// What was queued is in this write too: it wrote the session as it
		// stands now.
		if b.claims.unstored[s.id] == s {
			delete(b.claims.unstored, s.id)
		}
		return
	}
	b.log.Error("the session store refused a session write: the broker keeps it in memory and writes it again every second until it lands; a crash before then loses it",
		"client", s.id, "at", at, "error", err)
	if b.claims.unstored == nil {
		b.claims.unstored = make(map[string]*session)
	}
	// invariant 18: a session write the store refused is kept and written again every second until it lands.
	b.claims.unstored[s.id] = s
}

// rewriteSessions writes again every session record the store refused. A
// session that has ended meanwhile, or was replaced by a new one for its id,
// is no longer written: ending removes its record, and the new session
// writes its own.
func (b *Broker) rewriteSessions() {
	b.claims.mu.Lock()
	if len(b.claims.unstored) == 0 {
		b.claims.mu.Unlock()
		return
	}
	ids := make([]string, 0, len(b.claims.unstored))
	for id := range b.claims.unstored {
		ids = append(ids, id)
	}
	b.claims.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		b.claims.mu.Lock()
		s := b.claims.unstored[id]
		b.claims.mu.Unlock()
		if s == nil {
			continue
		}
		// The substrate's client holds the session's subscriptions, live or
		// away; without it the session ended.
		cl, ok := b.mqtt.Clients.Get(id)
		if b.sessionOf(id) != s || !ok {
			b.dropRewrite(s)
			continue
		}
		if err := b.storeSessionOf(s, cl); err != nil {
			b.log.Warn("the session store still refuses a session write; trying again in a second",
				"client", id, "error", err)
			continue
		}
		b.dropRewrite(s)
		b.log.Info("session write landed after the store refused it", "client", id)
	}
}

func (b *Broker) dropRewrite(s *session) {
	b.claims.mu.Lock()
	defer b.claims.mu.Unlock()
	if b.claims.unstored[s.id] == s {
		delete(b.claims.unstored, s.id)
	}
}
