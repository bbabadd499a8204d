package wire

import (
	"errors"
	"sync"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Framer follows MQTT's framing on the bytes a client sends, ahead of the
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
//     (check.go), before a byte of it reaches the substrate, whose
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
// The Framer hands on one packet's bytes per Read: the substrate reads a
// packet's bytes exactly and handles it before it reads again, so the packet
// whose bytes went last (Handling) is the one being handled, and a packet
// refused here comes after every earlier one was handled whole.
//
// Only the substrate's reader calls a connection's Framer: it is not safe
// for concurrent use.
type Framer struct {
	st connState
	// limits: see above.
	connectLimit, packetLimit int64
	packets                   int // packets handed on whole or in part (the first is the CONNECT)

	buf   []byte // bytes read and not yet handed on; buf[0] starts a packet unless ready > 0
	ready int    // of buf, bytes judged and to be handed on (one packet's at most)
	pass  int    // bytes of the packet being handed on still to come from the socket
	// handling is the type of the packet whose bytes were handed on last.
	handling byte
	// err is the socket's read error, returned once what was read before
	// it is handed on, or the error a refused packet ended the stream with.
	err error
}

// NewFramer is the Framer of a new connection: its first packet (the
// CONNECT) may be connectLimit bytes, every later one packetLimit, each
// counted whole (limits.max_connect_size, limits.max_message_size).
func NewFramer(connectLimit, packetLimit int64) Framer {
	return Framer{connectLimit: connectLimit, packetLimit: packetLimit}
}

// Conn is the connection a Framer reads for: its socket, and what acts on
// the verdict on each packet before the packet is handed on.
type Conn interface {
	// ReadSocket is one read from the client's socket.
	ReadSocket(p []byte) (int, error)
	// Judged acts on the verdict on the packet about to be handed on. A
	// refused packet is answered there, and the error returned (never nil
	// for a refusal) ends the stream: Read returns it from then on.
	Judged(v Verdict) error
}

// Verdict is what the Framer decided about one packet, for its Conn.
type Verdict struct {
	Type    byte      // the packet's type, as its first byte gives it
	First   bool      // the connection's first packet: its CONNECT
	Refused *Refusal  // refused by the check: answer Answer(Refused), then close
	Over    *Oversize // refused for its declared size, before it was read
}

// Oversize is a packet whose declared size is past its limit.
type Oversize struct {
	Size, Limit int64
	// Connect: the first packet, whose protocol level is not yet known;
	// Opening holds the bytes of it already read after its length (the
	// start of its variable header), for ReadVersion.
	Connect bool
	Opening []byte
}

// errRefusedUnanswered ends a stream whose Conn let a refused packet
// through: a refused packet is never handed on, whatever Judged returns.
var errRefusedUnanswered = errors.New("packet refused before the substrate read it")

// framerPooled is the size of the pooled buffers: the substrate's read
// buffer (ClientNetReadBufferSize), so what one read brings fits. A packet
// that needs more to be judged gets a buffer of its own, dropped once it is
// handed on.
const framerPooled = 4096

var framerPool = sync.Pool{New: func() any { b := make([]byte, 0, framerPooled); return &b }}

// judgement is what frame decided about the packet at the start of data.
type judgement struct {
	need  int       // > 0: more bytes must be held to decide (data must reach need)
	out   int       // the packet's bytes in data, to be handed on
	pass  int       // its bytes beyond data, handed on as they arrive
	first byte      // its first byte
	r     *Refusal  // refused by the check
	over  *Oversize // refused for its size
	body  int       // where its body starts in data (after the length)
}

// Read hands c's reader the client's bytes one judged packet at a time: a
// packet is read from c's socket and held until it is judged, and a refused
// one is never handed on (c.Judged answers it).
func (f *Framer) Read(p []byte, c Conn) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if f.ready > 0 {
			return f.take(p), nil
		}
		if f.pass > 0 && len(f.buf) == 0 {
			// A judged PUBLISH's payload: straight through, unheld.
			n, err := c.ReadSocket(p[:min(len(p), f.pass)])
			f.pass -= n
			return n, err
		}
		if len(f.buf) > 0 && f.pass == 0 {
			j := f.frame(f.buf)
			if j.need == 0 {
				if err := f.judged(c, j, f.buf); err != nil {
					return 0, err
				}
				f.ready = j.out
				if rw := f.disconnectWithProps(f.buf); rw != nil {
					f.buf, f.ready = append(f.buf[:0], rw...), len(rw)
				}
				continue
			}
			if f.err != nil {
				return 0, f.err
			}
			f.grow(j.need)
			n, err := c.ReadSocket(f.buf[len(f.buf):cap(f.buf)])
			f.buf = f.buf[:len(f.buf)+n]
			if err != nil {
				f.err = err
			}
			continue
		}
		if f.err != nil {
			return 0, f.err
		}
		// Nothing held: read into p and judge the packet there, so a packet
		// that arrived whole in one read is handed on without a copy.
		n, err := c.ReadSocket(p)
		if n == 0 {
			return 0, err
		}
		if err != nil {
			f.err = err
		}
		j := f.frame(p[:n])
		if j.need > 0 {
			f.hold(p[:n], j.need)
			continue
		}
		if err := f.judged(c, j, p[:n]); err != nil {
			return 0, err
		}
		if rw := f.disconnectWithProps(p[:n]); rw != nil {
			f.hold(rw, 0)
			f.ready = len(rw)
			continue
		}
		if j.out < n {
			f.hold(p[j.out:n], 0) // the packets that follow, judged at the next Read
		}
		return j.out, nil
	}
}

// judged gives c the verdict on the packet judged j (data holds what was
// read of it): a refusal ends the stream here, nothing more read or handed
// on.
func (f *Framer) judged(c Conn, j judgement, data []byte) error {
	v := Verdict{Type: j.first >> 4, First: f.packets == 0, Refused: j.r, Over: j.over}
	if j.over != nil && j.over.Connect {
		j.over.Opening = append([]byte(nil), data[j.body:]...)
	}
	err := c.Judged(v)
	if err == nil && (j.r != nil || j.over != nil) {
		err = errRefusedUnanswered
	}
	if err != nil {
		f.release()
		f.ready, f.pass, f.err = 0, 0, err
		return err
	}
	f.admit(j)
	return nil
}

// Holds reports whether f holds bytes of the client's next packet, read and
// not yet handed on: the substrate will handle it without waiting on the
// socket.
func (f *Framer) Holds() bool { return len(f.buf) > 0 }

// Version is the connection's protocol level once its CONNECT passed (3, 4
// or 5); 0 before.
func (f *Framer) Version() byte { return f.st.version }

// Handling is the type of the packet whose bytes were handed on last: the
// one the substrate is handling.
func (f *Framer) Handling() byte { return f.handling }

// frame judges the packet data starts with.
func (f *Framer) frame(data []byte) judgement {
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
		j.over = &Oversize{Size: size, Limit: limit, Connect: f.packets == 0}
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
func (f *Framer) admit(j judgement) {
	f.handling = j.first >> 4
	f.packets++
	f.pass = j.pass
}

// disconnectWithProps rewrites an MQTT 5 DISCONNECT whose body is its
// reason code alone into the same DISCONNECT with an empty property list:
// the substrate's decoder reads the reason code only from a body of two
// bytes or more, so `E0 01 04` (disconnect, publish my Will) would be taken
// as reason 0x00 and the Will discarded.
func (f *Framer) disconnectWithProps(data []byte) []byte {
	if f.st.version == 5 && len(data) >= 3 && data[0] == packets.Disconnect<<4 && data[1] == 1 {
		return []byte{data[0], 2, data[2], 0}
	}
	return nil
}

// hold makes buf (empty) hold data, with room for need bytes. need is
// bounded by the packet's limit, judged before (frame).
func (f *Framer) hold(data []byte, need int) {
	need = max(need, len(data))
	if need <= framerPooled {
		f.buf = append((*framerPool.Get().(*[]byte))[:0], data...)
		return
	}
	f.buf = append(make([]byte, 0, need), data...)
}

// grow makes room in buf for need bytes.
func (f *Framer) grow(need int) {
	if cap(f.buf) < need {
		nb := append(make([]byte, 0, need), f.buf...)
		f.release()
		f.buf = nb
	}
}

// release lets buf go: back to the pool if it came from there.
func (f *Framer) release() {
	if cap(f.buf) == framerPooled {
		b := f.buf[:0]
		framerPool.Put(&b)
	}
	f.buf = nil
}

// take hands on up to len(p) of the ready bytes.
func (f *Framer) take(p []byte) int {
	n := copy(p, f.buf[:f.ready])
	f.ready -= n
	rest := copy(f.buf, f.buf[n:])
	f.buf = f.buf[:rest]
	if rest == 0 {
		f.release() // an idle connection holds no buffer
	}
	return n
}

// Answer is the packet that answers refusal r on f's connection (before
// its CONNECT passed, r refuses the CONNECT itself): an MQTT 5 CONNACK or
// DISCONNECT with r's code and, if the client's Maximum Packet Size allows,
// its reason as Reason String; nil for a silent close (MQTT 3.1.1, and a
// connection whose protocol is not known).
func (f *Framer) Answer(r *Refusal) []byte {
	if r.silent {
		return nil
	}
	st := &f.st
	connect := st.version == 0
	var head []byte
	switch {
	case connect:
		head = []byte{0, r.Code} // CONNACK: Session Present 0, the reason code
	case st.version == 5:
		head = []byte{r.Code}
	default:
		return nil // 3.1.1 has no server DISCONNECT: closed
	}
	first := byte(0xE0)
	if connect {
		first = 0x20
	}
	plain := append([]byte{first, byte(len(head) + 1)}, append(head, 0)...)
	reason := r.Reason
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
