package door

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// WebSocket framing, the server's side (RFC 6455 §5). The stream a ws door
// hands on is the payload of the client's binary frames, joined: an MQTT
// packet may span frames and a frame may hold several packets (MQTT 5 §6),
// so frame boundaries mean nothing above this layer. Each Write is one
// binary frame.
//
// Frames are read in place in the caller's buffer — headers and control
// frames taken out, payload unmasked and moved down — so an idle
// connection holds no read buffer of its own: only the state of the frame
// it is in (a partial header, a control frame's ≤125 bytes).

// WebSocket opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// Close status codes this side sends (RFC 6455 §7.4.1).
const (
	closeNormal      = 1000
	closeProtocol    = 1002
	closeUnsupported = 1003
)

// maxControl is a control frame's largest payload (RFC 6455 §5.5).
const maxControl = 125

var (
	// ErrTextFrame ends a connection that sent a text frame: MQTT over
	// WebSocket is binary frames only (MQTT 5 §6).
	ErrTextFrame = errors.New("the client sent a WebSocket text frame; MQTT travels in binary frames only")
	// errPeerClosed is the client's close frame: the end of its stream.
	errPeerClosed = fmt.Errorf("the client closed the WebSocket: %w", io.EOF)
)

// wsProtocolError is a frame that breaks RFC 6455.
type wsProtocolError struct{ why string }

func (e *wsProtocolError) Error() string { return "WebSocket protocol error: " + e.why }

// wsReader is the state of the client's frame stream between reads.
type wsReader struct {
	hdr  [14]byte // the frame header being read
	hlen int      // bytes of it read so far
	// left is the current frame's payload still to come; op its opcode.
	left uint64
	op   byte
	mask [4]byte
	mpos int // the next payload byte's place in the mask
	// inMessage: a data message's last frame (FIN) has not come yet.
	inMessage bool
	ctl       [maxControl]byte // the control frame's payload so far
	clen      int
	// onControl is told each whole control frame (ping, pong, close).
	onControl func(op byte, payload []byte)
}

// feed reads the frames in b, leaving the data payload they carry,
// unmasked, at b[:n]. A close frame or a frame that breaks the protocol
// ends the stream (err); what came before it is still in b[:n].
func (r *wsReader) feed(b []byte) (n int, err error) {
	i := 0
	for i < len(b) {
		if r.hlen < 2 || r.hlen < headerSize(r.hdr[:r.hlen]) {
			r.hdr[r.hlen] = b[i]
			r.hlen++
			i++
			if r.hlen >= 2 && r.hlen == headerSize(r.hdr[:r.hlen]) {
				if err := r.begin(); err != nil {
					return n, err
				}
				if r.left == 0 {
					if err := r.end(); err != nil {
						return n, err
					}
				}
			}
			continue
		}
		take := len(b) - i
		if uint64(take) > r.left {
			take = int(r.left)
		}
		chunk := b[i : i+take]
		for k := range chunk {
			chunk[k] ^= r.mask[(r.mpos+k)&3]
		}
		r.mpos = (r.mpos + take) & 3
		if r.op&0x8 != 0 {
			r.clen += copy(r.ctl[r.clen:], chunk)
		} else {
			n += copy(b[n:], chunk)
		}
		i += take
		r.left -= uint64(take)
		if r.left == 0 {
			if err := r.end(); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// headerSize is the length of the frame header whose first bytes are h
// (at least two).
func headerSize(h []byte) int {
	if len(h) < 2 {
		return 2
	}
	n := 2
	switch h[1] & 0x7F {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4
	}
	return n
}

// begin judges a whole frame header (RFC 6455 §5.2, §5.5).
func (r *wsReader) begin() error {
	h := r.hdr[:r.hlen]
	fin, rsv, op := h[0]&0x80 != 0, h[0]&0x70, h[0]&0x0F
	masked, length := h[1]&0x80 != 0, uint64(h[1]&0x7F)
	rest := h[2:]
	switch length {
	case 126:
		length, rest = uint64(binary.BigEndian.Uint16(rest)), rest[2:]
	case 127:
		length, rest = binary.BigEndian.Uint64(rest), rest[8:]
	}
	switch {
	case rsv != 0:
		return &wsProtocolError{"reserved bits set, and no extension was agreed"}
	case !masked:
		return &wsProtocolError{"an unmasked frame from the client"}
	case length>>63 != 0:
		return &wsProtocolError{"a frame length with its top bit set"}
	}
	switch op {
	case opClose, opPing, opPong:
		// invariant 13: a control frame's payload is held whole, so its
		// length is judged from its header first.
		if !fin || length > maxControl {
			return &wsProtocolError{"a fragmented or oversized control frame"}
		}
	case opText:
		return ErrTextFrame
	case opBinary:
		if r.inMessage {
			return &wsProtocolError{"a new message before the last one's final frame"}
		}
		r.inMessage = !fin
	case opContinuation:
		if !r.inMessage {
			return &wsProtocolError{"a continuation frame with no message to continue"}
		}
		r.inMessage = !fin
	default:
		return &wsProtocolError{fmt.Sprintf("reserved opcode 0x%X", op)}
	}
	copy(r.mask[:], rest)
	r.op, r.left, r.mpos, r.clen = op, length, 0, 0
	return nil
}

// end closes the frame whose payload is complete.
func (r *wsReader) end() error {
	r.hlen = 0
	if r.op&0x8 == 0 {
		return nil
	}
	if r.onControl != nil {
		r.onControl(r.op, r.ctl[:r.clen])
	}
	if r.op == opClose {
		return errPeerClosed
	}
	return nil
}

// wsConn is a WebSocket stream over the connection below it (TLS or the
// socket). Reads are the reader goroutine's; writes may come from any
// goroutine, one frame at a time under wmu.
type wsConn struct {
	net.Conn
	carry []byte // bytes read with the upgrade request, not yet framed
	rd    wsReader
	rerr  error // the stream's end, returned once what came before it is read

	wmu       sync.Mutex
	closeSent bool // guarded by wmu
	// wdl is the write deadline the connection's writer set: a control
	// frame the reader writes runs under its own bound and then puts this
	// one back, so the writer's frames keep their caller's bound.
	dmu sync.Mutex
	wdl time.Time
	// owed is the control frame the reader could not write at once (the
	// writer was busy): the next frame written carries it first. Only the
	// latest is kept (a pong answers the latest ping, RFC 6455 §5.5.3).
	omu    sync.Mutex
	owed   [2 + maxControl]byte
	owedOp byte // 0: none
	owedN  int
}

// controlWithin bounds a control frame the reader writes itself (a pong, a
// close); the writer's own frames carry their caller's deadline.
const controlWithin = 5 * time.Second

func (c *wsConn) Read(p []byte) (int, error) {
	if c.rd.onControl == nil {
		c.rd.onControl = c.control
	}
	for len(p) > 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		var n int
		var err error
		if len(c.carry) > 0 {
			n = copy(p, c.carry)
			if c.carry = c.carry[n:]; len(c.carry) == 0 {
				c.carry = nil
			}
		} else {
			n, err = c.Conn.Read(p)
		}
		out, ferr := c.rd.feed(p[:n])
		if ferr != nil {
			c.rerr = ferr
			c.failed(ferr)
		} else if err != nil {
			c.rerr = err
		}
		c.writeOwed()
		if out > 0 {
			return out, nil
		}
	}
	return 0, nil
}

// control answers a whole control frame from the client.
func (c *wsConn) control(op byte, payload []byte) {
	switch op {
	case opPing:
		c.owe(opPong, payload)
	case opClose:
		// RFC 6455 §5.5.1: echo the status code.
		if len(payload) >= 2 {
			c.owe(opClose, payload[:2])
		} else {
			c.owe(opClose, nil)
		}
	}
}

// failed owes the client the close frame that says why its stream ended.
func (c *wsConn) failed(err error) {
	var pe *wsProtocolError
	switch {
	case errors.Is(err, ErrTextFrame):
		c.owe(opClose, closeStatus(closeUnsupported))
	case errors.As(err, &pe):
		c.owe(opClose, closeStatus(closeProtocol))
	}
}

func closeStatus(code uint16) []byte { return binary.BigEndian.AppendUint16(nil, code) }

func (c *wsConn) owe(op byte, payload []byte) {
	c.omu.Lock()
	defer c.omu.Unlock()
	if c.owedOp == opClose {
		return // a close is owed: nothing goes after it
	}
	c.owedOp = op
	c.owedN = copy(c.owed[:], payload)
}

// writeOwed writes an owed control frame now if no frame is being
// written; otherwise the writer carries it after its own (never blocking
// the reader behind a write to a client that does not read).
func (c *wsConn) writeOwed() {
	c.omu.Lock()
	none := c.owedOp == 0
	c.omu.Unlock()
	if none || !c.wmu.TryLock() {
		return
	}
	defer c.wmu.Unlock()
	c.dmu.Lock()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(controlWithin))
	c.dmu.Unlock()
	c.writeOwedLocked()
	c.dmu.Lock()
	_ = c.Conn.SetWriteDeadline(c.wdl)
	c.dmu.Unlock()
}

// SetWriteDeadline bounds the frames written from now on.
func (c *wsConn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.wdl = t
	return c.Conn.SetWriteDeadline(t)
}

// SetDeadline sets both halves' deadlines, the write one as
// SetWriteDeadline does.
func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *wsConn) writeOwedLocked() {
	c.omu.Lock()
	op, payload := c.owedOp, append([]byte(nil), c.owed[:c.owedN]...)
	c.owedOp = 0
	c.omu.Unlock()
	if op == 0 || c.closeSent {
		return
	}
	_ = c.writeFrame(op, payload)
}

// Write sends b as one binary frame.
func (c *wsConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return 0, net.ErrClosed
	}
	if err := c.writeFrame(opBinary, b); err != nil {
		return 0, err
	}
	c.writeOwedLocked()
	return len(b), nil
}

// smallFrame is the largest payload copied behind its header into one
// write (one TLS record, one system call); a larger one is written from
// the caller's bytes, behind a separate header.
const smallFrame = 4 << 10

var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 10+smallFrame); return &b }}

// writeFrame writes one unfragmented frame (wmu held).
func (c *wsConn) writeFrame(op byte, payload []byte) error {
	if op == opClose {
		c.closeSent = true
	}
	var hdr [10]byte
	hdr[0] = 0x80 | op
	h := hdr[:2]
	switch n := len(payload); {
	case n < 126:
		hdr[1] = byte(n)
	case n <= 0xFFFF:
		hdr[1] = 126
		h = binary.BigEndian.AppendUint16(hdr[:2], uint16(n))
	default:
		hdr[1] = 127
		h = binary.BigEndian.AppendUint64(hdr[:2], uint64(n))
	}
	if len(payload) > smallFrame {
		bufs := net.Buffers{h, payload}
		_, err := bufs.WriteTo(c.Conn)
		return err
	}
	bp := frameBufs.Get().(*[]byte)
	buf := append(append((*bp)[:0], h...), payload...)
	_, err := c.Conn.Write(buf)
	*bp = buf[:0]
	frameBufs.Put(bp)
	return err
}

// Close sends a close frame (unless one was sent, or a frame is being
// written: then the stream is cut) and closes the connection below.
func (c *wsConn) Close() error {
	if c.wmu.TryLock() {
		if !c.closeSent {
			_ = c.Conn.SetWriteDeadline(time.Now().Add(controlWithin))
			c.omu.Lock()
			owed := c.owedOp == opClose
			c.omu.Unlock()
			if owed {
				c.writeOwedLocked()
			} else {
				_ = c.writeFrame(opClose, closeStatus(closeNormal))
			}
		}
		c.wmu.Unlock()
	}
	return c.Conn.Close()
}
