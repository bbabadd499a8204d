package broker

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"saguin.dev/broker/config"
)

// scriptConn is a client socket that sends a fixed byte stream, at most
// chunk bytes per read, and keeps what the broker writes.
type scriptConn struct {
	in    []byte
	chunk int
	out   bytes.Buffer
}

func (s *scriptConn) Read(p []byte) (int, error) {
	if len(s.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.chunk)], s.in)
	s.in = s.in[n:]
	return n, nil
}

func (s *scriptConn) Write(p []byte) (int, error)        { return s.out.Write(p) }
func (s *scriptConn) Close() error                       { return nil }
func (s *scriptConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (s *scriptConn) RemoteAddr() net.Addr               { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (s *scriptConn) SetDeadline(t time.Time) error      { return nil }
func (s *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (s *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

// testConn is a clientConn over a scriptConn, as Accept makes one.
type testConn struct {
	*clientConn
	sc *scriptConn
}

func scriptedConn(t testing.TB, f framer, stream []byte, chunk int) testConn {
	t.Helper()
	sc := &scriptConn{in: stream, chunk: chunk}
	l := &admitListener{g: newGate(config.Limits{MaxConnections: 1}), log: slog.New(slog.DiscardHandler),
		pending: map[*clientConn]struct{}{}, done: make(chan struct{})}
	return testConn{clientConn: &clientConn{Conn: sc, l: l, closedCh: make(chan struct{}), fr: f}, sc: sc}
}

// drain reads the connection as the substrate does, until an error, and
// returns every byte handed on.
func (c testConn) drain() ([]byte, error) {
	var got []byte
	p := make([]byte, 4096)
	for {
		n, err := c.Read(p)
		got = append(got, p[:n]...)
		if err != nil {
			return got, err
		}
	}
}
