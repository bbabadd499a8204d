package door

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// clientFrame is one masked frame as a client sends it.
func clientFrame(fin bool, op byte, payload []byte, mask [4]byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n <= 0xFFFF:
		f = binary.BigEndian.AppendUint16(append(f, 0x80|126), uint16(n))
	default:
		f = binary.BigEndian.AppendUint64(append(f, 0x80|127), uint64(n))
	}
	f = append(f, mask[:]...)
	for i, c := range payload {
		f = append(f, c^mask[i&3])
	}
	return f
}

var testMask = [4]byte{0x37, 0xFA, 0x21, 0x3D}

// feedAll feeds stream to a reader in pieces of step bytes (as reads of
// that size would bring it) and returns the payload it left, the control
// frames it saw, and its error.
func feedAll(stream []byte, step int) (out []byte, controls []byte, err error) {
	r := &wsReader{onControl: func(op byte, _ []byte) { controls = append(controls, op) }}
	stream = append([]byte(nil), stream...)
	for len(stream) > 0 && err == nil {
		n := min(step, len(stream))
		piece := stream[:n]
		stream = stream[n:]
		var got int
		got, err = r.feed(piece)
		out = append(out, piece[:got]...)
	}
	return out, controls, err
}

// A message split over frames, several messages in one read, pings in the
// middle of a fragmented message, lengths of all three encodings: the
// payload comes out whole and in order, however the bytes are split into
// reads.
func TestWebSocketFramesJoinTheirPayload(t *testing.T) {
	long := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80,000 bytes: a 64-bit length
	mid := bytes.Repeat([]byte("m"), 300)                  // a 16-bit length
	var stream, want []byte
	stream = append(stream, clientFrame(false, opBinary, []byte("he"), testMask)...)
	stream = append(stream, clientFrame(true, opPing, []byte("are you there"), testMask)...)
	stream = append(stream, clientFrame(false, opContinuation, nil, testMask)...)
	stream = append(stream, clientFrame(true, opContinuation, []byte("llo"), testMask)...)
	stream = append(stream, clientFrame(true, opBinary, mid, testMask)...)
	stream = append(stream, clientFrame(true, opPong, nil, testMask)...)
	stream = append(stream, clientFrame(true, opBinary, long, testMask)...)
	want = append(append(append(want, "hello"...), mid...), long...)
	for _, step := range []int{1, 2, 7, 125, 4096, len(stream)} {
		out, controls, err := feedAll(stream, step)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("step %d: %d bytes out, want %d", step, len(out), len(want))
		}
		if !bytes.Equal(controls, []byte{opPing, opPong}) {
			t.Fatalf("step %d: control frames %v", step, controls)
		}
	}
}

// Frames that break RFC 6455, and a text frame (MQTT 5 §6), end the
// stream; the payload before them is still handed on.
func TestWebSocketFramesRefused(t *testing.T) {
	good := clientFrame(true, opBinary, []byte("ok"), testMask)
	unmasked := []byte{0x82, 0x01, 'x'}
	rsv := clientFrame(true, opBinary, []byte("x"), testMask)
	rsv[0] |= 0x40
	bigPing := clientFrame(true, opPing, bytes.Repeat([]byte("p"), 126), testMask)
	fragPing := clientFrame(false, opPing, nil, testMask)
	for name, c := range map[string]struct {
		frame []byte
		want  error
	}{
		"text":                      {clientFrame(true, opText, []byte("{}"), testMask), ErrTextFrame},
		"unmasked":                  {unmasked, nil},
		"reserved bits":             {rsv, nil},
		"oversized ping":            {bigPing, nil},
		"fragmented ping":           {fragPing, nil},
		"reserved opcode":           {clientFrame(true, 0x3, nil, testMask), nil},
		"continuation with nothing": {clientFrame(true, opContinuation, []byte("x"), testMask), nil},
		"close":                     {clientFrame(true, opClose, []byte{0x03, 0xE8}, testMask), errPeerClosed},
	} {
		out, _, err := feedAll(append(append([]byte(nil), good...), c.frame...), 3)
		if string(out) != "ok" {
			t.Errorf("%s: payload before it %q, want \"ok\"", name, out)
		}
		var pe *wsProtocolError
		switch {
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", name, err, c.want)
		case c.want == nil && !errors.As(err, &pe):
			t.Errorf("%s: %v, want a protocol error", name, err)
		}
	}
	// A new message before the last one's final frame.
	_, _, err := feedAll(append(clientFrame(false, opBinary, []byte("a"), testMask), clientFrame(true, opBinary, []byte("b"), testMask)...), 64)
	var pe *wsProtocolError
	if !errors.As(err, &pe) {
		t.Errorf("an interleaved message: %v", err)
	}
}

// FuzzWebSocketFrames feeds arbitrary bytes to the frame reader in
// arbitrary pieces: it never panics, never hands on more than it was fed,
// and a control frame it reports holds at most 125 bytes.
func FuzzWebSocketFrames(f *testing.F) {
	f.Add(clientFrame(true, opBinary, []byte{0x10, 0x0C, 0, 4, 'M', 'Q', 'T', 'T'}, testMask), uint8(3))
	f.Add(append(clientFrame(false, opBinary, []byte("a"), testMask), clientFrame(true, opPing, []byte("p"), testMask)...), uint8(1))
	f.Add(clientFrame(true, opBinary, bytes.Repeat([]byte("x"), 70000), testMask), uint8(200))
	f.Add([]byte{0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, uint8(5))
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		r := &wsReader{onControl: func(op byte, p []byte) {
			if len(p) > maxControl || op&0x8 == 0 {
				t.Fatalf("a control frame of %d bytes, opcode %x", len(p), op)
			}
		}}
		n := max(int(step), 1)
		total := 0
		for len(b) > 0 {
			piece := b[:min(n, len(b))]
			b = b[len(piece):]
			got, err := r.feed(piece)
			if got > len(piece) {
				t.Fatalf("%d bytes out of a %d-byte read", got, len(piece))
			}
			total += got
			if err != nil {
				return
			}
		}
	})
}
