package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// errRefusedHere is what script's Judged ends a stream with when a packet
// is refused (the broker's connection answers and logs; this only answers).
var errRefusedHere = errors.New("refused")

// script is a client connection that sends a fixed byte stream, at most
// chunk bytes per socket read, read through a Framer as the substrate reads
// it. It is a net.Conn, so the substrate's own reader can read it too
// (fuzz_test.go); what a refusal is answered is kept in out.
type script struct {
	fr       Framer
	in       []byte
	chunk    int
	out      bytes.Buffer
	verdicts []Verdict
	// letThrough: Judged returns nil even for a refused packet.
	letThrough bool
}

func newScript(connectLimit, packetLimit int64, stream []byte, chunk int) *script {
	return &script{fr: NewFramer(connectLimit, packetLimit), in: stream, chunk: chunk}
}

func (s *script) ReadSocket(p []byte) (int, error) {
	if len(s.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.chunk)], s.in)
	s.in = s.in[n:]
	return n, nil
}

func (s *script) Judged(v Verdict) error {
	s.verdicts = append(s.verdicts, v)
	if v.Refused == nil && v.Over == nil || s.letThrough {
		return nil
	}
	if v.Refused != nil {
		s.out.Write(s.fr.Answer(v.Refused))
	}
	return errRefusedHere
}

func (s *script) Read(p []byte) (int, error)         { return s.fr.Read(p, s) }
func (s *script) Write(p []byte) (int, error)        { return s.out.Write(p) }
func (s *script) Close() error                       { return nil }
func (s *script) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (s *script) RemoteAddr() net.Addr               { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (s *script) SetDeadline(t time.Time) error      { return nil }
func (s *script) SetReadDeadline(t time.Time) error  { return nil }
func (s *script) SetWriteDeadline(t time.Time) error { return nil }

// drain reads the connection as the substrate does, until an error, and
// returns every byte handed on.
func (s *script) drain() ([]byte, error) {
	var got []byte
	p := make([]byte, 4096)
	for {
		n, err := s.Read(p)
		got = append(got, p[:n]...)
		if err != nil {
			return got, err
		}
	}
}

// header encodes a fixed header declaring a body of n bytes.
func header(first byte, n int) []byte {
	b := []byte{first}
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 128
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

// connect5 is an MQTT 5 CONNECT: no properties, empty client id.
var connect5 = []byte{0x10, 13, 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 60, 0, 0, 0}

// The framer hands on one packet per Read (so the packet whose bytes went
// last is the one the substrate handles: the broker names it after a
// panic), whole, and in order, however the bytes arrive.
func TestFramerHandsOnOnePacketPerRead(t *testing.T) {
	ping := []byte{0xC0, 0}
	pub := []byte{0x30, 6, 0, 1, 't', 0, 'h', 'i'} // QoS 0, topic "t", no properties, "hi"
	stream := append(append(append(append([]byte{}, connect5...), ping...), pub...), ping...)
	for _, chunk := range []int{1, 3, 4096} {
		c := newScript(1000, 1000, stream, chunk)
		want := [][]byte{connect5, ping, pub, ping}
		var got [][]byte // the bytes handed on, packet by packet
		p := make([]byte, 4096)
		for i, left := 0, 0; ; {
			n, err := c.Read(p)
			if n > 0 {
				if left == 0 {
					// A packet starts: the read holds its first bytes and
					// the framer names it as the one being handled.
					if i == len(want) || c.fr.Handling() != want[i][0]>>4 {
						t.Fatalf("chunk %d: read %x starts packet %d, handling %d", chunk, p[:n], i, c.fr.Handling())
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
		c := newScript(1000, 1<<20, stream, chunk)
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
		if c.fr.Holds() {
			t.Fatalf("chunk %d: %d bytes kept once idle", chunk, cap(c.fr.buf))
		}
	}
	// A large packet that must be held whole (a SUBSCRIBE) is let go once
	// handed on.
	sub := append([]byte{0, 1, 0}, append(append([]byte{0x27, 0x10}, bytes.Repeat([]byte("f"), 10000)...), 1)...)
	stream = append(append(append([]byte{}, connect5...), header(0x82, len(sub))...), sub...)
	c := newScript(1000, 1<<20, stream, 1000)
	if got, _ := c.drain(); !bytes.Equal(got, stream) || c.fr.buf != nil {
		t.Fatalf("a 10 KB SUBSCRIBE: handed on %d of %d bytes, %d kept after", len(got), len(stream), cap(c.fr.buf))
	}
}

// An MQTT 5 DISCONNECT of its reason code alone is handed on with an empty
// property list, which the substrate's decoder reads the reason from.
func TestFramerGivesAShortDisconnectItsPropertyLength(t *testing.T) {
	for _, chunk := range []int{1, 4096} {
		c := newScript(1000, 1000, append(append([]byte{}, connect5...), 0xE0, 1, 0x04), chunk)
		got, _ := c.drain()
		if want := append(append([]byte{}, connect5...), 0xE0, 2, 0x04, 0); !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: handed on %x, want %x", chunk, got, want)
		}
	}
}

// The connection is told each verdict before the packet is handed on, and
// a refused packet is never handed on — even if the connection lets it
// through — and ends the stream: every later Read returns the refusal's
// error, nothing more read from the socket.
func TestFramerNeverHandsOnARefusedPacket(t *testing.T) {
	bad := []byte{0x82, 4, 0, 1, 0, 1} // SUBSCRIBE id 1, no properties, a filter length cut short: Malformed
	ping := []byte{0xC0, 0}
	stream := append(append(append([]byte{}, connect5...), bad...), ping...)
	for _, letThrough := range []bool{false, true} {
		for _, chunk := range []int{1, 4096} {
			c := newScript(1000, 1000, stream, chunk)
			c.letThrough = letThrough
			var got []byte
			var err error
			done := make(chan struct{})
			go func() { got, err = c.drain(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				// A refused packet let through is judged again, without end.
				t.Fatalf("let through %v, chunk %d: Read did not return", letThrough, chunk)
			}
			if !bytes.Equal(got, connect5) {
				t.Fatalf("let through %v, chunk %d: handed on %x, want the CONNECT alone", letThrough, chunk, got)
			}
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("let through %v, chunk %d: ended with %v, not the refusal", letThrough, chunk, err)
			}
			if n, again := c.Read(make([]byte, 16)); n != 0 || !errors.Is(again, err) {
				t.Fatalf("let through %v, chunk %d: a Read after the refusal gave %d bytes, %v", letThrough, chunk, n, again)
			}
			if len(c.verdicts) != 2 || !c.verdicts[0].First || c.verdicts[0].Type != 1 || c.verdicts[1].Refused == nil {
				t.Fatalf("let through %v, chunk %d: verdicts %+v, want the CONNECT's then the SUBSCRIBE's refusal", letThrough, chunk, c.verdicts)
			}
			if out := c.out.Bytes(); !letThrough && (len(out) < 3 || out[0] != 0xE0 || out[2] != 0x81) {
				t.Fatalf("chunk %d: answered %x, want DISCONNECT 0x81", chunk, c.out.Bytes())
			}
		}
	}
}

func TestEndsConnectionFindsRefusals(t *testing.T) {
	puback := []byte{0x40, 2, 0, 1}
	for name, tc := range map[string]struct {
		b    []byte
		want bool
	}{
		"accepting CONNACK":     {[]byte{0x20, 3, 0, 0, 0}, false},
		"refusing CONNACK":      {[]byte{0x20, 3, 0, 0x89, 0}, true},
		"3.1.1 refusing":        {[]byte{0x20, 2, 0, 0x03}, true},
		"PUBACKs":               {append(append([]byte{}, puback...), puback...), false},
		"DISCONNECT after data": {append(append([]byte{}, puback...), 0xE0, 1, 0x8E), true},
	} {
		if got := EndsConnection(tc.b); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// An overflow socket is answered from its CONNECT's opening bytes alone:
// the protocol level is found whatever the declared length, and anything
// that is not a CONNECT of a known level gets nothing.
func TestConnectOpeningGivesTheLevel(t *testing.T) {
	open := func(level byte) []byte { return []byte{0, 4, 'M', 'Q', 'T', 'T', level} }
	for name, tc := range map[string]struct {
		b    []byte
		want byte
	}{
		"MQTT 5, short length": {append(header(0x10, 20), open(5)...), 5},
		"3.1.1, 4-byte length": {append(header(0x10, 100<<20), open(4)...), 4},
		"MQIsdp 3.1":           {append(header(0x10, 30), 0, 6, 'M', 'Q', 'I', 's', 'd', 'p', 3), 3},
		"not a CONNECT":        {append(header(0x30, 20), open(5)...), 0},
		"five length bytes":    {[]byte{0x10, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 4, 'M', 'Q', 'T', 'T', 5}, 0},
		"cut short":            {append(header(0x10, 20), 0, 4, 'M', 'Q'), 0},
		"name no level uses":   {append(header(0x10, 20), 0, 9, 'x'), 0},
	} {
		if got := ReadConnectOpening(bytes.NewReader(tc.b)); got != tc.want {
			t.Errorf("%s: level %d, want %d", name, got, tc.want)
		}
	}
}
