package storagetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"saguin.dev/storage"
)

// SubmitCases are the conformance script for ordered submission
// (storage.Submitter): a broker takes a connection's next publish while
// the earlier ones commit, and answers each when it is stored, in the order
// sent. Run runs them after HoldCases.
var SubmitCases = []Case{
	{"SubmitStoresAndAnswersInSubmissionOrder", SubmitInOrder},
	{"SubmitValuesInOrderWhateverTheyReplace", SubmitValuesInOrder},
	{"Invariant18_SubmitAnsweredOnlyOnceStored", SubmitAnsweredOnceStored},
	{"SubmitChannelMaxBytes", SubmitChannelMaxBytes},
	{"Invariant18_SubmitCloseWhilePending", SubmitCloseWhilePending},
}

// answerWait bounds how long a test waits for one answer: a provider that
// never answers fails the test rather than hanging it.
const answerWait = 20 * time.Second

func submitter(t *testing.T, s any) storage.Submitter {
	t.Helper()
	sub, ok := s.(storage.Submitter)
	if !ok {
		t.Fatalf("%T is not a storage.Submitter", s)
	}
	return sub
}

func await(t *testing.T, what string, p storage.Pending) (storage.Record, error) {
	t.Helper()
	select {
	case <-p.Done():
		return p.Result()
	case <-time.After(answerWait):
		t.Fatalf("%s: not answered within %s", what, answerWait)
		return storage.Record{}, nil
	}
}

func answered(p storage.Pending) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}

// checkAnsweredInOrder waits for the last of ps and then finds every
// earlier one answered too; then it checks each answer with check.
func checkAnsweredInOrder(t *testing.T, what string, ps []storage.Pending, check func(i int, r storage.Record, err error)) {
	t.Helper()
	await(t, what+": the last", ps[len(ps)-1])
	for i, p := range ps {
		if !answered(p) {
			t.Fatalf("%s: submission %d of %d is not answered though the last one is: answers out of submission order", what, i+1, len(ps))
		}
		r, err := p.Result()
		check(i, r, err)
	}
}

// SubmitInOrder: records submitted without waiting, to two append logs and
// a queue of one provider in turn, take offsets in the order submitted on
// each, are answered in that order across all three, come back as
// submitted, and survive a restart. A waiting Append made after them is
// stored after them.
func SubmitInOrder(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	a, b, q := h.log("a"), h.log("b"), h.queue("jobs")
	subs := []storage.Submitter{submitter(t, a), submitter(t, b), submitter(t, q)}
	const n = 300
	var ps []storage.Pending
	var sent [3][]storage.Record
	for i := range n {
		k := i % 3
		r := rec(fmt.Sprint("s", i), 1+i%40, Base.Add(time.Duration(i)*time.Millisecond))
		ps = append(ps, subs[k].Submit(r))
		r.Offset = uint64(len(sent[k]) + 1)
		sent[k] = append(sent[k], r)
	}
	checkAnsweredInOrder(t, "submitted records", ps, func(i int, got storage.Record, err error) {
		if err != nil {
			t.Fatalf("submission %d: %v", i, err)
		}
		if d := RecordDiff(sent[i%3][i/3], got); d != "" {
			t.Fatalf("submission %d answered %s", i, d)
		}
	})
	last := mustAppend(t, a, rec("after", 3, Base))
	if last.Offset != uint64(len(sent[0])+1) {
		t.Fatalf("an Append after the submissions stored at %d, want %d", last.Offset, len(sent[0])+1)
	}
	want := append(append([]storage.Record(nil), sent[0]...), last)
	checkLog(t, "a", a, uint64(len(want)+1), 1, want)
	checkLog(t, "b", b, uint64(len(sent[1])+1), 1, sent[1])
	h.restart()
	checkLog(t, "a after restart", h.log("a"), uint64(len(want)+1), 1, want)
	checkLog(t, "b after restart", h.log("b"), uint64(len(sent[1])+1), 1, sent[1])
	items, err := h.queue("jobs").Items(0, n)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]storage.Record, len(items))
	for i := range items {
		got[i] = items[i].Record
	}
	checkRecords(t, "queue after restart", sent[2], got)
}

// SubmitValuesInOrder: puts of one topic submitted without waiting, each
// larger or smaller than the value it replaces, are stored in the order
// submitted — rising offsets, the last one submitted the value left — and
// so are puts of other topics between them. A provider that commits a put
// replacing a larger value on its own (it may use the reserve) must not
// move it after puts submitted later.
func SubmitValuesInOrder(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("state")
	sub := submitter(t, v)
	mustPut(t, v, valueRec("k", 100, "first"))
	sizes := []int{50, 200, 10, 10, 300, 1, 150, 150, 20, 400}
	var ps []storage.Pending
	for round := range 8 {
		for i, n := range sizes {
			ps = append(ps, sub.Submit(valueRec("k", n, fmt.Sprintf("k-%d-%d", round, i))))
			ps = append(ps, sub.Submit(valueRec(fmt.Sprintf("o%d", i%3), n, fmt.Sprintf("o-%d-%d", round, i))))
		}
	}
	var prev uint64
	checkAnsweredInOrder(t, "submitted puts", ps, func(i int, got storage.Record, err error) {
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if got.Offset <= prev {
			t.Fatalf("put %d (%s) stored at offset %d, after a put submitted before it at %d", i, got.MessageID, got.Offset, prev)
		}
		prev = got.Offset
	})
	check := func(what string, v storage.ValueStore) {
		t.Helper()
		got, ok, err := v.Get("k")
		if err != nil || !ok {
			t.Fatalf("%s: Get(k) = %v, %v", what, ok, err)
		}
		if want := fmt.Sprintf("k-7-%d", len(sizes)-1); got.MessageID != want {
			t.Fatalf("%s: k holds %s, want %s (the last put submitted)", what, got.MessageID, want)
		}
		if got.Offset != prev-1 {
			t.Fatalf("%s: k's value is at offset %d, want %d", what, got.Offset, prev-1)
		}
	}
	check("after the puts", v)
	h.restart()
	check("after restart", h.values("state"))
}

func valueRec(topic string, n int, id string) storage.Record {
	r := rec(id, n, Base)
	r.Topic = topic
	return r
}

// SubmitAnsweredOnceStored: a submitted record answered success is
// readable at once, and survives the provider's restart — what the
// provider promises of a record whose Append returned.
func SubmitAnsweredOnceStored(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	sub := submitter(t, l)
	var want []storage.Record
	for i := range 20 {
		r := rec(fmt.Sprint("d", i), 10, Base)
		got, err := await(t, "submission", sub.Submit(r))
		if err != nil {
			t.Fatal(err)
		}
		recs, _, err := l.Read(got.Offset, 1)
		if err != nil || len(recs) != 1 || recs[0].MessageID != r.MessageID {
			t.Fatalf("record %d answered stored at offset %d but not readable there: %v, %v", i, got.Offset, len(recs), err)
		}
		r.Offset = uint64(i + 1)
		want = append(want, r)
	}
	h.restart()
	checkLog(t, "after restart", h.log("events"), uint64(len(want)+1), 1, want)
}

// SubmitChannelMaxBytes: at a channel's max_bytes, submitted records are
// answered ErrFull and take no offset; those before them are stored, and
// one that fits after them still is.
func SubmitChannelMaxBytes(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	sub := submitter(t, l)
	r := rec("m", 100, Base)
	l.SetMaxBytes(3*size(r) + size(r)/2)
	var ps []storage.Pending
	for i := range 5 {
		ps = append(ps, sub.Submit(rec(fmt.Sprint("m", i), 100, Base)))
	}
	small := rec("s", 1, Base)
	ps = append(ps, sub.Submit(small))
	checkAnsweredInOrder(t, "submissions at the bound", ps, func(i int, got storage.Record, err error) {
		switch {
		case i < 3 && (err != nil || got.Offset != uint64(i+1)):
			t.Fatalf("submission %d: offset %d, %v; want stored at %d", i, got.Offset, err, i+1)
		case i >= 3 && i < 5 && !errors.Is(err, storage.ErrFull):
			t.Fatalf("submission %d over max_bytes: %v, want ErrFull", i, err)
		case i == 5 && (err != nil || got.Offset != 4):
			t.Fatalf("a small record after the refused ones: offset %d, %v; want stored at 4", got.Offset, err)
		}
	})
	if l.Next() != 5 {
		t.Fatalf("Next = %d, want 5: a refused record took an offset", l.Next())
	}
}

// SubmitCloseWhilePending: a provider closed while records are submitted
// answers every one of them — none is left waiting — and what it answered
// stored is exactly what it holds after a restart: every record answered
// success, none answered otherwise, and those a prefix of the submissions
// (invariant 18: nothing answered stored is lost; invariant 9: nothing
// refused takes an offset).
func SubmitCloseWhilePending(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	sub := submitter(t, l)
	const n = 2000
	ps := make(chan storage.Pending, n)
	go func() {
		defer close(ps)
		for i := range n {
			ps <- sub.Submit(rec(fmt.Sprint("c", i), 20, Base))
		}
	}()
	// Close once some are in: the rest race it.
	first := <-ps
	if _, err := await(t, "the first submission", first); err != nil {
		t.Fatalf("the first submission, before Close: %v", err)
	}
	if err := h.p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	stored := 1
	refused := false
	i := 1
	for p := range ps {
		got, err := await(t, fmt.Sprintf("submission %d", i), p)
		switch {
		case err == nil && refused:
			t.Fatalf("submission %d stored (offset %d) after an earlier one was refused: not in submission order", i, got.Offset)
		case err == nil:
			if got.Offset != uint64(stored+1) {
				t.Fatalf("submission %d stored at offset %d, want %d", i, got.Offset, stored+1)
			}
			stored++
		case errors.Is(err, storage.ErrClosed):
			refused = true
		default:
			t.Fatalf("submission %d: %v, want stored or ErrClosed", i, err)
		}
		i++
	}
	h.p = h.open(t, h.dir, h.opts)
	l = h.log("events")
	if l.Next() != uint64(stored+1) {
		t.Fatalf("after restart Next = %d; %d submissions were answered stored", l.Next(), stored)
	}
	recs := readAll(t, l)
	for k, r := range recs {
		if want := fmt.Sprint("c", k); r.MessageID != want {
			t.Fatalf("offset %d holds %s, want %s", r.Offset, r.MessageID, want)
		}
	}
}
