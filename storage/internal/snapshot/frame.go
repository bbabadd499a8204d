// Package snapshot is the snapshot file format (rfcs/storage-memory.md): the fixed
// header every snapshot file starts with, the CRC32C trailer, and a
// hand-written little-endian encoding of the values inside. It is
// hand-written rather than gob or JSON because those silently zero-fill a
// field they cannot find, and a snapshot that loads wrong must not load.
//
// Layout (little-endian):
//
//	off 0   magic          8 bytes  's','a','g','u','i','n',0x1A,0x00
//	off 8   format version uint32   = 21
//	off 12  kind           uint8
//	off 13  writer         24 bytes NUL-padded build revision
//	off 37  written at     int64    unix ns
//	off 45  body
//	end     checksum       uint32   CRC32C (Castagnoli) over every preceding byte
package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// Version is the only format this build writes and reads. There is no
// converter: a different version is refused by name (rfcs/storage-memory.md).
const Version uint32 = 21

// Kind says what a snapshot file holds. 4 and 5 are retired and never reused.
type Kind uint8

const (
	KindChannels  Kind = 1
	KindManifest  Kind = 2
	KindSessions  Kind = 3
	KindBroadcast Kind = 6
)

const (
	writerLen = 24
	// HeaderLen is the size of the fixed header; the body starts here.
	HeaderLen  = 8 + 4 + 1 + writerLen + 8
	trailerLen = 4
)

var magic = [8]byte{'s', 'a', 'g', 'u', 'i', 'n', 0x1A, 0x00}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrDamaged marks a file whose bytes are not a whole snapshot: too short,
// wrong magic, or a checksum that does not match.
var ErrDamaged = errors.New("snapshot damaged")

// VersionError is a whole, undamaged file written in another format version.
type VersionError struct {
	Version   uint32
	Writer    string
	WrittenAt time.Time
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("format version %d (written by %s at %s); this build reads only version %d",
		e.Version, writerName(e.Writer), e.WrittenAt.UTC().Format(time.RFC3339Nano), Version)
}

func writerName(w string) string {
	if w == "" {
		return "an unnamed build"
	}
	return fmt.Sprintf("build %q", w)
}

// Header is what the fixed header says about a file.
type Header struct {
	Kind      Kind
	Writer    string
	WrittenAt time.Time
}

// maxPrealloc bounds what a size hint allocates up front: a larger file
// grows as it is written.
const maxPrealloc = 64 << 20

// NewFile starts an encoder whose output is a whole snapshot file: the
// header is written now, the body by the caller, the checksum by Finish.
// sizeHint is the expected body size, to allocate once up to maxPrealloc.
// It is an int64, added up by the caller in int64: a store's byte count
// plus its per-entry minimums can pass the largest int of a 32-bit build,
// and as an int the sum wrapped into a capacity make refuses (a panic while
// snapshotting, where the file should simply have grown as it was written).
func NewFile(kind Kind, writer string, at time.Time, sizeHint int64) *Encoder {
	e := &Encoder{b: make([]byte, 0, HeaderLen+int(min(max(sizeHint, 0), maxPrealloc))+trailerLen)}
	e.b = append(e.b, magic[:]...)
	e.Uint32(Version)
	e.Uint8(uint8(kind))
	var w [writerLen]byte
	copy(w[:], writer) // truncated if longer (rfcs/storage-memory.md)
	e.b = append(e.b, w[:]...)
	e.Time(at)
	return e
}

// Finish appends the checksum over every preceding byte and returns the file.
func (e *Encoder) Finish() []byte {
	return binary.LittleEndian.AppendUint32(e.b, crc32.Checksum(e.b, castagnoli))
}

// Parse checks a whole file read into memory and returns its header and
// body. The checksum is checked before the version, so damage is never
// misreported as a version (rfcs/storage-memory.md).
func Parse(data []byte) (Header, []byte, error) {
	if len(data) < HeaderLen+trailerLen {
		return Header{}, nil, fmt.Errorf("%w: %d bytes is shorter than a header and checksum (%d)",
			ErrDamaged, len(data), HeaderLen+trailerLen)
	}
	if !bytes.Equal(data[:8], magic[:]) {
		return Header{}, nil, fmt.Errorf("%w: not a snapshot file (magic %q)", ErrDamaged, data[:8])
	}
	end := len(data) - trailerLen
	want := binary.LittleEndian.Uint32(data[end:])
	if got := crc32.Checksum(data[:end], castagnoli); got != want {
		return Header{}, nil, fmt.Errorf("%w: checksum %08x, file says %08x", ErrDamaged, got, want)
	}
	h := Header{
		Kind:      Kind(data[12]),
		Writer:    string(bytes.TrimRight(data[13:13+writerLen], "\x00")),
		WrittenAt: fromUnixNano(int64(binary.LittleEndian.Uint64(data[37:45]))),
	}
	if v := binary.LittleEndian.Uint32(data[8:12]); v != Version {
		return h, nil, &VersionError{Version: v, Writer: h.Writer, WrittenAt: h.WrittenAt}
	}
	return h, data[HeaderLen:end], nil
}

// UnixNano is how every time is stored: the zero time as 0, so a record
// without a timestamp never reads back as a date in 1754 (docs/operations.md "Storage files").
func UnixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Normalize returns t as it reads back after a round trip through storage:
// nanosecond precision, no monotonic reading, the zero time kept zero.
func Normalize(t time.Time) time.Time { return fromUnixNano(UnixNano(t)) }
