package brokertest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// RawClient speaks MQTT 5 packet by packet on one socket, with nothing a
// client library would add or reorder: a test controls exactly which bytes
// reach the broker, and in which order (for example every PUBACK strictly
// before the DISCONNECT).
type RawClient struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
	// version is the protocol level packets are decoded at (0: 5).
	version byte
}

// DialRaw connects and completes CONNECT/CONNACK, returning the CONNACK.
func DialRaw(t testing.TB, addr, id string, clean bool, sessionExpiry uint32) (*RawClient, packets.Packet) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := &RawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
	t.Cleanup(func() { _ = conn.Close() })
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: clean, Keepalive: 60},
		Properties:      packets.Properties{SessionExpiryInterval: sessionExpiry, SessionExpiryIntervalFlag: sessionExpiry > 0},
	}
	c.send(pk, (*packets.Packet).ConnectEncode)
	ack := c.Read()
	if ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", ack)
	}
	return c, ack
}

// DialConnect connects and sends the CONNECT given (a Will, a 3.1.1
// protocol level, a Keep Alive — 0 means none, as on the wire), returning
// the client and the broker's answer, which may be a refusal.
func DialConnect(t testing.TB, addr string, pk packets.Packet) (*RawClient, packets.Packet) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pk.FixedHeader.Type = packets.Connect
	if pk.ProtocolVersion == 0 {
		pk.ProtocolVersion = 5
	}
	c := &RawClient{t: t, conn: conn, r: bufio.NewReader(conn), version: pk.ProtocolVersion}
	t.Cleanup(func() { _ = conn.Close() })
	if pk.Connect.ProtocolName == nil {
		pk.Connect.ProtocolName = []byte("MQTT")
	}
	pk.Mods.AllowResponseInfo = true // encode a Will's Response Topic and Correlation Data
	c.send(pk, (*packets.Packet).ConnectEncode)
	return c, c.Read()
}

// Drop closes the connection without a DISCONNECT: to the broker, the
// client is gone (its Will applies).
func (c *RawClient) Drop() { _ = c.conn.Close() }

func (c *RawClient) send(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
	c.t.Helper()
	var buf bytes.Buffer
	if err := enc(&pk, &buf); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

// SendPublish writes one PUBLISH as given and returns without reading.
func (c *RawClient) SendPublish(pk packets.Packet) {
	c.t.Helper()
	pk.FixedHeader.Type = packets.Publish
	pk.ProtocolVersion = 5
	c.send(pk, (*packets.Packet).PublishEncode)
}

// SendPingreq writes a PINGREQ and returns without reading.
func (c *RawClient) SendPingreq() {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}, ProtocolVersion: 5},
		(*packets.Packet).PingreqEncode)
}

// SendSubscribe writes one SUBSCRIBE and returns without reading, so a test
// can assert the order of what follows (the SUBACK first).
func (c *RawClient) SendSubscribe(id uint16, subs ...packets.Subscription) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5,
		PacketID: id, Filters: subs}, (*packets.Packet).SubscribeEncode)
}

// Subscribe sends one SUBSCRIBE and returns its SUBACK.
func (c *RawClient) Subscribe(id uint16, filter string, qos byte) packets.Packet {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5,
		PacketID: id, Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}, (*packets.Packet).SubscribeEncode)
	for {
		pk := c.Read()
		if pk.FixedHeader.Type == packets.Suback {
			return pk
		}
	}
}

// Read reads the next packet from the broker (fails the test after 20s).
func (c *RawClient) Read() packets.Packet {
	c.t.Helper()
	pk, err := c.read(20 * time.Second)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return pk
}

// ReadWithin reads the next packet, or returns the error (a timeout when
// nothing came within d).
func (c *RawClient) ReadWithin(d time.Duration) (packets.Packet, error) {
	return c.read(d)
}

func (c *RawClient) read(timeout time.Duration) (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(timeout))
	v := c.version
	if v == 0 {
		v = 5
	}
	return ReadPacket(c.r, v)
}

// maxReadPacket bounds what ReadPacket allocates for one packet.
const maxReadPacket = 16 << 20

// ReadPacket reads one MQTT packet from r and decodes what tests look at
// (CONNACK, PUBLISH, the acknowledgements of QoS 1 and 2, SUBACK,
// UNSUBACK, DISCONNECT) at protocol level version.
// The caller sets any read deadline.
func ReadPacket(r *bufio.Reader, version byte) (packets.Packet, error) {
	var pk packets.Packet
	hb, err := r.ReadByte()
	if err != nil {
		return pk, err
	}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		return pk, err
	}
	n, mul := 0, 1
	for i := 0; ; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return pk, err
		}
		n += int(b&127) * mul
		mul *= 128
		if b&128 == 0 {
			break
		}
		if i == 3 {
			return pk, errors.New("malformed remaining length")
		}
	}
	// invariant 13 on the test's side too: a broker announcing a huge
	// packet fails the test instead of making it allocate.
	if n > maxReadPacket {
		return pk, fmt.Errorf("packet of %d bytes announced", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return pk, err
	}
	pk.FixedHeader.Remaining = n
	pk.ProtocolVersion = version
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Unsuback:
		err = pk.UnsubackDecode(body)
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	}
	if err != nil {
		return pk, fmt.Errorf("decoding %d: %w", pk.FixedHeader.Type, err)
	}
	return pk, nil
}

// Puback acknowledges a delivery.
func (c *RawClient) Puback(id uint16) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: id},
		(*packets.Packet).PubackEncode)
}

// DisconnectWith sends a DISCONNECT with the reason code given and waits
// for the broker to close the connection.
func (c *RawClient) DisconnectWith(code byte) {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5, ReasonCode: code},
		(*packets.Packet).DisconnectEncode)
	for {
		if _, err := c.read(20 * time.Second); err != nil {
			return
		}
	}
}

// Disconnect sends DISCONNECT 0x00 and waits until the broker closes the
// connection: the close that answers a DISCONNECT (invariant 18).
func (c *RawClient) Disconnect() {
	c.t.Helper()
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5},
		(*packets.Packet).DisconnectEncode)
	for {
		if _, err := c.read(20 * time.Second); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatal("the broker did not close the connection after DISCONNECT")
			}
			return
		}
	}
}
