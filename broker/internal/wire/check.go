package wire

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The inbound packet check (rfcs/wire-validation.md). The substrate's
// decoders trust lengths they never compare with the packet — one SUBSCRIBE
// whose options byte is missing indexes past its buffer and the panic ends
// the process — and accept packets MQTT calls malformed or protocol errors,
// which the broker would then act on. The Framer (framer.go) holds each
// packet until checkPacket has read every length, count and property in it
// against the packet's own bounds; only a packet that passes is handed to
// the substrate, so a refusal comes before any state changes.

// MQTT 5 reason codes the check refuses with (docs/security.md "Every refusal, and its code").
const (
	codeMalformed        = 0x81
	codeProtocolError    = 0x82
	codeUnsupportedLevel = 0x84
	codeBadAuthMethod    = 0x8C
	codeTopicAliasBad    = 0x94
)

// TopicAliasMaximum is the Topic Alias Maximum promised to every MQTT 5
// client, fixed (rfcs/limits.md): an alias above it is refused here, so the
// alias table a client can make a connection hold is bounded (invariant 13).
const TopicAliasMaximum = 16

// Refusal is why a packet is refused: Framer.Answer is what the client is
// sent for it. Code 0 with silent set: closed with nothing written (a
// CONNECT whose protocol is not MQTT, or not yet known).
type Refusal struct {
	Code   byte   // the MQTT 5 reason code
	Reason string // our own words, never the client's bytes: it is logged and sent
	silent bool
}

func malformed(format string, a ...any) *Refusal {
	return &Refusal{Code: codeMalformed, Reason: fmt.Sprintf(format, a...)}
}

func protocolError(format string, a ...any) *Refusal {
	return &Refusal{Code: codeProtocolError, Reason: fmt.Sprintf(format, a...)}
}

// connState is what the check knows of one network connection.
type connState struct {
	version byte // the CONNECT's protocol level once it passed (3, 4 or 5); 0 before
	// clientMax is the client's Maximum Packet Size (0: none given): a
	// refusal's Reason String is left out of an answer that would pass it.
	clientMax uint32
	maxKnown  bool // the CONNECT's properties were read (clientMax is known)
	// aliases: the Topic Aliases (1..16) this connection has set. A
	// mapping belongs to one network connection (MQTT 5 §3.3.2.3.4,
	// [MQTT-3.3.2-7]), as this state does.
	aliases uint32
}

// PacketName is a packet type as MQTT names it, for log lines.
func PacketName(t byte) string {
	if t == 0 {
		return "RESERVED"
	}
	if n, ok := packets.PacketNames[t]; ok {
		return strings.ToUpper(n)
	}
	return "UNKNOWN"
}

// bodyReader reads MQTT's data types from one packet's body, never past it.
type bodyReader struct {
	b   []byte
	off int
}

func (r *bodyReader) left() int { return len(r.b) - r.off }

func (r *bodyReader) byte() (byte, bool) {
	if r.left() < 1 {
		return 0, false
	}
	r.off++
	return r.b[r.off-1], true
}

func (r *bodyReader) uint16() (uint16, bool) {
	if r.left() < 2 {
		return 0, false
	}
	r.off += 2
	return uint16(r.b[r.off-2])<<8 | uint16(r.b[r.off-1]), true
}

func (r *bodyReader) uint32() (uint32, bool) {
	if r.left() < 4 {
		return 0, false
	}
	r.off += 4
	b := r.b[r.off-4:]
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]), true
}

// varint reads a Variable Byte Integer: at most four bytes (MQTT 5 §1.5.5;
// the substrate's decoder reads any number of continuation bytes).
func (r *bodyReader) varint() (int, bool) {
	v, mul := 0, 1
	for i := 0; i < 4; i++ {
		c, ok := r.byte()
		if !ok {
			return 0, false
		}
		v += int(c&127) * mul
		if c&128 == 0 {
			return v, true
		}
		mul *= 128
	}
	return 0, false
}

// binary reads Binary Data: a two-byte length, then that many bytes.
func (r *bodyReader) binary() ([]byte, bool) {
	n, ok := r.uint16()
	if !ok || r.left() < int(n) {
		return nil, false
	}
	r.off += int(n)
	return r.b[r.off-int(n) : r.off], true
}

// str reads a UTF-8 Encoded String. ok false: it runs past the packet;
// valid false: ill-formed UTF-8 or U+0000, a Malformed Packet either way
// ([MQTT-1.5.4-1], [MQTT-1.5.4-2]).
func (r *bodyReader) str() (s []byte, ok, valid bool) {
	b, ok := r.binary()
	if !ok {
		return nil, false, false
	}
	return b, true, utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// field reads a UTF-8 string field, refusing it as Malformed if it is
// short or ill-formed.
func (r *bodyReader) field(what string) ([]byte, *Refusal) {
	s, ok, valid := r.str()
	if !ok {
		return nil, malformed("the %s runs past the end of the packet", what)
	}
	if !valid {
		return nil, malformed("the %s is not well-formed UTF-8 (or holds U+0000)", what)
	}
	return s, nil
}

// Where a property may appear (MQTT 5 §2.2.2.2): the packets a client
// sends, and the Will Properties of a CONNECT.
const (
	inConnect = 1 << iota
	inWill
	inPublish
	inAck // PUBACK, PUBREC, PUBREL, PUBCOMP
	inSubscribe
	inUnsubscribe
	inDisconnect
	inAuth
)

type propKind byte

const (
	propByte propKind = iota
	propUint16
	propUint32
	propVarint
	propString
	propBinary
	propPair
)

type propSpec struct {
	name   string
	kind   propKind
	where  int
	repeat bool // may appear more than once (User Property only, from a client)
}

// propSpecs is MQTT 5's property table for what a client may send. An
// identifier not here, or not valid in the packet, is a Malformed Packet
// (MQTT 5 §2.2.2.2); one given twice that may not repeat is a Protocol
// Error. A Subscription Identifier in a client's PUBLISH is refused as a
// Protocol Error by publishProps ([MQTT-3.3.4-6]).
var propSpecs = [0x28]propSpec{
	0x01: {name: "Payload Format Indicator", kind: propByte, where: inWill | inPublish},
	0x02: {name: "Message Expiry Interval", kind: propUint32, where: inWill | inPublish},
	0x03: {name: "Content Type", kind: propString, where: inWill | inPublish},
	0x08: {name: "Response Topic", kind: propString, where: inWill | inPublish},
	0x09: {name: "Correlation Data", kind: propBinary, where: inWill | inPublish},
	0x0B: {name: "Subscription Identifier", kind: propVarint, where: inPublish | inSubscribe},
	0x11: {name: "Session Expiry Interval", kind: propUint32, where: inConnect | inDisconnect},
	0x15: {name: "Authentication Method", kind: propString, where: inConnect | inAuth},
	0x16: {name: "Authentication Data", kind: propBinary, where: inConnect | inAuth},
	0x17: {name: "Request Problem Information", kind: propByte, where: inConnect},
	0x18: {name: "Will Delay Interval", kind: propUint32, where: inWill},
	0x19: {name: "Request Response Information", kind: propByte, where: inConnect},
	0x1C: {name: "Server Reference", kind: propString, where: inDisconnect},
	0x1F: {name: "Reason String", kind: propString, where: inAck | inDisconnect | inAuth},
	0x21: {name: "Receive Maximum", kind: propUint16, where: inConnect},
	0x22: {name: "Topic Alias Maximum", kind: propUint16, where: inConnect},
	0x23: {name: "Topic Alias", kind: propUint16, where: inPublish},
	0x26: {name: "User Property", kind: propPair, repeat: true,
		where: inConnect | inWill | inPublish | inAck | inSubscribe | inUnsubscribe | inDisconnect | inAuth},
	0x27: {name: "Maximum Packet Size", kind: propUint32, where: inConnect},
}

// propValue is one property read: its number, or its bytes.
type propValue struct {
	n   uint32
	b   []byte
	set bool
}

// props is a property section read whole: the values the check acts on,
// by identifier (a repeatable property keeps its first). An array, not a
// map: it lives on the stack of the packet's check, nothing allocated per
// packet.
type props [0x28]propValue

// readProps reads a property section (its length, then the properties,
// which must end exactly where the length says) for a packet of kind where.
func readProps(r *bodyReader, where int, section string, got *props) *Refusal {
	n, ok := r.varint()
	if !ok {
		return malformed("the %s length is not a valid Variable Byte Integer within the packet", section)
	}
	if n > r.left() {
		return malformed("the %s length (%d) runs past the end of the packet (%d bytes left)", section, n, r.left())
	}
	sub := &bodyReader{b: r.b[r.off : r.off+n]}
	r.off += n
	for sub.left() > 0 {
		id, _ := sub.byte()
		var spec propSpec
		if int(id) < len(propSpecs) {
			spec = propSpecs[id]
		}
		if spec.where&where == 0 {
			return malformed("property %#x is not valid in the %s", id, section)
		}
		if got[id].set && !spec.repeat {
			return protocolError("the %s %s is given twice", section, spec.name)
		}
		var v propValue
		switch spec.kind {
		case propByte:
			c, ok := sub.byte()
			if !ok {
				return malformed("the %s %s runs past the property section", section, spec.name)
			}
			v = propValue{n: uint32(c), set: true}
		case propUint16:
			x, ok := sub.uint16()
			if !ok {
				return malformed("the %s %s runs past the property section", section, spec.name)
			}
			v = propValue{n: uint32(x), set: true}
		case propUint32:
			x, ok := sub.uint32()
			if !ok {
				return malformed("the %s %s runs past the property section", section, spec.name)
			}
			v = propValue{n: x, set: true}
		case propVarint:
			x, ok := sub.varint()
			if !ok {
				return malformed("the %s %s is not a valid Variable Byte Integer within the property section", section, spec.name)
			}
			v = propValue{n: uint32(x), set: true}
		case propString:
			s, ok, valid := sub.str()
			if !ok {
				return malformed("the %s %s runs past the property section", section, spec.name)
			}
			if !valid {
				return malformed("the %s %s is not well-formed UTF-8 (or holds U+0000)", section, spec.name)
			}
			v = propValue{b: s, set: true}
		case propBinary:
			b, ok := sub.binary()
			if !ok {
				return malformed("the %s %s runs past the property section", section, spec.name)
			}
			v = propValue{b: b, set: true}
		case propPair:
			for range 2 {
				_, ok, valid := sub.str()
				if !ok {
					return malformed("a %s User Property runs past the property section", section)
				}
				if !valid {
					return malformed("a %s User Property is not well-formed UTF-8 (or holds U+0000)", section)
				}
			}
			v = propValue{set: true}
		}
		if !got[id].set {
			got[id] = v
		}
	}
	return nil
}

// oneOrZero refuses a byte property other than 0 or 1 (Payload Format
// Indicator, Request Problem / Response Information): a Protocol Error.
func (p *props) oneOrZero(id byte, section string) *Refusal {
	if v := p[id]; v.set && v.n > 1 {
		return protocolError("the %s %s is %d; only 0 and 1 are defined", section, propSpecs[id].name, v.n)
	}
	return nil
}

// responseTopic refuses a Response Topic holding a wildcard: it names the
// topic a reply is published to ([MQTT-3.3.2-14]).
func (p *props) responseTopic(section string) *Refusal {
	if v := p[0x08]; v.set && bytes.ContainsAny(v.b, "+#") {
		return protocolError("the %s Response Topic holds a wildcard (+ or #)", section)
	}
	return nil
}

// checkHeader judges a fixed header's first byte before its body is read
// (MQTT 5 §2.1.3: reserved flags; §3.3.1.2: both QoS bits).
func checkHeader(first byte, st *connState) *Refusal {
	t, flags := first>>4, first&0x0F
	if st.version == 0 {
		if t != packets.Connect {
			// [MQTT-3.1.0-1]: the first packet is a CONNECT; the protocol
			// is not known, so nothing is answered.
			return &Refusal{silent: true, Reason: "the first packet is not a CONNECT"}
		}
	} else if t == packets.Connect {
		return protocolError("a second CONNECT on one connection")
	}
	switch t {
	case 0:
		return malformed("packet type 0 is reserved")
	case packets.Publish:
		if flags&0x06 == 0x06 {
			return malformed("a PUBLISH with both QoS bits set")
		}
		if flags&0x08 != 0 && flags&0x06 == 0 {
			return protocolError("a QoS 0 PUBLISH with the DUP flag set")
		}
		return nil
	case packets.Pubrel, packets.Subscribe, packets.Unsubscribe:
		if flags != 0x02 {
			return malformed("%s fixed-header flags are %#x; MQTT requires 0x2", PacketName(t), flags)
		}
		return nil
	case packets.Connack, packets.Suback, packets.Unsuback, packets.Pingresp:
		if flags == 0 {
			return protocolError("a client sent %s, which only a server sends", PacketName(t))
		}
	case packets.Auth:
		if st.version < 5 {
			return malformed("packet type 15 is reserved in MQTT 3.1.1")
		}
	}
	if flags != 0 {
		return malformed("%s fixed-header flags are %#x; MQTT requires 0", PacketName(t), flags)
	}
	return nil
}

// headNeed is how much of a packet's body the check must hold before it
// can decide: the whole body, except for a PUBLISH, whose payload the
// substrate reads only as one slice — the check needs it up to the end of
// its properties, and the payload then streams through unheld. It returns
// need > len(body) while more is needed to know; a PUBLISH whose head is
// itself malformed reports len(body) (the check then refuses it).
func headNeed(first byte, st *connState, body []byte, length int) int {
	if first>>4 != packets.Publish {
		return length
	}
	need := 2 // the topic's length
	if len(body) < need {
		return min(need, length)
	}
	need += int(body[0])<<8 | int(body[1])
	if first&0x06 != 0 {
		need += 2 // packet identifier
	}
	if st.version == 5 {
		// The property length, one to four bytes, then that many more.
		for i := 0; ; i++ {
			if i == 4 || need+i >= length {
				return min(need+i+1, length) // malformed: checkPublish refuses it
			}
			if len(body) <= need+i {
				return need + i + 1
			}
			if body[need+i]&128 == 0 {
				break
			}
		}
		r := &bodyReader{b: body[need:]}
		n, _ := r.varint()
		need += r.off + n
	}
	return min(need, length)
}

// checkPacket judges one whole packet (a PUBLISH: up to the end of its
// properties) on connection st. The CONNECT's verdict also sets st.version.
func checkPacket(first byte, body []byte, length int, st *connState) *Refusal {
	r := &bodyReader{b: body}
	switch first >> 4 {
	case packets.Connect:
		return checkConnect(r, st)
	case packets.Publish:
		return checkPublish(first, r, length, st)
	case packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp:
		return checkAck(first>>4, r, st)
	case packets.Subscribe:
		return checkSubscribe(r, st)
	case packets.Unsubscribe:
		return checkUnsubscribe(r, st)
	case packets.Pingreq:
		if len(body) != 0 {
			return malformed("a PINGREQ with a %d-byte body; it has none", len(body))
		}
	case packets.Disconnect:
		return checkDisconnect(r, st)
	case packets.Auth:
		// docs/security.md "Every refusal, and its code": this build has no enhanced authentication,
		// so any AUTH is a Protocol Error (a CONNECT with an Authentication
		// Method was already refused 0x8C, so none was ever begun).
		return protocolError("AUTH: this broker has no enhanced authentication")
	}
	return nil
}

func checkConnect(r *bodyReader, st *connState) *Refusal {
	name, ok := r.binary()
	if !ok {
		return &Refusal{silent: true, Reason: "the CONNECT's protocol name runs past the packet"}
	}
	level, ok := r.byte()
	if !ok {
		return &Refusal{silent: true, Reason: "the CONNECT ends before its protocol level"}
	}
	switch string(name) {
	case "MQTT":
		if level != 4 && level != 5 {
			// MQTT 5 §3.1.2.2: the Server MAY answer 0x84 and MUST close.
			return &Refusal{Code: codeUnsupportedLevel, Reason: fmt.Sprintf("protocol level %d is not MQTT 3.1.1 (4) or 5", level)}
		}
	case "MQIsdp":
		if level != 3 {
			return &Refusal{silent: true, Reason: fmt.Sprintf("protocol name MQIsdp with level %d", level)}
		}
		// MQTT 3.1: read for its bounds like 3.1.1 (the same layout); the
		// substrate then answers it 0x01, unacceptable protocol version.
	default:
		// MQTT 5 §3.1.2.1: not MQTT, so nothing MQTT says applies.
		return &Refusal{silent: true, Reason: "the protocol name is not MQTT"}
	}
	v5 := level == 5
	// From here the answer is in the client's own protocol: MQTT 5 gets a
	// CONNACK with the code, 3.1.1 is closed ([MQTT-3.1.4-1]).
	bad := func(f *Refusal) *Refusal {
		if !v5 {
			f.silent = true
		}
		return f
	}
	flags, ok := r.byte()
	if !ok {
		return bad(malformed("the CONNECT ends before its flags"))
	}
	will := flags&0x04 != 0
	willQoS := flags >> 3 & 3
	switch {
	case flags&0x01 != 0:
		return bad(malformed("the CONNECT's reserved flag is set")) // [MQTT-3.1.2-3]
	case willQoS == 3:
		return bad(malformed("Will QoS 3")) // MQTT 5 §3.1.2.6
	case !will && willQoS != 0:
		return bad(malformed("Will QoS %d without the Will flag", willQoS)) // [MQTT-3.1.2-11]
	case !will && flags&0x20 != 0:
		return bad(protocolError("Will Retain without the Will flag")) // [MQTT-3.1.2-13]
	case !v5 && flags&0x40 != 0 && flags&0x80 == 0:
		return bad(protocolError("a password without a user name")) // MQTT 3.1.1 [MQTT-3.1.2-22]
	}
	if _, ok := r.uint16(); !ok {
		return bad(malformed("the CONNECT ends before its Keep Alive"))
	}
	var authMethod bool
	if v5 {
		var p props
		if f := readProps(r, inConnect, "CONNECT properties", &p); f != nil {
			return f
		}
		if v := p[0x21]; v.set && v.n == 0 {
			return protocolError("Receive Maximum 0")
		}
		if v := p[0x27]; v.set && v.n == 0 {
			return protocolError("Maximum Packet Size 0")
		}
		if f := p.oneOrZero(0x17, "CONNECT"); f != nil {
			return f
		}
		if f := p.oneOrZero(0x19, "CONNECT"); f != nil {
			return f
		}
		authMethod = p[0x15].set
		if p[0x16].set && !authMethod {
			return protocolError("Authentication Data without an Authentication Method")
		}
		st.clientMax, st.maxKnown = p[0x27].n, true
	}
	if _, f := r.field("client identifier"); f != nil {
		return bad(f)
	}
	if will {
		if v5 {
			var p props
			if f := readProps(r, inWill, "Will properties", &p); f != nil {
				return f
			}
			if f := p.oneOrZero(0x01, "Will"); f != nil {
				return f
			}
			if f := p.responseTopic("Will"); f != nil {
				return f
			}
		}
		if _, f := r.field("Will topic"); f != nil {
			return bad(f)
		}
		if _, ok := r.binary(); !ok {
			return bad(malformed("the Will payload runs past the end of the packet"))
		}
	}
	if flags&0x80 != 0 {
		if _, f := r.field("user name"); f != nil {
			return bad(f)
		}
	}
	if flags&0x40 != 0 {
		if _, ok := r.binary(); !ok {
			return bad(malformed("the password runs past the end of the packet"))
		}
	}
	if r.left() != 0 {
		return bad(malformed("%d bytes follow the CONNECT's last field, within its Remaining Length", r.left()))
	}
	if authMethod {
		// docs/security.md "Every refusal, and its code": no enhanced authentication in this build.
		// Refused here, before the substrate sees the CONNECT, so the live
		// session of the same client id is never touched (invariant 17).
		return &Refusal{Code: codeBadAuthMethod, Reason: "this broker has no enhanced authentication: send no Authentication Method"}
	}
	st.version = level
	return nil
}

func checkPublish(first byte, r *bodyReader, length int, st *connState) *Refusal {
	topic, f := r.field("topic name")
	if f != nil {
		return f
	}
	if first&0x06 != 0 {
		if _, ok := r.uint16(); !ok {
			return malformed("the PUBLISH ends before its packet identifier")
		}
	}
	if st.version < 5 {
		return nil
	}
	var p props
	if f := readProps(r, inPublish, "PUBLISH properties", &p); f != nil {
		return f
	}
	if p[0x0B].set {
		return protocolError("a client's PUBLISH carries a Subscription Identifier") // [MQTT-3.3.4-6]
	}
	if f := p.oneOrZero(0x01, "PUBLISH"); f != nil {
		return f
	}
	if f := p.responseTopic("PUBLISH"); f != nil {
		return f
	}
	if a := p[0x23]; a.set {
		if a.n == 0 || a.n > TopicAliasMaximum {
			return &Refusal{Code: codeTopicAliasBad, Reason: fmt.Sprintf("Topic Alias %d; this broker's Topic Alias Maximum is %d", a.n, TopicAliasMaximum)}
		}
		bit := uint32(1) << a.n
		switch {
		case len(topic) > 0:
			// The substrate maps the alias for every topic it goes on to
			// process, and every topic but a wildcard one goes on
			// (broker/substrate_topics.go marks those its own check would drop);
			// a wildcard topic ends the connection (DISCONNECT 0x82).
			if !bytes.ContainsAny(topic, "+#") {
				st.aliases |= bit
			}
		case st.aliases&bit == 0:
			// MQTT 5 §3.3.4: an empty Topic Name with an alias the receiver
			// has no mapping for is a Protocol Error — never set on this
			// connection (a mapping made on an earlier one does not carry
			// over, [MQTT-3.3.2-7]).
			return protocolError("Topic Alias %d with an empty topic was never set on this connection", a.n)
		}
	}
	return nil
}

func checkAck(t byte, r *bodyReader, st *connState) *Refusal {
	if _, ok := r.uint16(); !ok {
		return malformed("the %s ends before its packet identifier", PacketName(t))
	}
	if st.version < 5 {
		if r.left() != 0 {
			return malformed("a 3.1.1 %s of %d bytes; it has 2", PacketName(t), len(r.b))
		}
		return nil
	}
	if r.left() == 0 {
		return nil
	}
	r.off++ // the reason code
	if r.left() == 0 {
		return nil
	}
	var p props
	if f := readProps(r, inAck, PacketName(t)+" properties", &p); f != nil {
		return f
	}
	if r.left() != 0 {
		return malformed("%d bytes follow the %s properties", r.left(), PacketName(t))
	}
	return nil
}

func checkSubscribe(r *bodyReader, st *connState) *Refusal {
	if _, ok := r.uint16(); !ok {
		return malformed("the SUBSCRIBE ends before its packet identifier")
	}
	if st.version == 5 {
		var p props
		if f := readProps(r, inSubscribe, "SUBSCRIBE properties", &p); f != nil {
			return f
		}
		if v := p[0x0B]; v.set && v.n == 0 {
			return protocolError("Subscription Identifier 0") // MQTT 5 §3.8.2.1.2
		}
	}
	// No filter at all is refused by the substrate's own check (0x82).
	for i := 1; r.left() > 0; i++ {
		if _, f := r.field(fmt.Sprintf("topic filter %d", i)); f != nil {
			return f
		}
		opt, ok := r.byte()
		if !ok {
			return malformed("topic filter %d has no Subscription Options byte", i)
		}
		if st.version == 5 {
			if opt&0xC0 != 0 {
				return malformed("topic filter %d: reserved Subscription Options bits set", i) // [MQTT-3.8.3-5]
			}
		} else if opt&0xFC != 0 {
			return malformed("topic filter %d: reserved bits set in its requested QoS byte", i) // 3.1.1 [MQTT-3-8.3-4]
		}
		if opt&3 == 3 {
			return protocolError("topic filter %d asks for QoS 3", i)
		}
		// Retain Handling 3 is refused (0x82) by the SUBSCRIBE hook before
		// any filter is applied (broker/subscribe.go).
	}
	return nil
}

func checkUnsubscribe(r *bodyReader, st *connState) *Refusal {
	if _, ok := r.uint16(); !ok {
		return malformed("the UNSUBSCRIBE ends before its packet identifier")
	}
	if st.version == 5 {
		var p props
		if f := readProps(r, inUnsubscribe, "UNSUBSCRIBE properties", &p); f != nil {
			return f
		}
	}
	for i := 1; r.left() > 0; i++ {
		if _, f := r.field(fmt.Sprintf("topic filter %d", i)); f != nil {
			return f
		}
	}
	return nil
}

func checkDisconnect(r *bodyReader, st *connState) *Refusal {
	if st.version < 5 {
		if r.left() != 0 {
			return malformed("a 3.1.1 DISCONNECT with a %d-byte body; it has none", r.left())
		}
		return nil
	}
	if r.left() < 2 {
		return nil // no body, or a reason code alone (see disconnectWithProps)
	}
	r.off++
	var p props
	if f := readProps(r, inDisconnect, "DISCONNECT properties", &p); f != nil {
		return f
	}
	if r.left() != 0 {
		return malformed("%d bytes follow the DISCONNECT properties", r.left())
	}
	return nil
}
