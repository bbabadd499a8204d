// Package msgid makes Message IDs: UUIDv7 strings (RFC 9562), time-ordered so
// that ids minted by one broker sort roughly by receipt. A Message ID is the
// identity of a message for its whole life (invariant 8) and is never an
// offset, so nothing here is tied to a channel.
package msgid

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// Generator mints UUIDv7s. Within one millisecond it keeps ids increasing by
// treating the 12-bit rand_a field as a counter (RFC 9562 §6.2, method 1), so
// two records stored in the same millisecond still sort in receipt order.
type Generator struct {
	mu     sync.Mutex
	lastMS int64
	seq    uint16
}

// New returns a UUIDv7 for the moment now.
func (g *Generator) New(now time.Time) string {
	ms := now.UnixMilli()
	var b [16]byte
	_, _ = rand.Read(b[6:]) // crypto/rand never fails on supported platforms

	g.mu.Lock()
	if ms <= g.lastMS {
		// Same (or an earlier, after a clock step) millisecond: keep the
		// last timestamp and count up, spilling into the next millisecond
		// when 4096 ids have been minted in one.
		g.seq++
		if g.seq > 0x0fff {
			g.lastMS++
			g.seq = 0
		}
		ms = g.lastMS
	} else {
		g.lastMS = ms
		g.seq = binary.BigEndian.Uint16(b[6:8]) & 0x01ff // random start, room to count
	}
	seq := g.seq
	g.mu.Unlock()

	b[0] = byte(ms >> 40)
	b[1] = byte(ms >> 32)
	b[2] = byte(ms >> 24)
	b[3] = byte(ms >> 16)
	b[4] = byte(ms >> 8)
	b[5] = byte(ms)
	b[6] = 0x70 | byte(seq>>8)&0x0f // version 7
	b[7] = byte(seq)
	b[8] = b[8]&0x3f | 0x80 // variant 10

	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
