package storagetest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"saguin.dev/storage"
)

// SampleRecords covers every field a record keeps and the distinctions
// that are easy to lose: an unset PayloadFormat or MessageExpiry against a
// set zero, header order and repeated names, empty header names and values,
// binary payloads, the zero timestamp, sub-microsecond timestamps, and a
// timestamp before 1970.
func SampleRecords() []storage.Record {
	big := make([]byte, 64<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	return []storage.Record{
		{
			MessageID:       "0195a3c1-7e2f-7b3c-9d4e-1f2a3b4c5d6e",
			Topic:           "devices/d1/temp",
			Timestamp:       Base.Add(1500*time.Millisecond + 7),
			Headers:         []storage.Header{{Name: "b", Value: "2"}, {Name: "a", Value: "1"}, {Name: "b", Value: "3"}, {Name: "b", Value: "2"}},
			Payload:         []byte{0, 1, 2, 0xff, 0, 'x'},
			ContentType:     "application/json",
			ResponseTopic:   "replies/d1",
			CorrelationData: []byte{0xde, 0xad, 0, 0xbe, 0xef},
			PayloadFormat:   ptr[byte](1),
			MessageExpiry:   ptr[uint32](3600),
			Retain:          true,
			QoS:             2,
			PublisherID:     "client-7",
			Bridge:          "uplink",
		},
		{MessageID: "m2", Topic: "devices/d2/temp"}, // zero timestamp, nothing set
		{
			MessageID:     "m3",
			Topic:         "métricas/ñandú/温度",
			Timestamp:     Base.Add(-time.Hour),
			Headers:       []storage.Header{{Name: "k", Value: ""}, {Name: "", Value: "v"}, {Name: "", Value: ""}},
			PayloadFormat: ptr[byte](0),
			MessageExpiry: ptr[uint32](0),
			QoS:           0,
		},
		{MessageID: "m4", Topic: "big", Timestamp: Base.Add(2 * time.Second), Payload: big, QoS: 1},
		{MessageID: "m5", Topic: "old", Timestamp: time.Date(1969, 7, 20, 20, 17, 40, 123456789, time.UTC), Payload: []byte("eagle")},
		{MessageID: "m6", Topic: "empty-payload", Timestamp: Base.Add(3 * time.Second), Payload: []byte{}, Headers: []storage.Header{}},
	}
}

// AppendAndRead: offsets start at 1 and are consecutive, every field comes
// back as stored (before and after a restart), the store keeps its own
// copy of what it is given, and reads page and end as the interface says.
func AppendAndRead(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	checkLog(t, "new log", l, 1, 1, nil)
	if got, floor, err := l.Read(1, 10); err != nil || len(got) != 0 || floor != 1 {
		t.Fatalf("Read(1) on a new log = %d records, floor %d, %v; want none, 1, nil", len(got), floor, err)
	}
	_, _, err := l.Read(0, 10)
	wantErr(t, "Read(0) on a new log", err, storage.ErrBelowFloor)

	samples := SampleRecords()
	var stored []storage.Record
	for i, r := range samples {
		got := mustAppend(t, l, r)
		if got.Offset != uint64(i+1) {
			t.Fatalf("record %d stored at offset %d", i+1, got.Offset)
		}
		stored = append(stored, got)
	}
	// The caller may reuse its buffers once Append returns.
	samples[0].Payload[0] = 'X'
	samples[0].Headers[0].Value = "changed"
	samples[0].CorrelationData[0] = 0
	*samples[0].PayloadFormat = 0
	*samples[0].MessageExpiry = 1
	want := SampleRecords()
	for i := range want {
		want[i].Offset = uint64(i + 1)
	}
	n := uint64(len(want))
	checkLog(t, "after appends", l, n+1, 1, want)
	checkRecords(t, "Append's answers", want, stored)

	page, floor, err := l.Read(2, 2)
	if err != nil || floor != 1 {
		t.Fatalf("Read(2, 2): floor %d, %v", floor, err)
	}
	checkRecords(t, "Read(2, 2)", want[1:3], page)
	for _, from := range []uint64{n + 1, n + 5} {
		if got, _, err := l.Read(from, 10); err != nil || len(got) != 0 {
			t.Fatalf("Read(%d) past the end = %d records, %v; want none", from, len(got), err)
		}
	}
	if got, _, err := l.Read(1, 0); err != nil || len(got) != 0 {
		t.Fatalf("Read(1, 0) = %d records, %v; want none", len(got), err)
	}

	h.restart()
	l = h.log("events")
	checkLog(t, "after restart", l, n+1, 1, want)
	mustAppend(t, l, rec("after", 3, Base))
	if l.Next() != n+2 {
		t.Fatalf("Next after restart and append = %d, want %d", l.Next(), n+2)
	}
}

// ReadBelowFloorIsRejected guards invariant 1: after every kind of removal
// (age trim, size trim, on a channel and on a dead-letter log, and across
// a restart) a read below the floor is refused, never served the oldest
// survivor.
func ReadBelowFloorIsRejected(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	var want []storage.Record
	for i := 1; i <= 10; i++ {
		want = append(want, mustAppend(t, l, rec("r", 10*i, Base.Add(time.Duration(i)*time.Second))))
	}
	below := func(what string, l storage.AppendLog, floor uint64) {
		t.Helper()
		for _, from := range []uint64{0, 1, floor - 1} {
			if from >= floor {
				continue
			}
			got, f, err := l.Read(from, 100)
			if !errors.Is(err, storage.ErrBelowFloor) || len(got) != 0 {
				t.Fatalf("%s: Read(%d) with floor %d = %d records (floor %d), %v; want ErrBelowFloor and nothing",
					what, from, floor, len(got), f, err)
			}
		}
		got, f, err := l.Read(floor, 1)
		if err != nil || f != floor {
			t.Fatalf("%s: Read(floor %d) = floor %d, %v", what, floor, f, err)
		}
		if l.Next() > floor && (len(got) != 1 || got[0].Offset < floor) {
			t.Fatalf("%s: Read(floor %d) = %v", what, floor, offsets(got))
		}
	}
	// Age: offsets 1..3 carry timestamps before Base+4s.
	mustTrim(t, l, Base.Add(4*time.Second), 0, 3, sizes(want[:3]))
	checkLog(t, "after age trim", l, 11, 4, want[3:])
	below("after age trim", l, 4)
	// Size: the path that does not feel like deleting data.
	mustTrim(t, l, time.Time{}, l.Bytes()-sizes(want[3:5]), 2, sizes(want[3:5]))
	checkLog(t, "after size trim", l, 11, 6, want[5:])
	below("after size trim", l, 6)
	h.restart()
	l = h.log("events")
	checkLog(t, "after restart", l, 11, 6, want[5:])
	below("after restart", l, 6)

	q := h.queue("jobs")
	for i := range 3 {
		if _, err := q.Enqueue(rec("j", 5+i, Base)); err != nil {
			t.Fatal(err)
		}
		if _, err := q.DeadLetter(uint64(i+1), "jobs/__dlq", nil, Base); err != nil {
			t.Fatal(err)
		}
	}
	d := q.DeadLetters()
	first, _, _ := d.Read(1, 1)
	mustTrim(t, d, time.Time{}, d.Bytes()-first[0].Size(), 1, first[0].Size())
	below("dead-letter log after size trim", d, 2)
	h.restart()
	below("dead-letter log after restart", h.queue("jobs").DeadLetters(), 2)
}

// TrimByAge: records strictly older than the cutoff go, from the oldest,
// stopping at the first keeper (a clock that stepped backwards cannot cut
// a hole the floor cannot name), and a record with no timestamp is never
// too old.
func TrimByAge(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	at := func(s int) time.Time { return Base.Add(time.Duration(s) * time.Second) }
	want := []storage.Record{
		mustAppend(t, l, rec("a", 10, at(1))),
		mustAppend(t, l, rec("b", 20, at(50))), // the clock jumped ahead
		mustAppend(t, l, rec("c", 30, at(2))),  // and stepped back
		mustAppend(t, l, rec("d", 40, time.Time{})),
		mustAppend(t, l, rec("e", 50, at(3))),
	}
	mustTrim(t, l, time.Time{}, 0, 0, 0)
	mustTrim(t, l, at(1), 0, 0, 0) // not older than its own moment
	mustTrim(t, l, at(1).Add(1), 0, 1, want[0].Size())
	checkLog(t, "cut at 1s", l, 6, 2, want[1:])
	mustTrim(t, l, at(10), 0, 0, 0) // b keeps c, though c is older
	checkLog(t, "cut at 10s", l, 6, 2, want[1:])
	mustTrim(t, l, at(100), 0, 2, sizes(want[1:3])) // d has no timestamp
	checkLog(t, "cut at 100s", l, 6, 4, want[3:])
	mustTrim(t, l, at(1000), 0, 0, 0)
	h.restart()
	l = h.log("events")
	checkLog(t, "after restart", l, 6, 4, want[3:])
	// Age first, then size, in one call: d goes only to the size rule.
	mustTrim(t, l, at(1000), want[4].Size(), 1, want[3].Size())
	checkLog(t, "age then size", l, 6, 5, want[4:])
}

// TrimBySize: the oldest records go while the channel holds more than the
// bound, whatever their timestamps; the floor follows.
func TrimBySize(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	var want []storage.Record
	for i := 1; i <= 5; i++ {
		ts := Base.Add(time.Duration(i) * time.Hour)
		if i == 2 {
			ts = time.Time{}
		}
		want = append(want, mustAppend(t, l, rec("s", 100*i, ts)))
	}
	total := sizes(want)
	mustTrim(t, l, time.Time{}, total, 0, 0)
	mustTrim(t, l, time.Time{}, total-1, 1, want[0].Size())
	checkLog(t, "one over", l, 6, 2, want[1:])
	mustTrim(t, l, time.Time{}, want[4].Size(), 3, sizes(want[1:4]))
	checkLog(t, "down to the last", l, 6, 5, want[4:])
	mustTrim(t, l, time.Time{}, 1, 1, want[4].Size())
	checkLog(t, "emptied", l, 6, 6, nil)
	mustTrim(t, l, time.Time{}, 1, 0, 0)
}

// OffsetsNeverReused guards invariant 9 (and 1): a channel emptied by
// retention, a queue emptied by resolution and a dead-letter log emptied by
// retention all keep next and floor across restarts, and the next offset
// handed out is the one after the last ever used.
func OffsetsNeverReused(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	for range 3 {
		mustAppend(t, l, rec("e", 8, Base))
	}
	mustTrim(t, l, time.Time{}, 1, 3, 3*size(rec("e", 8, Base)))
	checkLog(t, "emptied", l, 4, 4, nil)

	q := h.queue("jobs")
	for i := range 3 {
		r, err := q.Enqueue(rec("j", 4, Base))
		if err != nil || r.Offset != uint64(i+1) {
			t.Fatalf("Enqueue = offset %d, %v; want %d", r.Offset, err, i+1)
		}
	}
	for o := uint64(1); o <= 2; o++ {
		if err := q.Resolve(o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.DeadLetter(3, "jobs/__dlq", nil, Base); err != nil {
		t.Fatal(err)
	}
	d := q.DeadLetters()
	mustTrim(t, d, time.Time{}, 1, 1, d.Bytes())

	for round := range 2 { // a second restart with nothing written in between
		h.restart()
		l = h.log("events")
		checkLog(t, "restarted emptied log", l, 4, 4, nil)
		_, _, err := l.Read(3, 10)
		wantErr(t, "Read(3) on the restarted emptied log", err, storage.ErrBelowFloor)
		q = h.queue("jobs")
		if q.Next() != 4 || q.Depth() != 0 || q.Bytes() != 0 {
			t.Fatalf("round %d: restarted emptied queue: next %d, depth %d, bytes %d; want 4, 0, 0", round, q.Next(), q.Depth(), q.Bytes())
		}
		checkLog(t, "restarted emptied dead-letter log", q.DeadLetters(), 2, 2, nil)
	}
	if r := mustAppend(t, l, rec("e", 8, Base)); r.Offset != 4 {
		t.Fatalf("append after restart took offset %d, want 4", r.Offset)
	}
	if r, err := q.Enqueue(rec("j", 4, Base)); err != nil || r.Offset != 4 {
		t.Fatalf("enqueue after restart = offset %d, %v; want 4", r.Offset, err)
	}
	if r, err := q.DeadLetter(4, "jobs/__dlq", nil, Base); err != nil || r.Offset != 2 {
		t.Fatalf("dead-letter after restart = offset %d, %v; want 2", r.Offset, err)
	}
}

// ChannelMaxBytes: a channel's own bound refuses with ErrFull exactly at
// the bound, consumes no offset, evicts nothing, and admits again once
// there is room.
func ChannelMaxBytes(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	r := rec("x", 100, Base)
	s := r.Size()
	l.SetMaxBytes(3 * s)
	var want []storage.Record
	for range 3 {
		want = append(want, mustAppend(t, l, r))
	}
	_, err := l.Append(r)
	wantErr(t, "Append at the channel bound", err, storage.ErrFull)
	checkLog(t, "after refusal", l, 4, 1, want)
	mustTrim(t, l, time.Time{}, 2*s, 1, s)
	mustAppend(t, l, r)
	l.SetMaxBytes(0)
	for range 5 {
		mustAppend(t, l, r)
	}

	q := h.queue("jobs")
	q.SetMaxBytes(2 * s)
	for range 2 {
		if _, err := q.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	_, err = q.Enqueue(r)
	wantErr(t, "Enqueue at the queue bound", err, storage.ErrFull)
	if q.Next() != 3 || q.Depth() != 2 || q.Bytes() != 2*s {
		t.Fatalf("after refusal: next %d, depth %d, bytes %d; want 3, 2, %d", q.Next(), q.Depth(), q.Bytes(), 2*s)
	}
	// Relief operations are not refused at the bound (docs/channels.md "`queue`").
	if _, err := q.CountAttempt(1, Base); err != nil {
		t.Fatalf("CountAttempt at the queue bound: %v", err)
	}
	if _, err := q.DeadLetter(1, "jobs/__dlq", []storage.Header{{Name: "saguin-dlq-reason", Value: "attempts_exhausted"}}, Base); err != nil {
		t.Fatalf("DeadLetter at the queue bound: %v", err)
	}
	if r2, err := q.Enqueue(r); err != nil || r2.Offset != 3 {
		t.Fatalf("Enqueue after the move made room = offset %d, %v; want 3", r2.Offset, err)
	}
}

// ProviderBoundAndReserve guards invariant 2 at the provider bound: once
// publishes reach max_bytes less the reserve, Append and Enqueue are
// refused with ErrFull and nothing is evicted; the relief operations
// (attempt count, stored position, dead-letter move, resolve) still go
// through; and room made by retention admits publishes again.
func ProviderBoundAndReserve(t *testing.T, open OpenFunc) {
	const maxBytes, reserve = 256 << 10, 16 << 10
	h := newHarness(t, open, Opts{MaxBytes: maxBytes, Reserve: reserve})
	if h.p.MaxBytes() != maxBytes {
		t.Fatalf("MaxBytes() = %d, want %d", h.p.MaxBytes(), maxBytes)
	}
	q := h.queue("jobs")
	for range 3 {
		if _, err := q.Enqueue(rec("job", 1024, Base)); err != nil {
			t.Fatal(err)
		}
	}
	l := h.log("events")
	accepted := 0
	for ; ; accepted++ {
		if accepted > 10*maxBytes/1024 {
			t.Fatalf("provider never refused: %d records of 1 KiB under max_bytes %d", accepted, maxBytes)
		}
		next := l.Next()
		_, err := l.Append(rec("event", 1024, Base))
		if errors.Is(err, storage.ErrFull) {
			if l.Next() != next {
				t.Fatalf("a refused append moved Next from %d to %d", next, l.Next())
			}
			break
		}
		if err != nil {
			t.Fatalf("Append %d: %v", accepted+1, err)
		}
	}
	if accepted == 0 {
		t.Fatal("the first append was refused")
	}
	if got := len(readAll(t, l)); got != accepted || l.Floor() != 1 {
		t.Fatalf("after refusal the log holds %d records from floor %d, want all %d from 1: nothing is evicted", got, l.Floor(), accepted)
	}
	_, err := q.Enqueue(rec("job", 1024, Base))
	wantErr(t, "Enqueue with the provider full", err, storage.ErrFull)
	if q.Depth() != 3 || q.Next() != 4 {
		t.Fatalf("queue depth %d next %d after refusal, want 3, 4", q.Depth(), q.Next())
	}

	// Relief: none of these is refused for want of capacity.
	if _, err := q.CountAttempt(1, Base); err != nil {
		t.Fatalf("CountAttempt with the provider full: %v", err)
	}
	if err := l.SavePosition(storage.Position{Reader: "mqtt:c1", Offset: 2, LastSeen: Base, Expiry: time.Hour}); err != nil {
		t.Fatalf("SavePosition with the provider full: %v", err)
	}
	extra := []storage.Header{{Name: "saguin-dlq-channel", Value: "jobs"}, {Name: "saguin-dlq-reason", Value: strings.Repeat("r", 200)}}
	if _, err := q.DeadLetter(1, "jobs/__dlq/job", extra, Base); err != nil {
		t.Fatalf("DeadLetter with the provider full: %v", err)
	}
	if err := q.Resolve(2); err != nil {
		t.Fatalf("Resolve with the provider full: %v", err)
	}
	if b := h.p.Bytes(); b > maxBytes {
		t.Fatalf("provider Bytes() = %d over max_bytes %d: relief must stay inside the reserve", b, maxBytes)
	}
	// Retention makes room; publishes are admitted again.
	if _, _, err := l.Trim(time.Time{}, 1); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, rec("event", 1024, Base))
	if _, err := q.Enqueue(rec("job", 1024, Base)); err != nil {
		t.Fatalf("Enqueue after retention made room: %v", err)
	}
}

// FirstAtOrAfter returns the earliest offset whose timestamp is at or
// after the moment, scanning every held record: with a clock that steps
// backwards a bisection finds a later offset.
func FirstAtOrAfter(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	if _, ok, err := l.FirstAtOrAfter(Base); ok || err != nil {
		t.Fatalf("FirstAtOrAfter on an empty log = %v, %v", ok, err)
	}
	at := func(s int) time.Time { return Base.Add(time.Duration(s) * time.Second) }
	for _, ts := range []time.Time{at(10), at(20), at(15), at(30), {}, at(5), at(12)} {
		mustAppend(t, l, rec("f", 1, ts))
	}
	cases := []struct {
		at   time.Time
		want uint64
		ok   bool
	}{
		{at(0), 1, true}, {at(10), 1, true}, {at(11), 2, true}, {at(15), 2, true},
		{at(21), 4, true}, {at(30), 4, true}, {at(31), 0, false},
	}
	check := func(what string) {
		t.Helper()
		for _, c := range cases {
			got, ok, err := l.FirstAtOrAfter(c.at)
			if err != nil || ok != c.ok || (ok && got != c.want) {
				t.Fatalf("%s: FirstAtOrAfter(+%v) = %d, %v, %v; want %d, %v", what, c.at.Sub(Base), got, ok, err, c.want, c.ok)
			}
		}
	}
	check("fresh")
	h.restart()
	l = h.log("events")
	check("after restart")
	mustTrim(t, l, time.Time{}, l.Bytes()-2*size(rec("f", 1, Base)), 2, 2*size(rec("f", 1, Base)))
	cases = []struct {
		at   time.Time
		want uint64
		ok   bool
	}{{at(0), 3, true}, {at(11), 3, true}, {at(16), 4, true}, {at(6), 3, true}, {at(31), 0, false}}
	check("after trimming two")
}

// Positions: stored, replaced, listed, dropped and kept across restarts;
// never past next; and at open an mqtt: position whose session expired
// while the provider was down is dropped while a bridge: one is kept.
func Positions(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	for range 5 {
		mustAppend(t, l, rec("p", 1, Base))
	}
	if _, ok, err := l.Position("mqtt:a"); ok || err != nil {
		t.Fatalf("Position of an unknown reader = %v, %v", ok, err)
	}
	checkPositions(t, "none stored", l, nil)
	now := h.clock.Now()
	save := func(p storage.Position) {
		t.Helper()
		if err := l.SavePosition(p); err != nil {
			t.Fatalf("SavePosition(%+v): %v", p, err)
		}
	}
	save(storage.Position{Reader: "mqtt:a", Offset: 1, LastSeen: now, Expiry: time.Hour})
	save(storage.Position{Reader: "mqtt:a", Offset: 3, LastSeen: now.Add(7), Expiry: 2 * time.Hour})
	save(storage.Position{Reader: "mqtt:caught-up", Offset: 6, LastSeen: now, Expiry: time.Hour}) // next: caught up
	save(storage.Position{Reader: "mqtt:short", Offset: 2, LastSeen: now.Add(-10 * time.Minute), Expiry: 5 * time.Minute})
	save(storage.Position{Reader: "mqtt:no-expiry", Offset: 2, LastSeen: now.Add(-time.Second)})
	save(storage.Position{Reader: "bridge:up", Offset: 4, LastSeen: now.Add(-1000 * time.Hour)})
	save(storage.Position{Reader: "mqtt:dropme", Offset: 4, LastSeen: now, Expiry: time.Hour})
	err := l.SavePosition(storage.Position{Reader: "mqtt:ahead", Offset: 7, LastSeen: now, Expiry: time.Hour})
	wantErr(t, "SavePosition past next", err, storage.ErrBeyondEnd)
	if ok, err := l.DropPosition("mqtt:dropme"); !ok || err != nil {
		t.Fatalf("DropPosition of a stored reader = %v, %v", ok, err)
	}
	if ok, err := l.DropPosition("mqtt:dropme"); ok || err != nil {
		t.Fatalf("DropPosition twice = %v, %v", ok, err)
	}
	all := []storage.Position{
		{Reader: "bridge:up", Offset: 4, LastSeen: now.Add(-1000 * time.Hour)},
		{Reader: "mqtt:a", Offset: 3, LastSeen: now.Add(7), Expiry: 2 * time.Hour},
		{Reader: "mqtt:caught-up", Offset: 6, LastSeen: now, Expiry: time.Hour},
		{Reader: "mqtt:no-expiry", Offset: 2, LastSeen: now.Add(-time.Second)},
		{Reader: "mqtt:short", Offset: 2, LastSeen: now.Add(-10 * time.Minute), Expiry: 5 * time.Minute},
	}
	checkPositions(t, "stored", l, all)

	// At open the clock reads a minute later: mqtt:short (expired nine
	// minutes before) and mqtt:no-expiry (a session ending with its
	// connection) are dropped; the bridge reader is not judged by a clock.
	h.clock.Advance(time.Minute)
	h.restart()
	l = h.log("events")
	checkPositions(t, "after restart", l, []storage.Position{all[0], all[1], all[2]})
	p, ok, err := l.Position("mqtt:a")
	if err != nil || !ok || p.Offset != 3 || !p.LastSeen.Equal(now.Add(7)) || p.Expiry != 2*time.Hour {
		t.Fatalf("Position(mqtt:a) after restart = %+v, %v, %v", p, ok, err)
	}
	// A position below the floor is a lagging reader, not an error.
	mustTrim(t, l, time.Time{}, 1, 5, 5*size(rec("p", 1, Base)))
	if err := l.SavePosition(storage.Position{Reader: "mqtt:a", Offset: 4, LastSeen: now, Expiry: time.Hour}); err != nil {
		t.Fatalf("SavePosition below the floor: %v", err)
	}
	// Positions on a dead-letter log.
	d := h.queue("jobs").DeadLetters()
	if err := d.SavePosition(storage.Position{Reader: "mqtt:w", Offset: 1, LastSeen: now, Expiry: time.Hour}); err != nil {
		t.Fatalf("SavePosition on a dead-letter log: %v", err)
	}
	h.restart()
	checkPositions(t, "dead-letter log after restart", h.queue("jobs").DeadLetters(),
		[]storage.Position{{Reader: "mqtt:w", Offset: 1, LastSeen: now, Expiry: time.Hour}})
}

func checkPositions(t *testing.T, what string, l storage.AppendLog, want []storage.Position) {
	t.Helper()
	got, err := l.Positions()
	if err != nil {
		t.Fatalf("%s: Positions: %v", what, err)
	}
	slices.SortFunc(got, func(a, b storage.Position) int { return strings.Compare(a.Reader, b.Reader) })
	if len(got) != len(want) {
		t.Fatalf("%s: %d positions %+v, want %d %+v", what, len(got), got, len(want), want)
	}
	var lowest uint64
	for i := range want {
		w, g := want[i], got[i]
		if w.Reader != g.Reader || w.Offset != g.Offset || !sameTime(w.LastSeen, g.LastSeen) || w.Expiry != g.Expiry {
			t.Fatalf("%s: position %d = %+v, want %+v", what, i, g, w)
		}
		if i == 0 || w.Offset < lowest {
			lowest = w.Offset
		}
	}
	// The metrics' one pass agrees with the list it summarises.
	low, n, err := l.LowestPosition()
	if err != nil || low != lowest || n != len(want) {
		t.Fatalf("%s: LowestPosition = %d, %d, %v; want %d, %d, nil", what, low, n, err, lowest, len(want))
	}
}

// SameNameSameStore: asking twice for a channel returns the same store, so
// there is one counter (two would hand out one offset twice).
func SameNameSameStore(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	a, b := h.log("events"), h.log("events")
	if a != b {
		t.Fatal("Append(events) twice returned two stores")
	}
	q1, q2 := h.queue("jobs"), h.queue("jobs")
	if q1 != q2 {
		t.Fatal("Queue(jobs) twice returned two stores")
	}
	mustAppend(t, a, rec("s", 1, Base))
	if b.Next() != 2 {
		t.Fatalf("second handle sees Next %d, want 2", b.Next())
	}
	if _, err := q1.Enqueue(rec("j", 1, Base)); err != nil {
		t.Fatal(err)
	}
	if _, err := q1.DeadLetter(1, "jobs/__dlq", nil, Base); err != nil {
		t.Fatal(err)
	}
	d := h.log("jobs__dlq")
	if d.Next() != 2 || !bytes.Equal(readAll(t, d)[0].Payload, rec("j", 1, Base).Payload) {
		t.Fatalf("the dead-letter log opened by name does not see the move (Next %d)", d.Next())
	}
}

// Closed: after Close nothing is stored and every call says why.
func Closed(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	q := h.queue("jobs")
	mustAppend(t, l, rec("c", 1, Base))
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := l.Append(rec("c", 1, Base))
	wantErr(t, "Append after Close", err, storage.ErrClosed)
	_, err = q.Enqueue(rec("c", 1, Base))
	wantErr(t, "Enqueue after Close", err, storage.ErrClosed)
	_, err = h.p.Append("events")
	wantErr(t, "Provider.Append after Close", err, storage.ErrClosed)
	_, err = h.p.Queue("jobs", "jobs__dlq")
	wantErr(t, "Provider.Queue after Close", err, storage.ErrClosed)
	h.p = h.open(t, h.dir, h.opts)
	checkLog(t, "reopened", h.log("events"), 2, 1, []storage.Record{func() storage.Record { r := rec("c", 1, Base); r.Offset = 1; return r }()})
}
