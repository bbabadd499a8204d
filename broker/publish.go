package broker

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/storage"
)

// reservedPrefix marks Sagüin's own User Properties. A client may set only
// saguin-id; every other saguin-* property it sends is dropped, so nobody can
// forge delivery or dead-letter metadata (docs/channels.md "What a publish is answered").
const reservedPrefix = "saguin-"

// Reason codes Sagüin answers with that the substrate has no name for, or
// whose substrate reason string says too little.
var (
	codeTopicInvalid   = packets.Code{Code: 0x90, Reason: "topic name invalid"}
	codeQuotaExceeded  = packets.Code{Code: 0x97, Reason: "quota exceeded"}
	codeImplementation = packets.Code{Code: 0x83, Reason: "implementation specific error"}
	codeNotAuthorized  = packets.Code{Code: 0x87, Reason: "not authorized"}
	// codePayloadFormatInvalid is MQTT 5's 0x99 (Payload format invalid).
	codePayloadFormatInvalid = packets.Code{Code: 0x99, Reason: "payload format invalid"}
)

// payloadFormatValid reports whether a payload is what its Payload Format
// Indicator says: with the indicator 1, well-formed UTF-8 as RFC 3629
// defines it (MQTT 5 §3.3.2.3.2; §3.1.3.2.3 for a Will) — U+0000 is allowed
// there, unlike in an MQTT string. 3.1.1 carries no indicator. The payload
// is bounded by limits.max_message_size before it is read (invariant 13).
func payloadFormatValid(p packets.Properties, payload []byte) bool {
	return !p.PayloadFormatFlag || p.PayloadFormat != 1 || utf8.Valid(payload)
}

func withReason(c packets.Code, reason string) packets.Code {
	return packets.Code{Code: c.Code, Reason: reason}
}

// publish is the substrate's OnPublish for a publish answered before it
// returns: every PUBLISH a Will stand-in or an in-process client makes, and
// the PUBLISHes of a connection that are not pipelined (inbound.go).
// A broadcast publish is returned unchanged for its caller to hand to
// Sagüin's own fan-out (receivePublish, fanout.go); channel topics are
// stored and then acknowledged by the substrate (invariants 16, 18: PUBACK
// only after the record is stored), and never fanned out by it (invariant
// 11: channels deliver their own records). The substrate fans out nothing:
// every answer marks the packet ignored.
func (b *Broker) publish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	w, out, err := b.admitPublish(cl, pk)
	if w == nil {
		return out, err
	}
	if err := w.storeNow(b); err != nil {
		return b.refuse(cl, pk, storeRefusal(w.ch.name, err))
	}
	w.stored(b, w.rec)
	// Stored: the substrate sends the PUBACK/PUBREC and, because the packet
	// is marked ignored, fans nothing out.
	return pk, packets.CodeSuccessIgnore
}

// channelWrite is a QoS 0/1 publish to a channel (or a Will's, at any QoS)
// judged and made a record, not yet stored: stored at once by publish, or
// submitted in its connection's order by the pipeline (inbound.go).
type channelWrite struct {
	ch  *channel
	rec storage.Record
}

// admitPublish judges a PUBLISH: every bound and refusal, the reserved
// topics, broadcast and held QoS 2. It returns the channel write a publish
// to a channel becomes; or, with none, the answer publish returns — a
// broadcast publish (pk, nil) to fan out, or a refusal or hold already
// decided.
func (b *Broker) admitPublish(cl *mqtt.Client, pk packets.Packet) (*channelWrite, packets.Packet, error) {
	if cl.Net.Inline {
		return nil, pk, nil
	}
	decided := func(out packets.Packet, err error) (*channelWrite, packets.Packet, error) { return nil, out, err }
	if out, over, err := b.overPublishBudget(cl, pk); over { // limits.publish_rate/bytes (ratelimit.go)
		return decided(out, err)
	}
	if g, all := b.grantsOf(cl); !all && g != nil && b.publishFeatureRefusal(cl, g, pk) {
		return decided(pk, packets.ErrRejectPacket)
	}
	t := pk.TopicName
	lim := b.cfg.Broker.Limits
	// Bounds checked on what the packet declares, before anything is kept
	// (invariant 13).
	if len(t) > lim.MaxTopicLength {
		return decided(b.refuse(cl, pk, withReason(codeTopicInvalid,
			fmt.Sprintf("topic is %d bytes; limits.max_topic_length is %d", len(t), lim.MaxTopicLength))))
	}
	if n := strings.Count(t, "/") + 1; n > lim.MaxTopicLevels {
		return decided(b.refuse(cl, pk, withReason(codeTopicInvalid,
			fmt.Sprintf("topic has %d levels; limits.max_topic_levels is %d", n, lim.MaxTopicLevels))))
	}
	if n := len(pk.Properties.User); n > lim.MaxHeaderCount {
		return decided(b.refuse(cl, pk, withReason(codeQuotaExceeded,
			fmt.Sprintf("%d user properties; limits.max_header_count is %d", n, lim.MaxHeaderCount))))
	}
	var hb int64
	for _, u := range pk.Properties.User {
		hb += int64(len(u.Key) + len(u.Val))
	}
	if hb > lim.MaxHeaderBytes {
		return decided(b.refuse(cl, pk, withReason(codeQuotaExceeded,
			fmt.Sprintf("user properties hold %d bytes; limits.max_header_bytes is %d", hb, lim.MaxHeaderBytes))))
	}

	// Topics are case-sensitive (MQTT 5 §4.7.3): only these exact
	// spellings are the reserved forms; $sys/x, $SHARE/x and $SAGUIN/x are
	// ordinary topics (docs/channels.md "The `$saguin/` topics").
	switch {
	case strings.HasPrefix(t, "$share/"):
		return decided(b.refuse(cl, pk, withReason(codeTopicInvalid, "$share/ is a subscription form, not a topic")))
	case t == "$SYS" || strings.HasPrefix(t, "$SYS/"):
		return decided(b.refuse(cl, pk, withReason(codeNotAuthorized, "$SYS is the broker's")))
	}
	if !payloadFormatValid(pk.Properties, pk.Payload) {
		// MQTT 5 §3.3.2.3.2 lets the receiver check; docs/channels.md "What a publish is answered"
		// says it does. Refused before anything is stored or delivered.
		return decided(b.refuse(cl, pk, withReason(codePayloadFormatInvalid,
			"the Payload Format Indicator says UTF-8, but the payload is not well-formed UTF-8")))
	}
	if strings.HasPrefix(t, "$saguin/") {
		return decided(b.publishReserved(cl, pk))
	}

	name, ok := b.resolver.Resolve(t)
	if ok && b.channels[name].cfg.DeadLetterOf != "" {
		ch := b.channels[name]
		return decided(b.refuse(cl, pk, withReason(codeNotAuthorized,
			fmt.Sprintf("%s is the dead-letter channel of queue %s; only the broker writes it", ch.name, ch.cfg.DeadLetterOf))))
	}
	if out, err, allowed := b.publishACLRefusal(cl, pk, name); !allowed {
		return decided(out, err)
	}
	if !ok {
		// Broadcast: forwarded as published, less any saguin-* property.
		pk.Properties.User = stripReserved(pk.Properties.User, false)
		if pk.FixedHeader.Qos == 2 && !inProcessPublisher(cl) && b.bcastHolds != nil {
			// Held until PUBREL, then written to the broadcast log and
			// delivered (rfcs/qos2-holds.md "Broadcast QoS 2", qos2_broadcast.go).
			return decided(b.holdBroadcast(cl, pk))
		}
		if pk.FixedHeader.Retain {
			if err := b.retain(cl, pk); err != nil {
				return decided(b.refuse(cl, pk, retainedRefusal(err)))
			}
			b.pauses.afterRetainStored.at()
		}
		return decided(pk, nil)
	}
	ch := b.channels[name]
	if pk.FixedHeader.Qos == 2 && !inProcessPublisher(cl) {
		// Held until PUBREL, written then (rfcs/qos2-holds.md, qos2.go). A Will
		// is written at once: nobody will send its PUBREL.
		return decided(b.holdPublish(cl, pk, ch))
	}
	if ch.log == nil && ch.queue == nil && ch.values == nil {
		return decided(b.refuse(cl, pk, withReason(codeImplementation,
			fmt.Sprintf("channel %s is a %s channel, which this broker does not serve yet", ch.name, ch.cfg.Type))))
	}
	rec := b.recordOf(cl, pk)
	if ch.queue != nil && rec.Retain {
		// A retained publish to a queue is accepted with the flag dropped:
		// a job is nobody's current value (docs/channels.md "Broadcast").
		rec.Retain = false
		ch.retainIgnored.Add(1)
	}
	return &channelWrite{ch: ch, rec: rec}, pk, nil
}

// storeNow stores the record and waits for it.
func (w *channelWrite) storeNow(b *Broker) error {
	var err error
	switch {
	case w.ch.log != nil:
		_, err = w.ch.log.Append(w.rec)
	case w.ch.queue != nil:
		_, err = w.ch.queue.Enqueue(w.rec)
	default:
		// The topic's new value, or for a zero-length payload its
		// tombstone (latest.go, docs/channels.md "`latest`").
		err = b.storeLatest(w.ch, w.rec)
	}
	return err
}

// submit gives the record its place in its provider's order and returns
// at once (storage.Submitter); the pipeline waits for the answer. A latest
// deletion is never submitted: its look at the current value and its store
// are one step (storeLatest), taken by publish.
func (w *channelWrite) submit() storage.Pending {
	switch {
	case w.ch.log != nil:
		return storage.Submit(w.ch.log, w.rec, w.ch.log.Append)
	case w.ch.queue != nil:
		return storage.Submit(w.ch.queue, w.rec, w.ch.queue.Enqueue)
	default:
		return storage.Submit(w.ch.values, w.rec, w.ch.values.Put)
	}
}

// stored is the work after a record is stored, before its publisher is
// answered: the channel's consumers woken, the $share/ groups served. It
// waits for nothing a subscriber does (invariant 16).
func (w *channelWrite) stored(b *Broker, rec storage.Record) {
	w.ch.published.Add(1)
	switch {
	case w.ch.log != nil:
		w.ch.notify()
		b.shareChannelRecord(rec) // $share/ groups: new records only (share_channel.go)
	case w.ch.values != nil:
		w.ch.notify()
		b.shareChannelRecord(rec) // $share/ groups: changes only (share_channel.go)
	}
}

// storeRefusal maps a storage failure to the code docs/channels.md "What a publish is answered" names: 0x97
// at a bound, 0x83 for any other failure. Either way nothing is acknowledged.
func storeRefusal(channel string, err error) packets.Code {
	if errors.Is(err, storage.ErrFull) {
		return withReason(codeQuotaExceeded, fmt.Sprintf("channel %s is full", channel))
	}
	return withReason(codeImplementation, fmt.Sprintf("channel %s could not store the record", channel))
}

// refuse answers a publish the broker will not keep. MQTT 5 QoS>0 gets the
// reason code on its PUBACK; QoS 0 is dropped; a 3.1.1 client, which has no
// reason codes, is disconnected (docs/channels.md "What a publish is answered", "3.1.1: closed") rather than
// acknowledged — never acknowledged and then dropped.
func (b *Broker) refuse(cl *mqtt.Client, pk packets.Packet, code packets.Code) (packets.Packet, error) {
	b.logPublishRefusal(cl, pk, code)
	if pk.FixedHeader.Qos == 0 {
		return pk, packets.ErrRejectPacket
	}
	if b.answerInTurn(cl, pk, code) {
		// Answers are owed to the connection's earlier publishes: this
		// one leaves after them (MQTT 5 §4.6, inbound.go).
		return pk, packets.ErrRejectPacket
	}
	if cl.Properties.ProtocolVersion < 5 {
		cl.Stop(code)
		return pk, packets.ErrRejectPacket
	}
	if pk.FixedHeader.Qos == 2 {
		// The substrate answers codes with a PUBACK only; a QoS 2 exchange
		// needs a PUBREC.
		ack := packets.Packet{
			FixedHeader: packets.FixedHeader{Type: packets.Pubrec},
			PacketID:    pk.PacketID,
			ReasonCode:  code.Code,
			Properties:  packets.Properties{ReasonString: code.Reason},
		}
		_ = cl.WritePacket(ack)
		return pk, packets.ErrRejectPacket
	}
	return pk, code
}

// recordOf turns a PUBLISH into the record docs/channels.md "What a publish is answered" describes.
func (b *Broker) recordOf(cl *mqtt.Client, pk packets.Packet) storage.Record {
	now := b.clock.Now()
	p := pk.Properties
	rec := storage.Record{
		Topic:           pk.TopicName,
		Timestamp:       now,
		Payload:         pk.Payload,
		ContentType:     p.ContentType,
		ResponseTopic:   p.ResponseTopic,
		CorrelationData: p.CorrelationData,
		Retain:          pk.FixedHeader.Retain,
		QoS:             pk.FixedHeader.Qos,
		PublisherID:     cl.ID,
	}
	if p.PayloadFormatFlag {
		f := p.PayloadFormat
		rec.PayloadFormat = &f
	}
	if p.MessageExpiryInterval > 0 {
		e := p.MessageExpiryInterval
		rec.MessageExpiry = &e
	}
	if rec.MessageID = publishedMessageID(p.User); rec.MessageID == "" {
		rec.MessageID = b.ids.New(now)
	}
	if hs := stripReserved(p.User, true); len(hs) > 0 {
		rec.Headers = make([]storage.Header, len(hs))
		for i, u := range hs {
			rec.Headers[i] = storage.Header{Name: u.Key, Value: u.Val}
		}
	}
	return rec
}

// publishedMessageID is the Message ID a publisher gave its message: the
// first non-empty saguin-id User Property ("" for none).
// invariant 8: a publisher's own Message ID is kept, so a redriven dead
// letter stays the same message — one rule for a channel record and a
// logged broadcast message alike (recordOf, recordOfMsg).
func publishedMessageID(user []packets.UserProperty) string {
	for _, u := range user {
		if u.Key == "saguin-id" && u.Val != "" {
			return u.Val
		}
	}
	return ""
}

// stripReserved drops every saguin-* User Property. With dropID, saguin-id
// goes too (it is carried in the record's MessageID instead of its headers);
// without, saguin-id is kept, as on broadcast where the packet is forwarded.
func stripReserved(in []packets.UserProperty, dropID bool) []packets.UserProperty {
	keep := 0
	for _, u := range in {
		if !strings.HasPrefix(u.Key, reservedPrefix) || (!dropID && u.Key == "saguin-id") {
			keep++
		}
	}
	if keep == len(in) {
		return in
	}
	out := make([]packets.UserProperty, 0, keep)
	for _, u := range in {
		if !strings.HasPrefix(u.Key, reservedPrefix) || (!dropID && u.Key == "saguin-id") {
			out = append(out, u)
		}
	}
	return out
}

// receivePublish takes a client's PUBLISH (its topic already unmarked,
// substrate_topics.go) and answers it as the OnPublish hook must: every
// answer marks it ignored or refused, so the substrate's own copy fans out
// and retains nothing.
func (b *Broker) receivePublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if in := b.inboundOf(cl); in != nil {
		// A connection's QoS 0/1 publish is taken in and answered when
		// stored, while the read loop goes on (inbound.go).
		if out, err, taken := in.publish(pk); taken {
			return out, err
		}
		// Answered here, as before, once every publish the connection
		// sent before it is answered.
		in.settle()
	}
	if b.retainedBroadcast(cl, pk) {
		// Stored and fanned out as one step among new subscriptions
		// (retained_order.go).
		b.retainedOrder.RLock()
		defer b.retainedOrder.RUnlock()
	}
	out, err := b.publish(cl, pk)
	if err != nil {
		return out, err
	}
	// Broadcast (a Will injected in-process included): handed to each
	// subscriber's outbox and written by that connection's own sender, never
	// by the substrate's publishToClient on this goroutine (invariant 16,
	// fanout.go). Marked ignored, the substrate acknowledges it and fans
	// nothing out.
	b.fanOut(cl, out)
	return out, packets.CodeSuccessIgnore
}
