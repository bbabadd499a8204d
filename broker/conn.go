package broker

import (
	"bytes"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// deadlineListener hands out connections whose every Write is bounded by
// limits.write_timeout. The substrate writes to a client while holding that
// client's lock and sets no deadline of its own (mochi-notes: WritePacket),
// so without this one client that stops reading would hold whichever
// goroutine writes to it for ever (invariant 16). A write that misses the
// deadline fails and closes the connection (deadlineConn.Write).
type deadlineListener struct {
	net.Listener
	timeout time.Duration // 0: no bound (limits.write_timeout: none)
}

// connSendBuffer is the kernel send buffer of each client connection.
// Linux grows an unset one to megabytes, and a client that stops reading
// then swallows that much before any write blocks: its write deadline
// never fires, and with it invariant 16's "disconnected after
// write_timeout". A fixed buffer makes a deaf client's writes block within
// a quarter megabyte (and bounds what the kernel holds per connection).
const connSendBuffer = 256 << 10

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(connSendBuffer)
	}
	if l.timeout <= 0 {
		return c, nil
	}
	return &deadlineConn{Conn: c, timeout: l.timeout}, nil
}

type deadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	// invariant 16: every write to a client is bounded by write_timeout.
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(b)
	if err != nil {
		// A client that did not take a write in time is disconnected
		// (invariant 16). Closing here is what does it whoever wrote: the
		// substrate's own writers only log a failed write and go on, and
		// after a partial write the stream is corrupt, so no later write
		// may follow it. The read loop then fails and the connection is
		// torn down as any other that ends.
		_ = c.Conn.Close()
	}
	return n, err
}

// SetDeadline is called by the substrate to arm the keepalive read deadline;
// it would also clear our write deadline, which Write re-arms each time, so
// only the read half is passed on.
func (c *deadlineConn) SetDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(t)
}

// encodeDelivery appends one PUBLISH of Sagüin's own to buf, as every pump
// writes them (channel records, latest values, broadcast): at the client's
// protocol level, with the publisher's Response Topic and Correlation Data
// (the substrate's encoder drops both unless told it may — RFC 0003 "From
// publish to record"), and refused with ErrPacketTooLarge past the
// client's Maximum Packet Size (RFC 0003 §5), buf then left as it was.
func encodeDelivery(buf *bytes.Buffer, pk *packets.Packet, version byte, maxSize uint32) error {
	pk.ProtocolVersion = version
	pk.Mods.AllowResponseInfo = true
	start := buf.Len()
	err := pk.PublishEncode(buf)
	if err == nil && maxSize > 0 && uint32(buf.Len()-start) > maxSize {
		err = packets.ErrPacketTooLarge
	}
	if err != nil {
		buf.Truncate(start)
	}
	return err
}
