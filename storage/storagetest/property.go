package storagetest

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"saguin.dev/storage"
)

// Property checks a provider against a simple model under random sequences
// of appends, age and size trims, enqueues, attempt counts, resolutions,
// dead-letter moves, reads, value puts and removals, and restarts. After
// every step the provider's next, floor, byte counts and held records
// (log, queue, dead-letter log and value store) must equal the model's; a
// read below the floor must be refused.
func Property(t *testing.T, open OpenFunc) {
	base := t.TempDir()
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp(base, "run")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		m := &model{t: t, rt: rt, open: open, dir: dir, clock: Base,
			next: 1, floor: 1, qnext: 1, dnext: 1, dfloor: 1, vnext: 1, vals: map[string]storage.Record{}}
		m.p = open(t, dir, Opts{Now: func() time.Time { return Base }})
		defer func() {
			if m.p != nil {
				_ = m.p.Close()
			}
		}()
		m.attach()
		rt.Repeat(rapid.StateMachineActions(m))
	})
}

// model is what the provider should hold, kept the simple way.
type model struct {
	t    *testing.T
	rt   *rapid.T
	open OpenFunc
	dir  string
	p    storage.Provider
	l    storage.AppendLog
	q    storage.QueueStore
	v    storage.ValueStore

	clock         time.Time // the timestamps records are given; it steps back
	seq           int
	next, floor   uint64
	recs          []storage.Record
	qnext         uint64
	items         []storage.QueueItem
	dnext, dfloor uint64
	dlq           []storage.Record
	vnext         uint64
	vals          map[string]storage.Record // topic -> current value
}

func (m *model) attach() {
	var err error
	if m.l, err = m.p.Append("events"); err != nil {
		m.rt.Fatalf("Append(events): %v", err)
	}
	if m.q, err = m.p.Queue("jobs", "jobs__dlq"); err != nil {
		m.rt.Fatalf("Queue(jobs): %v", err)
	}
	if m.v, err = m.p.Values("retained"); err != nil {
		m.rt.Fatalf("Values(retained): %v", err)
	}
}

// valueTopic draws from few topics, so Puts replace and Removes hit.
func valueTopic(t *rapid.T) string {
	return "v/" + rapid.StringMatching(`[ab]{1,2}`).Draw(t, "value topic")
}

func (m *model) PutValue(t *rapid.T) {
	r := m.record(t)
	r.Topic = valueTopic(t)
	got, err := m.v.Put(r)
	if err != nil {
		t.Fatalf("Put(%s): %v", r.Topic, err)
	}
	r.Offset = m.vnext
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Put returned %s", d)
	}
	m.vnext++
	m.vals[r.Topic] = got
}

func (m *model) RemoveValue(t *rapid.T) {
	topic := valueTopic(t)
	_, want := m.vals[topic]
	if ok, err := m.v.Remove(topic); ok != want || err != nil {
		t.Fatalf("Remove(%s) = %v, %v; model %v", topic, ok, err, want)
	}
	delete(m.vals, topic)
}

// RemoveValueIf removes a value only at the offset drawn: the current one
// or a stale one (which must leave the value in place).
func (m *model) RemoveValueIf(t *rapid.T) {
	topic := valueTopic(t)
	cur, held := m.vals[topic]
	off := uint64(rapid.IntRange(1, int(m.vnext)).Draw(t, "offset"))
	if held && rapid.Bool().Draw(t, "current offset") {
		off = cur.Offset
	}
	want := held && cur.Offset == off
	if ok, err := m.v.RemoveIf(topic, off); ok != want || err != nil {
		t.Fatalf("RemoveIf(%s, %d) = %v, %v; model %v", topic, off, ok, err, want)
	}
	if want {
		delete(m.vals, topic)
	}
}

func (m *model) record(t *rapid.T) storage.Record {
	m.seq++
	m.clock = m.clock.Add(time.Duration(rapid.IntRange(-5, 10).Draw(t, "clock step")) * time.Second)
	ts := m.clock
	if rapid.IntRange(0, 5).Draw(t, "zero timestamp") == 0 {
		ts = time.Time{}
	}
	r := storage.Record{
		MessageID: fmt.Sprintf("m%d", m.seq),
		Topic:     "t/" + rapid.StringMatching(`[a-z]{0,6}`).Draw(t, "topic"),
		Timestamp: ts,
		Payload:   rapid.SliceOfN(rapid.Byte(), 0, 48).Draw(t, "payload"),
		QoS:       byte(rapid.IntRange(0, 2).Draw(t, "qos")),
	}
	for i := range rapid.IntRange(0, 2).Draw(t, "headers") {
		r.Headers = append(r.Headers, storage.Header{Name: fmt.Sprint("h", i%2), Value: rapid.StringMatching(`[a-z]{0,4}`).Draw(t, "value")})
	}
	if rapid.Bool().Draw(t, "payload format") {
		r.PayloadFormat = ptr(byte(rapid.IntRange(0, 1).Draw(t, "pf")))
	}
	return r
}

func (m *model) Append(t *rapid.T) {
	r := m.record(t)
	got, err := m.l.Append(r)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	r.Offset = m.next
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Append returned %s", d)
	}
	m.next++
	m.recs = append(m.recs, got)
}

// trim applies the retention rule to a model log: age from the oldest,
// stopping at the first keeper, then size.
func trimModel(recs []storage.Record, floor uint64, olderThan time.Time, maxBytes int64) ([]storage.Record, uint64, int, int64) {
	i := 0
	var freed int64
	for ; !olderThan.IsZero() && i < len(recs); i++ {
		ts := recs[i].Timestamp
		if ts.IsZero() || !ts.Before(olderThan) {
			break
		}
		freed += recs[i].Size()
	}
	held := sizes(recs) - freed
	for ; maxBytes > 0 && i < len(recs) && held > maxBytes; i++ {
		held -= recs[i].Size()
		freed += recs[i].Size()
	}
	if i > 0 {
		floor = max(floor, recs[i-1].Offset+1)
	}
	return recs[i:], floor, i, freed
}

func (m *model) trim(t *rapid.T, l storage.AppendLog, recs *[]storage.Record, floor *uint64, olderThan time.Time, maxBytes int64) {
	var wantRemoved int
	var wantFreed int64
	*recs, *floor, wantRemoved, wantFreed = trimModel(*recs, *floor, olderThan, maxBytes)
	removed, freed, err := l.Trim(olderThan, maxBytes)
	if err != nil || removed != wantRemoved || freed != wantFreed {
		t.Fatalf("Trim(%v, %d) = %d, %d, %v; want %d, %d", olderThan, maxBytes, removed, freed, err, wantRemoved, wantFreed)
	}
}

func (m *model) TrimAge(t *rapid.T) {
	cut := m.clock.Add(time.Duration(rapid.IntRange(-20, 5).Draw(t, "age cut")) * time.Second)
	m.trim(t, m.l, &m.recs, &m.floor, cut, 0)
}

func (m *model) TrimSize(t *rapid.T) {
	limit := rapid.Int64Range(1, sizes(m.recs)+8).Draw(t, "size limit")
	m.trim(t, m.l, &m.recs, &m.floor, time.Time{}, limit)
}

func (m *model) TrimBoth(t *rapid.T) {
	cut := m.clock.Add(time.Duration(rapid.IntRange(-20, 5).Draw(t, "age cut")) * time.Second)
	limit := rapid.Int64Range(1, sizes(m.recs)+8).Draw(t, "size limit")
	m.trim(t, m.l, &m.recs, &m.floor, cut, limit)
}

func (m *model) TrimDeadLetters(t *rapid.T) {
	limit := rapid.Int64Range(1, sizes(m.dlq)+8).Draw(t, "size limit")
	m.trim(t, m.q.DeadLetters(), &m.dlq, &m.dfloor, time.Time{}, limit)
}

func (m *model) Read(t *rapid.T) {
	from := rapid.Uint64Range(0, m.next+2).Draw(t, "from")
	max := rapid.IntRange(1, 8).Draw(t, "max")
	got, floor, err := m.l.Read(from, max)
	if from < m.floor {
		if !errors.Is(err, storage.ErrBelowFloor) || len(got) != 0 {
			t.Fatalf("Read(%d) below floor %d = %d records, %v; want ErrBelowFloor", from, m.floor, len(got), err)
		}
		return
	}
	if err != nil || floor != m.floor {
		t.Fatalf("Read(%d) = floor %d, %v; want floor %d", from, floor, err, m.floor)
	}
	var want []storage.Record
	for _, r := range m.recs {
		if r.Offset >= from && len(want) < max {
			want = append(want, r)
		}
	}
	if d := recordsDiff(want, got); d != "" {
		t.Fatalf("Read(%d, %d): %s", from, max, d)
	}
}

func (m *model) Restart(t *rapid.T) {
	if err := m.p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	m.p = nil
	m.p = m.open(m.t, m.dir, Opts{Now: func() time.Time { return Base }})
	m.attach()
}

func (m *model) Enqueue(t *rapid.T) {
	r := m.record(t)
	got, err := m.q.Enqueue(r)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	r.Offset = m.qnext
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Enqueue returned %s", d)
	}
	m.qnext++
	m.items = append(m.items, storage.QueueItem{Record: got})
}

func (m *model) pick(t *rapid.T) int {
	if len(m.items) == 0 {
		t.Skip("no unresolved items")
	}
	return rapid.IntRange(0, len(m.items)-1).Draw(t, "item")
}

func (m *model) CountAttempt(t *rapid.T) {
	i := m.pick(t)
	at := m.clock.Add(time.Duration(rapid.IntRange(0, 100).Draw(t, "delivered")) * time.Millisecond)
	got, err := m.q.CountAttempt(m.items[i].Offset, at)
	it := &m.items[i]
	it.Attempts++
	if it.FirstDelivered.IsZero() {
		it.FirstDelivered = at
	}
	it.LastDelivered = at
	if err != nil || ItemDiff(*it, got) != "" {
		t.Fatalf("CountAttempt(%d) = %s, %v", it.Offset, ItemDiff(*it, got), err)
	}
}

func (m *model) Resolve(t *rapid.T) {
	i := m.pick(t)
	if err := m.q.Resolve(m.items[i].Offset); err != nil {
		t.Fatalf("Resolve(%d): %v", m.items[i].Offset, err)
	}
	m.items = append(m.items[:i:i], m.items[i+1:]...)
}

func (m *model) DeadLetter(t *rapid.T) {
	i := m.pick(t)
	it := m.items[i]
	extra := []storage.Header{{Name: "saguin-dlq-reason", Value: "attempts_exhausted"}}
	got, err := m.q.DeadLetter(it.Offset, it.Topic+"/__dlq", extra, m.clock)
	want := it.Record
	want.Offset = m.dnext
	want.Topic += "/__dlq"
	want.Headers = append(append([]storage.Header(nil), it.Headers...), extra...)
	want.Timestamp = m.clock
	if err != nil || RecordDiff(want, got) != "" {
		t.Fatalf("DeadLetter(%d) = %s, %v", it.Offset, RecordDiff(want, got), err)
	}
	m.dnext++
	m.dlq = append(m.dlq, got)
	m.items = append(m.items[:i:i], m.items[i+1:]...)
}

// Check compares the whole provider with the model after every step.
func (m *model) Check(t *rapid.T) {
	m.checkLog(t, "events", m.l, m.next, m.floor, m.recs)
	m.checkLog(t, "jobs__dlq", m.q.DeadLetters(), m.dnext, m.dfloor, m.dlq)
	if m.q.Next() != m.qnext || m.q.Depth() != len(m.items) {
		t.Fatalf("queue next %d depth %d; model %d, %d", m.q.Next(), m.q.Depth(), m.qnext, len(m.items))
	}
	var b int64
	for i := range m.items {
		b += m.items[i].Size()
	}
	if m.q.Bytes() != b {
		t.Fatalf("queue bytes %d; model %d", m.q.Bytes(), b)
	}
	m.checkValues(t)
	got, err := m.q.Items(0, len(m.items)+1)
	if err != nil {
		t.Fatalf("Items: %v", err)
	}
	if len(got) != len(m.items) {
		t.Fatalf("Items: %d; model %d", len(got), len(m.items))
	}
	for i := range got {
		if d := ItemDiff(m.items[i], got[i]); d != "" {
			t.Fatalf("Items[%d]: %s", i, d)
		}
	}
}

func (m *model) checkLog(t *rapid.T, name string, l storage.AppendLog, next, floor uint64, recs []storage.Record) {
	if l.Next() != next || l.Floor() != floor || l.Bytes() != sizes(recs) {
		t.Fatalf("%s: next %d floor %d bytes %d; model %d, %d, %d", name, l.Next(), l.Floor(), l.Bytes(), next, floor, sizes(recs))
	}
	got, f, err := l.Read(floor, len(recs)+1)
	if err != nil || f != floor {
		t.Fatalf("%s: Read(floor %d) = floor %d, %v", name, floor, f, err)
	}
	if d := recordsDiff(recs, got); d != "" {
		t.Fatalf("%s: %s", name, d)
	}
	if floor > 1 {
		if _, _, err := l.Read(floor-1, 1); !errors.Is(err, storage.ErrBelowFloor) {
			t.Fatalf("%s: Read(%d) below floor %d: %v; want ErrBelowFloor", name, floor-1, floor, err)
		}
	}
}

func (m *model) checkValues(t *rapid.T) {
	want := make([]storage.Record, 0, len(m.vals))
	for _, topic := range slices.Sorted(maps.Keys(m.vals)) {
		want = append(want, m.vals[topic])
	}
	if m.v.Next() != m.vnext || m.v.Len() != len(want) || m.v.Bytes() != sizes(want) {
		t.Fatalf("values: next %d len %d bytes %d; model %d, %d, %d", m.v.Next(), m.v.Len(), m.v.Bytes(), m.vnext, len(want), sizes(want))
	}
	var got []storage.Record
	if err := m.v.Scan(func(r storage.Record) bool { got = append(got, r); return true }); err != nil {
		t.Fatalf("values: Scan: %v", err)
	}
	if d := recordsDiff(want, got); d != "" {
		t.Fatalf("values: Scan: %s", d)
	}
	// Since from the start, the end, and either side of every value: the
	// current values at or above it, in offset order.
	froms := []uint64{0, 1, m.vnext}
	for _, r := range want {
		froms = append(froms, r.Offset, r.Offset+1)
	}
	for _, from := range froms {
		since, err := m.v.Since(from, len(want)+1)
		if err != nil {
			t.Fatalf("values: Since(%d): %v", from, err)
		}
		var exp []storage.Record
		for _, r := range want {
			if r.Offset >= from {
				exp = append(exp, r)
			}
		}
		slices.SortFunc(exp, func(a, b storage.Record) int { return cmpOffset(a.Offset, b.Offset) })
		if d := recordsDiff(exp, since); d != "" {
			t.Fatalf("values: Since(%d): %s", from, d)
		}
	}
}
