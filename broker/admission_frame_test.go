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

// The framer hands on one packet per Read (so the packet whose bytes went
// last is the one the substrate handles: listener.go names it after a
// panic), whole, and in order, however the bytes arrive.
func TestFramerHandsOnOnePacketPerRead(t *testing.T) {
	ping := []byte{0xC0, 0}
	pub := []byte{0x30, 6, 0, 1, 't', 0, 'h', 'i'} // QoS 0, topic "t", no properties, "hi"
	stream := append(append(append(append([]byte{}, connect5...), ping...), pub...), ping...)
	for _, chunk := range []int{1, 3, 4096} {
		c := scriptedConn(t, framer{connectLimit: 1000, packetLimit: 1000}, stream, chunk)
		want := [][]byte{connect5, ping, pub, ping}
		var got [][]byte // the bytes handed on, packet by packet
		p := make([]byte, 4096)
		for i, left := 0, 0; ; {
			n, err := c.Read(p)
			if n > 0 {
				if left == 0 {
					// A packet starts: the read holds its first bytes and
					// the framer names it as the one being handled.
					if i == len(want) || c.fr.handling != want[i][0]>>4 {
						t.Fatalf("chunk %d: read %x starts packet %d, handling %d", chunk, p[:n], i, c.fr.handling)
					}
					got = append(got, nil)
					left = len(want[i])
					i++
				}
				if n > left {
					t.Fatalf("chunk %d: one read of %d bytes runs past packet %d (%d bytes left of it)", chunk, n, i-1, left)
				}
				got[i-1] = append(got[i-1], p[:n]...)
				left -= n
			}
			if err != nil {
				break
			}
		}
		if len(got) != len(want) {
			t.Fatalf("chunk %d: %d packets handed on, want %d", chunk, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("chunk %d: packet %d is %x, want %x", chunk, i, got[i], want[i])
			}
		}
	}
}

// A PUBLISH is held only up to the end of its properties: its payload
// streams through, so a big payload is not held twice, and an idle
// connection keeps no large buffer (invariant 13).
func TestFramerDoesNotHoldAPublishPayload(t *testing.T) {
	payload := bytes.Repeat([]byte("p"), 60000)
	body := append([]byte{0, 3, 'a', '/', 'b', 0, 7, 7, 3, 0, 4, 't', 'e', 'x', 't'}, payload...) // QoS 1, id 7, Content Type
	pub := append(header(0x32, len(body)), body...)
	stream := append(append([]byte{}, connect5...), pub...)
	for _, chunk := range []int{1, 5, 1500, 70000} {
		c := scriptedConn(t, framer{connectLimit: 1000, packetLimit: 1 << 20}, stream, chunk)
		var got []byte
		p := make([]byte, 4096)
		held := 0
		for {
			n, err := c.Read(p)
			got = append(got, p[:n]...)
			held = max(held, cap(c.fr.buf))
			if err != nil {
				break
			}
		}
		if !bytes.Equal(got, stream) {
			t.Fatalf("chunk %d: handed on %d bytes, want the %d sent", chunk, len(got), len(stream))
		}
		if held > framerPooled {
			t.Fatalf("chunk %d: the framer held a %d-byte buffer for a PUBLISH whose head is %d bytes", chunk, held, 20)
		}
		if c.fr.buf != nil {
			t.Fatalf("chunk %d: %d bytes kept once idle", chunk, cap(c.fr.buf))
		}
	}
	// A large packet that must be held whole (a SUBSCRIBE) is let go once
	// handed on.
	sub := append([]byte{0, 1, 0}, append(append([]byte{0x27, 0x10}, bytes.Repeat([]byte("f"), 10000)...), 1)...)
	stream = append(append(append([]byte{}, connect5...), header(0x82, len(sub))...), sub...)
	c := scriptedConn(t, framer{connectLimit: 1000, packetLimit: 1 << 20}, stream, 1000)
	if got, _ := c.drain(); !bytes.Equal(got, stream) || c.fr.buf != nil {
		t.Fatalf("a 10 KB SUBSCRIBE: handed on %d of %d bytes, %d kept after", len(got), len(stream), cap(c.fr.buf))
	}
}

// An MQTT 5 DISCONNECT of its reason code alone is handed on with an empty
// property list, which the substrate's decoder reads the reason from.
func TestFramerGivesAShortDisconnectItsPropertyLength(t *testing.T) {
	for _, chunk := range []int{1, 4096} {
		c := scriptedConn(t, framer{connectLimit: 1000, packetLimit: 1000}, append(append([]byte{}, connect5...), 0xE0, 1, 0x04), chunk)
		got, _ := c.drain()
		if want := append(append([]byte{}, connect5...), 0xE0, 2, 0x04, 0); !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: handed on %x, want %x", chunk, got, want)
		}
	}
}
