package snapshot

import (
	"encoding/binary"
	"fmt"
	"time"

	"saguin.dev/storage"
)

// Encoder appends little-endian values to a growing file.
type Encoder struct{ b []byte }

func (e *Encoder) Uint8(v uint8)   { e.b = append(e.b, v) }
func (e *Encoder) Uint32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *Encoder) Uint64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *Encoder) Time(t time.Time) {
	e.b = binary.LittleEndian.AppendUint64(e.b, uint64(UnixNano(t)))
}
func (e *Encoder) Duration(d time.Duration) { e.Uint64(uint64(d)) }
func (e *Encoder) Bool(v bool) {
	if v {
		e.Uint8(1)
	} else {
		e.Uint8(0)
	}
}

// String writes a uint32 length and the bytes.
func (e *Encoder) String(s string) {
	e.Uint32(uint32(len(s)))
	e.b = append(e.b, s...)
}

// Bytes writes a uint32 length and the bytes; nil and empty are the same.
func (e *Encoder) Bytes(p []byte) {
	e.Uint32(uint32(len(p)))
	e.b = append(e.b, p...)
}

// Count writes the number of entries that follow.
func (e *Encoder) Count(n int) { e.Uint32(uint32(n)) }

// Minimum encoded sizes: a declared count is refused when count × minimum
// exceeds the bytes present, before anything is allocated for it
// (invariant 13).
const (
	MinHeaderSize    = 4 + 4
	MinRecordSize    = 8 + 4 + 4 + 8 + 4 + 4 + 4 + 4 + 4 + 1 + 1 + 1 + 4 + 4 + 1 + 1
	MinQueueItemSize = MinRecordSize + 4 + 8 + 8
	MinPositionSize  = 4 + 8 + 8 + 8
)

// Record writes one record in format 21's field order.
func (e *Encoder) Record(r *storage.Record) {
	e.Uint64(r.Offset)
	e.String(r.MessageID)
	e.String(r.Topic)
	e.Time(r.Timestamp)
	e.Count(len(r.Headers))
	for _, h := range r.Headers {
		e.String(h.Name)
		e.String(h.Value)
	}
	e.Bytes(r.Payload)
	e.String(r.ContentType)
	e.String(r.ResponseTopic)
	e.Bytes(r.CorrelationData)
	if r.PayloadFormat != nil {
		e.Uint8(1)
		e.Uint8(*r.PayloadFormat)
	} else {
		e.Uint8(0)
	}
	if r.MessageExpiry != nil {
		e.Uint8(1)
		e.Uint32(*r.MessageExpiry)
	} else {
		e.Uint8(0)
	}
	e.Bool(r.Retain)
	e.String(r.Bridge)
	e.String(r.PublisherID)
	e.Uint8(r.QoS)
	e.Uint8(0) // extras flag: channel records carry none of the broadcast-log extras
}

// QueueItem writes a record and what survives about its deliveries.
// invariant 15: no holder, Delivery ID, deadline or epoch is written.
func (e *Encoder) QueueItem(it *storage.QueueItem) {
	e.Record(&it.Record)
	e.Uint32(it.Attempts)
	e.Time(it.FirstDelivered)
	e.Time(it.LastDelivered)
}

// Position writes a reader's cursor.
func (e *Encoder) Position(p *storage.Position) {
	e.String(p.Reader)
	e.Uint64(p.Offset)
	e.Time(p.LastSeen)
	e.Duration(p.Expiry)
}

// Decoder reads values back, checking every declared length against the
// bytes present. The first failure sticks: later reads return zero values
// and Err reports where and what.
type Decoder struct {
	b   []byte
	off int
	err error
}

// NewDecoder reads body, a file's bytes between header and checksum.
func NewDecoder(body []byte) *Decoder { return &Decoder{b: body} }

// Err is the first failure, naming its byte offset within the body.
func (d *Decoder) Err() error { return d.err }

// Fail records a failure found by the caller's own checks.
func (d *Decoder) Fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("body byte %d: %s", d.off, fmt.Sprintf(format, args...))
	}
}

// Remaining is how many body bytes are unread.
func (d *Decoder) Remaining() int { return len(d.b) - d.off }

// End fails if bytes are left over: a file longer than what it declares is
// as damaged as a shorter one.
func (d *Decoder) End() error {
	if d.err == nil && d.Remaining() != 0 {
		d.Fail("%d bytes after the last declared value", d.Remaining())
	}
	return d.err
}

// take consumes n bytes. n is unsigned and compared as 64 bits: a length
// read from a file is four unsigned bytes, and converted to a 32-bit int one
// past 2^31 turns negative (docs/operations.md "32-bit devices": a file one build writes,
// every build reads the same way).
func (d *Decoder) take(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(d.Remaining()) {
		d.Fail("%s declares %d bytes, %d remain", what, n, d.Remaining())
		return nil
	}
	p := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return p
}

func (d *Decoder) Uint8() uint8 {
	if p := d.take(1, "uint8"); p != nil {
		return p[0]
	}
	return 0
}

func (d *Decoder) Uint32() uint32 {
	if p := d.take(4, "uint32"); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *Decoder) Uint64() uint64 {
	if p := d.take(8, "uint64"); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *Decoder) Time() time.Time { return fromUnixNano(int64(d.Uint64())) }

func (d *Decoder) Duration() time.Duration { return time.Duration(d.Uint64()) }

// Bool reads a flag byte, refusing anything but 0 and 1.
func (d *Decoder) Bool(what string) bool {
	switch v := d.Uint8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.Fail("%s flag is %d, want 0 or 1", what, v)
		return false
	}
}

// String reads a length-prefixed string; the length is checked against the
// bytes present before anything is allocated.
func (d *Decoder) String(what string) string {
	return string(d.take(uint64(d.Uint32()), what))
}

// Bytes reads a length-prefixed byte string, copying it; empty reads as nil.
func (d *Decoder) Bytes(what string) []byte {
	p := d.take(uint64(d.Uint32()), what)
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// Count reads a count of entries each at least minSize bytes long, refusing
// one the remaining bytes could not hold (invariant 13: checked before the
// caller allocates for it).
// The count is compared as 64 bits before it becomes an int: on a 32-bit
// build one past 2^31 would turn negative, pass the check and read as zero
// entries, loading a damaged file as an empty store (invariant 14). Once
// checked it is at most the bytes present, so it fits an int.
func (d *Decoder) Count(what string, minSize int) int {
	n := uint64(d.Uint32())
	// invariant 13: a count the bytes present cannot hold is refused before anything is allocated for it.
	if d.err == nil && n > uint64(d.Remaining()/minSize) {
		d.Fail("%s count %d needs at least %d bytes, %d remain", what, n, n*uint64(minSize), d.Remaining())
		return 0
	}
	return int(n)
}

// Record reads one record.
func (d *Decoder) Record() storage.Record {
	var r storage.Record
	r.Offset = d.Uint64()
	r.MessageID = d.String("message id")
	r.Topic = d.String("topic")
	r.Timestamp = d.Time()
	if n := d.Count("header", MinHeaderSize); n > 0 {
		r.Headers = make([]storage.Header, n)
		for i := range r.Headers {
			r.Headers[i] = storage.Header{Name: d.String("header name"), Value: d.String("header value")}
		}
	}
	r.Payload = d.Bytes("payload")
	r.ContentType = d.String("content type")
	r.ResponseTopic = d.String("response topic")
	r.CorrelationData = d.Bytes("correlation data")
	if d.Bool("payload format") {
		v := d.Uint8()
		r.PayloadFormat = &v
	}
	if d.Bool("message expiry") {
		v := d.Uint32()
		r.MessageExpiry = &v
	}
	r.Retain = d.Bool("retain")
	r.Bridge = d.String("bridge")
	r.PublisherID = d.String("publisher id")
	if r.QoS = d.Uint8(); r.QoS > 2 {
		d.Fail("record QoS %d", r.QoS)
	}
	// Records only on kinds that allow them: the broadcast-log extras have
	// no meaning on a channel.
	if x := d.Uint8(); x != 0 {
		d.Fail("record extras flag %d on a channel record", x)
	}
	return r
}

// QueueItem reads one queue item.
func (d *Decoder) QueueItem() storage.QueueItem {
	it := storage.QueueItem{Record: d.Record()}
	it.Attempts = d.Uint32()
	it.FirstDelivered = d.Time()
	it.LastDelivered = d.Time()
	return it
}

// Position reads one reader position.
func (d *Decoder) Position() storage.Position {
	return storage.Position{
		Reader:   d.String("reader"),
		Offset:   d.Uint64(),
		LastSeen: d.Time(),
		Expiry:   d.Duration(),
	}
}

// MinHeldSize is the smallest encoded hold: client, packet id, held-at and
// a record without its offset's meaning (rfcs/storage-memory.md: "holds (client,
// packet id, held-at, record without offset)").
const MinHeldSize = 4 + 4 + 8 + MinRecordSize

// Held writes one unreleased QoS 2 publish. The channel is the file's, so
// it is not written; the record's offset is written as 0.
func (e *Encoder) Held(h *storage.Held) {
	e.String(h.ClientID)
	e.Uint32(uint32(h.PacketID))
	e.Time(h.HeldAt)
	r := h.Record
	r.Offset = 0
	e.Record(&r)
}

// Held reads one hold; channel is the file's channel. A packet id outside
// 1..65535, an empty client id or a record with an offset is refused: a
// hold takes no offset until its release (invariant 1).
func (d *Decoder) Held(channel string) storage.Held {
	h := storage.Held{Channel: channel}
	h.ClientID = d.String("hold client id")
	pid := d.Uint32()
	h.HeldAt = d.Time()
	h.Record = d.Record()
	if d.Err() != nil {
		return h
	}
	if pid == 0 || pid > 0xFFFF || h.ClientID == "" || h.Record.Offset != 0 {
		d.Fail("hold of client %q packet id %d with offset %d (want a client id, a packet id in 1..65535, no offset)",
			h.ClientID, pid, h.Record.Offset)
		return h
	}
	h.PacketID = uint16(pid)
	return h
}
