package main

// A bare MQTT client speaking 3.1.1 or 5 for the headline table
// (table.go). NATS's MQTT listener speaks 3.1.1 only, and paho.golang
// (loadgen, sessclient.go) speaks 5 only, so the table's load runs through
// this one client on every broker - the same code path on each side of a
// ratio. It encodes the handful of packets the scenarios send and decodes
// what they receive; every length read off the wire is checked against
// maxWirePacket before anything is allocated for it (invariant 13).

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// maxWirePacket bounds one packet this client reads.
const maxWirePacket = 1<<20 + 64<<10

// MQTT protocol levels.
const (
	mqtt311 byte = 4
	mqtt5   byte = 5
)

// Control packet types (high nibble of the first byte).
const (
	pCONNACK    = 2
	pPUBLISH    = 3
	pPUBACK     = 4
	pSUBACK     = 9
	pPINGRESP   = 13
	pDISCONNECT = 14
)

// wconn is one connection. Writes go through a buffer under wmu; reads are
// the caller's (one reader goroutine per connection).
type wconn struct {
	c       net.Conn
	r       *bufio.Reader
	wmu     sync.Mutex
	w       *bufio.Writer
	v       byte
	id      string
	scratch []byte // packet body being read; valid until the next read
	enc     []byte // packet being written; guarded by wmu
}

// wdial is how a connection is opened.
type wdial struct {
	id         string
	version    byte
	clean      bool
	receiveMax uint16        // MQTT 5 only; 0 = not sent
	rcvBuf     int           // SO_RCVBUF before connecting; 0 = the kernel's
	small      bool          // 1 KiB buffers: an idle connection held by the thousand
	timeout    time.Duration // dial and CONNACK
}

// wDial connects and requires CONNACK success. Keep Alive is 0: the
// scenarios' connections are either busy or measured idle, and a ping
// would be load of its own.
func wDial(ctx context.Context, addr string, o wdial) (*wconn, error) {
	d := net.Dialer{Timeout: o.timeout}
	if o.rcvBuf > 0 {
		// Set before connect, so the window the broker sees is small from
		// the first byte: a subscriber that stops reading is then deaf at
		// once, not after the kernel has buffered megabytes for it.
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, o.rcvBuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: dial %s: %w", o.id, addr, err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	rsize, wsize := 64<<10, 16<<10
	switch {
	case o.small:
		rsize, wsize = 1<<10, 1<<10
	case o.rcvBuf > 0:
		rsize = 4 << 10
	}
	c := &wconn{c: raw, r: bufio.NewReaderSize(raw, rsize), w: bufio.NewWriterSize(raw, wsize), v: o.version, id: o.id}
	_ = raw.SetDeadline(time.Now().Add(o.timeout))
	if err := c.connect(o); err != nil {
		_ = raw.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return c, nil
}

func (c *wconn) connect(o wdial) error {
	b := c.enc[:0]
	b = appendStr(b, "MQTT")
	b = append(b, o.version)
	var flags byte
	if o.clean {
		flags |= 0x02
	}
	b = append(b, flags, 0, 0) // Keep Alive 0
	if o.version == mqtt5 {
		var props []byte
		if o.receiveMax > 0 {
			props = append(props, 0x21, byte(o.receiveMax>>8), byte(o.receiveMax))
		}
		props = append(props, 0x27, 0, 0, 0, 0) // Maximum Packet Size
		binary.BigEndian.PutUint32(props[len(props)-4:], maxWirePacket)
		b = appendVBI(b, len(props))
		b = append(b, props...)
	}
	b = appendStr(b, o.id)
	if err := c.sendPacket(0x10, b); err != nil {
		return fmt.Errorf("%s: CONNECT: %w", c.id, err)
	}
	typ, _, body, err := c.read()
	if err != nil {
		return fmt.Errorf("%s: reading CONNACK: %w", c.id, err)
	}
	if typ != pCONNACK || len(body) < 2 {
		return fmt.Errorf("%s: packet type %d where CONNACK was due", c.id, typ)
	}
	if body[1] != 0 {
		return fmt.Errorf("%s: CONNACK return code 0x%02x", c.id, body[1])
	}
	return nil
}

// sendPacket writes one packet and flushes it.
func (c *wconn) sendPacket(first byte, body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writeLocked(first, body); err != nil {
		return err
	}
	return c.w.Flush()
}

func (c *wconn) writeLocked(first byte, body []byte) error {
	var hdr [5]byte
	h := appendVBI(append(hdr[:0], first), len(body))
	if _, err := c.w.Write(h); err != nil {
		return err
	}
	_, err := c.w.Write(body)
	return err
}

// subscribe subscribes to one filter and requires that QoS granted.
func (c *wconn) subscribe(filter string, qos byte, timeout time.Duration) error {
	b := []byte{0, 1}
	if c.v == mqtt5 {
		b = append(b, 0)
	}
	b = appendStr(b, filter)
	b = append(b, qos)
	if err := c.sendPacket(0x82, b); err != nil {
		return fmt.Errorf("%s: SUBSCRIBE: %w", c.id, err)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.c.SetReadDeadline(time.Time{}) }()
	typ, _, body, err := c.read()
	if err != nil {
		return fmt.Errorf("%s: reading SUBACK: %w", c.id, err)
	}
	if typ != pSUBACK || len(body) < 3 {
		return fmt.Errorf("%s: packet type %d where SUBACK was due", c.id, typ)
	}
	rest := body[2:]
	if c.v == mqtt5 {
		n, k, err := vbiFromBytes(rest)
		if err != nil || k+n > len(rest) {
			return fmt.Errorf("%s: malformed SUBACK properties", c.id)
		}
		rest = rest[k+n:]
	}
	if len(rest) != 1 || rest[0] != qos {
		return fmt.Errorf("%s: subscribe %q at QoS %d: SUBACK %x", c.id, filter, qos, rest)
	}
	return nil
}

// pubProps are the MQTT 5 properties a PUBLISH may carry here.
type pubProps struct {
	responseTopic string
	correlation   []byte
}

// writePublish buffers one PUBLISH (flushed by flush, or by the buffer
// filling). id is ignored at QoS 0.
func (c *wconn) writePublish(topic string, qos byte, id uint16, payload []byte, props *pubProps) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := appendStr(c.enc[:0], topic)
	if qos > 0 {
		b = append(b, byte(id>>8), byte(id))
	}
	if c.v == mqtt5 {
		if props == nil {
			b = append(b, 0)
		} else {
			var p []byte
			if props.responseTopic != "" {
				p = appendStr(append(p, 0x08), props.responseTopic)
			}
			if props.correlation != nil {
				p = append(p, 0x09, byte(len(props.correlation)>>8), byte(len(props.correlation)))
				p = append(p, props.correlation...)
			}
			b = appendVBI(b, len(p))
			b = append(b, p...)
		}
	}
	b = append(b, payload...)
	c.enc = b
	return c.writeLocked(0x30|qos<<1, b)
}

// writePuback buffers a PUBACK (success).
func (c *wconn) writePuback(id uint16) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(0x40, []byte{byte(id >> 8), byte(id)})
}

func (c *wconn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.Flush()
}

// disconnect sends a normal DISCONNECT and closes the socket.
func (c *wconn) disconnect() {
	_ = c.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	_ = c.sendPacket(0xE0, nil)
	_ = c.c.Close()
}

func (c *wconn) close() { _ = c.c.Close() }

// read reads one packet: its type, the first byte's flags, and its body,
// which stays valid until the next read.
func (c *wconn) read() (typ, flags byte, body []byte, err error) {
	first, err := c.r.ReadByte()
	if err != nil {
		return 0, 0, nil, err
	}
	n, err := readVBIFrom(c.r)
	if err != nil {
		return 0, 0, nil, err
	}
	if n > maxWirePacket {
		return 0, 0, nil, fmt.Errorf("%s: a packet of %d bytes declared, at most %d accepted", c.id, n, maxWirePacket)
	}
	if cap(c.scratch) < n {
		c.scratch = make([]byte, n)
	}
	body = c.scratch[:n]
	if _, err := io.ReadFull(c.r, body); err != nil {
		return 0, 0, nil, err
	}
	return first >> 4, first & 0x0f, body, nil
}

// wpublish is a decoded PUBLISH; its slices alias the read buffer.
type wpublish struct {
	qos     byte
	dup     bool
	id      uint16
	topic   []byte
	payload []byte
	props   pubProps
}

// decodePublishBody decodes a PUBLISH body read by read.
func (c *wconn) decodePublishBody(flags byte, body []byte, p *wpublish) error {
	p.qos = flags >> 1 & 3
	p.dup = flags&0x08 != 0
	p.props = pubProps{}
	if len(body) < 2 {
		return errors.New("short PUBLISH")
	}
	tl := int(binary.BigEndian.Uint16(body))
	if 2+tl > len(body) {
		return errors.New("PUBLISH topic past the packet")
	}
	p.topic = body[2 : 2+tl]
	rest := body[2+tl:]
	if p.qos > 0 {
		if len(rest) < 2 {
			return errors.New("PUBLISH without a packet id")
		}
		p.id = binary.BigEndian.Uint16(rest)
		rest = rest[2:]
	}
	if c.v == mqtt5 {
		n, k, err := vbiFromBytes(rest)
		if err != nil || k+n > len(rest) {
			return errors.New("malformed PUBLISH properties")
		}
		if err := parsePubProps(rest[k:k+n], &p.props); err != nil {
			return err
		}
		rest = rest[k+n:]
	}
	p.payload = rest
	return nil
}

// parsePubProps keeps Response Topic and Correlation Data and skips the
// other properties a PUBLISH may carry (MQTT 5 §3.3.2.3).
func parsePubProps(b []byte, p *pubProps) error {
	for len(b) > 0 {
		id := b[0]
		b = b[1:]
		var skip int
		switch id {
		case 0x01: // Payload Format Indicator
			skip = 1
		case 0x23: // Topic Alias
			skip = 2
		case 0x02: // Message Expiry Interval
			skip = 4
		case 0x0B: // Subscription Identifier
			_, k, err := vbiFromBytes(b)
			if err != nil {
				return err
			}
			skip = k
		case 0x03, 0x08, 0x09: // Content Type, Response Topic, Correlation Data
			if len(b) < 2 {
				return errors.New("short property")
			}
			l := int(binary.BigEndian.Uint16(b))
			if 2+l > len(b) {
				return errors.New("property past the packet")
			}
			switch id {
			case 0x08:
				p.responseTopic = string(b[2 : 2+l])
			case 0x09:
				p.correlation = append([]byte(nil), b[2:2+l]...)
			}
			skip = 2 + l
		case 0x26: // User Property: two strings
			for range 2 {
				if len(b[skip:]) < 2 {
					return errors.New("short user property")
				}
				skip += 2 + int(binary.BigEndian.Uint16(b[skip:]))
			}
		default:
			return fmt.Errorf("unexpected PUBLISH property 0x%02x", id)
		}
		if skip > len(b) {
			return errors.New("property past the packet")
		}
		b = b[skip:]
	}
	return nil
}

// pubackReason is a PUBACK's packet id and reason code (0 when omitted,
// and always in 3.1.1).
func pubackReason(body []byte) (uint16, byte, error) {
	if len(body) < 2 {
		return 0, 0, errors.New("short PUBACK")
	}
	var reason byte
	if len(body) > 2 {
		reason = body[2]
	}
	return binary.BigEndian.Uint16(body), reason, nil
}

func appendStr(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

func appendVBI(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func readVBIFrom(r io.ByteReader) (int, error) {
	n, mult := 0, 1
	for range 4 {
		d, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		n += int(d&0x7f) * mult
		if d&0x80 == 0 {
			return n, nil
		}
		mult *= 128
	}
	return 0, errors.New("malformed Remaining Length")
}

// vbiFromBytes decodes a variable byte integer: its value and its length.
func vbiFromBytes(b []byte) (int, int, error) {
	n, mult := 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		n += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return n, i + 1, nil
		}
		mult *= 128
	}
	return 0, 0, errors.New("malformed variable byte integer")
}
