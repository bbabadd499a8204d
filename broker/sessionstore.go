package broker

import (
	"encoding/json"
	"fmt"
	"saguin.dev/broker/partition"
	"slices"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/metrics"
	"saguin.dev/storage"
)

// sessionStoreName is the value store durable sessions live in, one value per
// client id, on the provider broker.session.storage names.
const sessionStoreName = "$saguin/sessions"

// sessionFormat is the version of a stored session's JSON. A record of any
// other version is a start-up error naming the client: never silently
// dropped (invariant 14's rule for a snapshot applies to what it holds).
const sessionFormat = 1

// maxStoredSubscriptions bounds what one stored session may hold, so a
// damaged or hostile record cannot make a start allocate without limit
// (invariant 13).
const maxStoredSubscriptions = 10000

// storedSession is what survives of a durable session (one whose Session
// Expiry Interval outlives its connection): enough for a CONNECT with Clean
// Start 0 after a restart to be answered Session Present 1 and served as
// before. Positions are stored by each channel's log, not here.
type storedSession struct {
	Format   int   `json:"format"`
	Protocol byte  `json:"protocol"`
	Expiry   int64 `json:"expiry_s"` // granted, capped by limits.max_session_expiry
	// LastSeen is when the session's last connection ended (Unix ns); zero
	// while connected. A session found connected at start ended when the
	// broker stopped, which its start stands in for.
	LastSeen      int64             `json:"last_seen,omitempty"`
	Subscriptions []storedSubscribe `json:"subscriptions"`
	// Will is the session's Last Will, with the moment it falls due once
	// its wait began. A restart keeps it either way (docs/channels.md "Last
	// Will"): one with a moment resumes its wait, or is published at once
	// if the moment passed; one without (its client was connected when
	// the broker stopped) waits on the restored session until the client
	// returns and replaces it, or the session expires and publishes it.
	Will *storedWill `json:"will,omitempty"`
}

type storedWill struct {
	Topic           string                 `json:"topic"`
	Payload         []byte                 `json:"payload,omitempty"`
	QoS             byte                   `json:"qos"`
	Retain          bool                   `json:"retain,omitempty"`
	PayloadFormat   *byte                  `json:"payload_format,omitempty"`
	MessageExpiry   uint32                 `json:"message_expiry,omitempty"`
	ContentType     string                 `json:"content_type,omitempty"`
	ResponseTopic   string                 `json:"response_topic,omitempty"`
	CorrelationData []byte                 `json:"correlation_data,omitempty"`
	User            []packets.UserProperty `json:"user,omitempty"`
	Delay           int64                  `json:"delay_s,omitempty"`
	Due             int64                  `json:"due,omitempty"` // Unix ns; 0: its connection was live
	Username        string                 `json:"username,omitempty"`
}

func storeWill(w *will) *storedWill {
	if w == nil {
		return nil
	}
	sw := &storedWill{Topic: w.topic, Payload: w.payload, QoS: w.qos, Retain: w.retain,
		MessageExpiry: w.props.MessageExpiryInterval, ContentType: w.props.ContentType,
		ResponseTopic: w.props.ResponseTopic, CorrelationData: w.props.CorrelationData, User: w.props.User,
		Delay: int64(w.delay / time.Second), Username: w.username}
	if w.props.PayloadFormatFlag {
		pf := w.props.PayloadFormat
		sw.PayloadFormat = &pf
	}
	if !w.due.IsZero() {
		sw.Due = w.due.UnixNano()
	}
	return sw
}

func (sw *storedWill) will() *will {
	w := &will{topic: sw.Topic, payload: sw.Payload, qos: sw.QoS, retain: sw.Retain,
		props: packets.Properties{MessageExpiryInterval: sw.MessageExpiry, ContentType: sw.ContentType,
			ResponseTopic: sw.ResponseTopic, CorrelationData: sw.CorrelationData, User: sw.User},
		delay: time.Duration(sw.Delay) * time.Second, username: sw.Username}
	if sw.PayloadFormat != nil {
		w.props.PayloadFormat, w.props.PayloadFormatFlag = *sw.PayloadFormat, true
	}
	if sw.Due != 0 {
		w.due = time.Unix(0, sw.Due)
	}
	return w
}

type storedSubscribe struct {
	Filter            string `json:"filter"`
	QoS               byte   `json:"qos"`
	Identifier        int    `json:"id,omitempty"`
	NoLocal           bool   `json:"no_local,omitempty"`
	RetainAsPublished bool   `json:"rap,omitempty"`
	RetainHandling    byte   `json:"rh,omitempty"`
	// Partition is the filter's saguin-filter declaration, as canonical
	// values: it lasts as long as the session.
	Partition []string `json:"partition,omitempty"`
	// LogFrom is the broadcast log's offset when the filter was subscribed:
	// a restart serves it logged messages from there on only (matched at
	// publish time, rfcs/broadcast-log.md).
	LogFrom uint64 `json:"log_from,omitempty"`
}

func (b *Broker) openSessions() error {
	name := b.cfg.Broker.Session.Storage
	if name == "" {
		name = b.cfg.Broker.DefaultProvider
	}
	p, err := b.provider(name)
	if err != nil {
		return err
	}
	if b.sessionStore, err = p.Values(sessionStoreName); err != nil {
		return fmt.Errorf("session store on provider %s: %w", name, err)
	}
	// QoS 2 broadcast publishes are held in the broadcast log's store
	// (rfcs/qos2-holds.md "Broadcast QoS 2", qos2_broadcast.go).
	b.bcastHolds, _ = p.(storage.HoldStore)
	b.sessionProvider = name
	return b.openBroadcastLog(p)
}

// storeSession writes the session's record: its expiry, when it was last
// connected, its Will and subscriptions (subs, the connection's whole
// subscription set). invariant 18: the caller does this before telling the
// client what it records (a CONNACK, a SUBACK, the close answering a
// DISCONNECT).
func (b *Broker) storeSession(s *session, subs []packets.Subscription) error {
	r := s.record()
	durable, expiry, lastSeen, protocol, sw, declared := r.durable, r.expiry, r.lastSeen, r.protocol, r.will, r.declared
	if !durable {
		return nil
	}
	from := b.subscribedFrom(s, subs)
	rec := storedSession{Format: sessionFormat, Protocol: protocol, Expiry: int64(expiry / time.Second), Will: sw}
	if !lastSeen.IsZero() {
		rec.LastSeen = lastSeen.UnixNano()
	}
	for _, f := range subs {
		rec.Subscriptions = append(rec.Subscriptions, storedSubscribe{
			Filter: f.Filter, QoS: f.Qos, Identifier: f.Identifier, NoLocal: f.NoLocal,
			RetainAsPublished: f.RetainAsPublished, RetainHandling: f.RetainHandling,
			Partition: declared[f.Filter], LogFrom: from[f.Filter],
		})
	}
	payload, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := b.ensureGroups(subs, from); err != nil {
		return err
	}
	// The broadcast log yields room to a session record (bcastlog_full.go;
	// rfcs/broadcast-log.md).
	stored := storage.Record{Topic: s.id, Payload: payload, Timestamp: b.clock.Now()}
	err = b.withLogRoom(stored.Size(), func() error {
		_, err := b.sessionStore.Put(stored)
		return err
	})
	if err != nil {
		return fmt.Errorf("storing session %s: %w", s.id, err)
	}
	return nil
}

// storeSessionOf stores the session with the subscriptions the connection
// cl (live, or the substrate's record of an away session) holds.
func (b *Broker) storeSessionOf(s *session, cl *mqtt.Client) error {
	return b.storeSession(s, subscriptionsOf(cl))
}

// subscriptionsOf lists a connection's subscriptions in a stable order.
func subscriptionsOf(cl *mqtt.Client) []packets.Subscription {
	all := cl.State.Subscriptions.GetAll()
	out := make([]packets.Subscription, 0, len(all))
	for _, f := range all {
		out = append(out, f)
	}
	sortSubscriptions(out)
	return out
}

func sortSubscriptions(subs []packets.Subscription) {
	slices.SortFunc(subs, func(a, b packets.Subscription) int { return strings.Compare(a.Filter, b.Filter) })
}

// forgetSession removes a session's record (the session ended).
func (b *Broker) forgetSession(id string) {
	if b.sessionStore == nil {
		return
	}
	if _, err := b.sessionStore.Remove(id); err != nil {
		b.log.Error("removing a stored session", "client", id, "error", err)
	}
	b.forgetBroadcast(id)
}

// restoreSessions brings back every stored durable session before the
// listeners open (step 5, docs/channels.md "`append`"): a session whose expiry passed while
// the broker was stopped, or that holds a subscription this configuration
// refuses, ends here with its positions; the rest wait for their client as
// sessions that are away, so its CONNECT with Clean Start 0 is answered
// Session Present 1 and its consumers resume from their stored positions.
// invariant 15: nothing in flight comes back — only subscriptions.
func (b *Broker) restoreSessions() error {
	now := b.clock.Now()
	var recs []storage.Record
	if err := b.sessionStore.Scan(func(r storage.Record) bool {
		recs = append(recs, r)
		return true
	}); err != nil {
		return fmt.Errorf("reading stored sessions: %w", err)
	}
	restored, ended := 0, 0
	for _, r := range recs {
		var st storedSession
		if err := json.Unmarshal(r.Payload, &st); err != nil {
			return fmt.Errorf("stored session of client %q: %w", r.Topic, err)
		}
		if st.Format != sessionFormat {
			return fmt.Errorf("stored session of client %q: format %d, this broker reads %d", r.Topic, st.Format, sessionFormat)
		}
		if len(st.Subscriptions) > maxStoredSubscriptions {
			return fmt.Errorf("stored session of client %q: %d subscriptions, more than %d", r.Topic, len(st.Subscriptions), maxStoredSubscriptions)
		}
		lastSeen := now // connected when the broker stopped
		if st.LastSeen != 0 {
			lastSeen = time.Unix(0, st.LastSeen)
		}
		expiry := time.Duration(st.Expiry) * time.Second
		if expiry > b.cfg.Broker.Limits.MaxSessionExpiry {
			expiry = b.cfg.Broker.Limits.MaxSessionExpiry
		}
		remaining := expiry - now.Sub(lastSeen)
		if remaining <= 0 {
			b.log.Info("session expired while the broker was stopped: ended", "client", r.Topic)
			if st.Will != nil && st.Will.Due != 0 {
				// Published first: its wait had begun before the stop.
				b.publishWill(r.Topic, st.Will.will(), metrics.WillAtStart)
			}
			b.endStoredSession(r.Topic)
			b.events.sessionsDropped[metrics.SessionExpiredWhileStopped].Add(1)
			ended++
			continue
		}
		if reason := b.refusedOnRestore(st); reason != "" {
			b.log.Warn("stored session holds a subscription this configuration refuses: ended",
				"client", r.Topic, "reason", reason)
			b.endStoredSession(r.Topic)
			b.events.sessionsDropped[metrics.SessionSubscriptionRefused].Add(1)
			ended++
			continue
		}
		b.restoreSession(r.Topic, st, expiry, remaining)
		b.events.sessionsRestored.Add(1)
		restored++
	}
	if restored+ended > 0 {
		b.log.Info("stored sessions", "restored", restored, "ended", ended)
	}
	// What the broadcast log holds for the restored sessions and groups is
	// served from their cursors (bcastlog.go); its loop trims the log and
	// stores group cursors from now on.
	if err := b.restoreBroadcast(); err != nil {
		return err
	}
	if b.fan.log != nil {
		b.background(b.bcastLoop)
	}
	return nil
}

func (b *Broker) endStoredSession(id string) {
	b.dropPositions(id)
	b.forgetSession(id)
}

// refusedOnRestore checks a stored session's filters against this
// configuration, as a SUBSCRIBE would be: a filter now refused (a queue
// removed, a filter now inside a queue) ends the session rather than serve
// it something other than it was granted.
func (b *Broker) refusedOnRestore(st storedSession) string {
	for _, f := range st.Subscriptions {
		sub := packets.Subscription{Filter: f.Filter, Qos: f.QoS, NoLocal: f.NoLocal}
		if code, _ := b.routing.filterCode(sub, st.Protocol == 5); code >= 0x80 {
			return fmt.Sprintf("filter %q answered 0x%02X", f.Filter, code)
		}
		if len(f.Partition) > 0 {
			if _, err := partition.Parse(f.Partition); err != nil {
				return fmt.Sprintf("filter %q: saguin-filter %v", f.Filter, err)
			}
			if err := partition.CheckFilter(f.Filter); err != nil {
				return fmt.Sprintf("filter %q: saguin-filter %v", f.Filter, err)
			}
		}
	}
	return ""
}

// restoreSession registers one stored session as away: Sagüin's half (its
// consumers at their stored positions, its queue registrations) and the
// substrate's (a disconnected client holding the subscriptions, which a
// resuming CONNECT inherits and the substrate expires when remaining has
// passed).
func (b *Broker) restoreSession(id string, st storedSession, expiry, remaining time.Duration) {
	lastSeen := b.clock.Now() // a session found connected ended at the stop
	if st.LastSeen != 0 {
		lastSeen = time.Unix(0, st.LastSeen)
	}
	var w *will
	if st.Will != nil {
		// With a moment, the loop publishes it when due, at once if past;
		// without, the session's expiry does (endSession), unless the
		// client's next CONNECT replaces it. A broker stopping is not a
		// device dying, and stripping the Will would take its protection
		// away from every device connected at the stop.
		w = st.Will.will()
	}
	s := restoredSession(id, expiry, st.Protocol, lastSeen, w)

	cl := b.mqtt.NewClient(nil, "restore", id, false)
	cl.Properties.ProtocolVersion = st.Protocol
	cl.Properties.Props.SessionExpiryInterval = uint32((remaining + time.Second - 1) / time.Second)
	cl.Properties.Props.SessionExpiryIntervalFlag = true
	cl.Stop(packets.ErrServerShuttingDown) // away: the substrate's expiry clock starts now

	o := b.outboxOf(s)
	for _, f := range st.Subscriptions {
		if f.LogFrom != 0 {
			o.from[f.Filter] = f.LogFrom
		}
		sub := packets.Subscription{Filter: f.Filter, Qos: f.QoS, Identifier: f.Identifier, NoLocal: f.NoLocal,
			RetainAsPublished: f.RetainAsPublished, RetainHandling: f.RetainHandling}
		if len(f.Partition) > 0 {
			// Parsed as at SUBSCRIBE: refusedOnRestore already ended a
			// session holding one that no longer parses.
			if m, err := partition.Parse(f.Partition); err == nil {
				s.restoreDeclared(f.Filter, m)
				b.spaces.Declare(f.Filter, id, m)
			}
		}
		b.mqtt.Topics.Subscribe(id, sub)
		cl.State.Subscriptions.Add(sub.Filter, sub)
		if name, ok := strings.CutPrefix(sub.Filter, "$saguin/queue/"); ok {
			s.addQueue(name)
			continue
		}
		if strings.HasPrefix(sub.Filter, "$saguin/") || strings.HasPrefix(sub.Filter, "$share/") {
			continue
		}
		b.restoreChannelSubscription(s, sub)
	}
	b.mqtt.Clients.Add(cl)
	b.mu.Lock()
	b.sessions[id] = s
	b.mu.Unlock()
}

// restoreChannelSubscription gives a restored filter its consumers, each at
// its stored position as stored (a passed one is answered at the CONNECT:
// invariant 1), or where a reader with none starts.
func (b *Broker) restoreChannelSubscription(s *session, f packets.Subscription) {
	// Latest channels: restored without a mark, so the resume is served
	// the full current state (latest.go).
	b.restoreLatestSubscription(s, f)
	reached := b.resolver.Reaching(f.Filter)
	var logs []*channel
	for _, name := range reached {
		if ch := b.channels[name]; ch != nil && ch.log != nil {
			logs = append(logs, ch)
		}
	}
	if len(logs) == 0 {
		return
	}
	s.restoreSubscription(f, reached)
	for _, ch := range logs {
		if s.consumerOf(ch.name) != nil {
			continue
		}
		// Retain Handling 2 acted when the subscription was made; a restart
		// does not make it new again. A stored position is restored as it
		// is, even below the floor: the CONNECT that resumes the session
		// finds it passed and answers Session Present 0 (invariant 1,
		// floor.go), which a consumer moved to the floor here would hide.
		start := noPositionStart(ch, false)
		p, ok, err := ch.log.Position(s.reader())
		switch {
		case err != nil:
			b.log.Error("reading a stored position", "client", s.id, "channel", ch.name, "error", err)
			start = ch.log.Next()
		case ok:
			start = p.Offset
		}
		s.restoreConsumer(newConsumer(b, s, ch, start))
	}
}
