package loadgen

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// subscriber is the receiving side of the load generator: one MQTT 5
// connection holding one subscription, which reads deliveries and
// acknowledges them in order.
//
// It is not paho, deliberately. paho decodes every string of a PUBLISH
// through a fresh bytes.Buffer (at least 512 bytes each), so a channel
// record with three User Properties costs it about 4 KiB of garbage, and it
// writes each PUBACK with its own system call. Measured against a server
// that only sends, a paho reader stopped near 35,000 records/s on the
// two-core machine the benchmark runs on, under the 100,000 records/s the
// replay target asks a broker for: the reader would have measured itself.
// This one decodes a PUBLISH in place from a buffer it reuses and sends the
// PUBACKs for everything it has read in one write, before it next waits for
// the socket. Setup packets (CONNECT, CONNACK, SUBSCRIBE, SUBACK) go through
// paho's packets package.
type subscriber struct {
	conn net.Conn
	r    *bufio.Reader

	wmu sync.Mutex // guards w: the read loop's PUBACKs and the pinger
	w   *bufio.Writer

	onPublish func(*delivery)
	onPuback  func(id uint16, reason byte)
	maxPacket uint32
	// ackEvery is how many PUBACKs may wait for the buffer to run dry
	// before they are sent anyway: under a continuous stream the buffer
	// never empties, and a broker whose window (our Receive Maximum) is
	// all unacknowledged stops sending or, like mosquitto past
	// max_queued_messages, starts dropping.
	ackEvery  int
	done      chan struct{} // closed when the read loop ends
	err       error         // why it ended; read after done
	stopped   chan struct{} // closed by close
	closeOnce sync.Once
}

// delivery is one received PUBLISH. Its slices point into the reader's
// buffer and are valid only during the onPublish call.
type delivery struct {
	Topic    []byte
	QoS      byte
	Retain   bool
	PacketID uint16
	Payload  []byte
	// Correlation is the Correlation Data property, nil when absent.
	Correlation []byte
	user        [][2][]byte
}

// Prop returns the value of the first User Property named key, or nil.
func (d *delivery) Prop(key string) []byte {
	for _, kv := range d.user {
		if string(kv[0]) == key {
			return kv[1]
		}
	}
	return nil
}

type subscriberOptions struct {
	ClientID       string
	CleanStart     bool
	SessionExpiry  uint32
	ReceiveMaximum uint16
	Filter         string
	QoS            byte // 0 or 1
	Timeout        time.Duration
	OnPublish      func(*delivery)
	// OnPuback, if set, receives the PUBACKs of publishes sent with
	// send (the reason code is 0x00 when the PUBACK omits it); without it
	// a PUBACK ends the connection as an unexpected packet.
	OnPuback func(id uint16, reason byte)
	// ReadBuffer is the socket read buffer; 0 = readBufferSize. A fan-out
	// of a thousand subscribers that each receive a few small messages
	// takes a small one, so the run's memory does not grow by 64 KiB a
	// connection.
	ReadBuffer int
}

// maxSubscriberPacket is the Maximum Packet Size the subscriber announces:
// the largest payload a run may use plus room for topic and properties. A
// broker must not send more (MQTT-3.1.2-24), and a packet declaring more is
// refused before its buffer is sized (invariant 13).
const maxSubscriberPacket = MaxPayload + 64<<10

// dialSubscriber connects, subscribes, and starts the read loop. The
// returned bool is the CONNACK's Session Present.
func dialSubscriber(ctx context.Context, addr string, o subscriberOptions) (*subscriber, bool, error) {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.QoS > 1 {
		return nil, false, fmt.Errorf("subscriber: QoS %d, want 0 or 1", o.QoS)
	}
	d := net.Dialer{Timeout: o.Timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w", addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	rbuf, wbuf := readBufferSize, 16<<10
	if o.ReadBuffer > 0 {
		rbuf, wbuf = min(o.ReadBuffer, readBufferSize), min(o.ReadBuffer, wbuf)
	}
	s := &subscriber{
		conn:      conn,
		r:         bufio.NewReaderSize(conn, rbuf),
		w:         bufio.NewWriterSize(conn, wbuf),
		onPublish: o.OnPublish,
		onPuback:  o.OnPuback,
		maxPacket: maxSubscriberPacket,
		ackEvery:  ackBatch(o.ReceiveMaximum),
		done:      make(chan struct{}),
		stopped:   make(chan struct{}),
	}
	present, keepAlive, err := s.handshake(ctx, o)
	if err != nil {
		_ = conn.Close()
		return nil, false, err
	}
	go s.readLoop()
	if keepAlive > 0 {
		go s.pinger(time.Duration(keepAlive) * time.Second)
	}
	return s, present, nil
}

// subscriberKeepAlive is the keep alive the subscriber asks for; a broker
// may answer with its own Server Keep Alive, which the pinger then keeps.
const subscriberKeepAlive = 60

func (s *subscriber) handshake(ctx context.Context, o subscriberOptions) (bool, uint16, error) {
	deadline := time.Now().Add(o.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = s.conn.SetDeadline(deadline)
	defer func() { _ = s.conn.SetDeadline(time.Time{}) }()

	maxPacket := s.maxPacket
	props := &packets.Properties{MaximumPacketSize: &maxPacket}
	if o.SessionExpiry > 0 {
		se := o.SessionExpiry
		props.SessionExpiryInterval = &se
	}
	if o.ReceiveMaximum > 0 {
		rm := o.ReceiveMaximum
		props.ReceiveMaximum = &rm
	}
	cp := packets.NewControlPacket(packets.CONNECT)
	cp.Content = &packets.Connect{
		ProtocolName:    "MQTT",
		ProtocolVersion: 5,
		ClientID:        o.ClientID,
		CleanStart:      o.CleanStart,
		KeepAlive:       subscriberKeepAlive,
		Properties:      props,
	}
	if _, err := cp.WriteTo(s.conn); err != nil {
		return false, 0, fmt.Errorf("subscriber %q: CONNECT: %w", o.ClientID, err)
	}
	p, err := packets.ReadPacket(s.r)
	if err != nil {
		return false, 0, fmt.Errorf("subscriber %q: reading CONNACK: %w", o.ClientID, err)
	}
	ca, ok := p.Content.(*packets.Connack)
	if !ok {
		return false, 0, fmt.Errorf("subscriber %q: %s where CONNACK was due", o.ClientID, p.PacketType())
	}
	if ca.ReasonCode != 0 {
		return false, 0, fmt.Errorf("subscriber %q: CONNACK reason 0x%02x (%s)", o.ClientID, ca.ReasonCode, ca.Reason())
	}
	keepAlive := uint16(subscriberKeepAlive)
	if ca.Properties != nil && ca.Properties.ServerKeepAlive != nil {
		keepAlive = *ca.Properties.ServerKeepAlive
	}

	sp := packets.NewControlPacket(packets.SUBSCRIBE)
	sp.Content = &packets.Subscribe{
		PacketID:      1,
		Properties:    &packets.Properties{},
		Subscriptions: []packets.SubOptions{{Topic: o.Filter, QoS: o.QoS}},
	}
	if _, err := sp.WriteTo(s.conn); err != nil {
		return false, 0, fmt.Errorf("subscriber %q: SUBSCRIBE: %w", o.ClientID, err)
	}
	// Records may arrive right behind the SUBACK, so nothing past it is
	// consumed here: ReadPacket reads exactly one packet from the buffer.
	p, err = packets.ReadPacket(s.r)
	if err != nil {
		return false, 0, fmt.Errorf("subscriber %q: reading SUBACK: %w", o.ClientID, err)
	}
	sa, ok := p.Content.(*packets.Suback)
	if !ok {
		return false, 0, fmt.Errorf("subscriber %q: %s where SUBACK was due", o.ClientID, p.PacketType())
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] != o.QoS {
		return false, 0, fmt.Errorf("subscriber %q: subscribe %q: SUBACK reasons %x, want [%02x] (granted QoS %d)", o.ClientID, o.Filter, sa.Reasons, o.QoS, o.QoS)
	}
	return ca.SessionPresent, keepAlive, nil
}

// ackBatch is the PUBACK batch for a Receive Maximum: a quarter of the
// window, so the broker always has most of it to send into, and at most 8:
// a broker may keep its own, smaller window (mosquitto sends 20 at a time)
// and would otherwise idle between batches.
func ackBatch(receiveMaximum uint16) int {
	rm := int(receiveMaximum)
	if rm == 0 {
		rm = 65535
	}
	return max(1, min(rm/4, 8))
}

// readLoop reads packets until the connection ends. It flushes the PUBACKs
// collected so far before each read that would wait on the socket, and
// whenever ackEvery of them are waiting, so they leave a batch per write
// and none waits for long.
func (s *subscriber) readLoop() {
	defer close(s.done)
	var buf []byte
	var d delivery
	pending := 0
	for {
		if pending > 0 && (pending >= s.ackEvery || s.r.Buffered() == 0) {
			if err := s.flush(); err != nil {
				s.err = err
				return
			}
			pending = 0
		}
		first, err := s.r.ReadByte()
		if err != nil {
			s.err = err
			return
		}
		n, err := readVBI(s.r)
		if err != nil {
			s.err = fmt.Errorf("remaining length: %w", err)
			return
		}
		if uint32(n) > s.maxPacket {
			s.err = fmt.Errorf("packet type %d of %d bytes, over the Maximum Packet Size %d", first>>4, n, s.maxPacket)
			return
		}
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		body := buf[:n]
		if _, err := io.ReadFull(s.r, body); err != nil {
			s.err = err
			return
		}
		switch first >> 4 {
		case packets.PUBLISH:
			if err := decodePublish(first, body, &d); err != nil {
				s.err = err
				return
			}
			if s.onPublish != nil {
				s.onPublish(&d)
			}
			if d.QoS == 1 {
				s.wmu.Lock()
				_, err = s.w.Write([]byte{packets.PUBACK << 4, 2, byte(d.PacketID >> 8), byte(d.PacketID)})
				s.wmu.Unlock()
				if err != nil {
					s.err = err
					return
				}
				pending++
			}
		case packets.PUBACK:
			if s.onPuback == nil {
				s.err = errors.New("PUBACK for a publish this connection never sent")
				return
			}
			if len(body) < 2 {
				s.err = errors.New("PUBACK without a packet identifier")
				return
			}
			reason := byte(0) // MQTT 5 §3.4.2.1: omitted means Success
			if len(body) > 2 {
				reason = body[2]
			}
			s.onPuback(binary.BigEndian.Uint16(body), reason)
		case packets.PINGRESP:
		case packets.DISCONNECT:
			reason := byte(0)
			if len(body) > 0 {
				reason = body[0]
			}
			s.err = fmt.Errorf("broker sent DISCONNECT, reason 0x%02x", reason)
			return
		default:
			s.err = fmt.Errorf("unexpected packet type %d", first>>4)
			return
		}
	}
}

// send writes one whole packet the caller encoded and flushes it (with
// any PUBACKs waiting in the buffer). It is safe beside the read loop.
func (s *subscriber) send(packet []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.w.Write(packet); err != nil {
		return err
	}
	return s.w.Flush()
}

func (s *subscriber) flush() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.w.Flush()
}

// pinger sends PINGREQ at three quarters of the keep alive.
func (s *subscriber) pinger(keepAlive time.Duration) {
	t := time.NewTicker(keepAlive * 3 / 4)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-s.stopped:
			return
		case <-t.C:
			s.wmu.Lock()
			_, err := s.w.Write([]byte{packets.PINGREQ << 4, 0})
			if err == nil {
				err = s.w.Flush()
			}
			s.wmu.Unlock()
			if err != nil {
				return
			}
		}
	}
}

// close sends a normal DISCONNECT (leaving a session with an expiry to
// expire), closes the connection and waits for the read loop.
func (s *subscriber) close() {
	s.closeOnce.Do(func() {
		close(s.stopped)
		s.wmu.Lock()
		_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = s.w.Write([]byte{packets.DISCONNECT << 4, 0})
		_ = s.w.Flush()
		s.wmu.Unlock()
		_ = s.conn.Close()
		<-s.done
	})
}

// readVBI reads an MQTT Variable Byte Integer (at most four bytes).
func readVBI(r io.ByteReader) (int, error) {
	var v, mult int = 0, 1
	for i := range 4 {
		b, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		v += int(b&0x7f) * mult
		if b&0x80 == 0 {
			return v, nil
		}
		if i == 3 {
			break
		}
		mult *= 128
	}
	return 0, errors.New("malformed variable byte integer")
}

// decodePublish decodes a PUBLISH body in place (MQTT 5 §3.3).
func decodePublish(first byte, body []byte, d *delivery) error {
	*d = delivery{user: d.user[:0]}
	d.QoS = (first >> 1) & 3
	d.Retain = first&1 != 0
	if d.QoS > 1 {
		return fmt.Errorf("PUBLISH at QoS %d on a subscription of at most QoS 1", d.QoS)
	}
	topic, rest, err := takeString(body)
	if err != nil {
		return fmt.Errorf("PUBLISH topic: %w", err)
	}
	d.Topic = topic
	if d.QoS > 0 {
		if len(rest) < 2 {
			return errors.New("PUBLISH: no packet identifier")
		}
		d.PacketID = binary.BigEndian.Uint16(rest)
		rest = rest[2:]
	}
	plen, n, err := vbiFrom(rest)
	if err != nil {
		return fmt.Errorf("PUBLISH properties length: %w", err)
	}
	rest = rest[n:]
	if plen > len(rest) {
		return errors.New("PUBLISH properties overrun the packet")
	}
	props := rest[:plen]
	d.Payload = rest[plen:]
	for len(props) > 0 {
		id := props[0]
		props = props[1:]
		switch id {
		case 0x01: // Payload Format Indicator
			if len(props) < 1 {
				return errors.New("PUBLISH property truncated")
			}
			props = props[1:]
		case 0x02: // Message Expiry Interval
			if len(props) < 4 {
				return errors.New("PUBLISH property truncated")
			}
			props = props[4:]
		case 0x23: // Topic Alias: never announced a maximum, so never valid
			return errors.New("PUBLISH carries a Topic Alias the client never allowed")
		case 0x08, 0x03: // Response Topic, Content Type
			var err error
			if _, props, err = takeString(props); err != nil {
				return fmt.Errorf("PUBLISH property 0x%02x: %w", id, err)
			}
		case 0x09: // Correlation Data
			var err error
			if d.Correlation, props, err = takeString(props); err != nil {
				return fmt.Errorf("PUBLISH correlation data: %w", err)
			}
		case 0x0B: // Subscription Identifier
			_, n, err := vbiFrom(props)
			if err != nil {
				return fmt.Errorf("PUBLISH subscription identifier: %w", err)
			}
			props = props[n:]
		case 0x26: // User Property
			k, r1, err := takeString(props)
			if err != nil {
				return fmt.Errorf("PUBLISH user property: %w", err)
			}
			v, r2, err := takeString(r1)
			if err != nil {
				return fmt.Errorf("PUBLISH user property: %w", err)
			}
			d.user = append(d.user, [2][]byte{k, v})
			props = r2
		default:
			return fmt.Errorf("PUBLISH property 0x%02x is not a PUBLISH property", id)
		}
	}
	return nil
}

// takeString splits a two-byte-length-prefixed string (or binary) off b.
func takeString(b []byte) ([]byte, []byte, error) {
	if len(b) < 2 {
		return nil, nil, errors.New("truncated length")
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b)-2 < n {
		return nil, nil, errors.New("string overruns the packet")
	}
	return b[2 : 2+n], b[2+n:], nil
}

// vbiFrom decodes a Variable Byte Integer at the start of b and returns it
// and its length.
func vbiFrom(b []byte) (int, int, error) {
	var v, mult int = 0, 1
	for i := 0; i < 4 && i < len(b); i++ {
		v += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return v, i + 1, nil
		}
		mult *= 128
	}
	return 0, 0, errors.New("malformed variable byte integer")
}
