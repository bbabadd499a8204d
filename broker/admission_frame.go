package broker

import (
	"sync"

	"github.com/mochi-mqtt/server/v2/packets"
)

// framer follows MQTT's framing on the bytes a client sends, ahead of the
// substrate's reader, and holds each packet until it is judged
// (rfcs/wire-validation.md):
//
//   - its declared size, as soon as its length is read, against its limit
//     (the first packet against max_connect_size, every later one against
//     max_message_size; both count the whole packet, as MQTT's Maximum
//     Packet Size does), so an oversized packet is refused before anything
//     is allocated for it (invariant 13). The substrate's own check leaves
//     out the length bytes, answers nothing and knows nothing of
//     limits.max_connect_size; it never sees such a packet.
//   - every length, count and property in it against its own bounds
//     (wire_check.go), before a byte of it reaches the substrate, whose
//     decoders index past a packet that lies about itself.
//
// A packet is held whole — a PUBLISH only up to the end of its
// properties: its payload then streams through as it arrives, never held
// here (the substrate reads it into its own buffer). What is held is
// bounded by the packet's limit, checked before the buffer grows. A packet
// that arrived whole in one read is handed on from the substrate's own
// buffer, and nothing is held for it; bytes that must be held (a packet
// split across reads, the packets after it in the same read) go into a
// buffer taken from a pool shared by every connection and given back once
// emptied, so an idle connection holds none (invariant 13), and a busy one
// does not allocate one per read.
//
// The framer hands on one packet's bytes per Read: the substrate reads a
// packet's bytes exactly and handles it before it reads again, so the packet
// whose bytes went last (handling) is the one being handled, and a packet
// refused here comes after every earlier one was handled whole.
type framer struct {
	st wireState
	// limits: see above.
	connectLimit, packetLimit int64
	packets                   int // packets handed on whole or in part (the first is the CONNECT)

	buf   []byte // bytes read and not yet handed on; buf[0] starts a packet unless ready > 0
	ready int    // of buf, bytes judged and to be handed on (one packet's at most)
	pass  int    // bytes of the packet being handed on still to come from the socket
	// handling is the type of the packet whose bytes were handed on last.
	handling byte
}

// framerPooled is the size of the pooled buffers: the substrate's read
// buffer (ClientNetReadBufferSize), so what one read brings fits. A packet
// that needs more to be judged gets a buffer of its own, dropped once it is
// handed on.
const framerPooled = 4096

var framerPool = sync.Pool{New: func() any { b := make([]byte, 0, framerPooled); return &b }}

// oversize is a packet whose declared size is past its limit.
type oversize struct {
	size, limit int64
	connect     bool // the CONNECT: its opening bytes are still unread
}

// judgement is what frame decided about the packet at the start of data.
type judgement struct {
	need  int       // > 0: more bytes must be held to decide (data must reach need)
	out   int       // the packet's bytes in data, to be handed on
	pass  int       // its bytes beyond data, handed on as they arrive
	first byte      // its first byte
	r     *refusal  // refused by the check
	over  *oversize // refused for its size
	body  int       // where its body starts in data (after the length)
}

// frame judges the packet data starts with.
func (f *framer) frame(data []byte) judgement {
	var j judgement
	if len(data) == 0 {
		j.need = 1
		return j
	}
	j.first = data[0]
	if r := checkHeader(data[0], &f.st); r != nil {
		j.r = r
		return j
	}
	length, mul, i := 0, 1, 1
	for ; ; i++ {
		if i == len(data) {
			j.need = i + 1
			return j
		}
		c := data[i]
		length += int(c&127) * mul
		mul *= 128
		if c&128 == 0 {
			break
		}
		if i == 4 {
			j.r = malformed("the Remaining Length runs past four bytes")
			if f.st.version == 0 {
				j.r.silent = true
			}
			return j
		}
	}
	j.body = i + 1
	size := int64(j.body + length)
	limit := f.packetLimit
	if f.packets == 0 {
		limit = f.connectLimit
	}
	if size > limit {
		j.over = &oversize{size: size, limit: limit, connect: f.packets == 0}
		return j
	}
	head := j.body + headNeed(data[0], &f.st, data[j.body:], length)
	if len(data) < head {
		j.need = head
		return j
	}
	if r := checkPacket(data[0], data[j.body:head], length, &f.st); r != nil {
		j.r = r
		return j
	}
	total := j.body + length
	j.out = min(total, len(data))
	j.pass = total - j.out
	return j
}

// admit records that the packet judged j is being handed on.
func (f *framer) admit(j judgement) {
	f.handling = j.first >> 4
	f.packets++
	f.pass = j.pass
}

// disconnectWithProps rewrites an MQTT 5 DISCONNECT whose body is its
// reason code alone into the same DISCONNECT with an empty property list:
// the substrate's decoder reads the reason code only from a body of two
// bytes or more, so `E0 01 04` (disconnect, publish my Will) would be taken
// as reason 0x00 and the Will discarded.
func (f *framer) disconnectWithProps(data []byte) []byte {
	if f.st.version == 5 && len(data) >= 3 && data[0] == packets.Disconnect<<4 && data[1] == 1 {
		return []byte{data[0], 2, data[2], 0}
	}
	return nil
}

// hold makes buf (empty) hold data, with room for need bytes. need is
// bounded by the packet's limit, judged before (frame).
func (f *framer) hold(data []byte, need int) {
	need = max(need, len(data))
	if need <= framerPooled {
		f.buf = append((*framerPool.Get().(*[]byte))[:0], data...)
		return
	}
	f.buf = append(make([]byte, 0, need), data...)
}

// grow makes room in buf for need bytes.
func (f *framer) grow(need int) {
	if cap(f.buf) < need {
		nb := append(make([]byte, 0, need), f.buf...)
		f.release()
		f.buf = nb
	}
}

// release lets buf go: back to the pool if it came from there.
func (f *framer) release() {
	if cap(f.buf) == framerPooled {
		b := f.buf[:0]
		framerPool.Put(&b)
	}
	f.buf = nil
}

// take hands on up to len(p) of the ready bytes.
func (f *framer) take(p []byte) int {
	n := copy(p, f.buf[:f.ready])
	f.ready -= n
	rest := copy(f.buf, f.buf[n:])
	f.buf = f.buf[:rest]
	if rest == 0 {
		f.release() // an idle connection holds no buffer
	}
	return n
}

// anyPacket reports whether f holds for a packet of b, which holds whole
// packets (every writer hands a connection whole packets): f is given the
// packet's type and the offset where its variable header begins.
func anyPacket(b []byte, f func(typ byte, body int) bool) bool {
	for i := 0; i < len(b); {
		typ := b[i] >> 4
		length, mul, j := 0, 1, i+1
		for ; j < len(b) && j < i+5; j++ {
			length += int(b[j]&127) * mul
			mul *= 128
			if b[j]&128 == 0 {
				break
			}
		}
		body := j + 1
		if f(typ, body) {
			return true
		}
		i = body + length
	}
	return false
}

// endsConnection reports whether b, whole packets, carries a refusing
// CONNACK or a DISCONNECT: the end of the connection is then decided, and
// its slot is let go before the answer is written (docs/configuration.md "`broker.limits`"
// connection admission).
func endsConnection(b []byte) bool {
	return anyPacket(b, func(typ byte, body int) bool {
		return typ == 14 || typ == 2 && body+1 < len(b) && b[body+1] != 0
	})
}

// connectVersion reads the protocol level from a CONNECT's opening bytes:
// a two-byte name length, the name ("MQTT", or "MQIsdp" for 3.1), then the
// level.
func connectVersion(open []byte) byte {
	if len(open) < 2 {
		return 0
	}
	n := int(open[0])<<8 | int(open[1])
	if n != 4 && n != 6 || len(open) < 2+n+1 {
		return 0
	}
	return open[2+n]
}

// answerFor is the packet that answers refusal r on a connection at
// protocol level version (0: the CONNECT itself is refused): an MQTT 5
// CONNACK or DISCONNECT with r's code and, if the client's Maximum Packet
// Size allows, its reason as Reason String; nil for a silent close (MQTT
// 3.1.1, and a connection whose protocol is not known).
func answerFor(r *refusal, connect bool, st *wireState) []byte {
	if r.silent {
		return nil
	}
	var head []byte
	switch {
	case connect:
		head = []byte{0, r.code} // CONNACK: Session Present 0, the reason code
	case st.version == 5:
		head = []byte{r.code}
	default:
		return nil // 3.1.1 has no server DISCONNECT: closed
	}
	first := byte(0xE0)
	if connect {
		first = 0x20
	}
	plain := append([]byte{first, byte(len(head) + 1)}, append(head, 0)...)
	reason := r.reason
	if len(reason) > 100 {
		reason = reason[:100]
	}
	props := append([]byte{0x1F, 0, byte(len(reason))}, reason...)
	body := append(append(head, byte(len(props))), props...)
	withReason := append([]byte{first, byte(len(body))}, body...)
	if !st.maxKnown || (st.clientMax > 0 && int64(len(withReason)) > int64(st.clientMax)) {
		return plain
	}
	return withReason
}
