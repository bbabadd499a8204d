package snapshot

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"saguin.dev/storage"
)

func TestFileNameEncodesEverythingOutsideTheSafeSet(t *testing.T) {
	cases := map[string]string{
		"events":           "events.snapshot",
		"a-b_C9":           "a-b_C9.snapshot",
		"a.b":              "a%2Eb.snapshot",
		".":                "%2E.snapshot",
		"..":               "%2E%2E.snapshot",
		"$saguin/retained": "%24saguin%2Fretained.snapshot",
		"100%":             "100%25.snapshot",
		"ñ":                "%C3%B1.snapshot",
		"x.tmp-1":          "x%2Etmp-1.snapshot",
	}
	seen := map[string]string{}
	for in, want := range cases {
		got := FileName(in)
		if got != want {
			t.Errorf("FileName(%q) = %q, want %q", in, got, want)
		}
		if strings.Count(got, ".") != 1 {
			t.Errorf("FileName(%q) = %q has a dot besides the extension", in, got)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("%q and %q share file %q", prev, in, got)
		}
		seen[got] = in
	}
}

func TestParseRoundTripAndRefusals(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	e := NewFile(KindChannels, "rev", at, 0)
	r := storage.Record{Offset: 3, MessageID: "m", Topic: "t", Headers: []storage.Header{{Name: "a", Value: "b"}}, PayloadFormat: new(byte)}
	e.Record(&r)
	data := e.Finish()
	h, body, err := Parse(data)
	if err != nil || h.Kind != KindChannels || h.Writer != "rev" || !h.WrittenAt.Equal(at) {
		t.Fatalf("Parse = %+v, %v", h, err)
	}
	d := NewDecoder(body)
	got := d.Record()
	if err := d.End(); err != nil || got.Offset != 3 || got.Headers[0].Value != "b" || got.PayloadFormat == nil || *got.PayloadFormat != 0 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	if !got.Timestamp.IsZero() {
		t.Fatalf("a zero timestamp read back as %v", got.Timestamp)
	}

	data[len(data)-1] ^= 1
	if _, _, err := Parse(data); !errors.Is(err, ErrDamaged) {
		t.Fatalf("bad checksum: %v", err)
	}
	if _, _, err := Parse(data[:10]); !errors.Is(err, ErrDamaged) {
		t.Fatalf("short file: %v", err)
	}
}

func TestDecoderRefusesBadFlagsAndTrailingBytes(t *testing.T) {
	enc := func(f func(e *Encoder)) *Decoder {
		e := &Encoder{}
		f(e)
		return NewDecoder(e.b)
	}
	r := storage.Record{QoS: 1}
	d := enc(func(e *Encoder) { e.Record(&r); e.Uint8(9) })
	d.Record()
	if err := d.End(); err == nil || !strings.Contains(err.Error(), "after the last") {
		t.Fatalf("trailing byte: %v", err)
	}
	r.QoS = 3
	d = enc(func(e *Encoder) { e.Record(&r) })
	d.Record()
	if err := d.End(); err == nil || !strings.Contains(err.Error(), "QoS") {
		t.Fatalf("QoS 3: %v", err)
	}
	d = enc(func(e *Encoder) { e.Uint8(2) })
	d.Bool("retain")
	if err := d.End(); err == nil || !strings.Contains(err.Error(), "retain") {
		t.Fatalf("flag 2: %v", err)
	}
	d = enc(func(e *Encoder) { e.Uint32(1 << 30); e.Uint32(0) })
	if s := d.String("topic"); s != "" || d.Err() == nil {
		t.Fatalf("string longer than the body: %q, %v", s, d.Err())
	}
}

// TestDecoderReadsDeclaredLengthsAsUnsigned: a length or count is four
// unsigned bytes on disk whatever the build. Read into a 32-bit int, one at
// or past 2^31 turned negative: a count then passed the bytes-present check
// and read as zero entries, so a damaged file loaded as an empty store
// (invariant 14), and a length was refused under a negative number.
func TestDecoderReadsDeclaredLengthsAsUnsigned(t *testing.T) {
	for _, declared := range []uint32{1 << 31, 1<<32 - 1} {
		e := &Encoder{}
		e.Uint32(declared)
		e.Uint32(0)
		d := NewDecoder(e.b)
		if n := d.Count("record", MinRecordSize); n != 0 || d.Err() == nil {
			t.Fatalf("count %d over 4 bytes: read %d entries, error %v", declared, n, d.Err())
		}
		if want := fmt.Sprintf("record count %d", declared); !strings.Contains(d.Err().Error(), want) {
			t.Fatalf("count %d: error %q does not say %q", declared, d.Err(), want)
		}
		d = NewDecoder(e.b)
		if s := d.String("topic"); s != "" || d.Err() == nil {
			t.Fatalf("string of %d bytes over 4: %q, %v", declared, s, d.Err())
		}
		if want := fmt.Sprintf("topic declares %d bytes", declared); !strings.Contains(d.Err().Error(), want) {
			t.Fatalf("string of %d bytes: error %q does not say %q", declared, d.Err(), want)
		}
		d = NewDecoder(e.b)
		if p := d.Bytes("payload"); p != nil || d.Err() == nil {
			t.Fatalf("payload of %d bytes over 4: %d bytes, %v", declared, len(p), d.Err())
		}
	}
}

// TestNewFileSizeHintIsOnlyAHint: a memory store's hint is its byte count
// plus per-entry minimums, which on a 32-bit build can reach the top of
// int. The hint preallocates at most maxPrealloc (the file grows past it
// as it is written); it must never overflow into a capacity make refuses.
func TestNewFileSizeHintIsOnlyAHint(t *testing.T) {
	for _, hint := range []int64{-1, 0, 100, math.MaxInt32, math.MaxInt64} {
		e := NewFile(KindChannels, "rev", time.Unix(1, 0), hint)
		if c := cap(e.b); c > HeaderLen+maxPrealloc+trailerLen {
			t.Fatalf("hint %d preallocated %d bytes, more than %d", hint, c, HeaderLen+maxPrealloc+trailerLen)
		}
		e.String("events")
		if _, body, err := Parse(e.Finish()); err != nil || len(body) != 4+len("events") {
			t.Fatalf("hint %d: %d-byte body, %v", hint, len(body), err)
		}
	}
}

// FuzzDecodeRecords feeds arbitrary bodies to the decoder: it must never
// panic and never allocate for a count the bytes cannot hold.
func FuzzDecodeRecords(f *testing.F) {
	e := &Encoder{}
	e.Count(2)
	for i := range 2 {
		r := storage.Record{Offset: uint64(i + 1), MessageID: "m", Topic: "t", Payload: []byte("p"),
			Headers: []storage.Header{{Name: "h", Value: "v"}}, MessageExpiry: new(uint32)}
		e.Record(&r)
	}
	f.Add(e.b)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, body []byte) {
		d := NewDecoder(body)
		n := d.Count("record", MinRecordSize)
		if n > len(body)/MinRecordSize {
			t.Fatalf("count %d admitted for %d bytes", n, len(body))
		}
		for range n {
			d.Record()
		}
		_ = d.End()
	})
}
