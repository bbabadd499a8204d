package main

// A bare MQTT 5 client for the sessions scenarios (sessions.go). The
// scenarios hold thousands of connections with one goroutine each at most,
// choose Clean Start and Session Expiry per connection, read Session
// Present from every CONNACK and see each PUBLISH's DUP flag: paho's client
// hides the DUP flag and costs several goroutines per connection, so the
// packets are paho's codec and the connection handling is this file's.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// maxSessPacket bounds a packet this client reads (invariant 13): its
// declared length is checked before paho's codec allocates for it. The
// scenarios' packets carry payloads of at most -payload bytes (1MiB).
const maxSessPacket = 1<<20 + 64<<10

// sessionExpiry is the Session Expiry Interval every durable session asks
// for: an hour, far past any scenario's length.
const sessionExpiry = 3600

// sessConn is one client connection.
type sessConn struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	id   string
}

// sessDial is how a connection is opened.
type sessDial struct {
	id         string
	clean      bool   // Clean Start
	expiry     uint32 // Session Expiry Interval, seconds
	receiveMax uint16 // 0 = not sent (65,535)
	timeout    time.Duration
}

// sessConnack is what a CONNACK said.
type sessConnack struct {
	present bool
}

// dialSession connects and reads the CONNACK; any reason code but 0x00 is
// an error. The connection asks for no keep alive (0): a load generator
// holding 10,000 idle connections does not ping; a broker that imposes a
// Server Keep Alive short enough to matter within a scenario is an error,
// since the measurement would then end in timeouts rather than figures.
func dialSession(ctx context.Context, addr string, o sessDial) (*sessConn, sessConnack, error) {
	d := net.Dialer{Timeout: o.timeout}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, sessConnack{}, fmt.Errorf("%s: dial %s: %w", o.id, addr, err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := &sessConn{conn: raw, r: bufio.NewReaderSize(raw, 4<<10), w: bufio.NewWriterSize(raw, 4<<10), id: o.id}
	ca, err := c.connect(ctx, o)
	if err != nil {
		_ = raw.Close()
		return nil, sessConnack{}, err
	}
	return c, ca, nil
}

func (c *sessConn) connect(ctx context.Context, o sessDial) (sessConnack, error) {
	deadline := time.Now().Add(o.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.conn.SetDeadline(deadline)
	defer func() { _ = c.conn.SetDeadline(time.Time{}) }()

	maxPacket := uint32(maxSessPacket)
	props := &packets.Properties{MaximumPacketSize: &maxPacket}
	if o.expiry > 0 {
		se := o.expiry
		props.SessionExpiryInterval = &se
	}
	if o.receiveMax > 0 {
		rm := o.receiveMax
		props.ReceiveMaximum = &rm
	}
	cp := packets.NewControlPacket(packets.CONNECT)
	cp.Content = &packets.Connect{
		ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: o.id,
		CleanStart: o.clean, KeepAlive: 0, Properties: props,
	}
	if err := c.send(cp); err != nil {
		return sessConnack{}, fmt.Errorf("%s: CONNECT: %w", o.id, err)
	}
	p, err := c.read()
	if err != nil {
		return sessConnack{}, fmt.Errorf("%s: reading CONNACK: %w", o.id, err)
	}
	ca, ok := p.Content.(*packets.Connack)
	if !ok {
		return sessConnack{}, fmt.Errorf("%s: %s where CONNACK was due", o.id, packetName(p))
	}
	if ca.ReasonCode != 0 {
		return sessConnack{}, fmt.Errorf("%s: CONNACK reason 0x%02x (%s)", o.id, ca.ReasonCode, ca.Reason())
	}
	if ca.Properties != nil && ca.Properties.ServerKeepAlive != nil {
		if ka := *ca.Properties.ServerKeepAlive; ka > 0 && ka < 3600 {
			return sessConnack{}, fmt.Errorf("%s: the broker imposes a Server Keep Alive of %ds; this load generator does not ping", o.id, ka)
		}
	}
	if o.expiry > 0 && ca.Properties != nil && ca.Properties.SessionExpiryInterval != nil && *ca.Properties.SessionExpiryInterval < o.expiry {
		return sessConnack{}, fmt.Errorf("%s: Session Expiry granted %ds, asked %ds", o.id, *ca.Properties.SessionExpiryInterval, o.expiry)
	}
	return sessConnack{present: ca.SessionPresent}, nil
}

// subscribe subscribes to one filter at QoS 1 and requires QoS 1 granted.
func (c *sessConn) subscribe(filter string, timeout time.Duration) error {
	_ = c.conn.SetDeadline(time.Now().Add(timeout))
	defer func() { _ = c.conn.SetDeadline(time.Time{}) }()
	sp := packets.NewControlPacket(packets.SUBSCRIBE)
	sp.Content = &packets.Subscribe{
		PacketID: 1, Properties: &packets.Properties{},
		Subscriptions: []packets.SubOptions{{Topic: filter, QoS: 1}},
	}
	if err := c.send(sp); err != nil {
		return fmt.Errorf("%s: SUBSCRIBE: %w", c.id, err)
	}
	p, err := c.read()
	if err != nil {
		return fmt.Errorf("%s: reading SUBACK: %w", c.id, err)
	}
	sa, ok := p.Content.(*packets.Suback)
	if !ok {
		return fmt.Errorf("%s: %s where SUBACK was due", c.id, packetName(p))
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] != 1 {
		return fmt.Errorf("%s: subscribe %q: SUBACK reasons %x, want [01] (QoS 1 granted)", c.id, filter, sa.Reasons)
	}
	return nil
}

// publish sends a QoS 1 PUBLISH without waiting for its PUBACK.
func (c *sessConn) publish(id uint16, topic string, payload []byte) error {
	pp := packets.NewControlPacket(packets.PUBLISH)
	pp.Content = &packets.Publish{PacketID: id, QoS: 1, Topic: topic, Payload: payload, Properties: &packets.Properties{}}
	return c.send(pp)
}

// puback acknowledges a QoS 1 delivery (buffered: flush sends it).
func (c *sessConn) puback(id uint16) error {
	pa := packets.NewControlPacket(packets.PUBACK)
	pa.Content = &packets.Puback{PacketID: id, ReasonCode: 0, Properties: &packets.Properties{}}
	_, err := pa.WriteTo(c.w)
	return err
}

func (c *sessConn) flush() error { return c.w.Flush() }

// disconnect sends a normal DISCONNECT (reason 0x00: the session stays for
// its expiry interval) and closes the socket.
func (c *sessConn) disconnect() {
	_ = c.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	dp := packets.NewControlPacket(packets.DISCONNECT)
	dp.Content = &packets.Disconnect{ReasonCode: 0, Properties: &packets.Properties{}}
	_ = c.send(dp)
	_ = c.conn.Close()
}

func (c *sessConn) close() { _ = c.conn.Close() }

func (c *sessConn) send(cp *packets.ControlPacket) error {
	if _, err := cp.WriteTo(c.w); err != nil {
		return err
	}
	return c.w.Flush()
}

// read reads one packet, its declared length checked first.
func (c *sessConn) read() (*packets.ControlPacket, error) {
	n, err := peekLength(c.r)
	if err != nil {
		return nil, err
	}
	if n > maxSessPacket {
		return nil, fmt.Errorf("%s: a packet of %d bytes declared, at most %d accepted", c.id, n, maxSessPacket)
	}
	p, err := packets.ReadPacket(c.r)
	if err != nil {
		return nil, err
	}
	if d, ok := p.Content.(*packets.Disconnect); ok {
		return nil, fmt.Errorf("%s: the broker disconnected it: reason 0x%02x (%s)", c.id, d.ReasonCode, d.Reason())
	}
	return p, nil
}

// peekLength reads a fixed header's Remaining Length without consuming
// it: byte by byte, so it never waits for bytes a short packet does not
// have (a continuation bit promises the next one).
func peekLength(r *bufio.Reader) (int, error) {
	n, mult := 0, 1
	for i := 1; i <= 4; i++ {
		b, err := r.Peek(i + 1)
		if err != nil {
			return 0, err
		}
		n += int(b[i]&0x7f) * mult
		if b[i]&0x80 == 0 {
			return n, nil
		}
		mult *= 128
	}
	return 0, errors.New("malformed Remaining Length")
}

func packetName(p *packets.ControlPacket) string {
	if p == nil {
		return "nothing"
	}
	return p.PacketType()
}
