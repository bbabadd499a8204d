package broker

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/wire"
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

// testConn is a clientConn over a scriptConn, as Accept makes one: its
// framer (broker/internal/wire, tested there on its own) reads for it, and
// what it answers a refusal is kept in sc.out.
type testConn struct {
	*clientConn
	sc *scriptConn
}

func scriptedConn(t testing.TB, f wire.Framer, stream []byte, chunk int) testConn {
	t.Helper()
	sc := &scriptConn{in: stream, chunk: chunk}
	discard := slog.New(slog.DiscardHandler)
	l := &admitListener{g: newGate(config.Limits{MaxConnections: 1}), log: discard,
		refusals: logging.NewRefusalLog(discard, time.Now),
		pending:  map[*clientConn]struct{}{}, done: make(chan struct{})}
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

// connect5 is an MQTT 5 CONNECT: no properties, empty client id.
var connect5 = []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 60, 0, 0, 0}
