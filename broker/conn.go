package broker

import (
	"net"
	"time"
)

// deadlineListener hands out connections whose every Write is bounded by
// limits.write_timeout. The substrate writes to a client while holding that
// client's lock and sets no deadline of its own (mochi-notes: WritePacket),
// so without this one client that stops reading would hold whichever
// goroutine writes to it for ever (invariant 16). A write that misses the
// deadline fails, and the substrate then closes the connection.
type deadlineListener struct {
	net.Listener
	timeout time.Duration // 0: no bound (limits.write_timeout: none)
}

func (l deadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
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
	return c.Conn.Write(b)
}

// SetDeadline is called by the substrate to arm the keepalive read deadline;
// it would also clear our write deadline, which Write re-arms each time, so
// only the read half is passed on.
func (c *deadlineConn) SetDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(t)
}
