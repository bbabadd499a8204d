package wire

import "io"

// AnyPacket reports whether f holds for a packet of b, which holds whole
// packets the broker writes (every writer hands a connection whole
// packets; a client's bytes go through the Framer instead): f is given the
// packet's type and the offset where its variable header begins.
func AnyPacket(b []byte, f func(typ byte, body int) bool) bool {
	for i := 0; i < len(b); {
		typ := b[i] >> 4
		length, mul, j := 0, 1, i+1
		for ; j < len(b) && j < i+5; j++ {
			length += int(b[j]&127) * mul
			mul *= 128
			if b[j]&128 == 0 {
				break
			}
		}
		body := j + 1
		if f(typ, body) {
			return true
		}
		i = body + length
	}
	return false
}

// EndsConnection reports whether b, whole packets, carries a refusing
// CONNACK or a DISCONNECT: the end of the connection is then decided, and
// its slot is let go before the answer is written (docs/configuration.md "`broker.limits`"
// connection admission).
func EndsConnection(b []byte) bool {
	return AnyPacket(b, func(typ byte, body int) bool {
		return typ == 14 || typ == 2 && body+1 < len(b) && b[body+1] != 0
	})
}

// connectVersion reads the protocol level from a CONNECT's opening bytes:
// a two-byte name length, the name ("MQTT", or "MQIsdp" for 3.1), then the
// level.
func connectVersion(open []byte) byte {
	if len(open) < 2 {
		return 0
	}
	n := int(open[0])<<8 | int(open[1])
	if n != 4 && n != 6 || len(open) < 2+n+1 {
		return 0
	}
	return open[2+n]
}

// ReadConnectOpening reads a CONNECT's fixed header and its bytes up to the
// protocol level, and returns that level (0: not a CONNECT, not in time,
// or no MQTT level): what a socket refused for want of a slot is answered
// in (rfcs/limits.md), without the rest of its CONNECT ever being read.
func ReadConnectOpening(r io.Reader) byte {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil || b[0]>>4 != 1 {
		return 0
	}
	for i := 0; ; i++ { // the remaining length: at most four bytes
		if _, err := io.ReadFull(r, b[:1]); err != nil {
			return 0
		}
		if b[0]&128 == 0 {
			break
		}
		if i == 3 {
			return 0
		}
	}
	return ReadVersion(r, nil)
}

// ReadVersion completes a CONNECT's opening bytes from have and then r and
// returns its protocol level (0 if unreadable): an oversized CONNECT is
// answered in its own protocol from have, its Oversize.Opening.
func ReadVersion(r io.Reader, have []byte) byte {
	var open [9]byte
	n := copy(open[:], have)
	if n < 2 {
		m, err := io.ReadFull(r, open[n:2])
		if n += m; err != nil {
			return 0
		}
	}
	need := 2 + (int(open[0])<<8 | int(open[1])) + 1
	if need > len(open) {
		return 0
	}
	if n < need {
		if _, err := io.ReadFull(r, open[n:need]); err != nil {
			return 0
		}
	}
	return connectVersion(open[:need])
}
