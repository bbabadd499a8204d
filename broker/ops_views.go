package broker

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/internal/ops"
	"saguin.dev/broker/passwd"
	"saguin.dev/storage"
)

// The operations listener's answers (ops.Source). Each copies what it
// needs under the locks it takes — one at a time, as doc.go's lock order
// allows: Broker.mu for the sessions map, then each session.mu, then each
// consumer.mu or queueEngine.mu — and lets go before anything is sorted
// or formatted. Storage is read with no lock of ours held. Each type is
// read through the view it builds of itself (session.view,
// consumer.position, channel.view, queueEngine.jobViews): this file selects
// no field of another type that keeps a lock or an atomic
// (rfcs/delivery-seam.md "The session behind methods").

// PublishPathOpen is /health's probe (health.go).
func (o opsSource) PublishPathOpen(within time.Duration) bool { return o.publishPathOpen(within) }

// Operators is the operator file at path as the authority in force holds it.
func (o opsSource) Operators(path string) *passwd.Table {
	if a := o.auth.Load(); a != nil {
		return a.operators[path]
	}
	return nil
}

// ExplainACL is /v1/operations/acl: the ACL in force (SIGUSR1 included),
// or everything allowed without one.
func (o opsSource) ExplainACL(user string, clientID *string) acl.Explanation {
	a := o.auth.Load()
	if a == nil || a.rules == nil {
		return acl.NoACL(user)
	}
	return a.rules.Explain(user, clientID)
}

// Users is /v1/operations/users: each MQTT door's password file's users
// (as the authority in force holds them: read at start, or by the last
// SIGUSR1 that loaded), whether it admits anonymous clients, and what it
// does with certificates. Operators are never listed.
func (o opsSource) Users(max int) ops.Users {
	a := o.auth.Load()
	out := ops.Users{Users: []string{}, Listeners: make(map[string]ops.Door, len(o.cfg.Broker.Listeners))}
	all := map[string]bool{}
	for _, l := range o.cfg.Broker.Listeners {
		var names []string
		if t := a.passwords[l.PasswordFile]; l.PasswordFile != "" && t != nil {
			names = t.Users() // sorted
		}
		for _, n := range names {
			all[n] = true
		}
		cert := "none" // docs/operations.md "The routes": a unix door is always none
		if l.Kind != "unix" {
			cert = o.layers[l.ID].ClientCertificates()
		}
		shown := capped(names, max)
		out.Listeners[l.Name] = ops.Door{Users: shown, Total: len(names), Returned: len(shown),
			AnonymousAllowed: l.AllowAnonymous, Certificate: cert}
		out.AnonymousAllowed = out.AnonymousAllowed || l.AllowAnonymous
	}
	names := slices.Sorted(maps.Keys(all))
	out.Users, out.Total = capped(names, max), len(names)
	out.Returned = len(out.Users)
	return out
}

func capped(s []string, max int) []string {
	if s == nil {
		return []string{}
	}
	return s[:min(len(s), max)]
}

// heldSession is what Sessions copies of one session under its lock.
type heldSession = sessionView

// Sessions is /v1/operations/sessions: held sessions with no connection
// first, longest away first, then the connected ones by client id.
func (o opsSource) Sessions(max int) ops.Sessions {
	var rows []heldSession
	for _, s := range o.heldSessions() {
		rows = append(rows, s.view())
	}
	out := ops.Sessions{Total: len(rows)}
	for _, h := range rows {
		if h.cl != nil {
			out.Connected++
		}
	}
	out.Offline = out.Total - out.Connected
	slices.SortFunc(rows, func(a, b heldSession) int {
		if c := cmp.Compare(boolRank(a.cl != nil), boolRank(b.cl != nil)); c != 0 {
			return c
		}
		if c := a.lastSeen.Compare(b.lastSeen); a.cl == nil && c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	rows = rows[:min(len(rows), max)]
	out.Sessions = make([]ops.Session, 0, len(rows))
	for _, h := range rows {
		out.Sessions = append(out.Sessions, o.sessionView(h))
	}
	out.Returned = len(out.Sessions)
	return out
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sessionView formats one session. A connection's own facts are read
// from the substrate's client, set at its CONNECT; a held session's
// subscriptions from the substrate's record of it.
func (o opsSource) sessionView(h heldSession) ops.Session {
	v := ops.Session{ClientID: h.id, Connected: h.cl != nil, Protocol: protocolName(h.protocol),
		ExpiresAfter: int64(h.expiry / time.Second)}
	if cl := h.cl; cl != nil {
		user, listener, keepalive, clean := userOf(cl), cl.Net.Listener, int(cl.State.Keepalive), cl.Properties.Clean
		v.User, v.Listener, v.Keepalive, v.CleanStart = &user, &listener, &keepalive, &clean
		if a := remoteOf(cl); a != nil {
			remote := a.String()
			v.Remote = &remote
		}
		v.Subscriptions = cl.State.Subscriptions.Len()
	} else {
		v.LastSeen = ops.TimeOf(h.lastSeen)
		if cl, ok := o.mqtt.Clients.Get(h.id); ok {
			v.Subscriptions = cl.State.Subscriptions.Len()
		}
	}
	for _, f := range slices.Sorted(maps.Keys(h.declared)) {
		m := h.declared[f]
		v.Partitions = append(v.Partitions, ops.Slice{Filter: f, Count: m.Partitions(), Indices: m.Indexes()})
	}
	return v
}

func protocolName(v byte) string {
	if v == 5 {
		return "5"
	}
	return "3.1.1"
}

// readerAt is one reader's place on one channel.
type readerAt struct {
	offset   uint64
	lastSeen time.Time
}

// Consumers is /v1/operations/consumers: every append channel's readers
// — their stored positions, and the live position of every consumer the
// broker holds in memory in place of its stored one — furthest behind
// first; the channels whose worst reader is furthest behind first.
func (o opsSource) Consumers(max int) ops.Consumers {
	now := o.clock.Now()
	live := map[string]map[string]readerAt{} // channel → reader → place
	for _, s := range o.heldSessions() {
		v := s.view()
		seen := v.lastSeen
		if v.cl != nil {
			seen = now // connected: seen now
		}
		for name, c := range v.consumers {
			pos := c.position()
			if live[name] == nil {
				live[name] = map[string]readerAt{}
			}
			live[name][s.reader()] = readerAt{offset: pos, lastSeen: seen}
		}
	}
	var chans []ops.ConsumerChannel
	var worst []uint64
	for _, name := range slices.Sorted(maps.Keys(o.channels)) {
		ch := o.channels[name]
		v := ch.view()
		if v.store != appendStore {
			continue
		}
		c, w := o.channelReaders(ch, v, live[name], max)
		chans = append(chans, c)
		worst = append(worst, w)
	}
	order := make([]int, len(chans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(worst[b], worst[a]) })
	out := ops.Consumers{Channels: make([]ops.ConsumerChannel, 0, min(len(order), max)), Total: len(chans)}
	for _, i := range order[:min(len(order), max)] {
		out.Channels = append(out.Channels, chans[i])
	}
	out.Returned = len(out.Channels)
	return out
}

// channelReaders is one append channel's readers, and how far its worst is
// behind; v is the channel's view.
func (o opsSource) channelReaders(ch *channel, v channelView, live map[string]readerAt, max int) (ops.ConsumerChannel, uint64) {
	next := v.next
	readers := map[string]readerAt{}
	stored, err := ch.storedPositions()
	if err != nil {
		o.log.Error("operations: reading a channel's stored positions; showing the live ones only", "channel", v.name, "error", err)
	}
	for _, p := range stored {
		readers[p.Reader] = readerAt{offset: p.Offset, lastSeen: p.LastSeen}
	}
	maps.Copy(readers, live)
	positions := make([]ops.Position, 0, len(readers))
	for reader, at := range readers {
		positions = append(positions, ops.Position{Reader: reader, Offset: at.offset, Behind: behind(next, at.offset),
			LastSeen: ops.TimeOf(at.lastSeen)})
	}
	slices.SortFunc(positions, func(a, b ops.Position) int {
		if c := cmp.Compare(b.Behind, a.Behind); c != 0 {
			return c
		}
		return strings.Compare(a.Reader, b.Reader)
	})
	var worst uint64
	if len(positions) > 0 {
		worst = positions[0].Behind
	}
	shown := positions[:min(len(positions), max)]
	return ops.ConsumerChannel{Channel: v.name, NextOffset: next, Consumers: len(positions), Returned: len(shown),
		Positions: shown}, worst
}

// behind is how many offsets a reader at offset has yet to read.
func behind(next, offset uint64) uint64 {
	if offset >= next {
		return 0
	}
	return next - offset
}

// Queue is /v1/operations/queues/<channel>: the oldest unresolved jobs —
// a queue serves them oldest first, so the oldest is the one waiting
// longest — with each one's state from the queue's engine. Never a
// payload.
func (o opsSource) Queue(name string, max int) (ops.Queue, bool, error) {
	q := o.engines[name]
	if q == nil {
		return ops.Queue{}, false, nil
	}
	items, err := q.unresolved(max)
	if err != nil {
		return ops.Queue{}, true, err
	}
	out := ops.Queue{Channel: name, Unresolved: q.depth(), Records: make([]ops.QueueRecord, len(items))}
	for i, j := range q.jobViews(items) {
		out.Records[i] = queueRecord(items[i], j)
	}
	out.Returned = len(out.Records)
	return out, true, nil
}

// queueRecord is one job; j is its delivery's view (queueEngine.jobViews).
func queueRecord(it storage.QueueItem, j jobView) ops.QueueRecord {
	r := ops.QueueRecord{Offset: it.Offset, Topic: it.Topic, Attempts: it.Attempts, State: "waiting",
		FirstSeen: ops.TimeOf(it.Timestamp), LastSeen: ops.TimeOf(it.LastDelivered)}
	switch {
	case !j.out:
	case j.leased:
		holder := j.holder
		r.State, r.Holder, r.LeaseUntil = "leased", &holder, ops.TimeOf(j.leaseUntil)
	default:
		r.State = "delivering"
	}
	return r
}

// Refused is /v1/operations/refused (refused_record.go).
func (o opsSource) Refused(max int) ops.Refused { return o.refusedClients.view(max) }

// PositionLost is /v1/operations/position-lost (position_record.go).
func (o opsSource) PositionLost(max int) ops.PositionLost { return o.positionsLost.view(max) }
