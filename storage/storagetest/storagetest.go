// Package storagetest is the conformance suite every storage provider must
// pass: one script drives a provider and compares every answer - offsets,
// records field by field, counters, refusals below the floor, byte bounds,
// positions, and the queue from enqueue to the dead-letter move - across
// restarts (storage/storage.go "Conformance test").
//
// A provider's tests call Run, and Property for the model-based random
// test, with a function that opens the provider on a directory:
//
//	func TestConformance(t *testing.T) { storagetest.Run(t, open) }
//
// The suite restarts a provider by closing it and opening it again on the
// same directory, so open must keep what it is given there (a memory
// provider needs its snapshot directory set to dir).
package storagetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage"
)

// Opts is how the suite wants a provider opened.
type Opts struct {
	// MaxBytes is the provider bound (0: unbounded).
	MaxBytes int64
	// Reserve is the part of MaxBytes only relief operations may use.
	Reserve int64
	// Now is the provider's clock; the suite steps it to judge position
	// expiry at open. Never nil when the suite calls open.
	Now func() time.Time
	// BetweenReleaseHalves, when set, is the provider's fault hook inside
	// a QoS 2 release, between the record's write and the hold's delete
	// (memory and sqlite Faults.BetweenReleaseHalves).
	BetweenReleaseHalves func() error
}

// OpenFunc opens a provider keeping its data in dir. It fails t itself
// when the provider does not open. The suite closes what it opens.
type OpenFunc func(t *testing.T, dir string, o Opts) storage.Provider

// Case is one conformance test.
type Case struct {
	Name string
	Test func(t *testing.T, open OpenFunc)
}

// Cases is the conformance script, in the order Run runs it. The names
// carrying an invariant number are guards of that invariant.
var Cases = []Case{
	{"AppendAndRead", AppendAndRead},
	{"Invariant01_ReadBelowFloorIsRejected", ReadBelowFloorIsRejected},
	{"TrimByAge", TrimByAge},
	{"TrimBySize", TrimBySize},
	{"Invariant09_OffsetsNeverReusedAfterEmptyingAndRestart", OffsetsNeverReused},
	{"ChannelMaxBytes", ChannelMaxBytes},
	{"Invariant02_ProviderBoundRefusesNeverEvictsAndReserveRelieves", ProviderBoundAndReserve},
	{"FirstAtOrAfter", FirstAtOrAfter},
	{"Positions", Positions},
	{"QueueLifecycle", QueueLifecycle},
	{"Invariant08_DeadLetterKeepsMessageID", DeadLetterKeepsMessageID},
	{"Invariant15_AttemptsSurviveRestart", AttemptsSurviveRestart},
	{"SameNameSameStore", SameNameSameStore},
	{"Closed", Closed},
}

// Run runs every case in Cases, ValueCases, HoldCases and SubmitCases as a
// subtest.
func Run(t *testing.T, open OpenFunc) {
	for _, c := range slices.Concat(Cases, ValueCases, HoldCases, SubmitCases) {
		t.Run(c.Name, func(t *testing.T) { c.Test(t, open) })
	}
}

// RunGuards runs, as subtests, only the cases whose names begin with
// "Invariant": the conformance cases that guard an invariant. A provider's
// TestInvariantConformance calls it so that make invariants, which runs the
// TestInvariant* tests, runs and counts them (a subtest named InvariantNN_*
// counts for invariant NN) without running the whole suite.
func RunGuards(t *testing.T, open OpenFunc) {
	for _, c := range slices.Concat(Cases, ValueCases, HoldCases, SubmitCases) {
		if strings.HasPrefix(c.Name, "Invariant") {
			t.Run(c.Name, func(t *testing.T) { c.Test(t, open) })
		}
	}
}

// Base is the moment the suite's clocks start at.
var Base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Clock is a settable clock for tests.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

func NewClock(t time.Time) *Clock { return &Clock{t: t} }

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness holds one provider on one directory and restarts it.
type harness struct {
	t     *testing.T
	open  OpenFunc
	dir   string
	opts  Opts
	clock *Clock
	p     storage.Provider
}

func newHarness(t *testing.T, open OpenFunc, o Opts) *harness {
	t.Helper()
	h := &harness{t: t, open: open, dir: t.TempDir(), opts: o, clock: NewClock(Base)}
	if h.opts.Now == nil {
		h.opts.Now = h.clock.Now
	}
	h.p = open(t, h.dir, h.opts)
	t.Cleanup(func() {
		if h.p != nil {
			if err := h.p.Close(); err != nil {
				t.Errorf("closing provider: %v", err)
			}
		}
	})
	return h
}

// restart closes the provider and opens it again on the same directory.
func (h *harness) restart() {
	h.t.Helper()
	p := h.p
	h.p = nil
	if err := p.Close(); err != nil {
		h.t.Fatalf("close before restart: %v", err)
	}
	h.p = h.open(h.t, h.dir, h.opts)
}

func (h *harness) log(name string) storage.AppendLog {
	h.t.Helper()
	l, err := h.p.Append(name)
	if err != nil {
		h.t.Fatalf("Append(%q): %v", name, err)
	}
	return l
}

// queue opens name with its dead-letter channel name+"__dlq".
func (h *harness) queue(name string) storage.QueueStore {
	h.t.Helper()
	q, err := h.p.Queue(name, name+"__dlq")
	if err != nil {
		h.t.Fatalf("Queue(%q): %v", name, err)
	}
	return q
}

// RecordDiff describes how got differs from want, "" when they are the
// same record. Offsets are compared; times by instant (a zero time only
// equals a zero time); nil and empty byte strings and header lists are the
// same; PayloadFormat and MessageExpiry must agree on being set.
func RecordDiff(want, got storage.Record) string {
	var d []string
	add := func(field string, w, g any) { d = append(d, fmt.Sprintf("%s: want %v, got %v", field, w, g)) }
	if want.Offset != got.Offset {
		add("Offset", want.Offset, got.Offset)
	}
	if want.MessageID != got.MessageID {
		add("MessageID", want.MessageID, got.MessageID)
	}
	if want.Topic != got.Topic {
		add("Topic", want.Topic, got.Topic)
	}
	if !sameTime(want.Timestamp, got.Timestamp) {
		add("Timestamp", want.Timestamp, got.Timestamp)
	}
	if len(want.Headers) != len(got.Headers) || (len(want.Headers) > 0 && !slices.Equal(want.Headers, got.Headers)) {
		add("Headers", want.Headers, got.Headers)
	}
	if !bytes.Equal(want.Payload, got.Payload) {
		add("Payload", fmt.Sprintf("%d bytes %.16x", len(want.Payload), want.Payload), fmt.Sprintf("%d bytes %.16x", len(got.Payload), got.Payload))
	}
	if want.ContentType != got.ContentType {
		add("ContentType", want.ContentType, got.ContentType)
	}
	if want.ResponseTopic != got.ResponseTopic {
		add("ResponseTopic", want.ResponseTopic, got.ResponseTopic)
	}
	if !bytes.Equal(want.CorrelationData, got.CorrelationData) {
		add("CorrelationData", want.CorrelationData, got.CorrelationData)
	}
	if !samePtr(want.PayloadFormat, got.PayloadFormat) {
		add("PayloadFormat", show(want.PayloadFormat), show(got.PayloadFormat))
	}
	if !samePtr(want.MessageExpiry, got.MessageExpiry) {
		add("MessageExpiry", show(want.MessageExpiry), show(got.MessageExpiry))
	}
	if want.Retain != got.Retain {
		add("Retain", want.Retain, got.Retain)
	}
	if want.QoS != got.QoS {
		add("QoS", want.QoS, got.QoS)
	}
	if want.PublisherID != got.PublisherID {
		add("PublisherID", want.PublisherID, got.PublisherID)
	}
	if want.Bridge != got.Bridge {
		add("Bridge", want.Bridge, got.Bridge)
	}
	if len(d) == 0 {
		return ""
	}
	return fmt.Sprintf("record %d: %v", want.Offset, d)
}

// ItemDiff is RecordDiff plus the delivery history a queue item keeps.
func ItemDiff(want, got storage.QueueItem) string {
	d := RecordDiff(want.Record, got.Record)
	if want.Attempts != got.Attempts {
		d += fmt.Sprintf(" Attempts: want %d, got %d", want.Attempts, got.Attempts)
	}
	if !sameTime(want.FirstDelivered, got.FirstDelivered) {
		d += fmt.Sprintf(" FirstDelivered: want %v, got %v", want.FirstDelivered, got.FirstDelivered)
	}
	if !sameTime(want.LastDelivered, got.LastDelivered) {
		d += fmt.Sprintf(" LastDelivered: want %v, got %v", want.LastDelivered, got.LastDelivered)
	}
	return d
}

func sameTime(a, b time.Time) bool { return a.IsZero() == b.IsZero() && a.Equal(b) }

func samePtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func show[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

func ptr[T any](v T) *T { return &v }

// checkRecords fails t unless got is want, record by record.
func checkRecords(t *testing.T, what string, want, got []storage.Record) {
	t.Helper()
	if d := recordsDiff(want, got); d != "" {
		t.Fatalf("%s: %s", what, d)
	}
}

func recordsDiff(want, got []storage.Record) string {
	if len(want) != len(got) {
		return fmt.Sprintf("want %d records (offsets %v), got %d (offsets %v)", len(want), offsets(want), len(got), offsets(got))
	}
	for i := range want {
		if d := RecordDiff(want[i], got[i]); d != "" {
			return d
		}
	}
	return ""
}

func checkItems(t *testing.T, what string, want, got []storage.QueueItem) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s: want %d items, got %d", what, len(want), len(got))
	}
	for i := range want {
		if d := ItemDiff(want[i], got[i]); d != "" {
			t.Fatalf("%s: %s", what, d)
		}
	}
}

func offsets(rs []storage.Record) []uint64 {
	o := make([]uint64, len(rs))
	for i := range rs {
		o[i] = rs[i].Offset
	}
	return o
}

// readAll reads a whole log from its floor, in pages.
func readAll(t *testing.T, l storage.AppendLog) []storage.Record {
	t.Helper()
	var out []storage.Record
	from := l.Floor()
	for {
		page, _, err := l.Read(from, 64)
		if err != nil {
			t.Fatalf("Read(%d): %v", from, err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		from = page[len(page)-1].Offset + 1
	}
}

// checkLog fails t unless the log's counters and records are as given.
func checkLog(t *testing.T, what string, l storage.AppendLog, next, floor uint64, want []storage.Record) {
	t.Helper()
	if got := l.Next(); got != next {
		t.Fatalf("%s: Next() = %d, want %d", what, got, next)
	}
	if got := l.Floor(); got != floor {
		t.Fatalf("%s: Floor() = %d, want %d", what, got, floor)
	}
	checkRecords(t, what, want, readAll(t, l))
	if got, w := l.Bytes(), sizes(want); got != w {
		t.Fatalf("%s: Bytes() = %d, want %d (the sum of Size over held records)", what, got, w)
	}
}

func sizes(rs []storage.Record) (n int64) {
	for i := range rs {
		n += rs[i].Size()
	}
	return n
}

// mustAppend appends and checks the answer is the record at the expected
// offset.
func mustAppend(t *testing.T, l storage.AppendLog, r storage.Record) storage.Record {
	t.Helper()
	want := l.Next()
	got, err := l.Append(r)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	r.Offset = want
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Append returned %s", d)
	}
	return got
}

func mustTrim(t *testing.T, l storage.AppendLog, olderThan time.Time, maxBytes int64, wantRemoved int, wantFreed int64) {
	t.Helper()
	removed, freed, err := l.Trim(olderThan, maxBytes)
	if err != nil {
		t.Fatalf("Trim(%v, %d): %v", olderThan, maxBytes, err)
	}
	if removed != wantRemoved || freed != wantFreed {
		t.Fatalf("Trim(%v, %d) = %d removed, %d freed; want %d, %d", olderThan, maxBytes, removed, freed, wantRemoved, wantFreed)
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want %v", what, err, target)
	}
}

// rec is a small record with a payload of n bytes and timestamp ts.
func rec(id string, n int, ts time.Time) storage.Record {
	return storage.Record{
		MessageID: id,
		Topic:     "t/" + id,
		Timestamp: ts,
		Payload:   bytes.Repeat([]byte{byte(len(id))}, n),
		QoS:       1,
	}
}

func size(r storage.Record) int64 { return r.Size() }
