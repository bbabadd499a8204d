package broker

// framer follows MQTT's framing on the bytes a client sends, ahead of the
// substrate's reader, so that a packet's declared size is judged before
// anything is allocated for it (invariant 13). The substrate reads a fixed
// header and then allocates the whole declared body; its own size check
// leaves out the length bytes (a packet up to three bytes over the
// advertised Maximum Packet Size passes it), answers nothing (MQTT 5 is
// owed DISCONNECT 0x95) and knows nothing of limits.max_connect_size. The
// framer withholds the last byte of an oversized packet's length, so the
// substrate never learns the size, and the connection refuses it instead
// (clientConn.refuseOversize).
type framer struct {
	state   int // frameHeader, frameLength, frameBody; frameOff after a malformed length
	lenN    int // length bytes read so far
	mul     int
	length  int
	left    int // body bytes still to come
	packets int // packets whole so far (the first is the CONNECT)
	open    [12]byte
	openN   int
	// limits: the first packet against max_connect_size, every later one
	// against max_message_size; both count the whole packet, as MQTT's
	// Maximum Packet Size does.
	connectLimit, packetLimit int64
}

const (
	frameHeader = iota
	frameLength
	frameBody
	frameOff
)

// oversize is a packet whose declared size is past its limit.
type oversize struct {
	size, limit int64
	connect     bool // the CONNECT: its opening bytes are still unread
}

// scan follows b and returns how many of its bytes may be handed on: all of
// them, or those before the last length byte of an oversized packet.
func (f *framer) scan(b []byte) (int, *oversize) {
	for i := 0; i < len(b); {
		switch f.state {
		case frameOff:
			// A length longer than four bytes: the substrate refuses it
			// as malformed before allocating anything.
			return len(b), nil
		case frameHeader:
			f.state, f.lenN, f.mul, f.length = frameLength, 0, 1, 0
			i++
		case frameLength:
			c := b[i]
			f.length += int(c&127) * f.mul
			f.mul *= 128
			f.lenN++
			if c&128 != 0 {
				if f.lenN == 4 {
					f.state = frameOff
					return len(b), nil
				}
				i++
				continue
			}
			size := int64(1 + f.lenN + f.length)
			limit := f.packetLimit
			if f.packets == 0 {
				limit = f.connectLimit
			}
			if size > limit {
				return i, &oversize{size: size, limit: limit, connect: f.packets == 0}
			}
			i++
			f.left = f.length
			f.state = frameBody
			if f.left == 0 {
				f.packets++
				f.state = frameHeader
			}
		case frameBody:
			n := min(f.left, len(b)-i)
			if f.packets == 0 && f.openN < len(f.open) {
				f.openN += copy(f.open[f.openN:], b[i:i+n])
			}
			f.left -= n
			i += n
			if f.left == 0 {
				f.packets++
				f.state = frameHeader
			}
		}
	}
	return len(b), nil
}

// connectRead reports whether the whole CONNECT has gone by.
func (f *framer) connectRead() bool { return f.packets > 0 }

// version is the protocol level the CONNECT declared (0 if unknown: not
// yet read, or a protocol name no MQTT level uses).
func (f *framer) version() byte {
	return connectVersion(f.open[:f.openN])
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

// endsConnection reports whether b, which holds whole packets (every writer
// hands a connection whole packets), carries a refusing CONNACK or a
// DISCONNECT: the end of the connection is then decided, and its slot is
// let go before the answer is written (RFC 0002 §1.5 connection admission).
func endsConnection(b []byte) bool {
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
		switch {
		case typ == 14:
			return true
		case typ == 2 && body+1 < len(b) && b[body+1] != 0:
			return true
		}
		i = body + length
	}
	return false
}
