package storagetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage"
)

// ValueCases are the value-store part of the script (storage.ValueStore):
// the retained store now, latest channels later. Run runs them after Cases.
var ValueCases = []Case{
	{"ValuesPutGetScanAndRestart", ValuesPutGetScanAndRestart},
	{"Invariant09_ValueOffsetsNeverReusedAfterReplaceRemoveAndRestart", ValueOffsetsNeverReused},
	{"ValuesScanOrderAndPaging", ValuesScanOrderAndPaging},
	{"Invariant02_ValuesRefusedAtProviderBoundNeverEvicted", ValuesProviderBound},
	{"ValuesConcurrentPutsKeepTheLastOffset", ValuesConcurrentPuts},
	{"ValuesNameIsOneKind", ValuesNameIsOneKind},
	{"ValuesClosed", ValuesClosed},
	{"ValuesSinceInOffsetOrder", ValuesSinceInOffsetOrder},
	{"ValuesRemoveIfOnlyTheValueAtThatOffset", ValuesRemoveIf},
	{"Invariant09_ValuesEmptyPayloadIsAValueWithItsOwnOffset", ValuesEmptyPayload},
}

func (h *harness) values(name string) storage.ValueStore {
	h.t.Helper()
	v, err := h.p.Values(name)
	if err != nil {
		h.t.Fatalf("Values(%q): %v", name, err)
	}
	return v
}

// mustPut puts r and checks the answer is r at the store's next offset.
func mustPut(t *testing.T, v storage.ValueStore, r storage.Record) storage.Record {
	t.Helper()
	want := v.Next()
	got, err := v.Put(r)
	if err != nil {
		t.Fatalf("Put(%q): %v", r.Topic, err)
	}
	r.Offset = want
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Put(%q) returned %s", r.Topic, d)
	}
	if v.Next() != want+1 {
		t.Fatalf("Put(%q) took offset %d but Next is now %d, want %d", r.Topic, got.Offset, v.Next(), want+1)
	}
	return got
}

// scanAll collects every value Scan passes.
func scanAll(t *testing.T, v storage.ValueStore) []storage.Record {
	t.Helper()
	var out []storage.Record
	if err := v.Scan(func(r storage.Record) bool { out = append(out, r); return true }); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}

// checkValues fails t unless the store holds exactly want (any order) with
// the given next: Scan in byte-wise topic order, Get of each, Len, Bytes.
func checkValues(t *testing.T, what string, v storage.ValueStore, next uint64, want []storage.Record) {
	t.Helper()
	want = slices.Clone(want)
	slices.SortFunc(want, func(a, b storage.Record) int { return strings.Compare(a.Topic, b.Topic) })
	if got := v.Next(); got != next {
		t.Fatalf("%s: Next() = %d, want %d", what, got, next)
	}
	if got := v.Len(); got != len(want) {
		t.Fatalf("%s: Len() = %d, want %d", what, got, len(want))
	}
	if got, w := v.Bytes(), sizes(want); got != w {
		t.Fatalf("%s: Bytes() = %d, want %d (the sum of Size over held values)", what, got, w)
	}
	got := scanAll(t, v)
	if len(got) != len(want) {
		t.Fatalf("%s: Scan passed %d values (topics %v), want %d (topics %v)", what, len(got), topics(got), len(want), topics(want))
	}
	for i := range want {
		if d := RecordDiff(want[i], got[i]); d != "" {
			t.Fatalf("%s: Scan value %d (topic order): %s", what, i, d)
		}
	}
	for _, w := range want {
		g, ok, err := v.Get(w.Topic)
		if err != nil || !ok {
			t.Fatalf("%s: Get(%q) = %v, %v; want the value", what, w.Topic, ok, err)
		}
		if d := RecordDiff(w, g); d != "" {
			t.Fatalf("%s: Get(%q): %s", what, w.Topic, d)
		}
	}
}

func topics(rs []storage.Record) []string {
	out := make([]string, len(rs))
	for i := range rs {
		out[i] = rs[i].Topic
	}
	return out
}

// ValuesPutGetScanAndRestart: a new store is empty at next 1; every field
// of every sample record comes back from Put, Get and Scan, before and
// after a restart; the store keeps its own copy of what it is given; a
// topic nobody put is absent; a value without a topic is refused and takes
// no offset.
func ValuesPutGetScanAndRestart(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("retained")
	checkValues(t, "new store", v, 1, nil)
	if _, ok, err := v.Get("devices/d1/temp"); ok || err != nil {
		t.Fatalf("Get on a new store = %v, %v; want absent", ok, err)
	}

	samples := SampleRecords()
	for i, r := range samples {
		if got := mustPut(t, v, r); got.Offset != uint64(i+1) {
			t.Fatalf("value %d stored at offset %d", i+1, got.Offset)
		}
	}
	// The caller may reuse its buffers once Put returns.
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
	checkValues(t, "after puts", v, n+1, want)
	if _, ok, err := v.Get("devices"); ok || err != nil {
		t.Fatalf("Get of a prefix nobody put = %v, %v; want absent", ok, err)
	}

	_, err := v.Put(storage.Record{MessageID: "no-topic", Payload: []byte("x")})
	if err == nil || errors.Is(err, storage.ErrFull) {
		t.Fatalf("Put without a topic: %v; want a refusal that is not ErrFull", err)
	}
	checkValues(t, "after the refused put", v, n+1, want)

	h.restart()
	v = h.values("retained")
	checkValues(t, "after restart", v, n+1, want)
	after := mustPut(t, v, rec("after", 3, Base))
	checkValues(t, "put after restart", v, n+2, append(want, after))
}

// ValueOffsetsNeverReused guards invariant 9 on a value store: a replace
// takes a new offset (even with the same content), Remove hands no offset
// back, and a store emptied by removal keeps its next across restarts, so
// the next Put takes the offset after the last ever used.
func ValueOffsetsNeverReused(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("retained")
	mustPut(t, v, rec("a", 10, Base))
	b := mustPut(t, v, rec("b", 20, Base))
	c := mustPut(t, v, rec("c", 30, Base))
	a2 := mustPut(t, v, rec("a", 40, Base))
	if a2.Offset != 4 {
		t.Fatalf("replacing a took offset %d, want 4", a2.Offset)
	}
	checkValues(t, "after replacing a", v, 5, []storage.Record{a2, b, c})

	if ok, err := v.Remove("t/b"); !ok || err != nil {
		t.Fatalf("Remove(t/b) = %v, %v; want true", ok, err)
	}
	if ok, err := v.Remove("t/b"); ok || err != nil {
		t.Fatalf("Remove(t/b) twice = %v, %v; want false", ok, err)
	}
	if ok, err := v.Remove("t/never"); ok || err != nil {
		t.Fatalf("Remove of a topic never put = %v, %v; want false", ok, err)
	}
	checkValues(t, "after removing b", v, 5, []storage.Record{a2, c})
	same := mustPut(t, v, rec("a", 40, Base)) // identical content: still a new offset
	if same.Offset != 5 {
		t.Fatalf("putting a's value again took offset %d, want 5", same.Offset)
	}
	checkValues(t, "after putting a again", v, 6, []storage.Record{same, c})

	h.restart()
	v = h.values("retained")
	checkValues(t, "after restart", v, 6, []storage.Record{same, c})
	for _, topic := range []string{"t/a", "t/c"} {
		if ok, err := v.Remove(topic); !ok || err != nil {
			t.Fatalf("Remove(%s) = %v, %v", topic, ok, err)
		}
	}
	checkValues(t, "emptied", v, 6, nil)
	for round := range 2 { // a second restart with nothing written in between
		h.restart()
		v = h.values("retained")
		checkValues(t, fmt.Sprintf("restart %d of the emptied store", round+1), v, 6, nil)
	}
	if r := mustPut(t, v, rec("b", 20, Base)); r.Offset != 6 {
		t.Fatalf("put after emptying and restarting took offset %d, want 6 (offsets 1 to 5 were used)", r.Offset)
	}
}

// ValuesScanOrderAndPaging: Scan passes values in byte-wise topic order
// (prefixes first, upper case before lower, multi-byte UTF-8 after ASCII),
// stops the moment fn returns false, walks stores longer than any page a
// provider reads at once, skips removed topics, and lets fn call the store.
func ValuesScanOrderAndPaging(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("retained")
	if err := v.Scan(func(storage.Record) bool { t.Fatal("Scan of an empty store called fn"); return false }); err != nil {
		t.Fatalf("Scan of an empty store: %v", err)
	}
	odd := []string{"b", "a/b", "a", "a/", "ab", "a/b/c", "Z", "é", "e", "a b", "~", "a/b/", "$SYS/x", "ß", "a\x00"}
	var want []storage.Record
	for i, topic := range odd {
		r := rec(fmt.Sprint("o", i), i, Base)
		r.Topic = topic
		want = append(want, mustPut(t, v, r))
	}
	checkValues(t, "odd topics", v, uint64(len(odd)+1), want)
	sorted := slices.Clone(odd)
	slices.Sort(sorted)
	if got := topics(scanAll(t, v)); !slices.Equal(got, sorted) {
		t.Fatalf("Scan order %q, want byte order %q", got, sorted)
	}

	calls := 0
	if err := v.Scan(func(storage.Record) bool { calls++; return calls < 3 }); err != nil || calls != 3 {
		t.Fatalf("Scan stopping at the third value called fn %d times, %v; want 3", calls, err)
	}

	// More values than one page (256 in both providers), put in reverse
	// order.
	const many = 300
	for i := many - 1; i >= 0; i-- {
		r := rec(fmt.Sprint("p", i), 1, Base)
		r.Topic = fmt.Sprintf("page/%04d", i)
		want = append(want, mustPut(t, v, r))
	}
	checkValues(t, "many topics", v, uint64(len(want)+1), want)
	calls = 0
	if err := v.Scan(func(storage.Record) bool { calls++; return calls < 280 }); err != nil || calls != 280 {
		t.Fatalf("Scan stopping at the 280th value (on the second page) called fn %d times, %v; want 280", calls, err)
	}

	// Remove every other page topic; the scan skips them.
	kept := want[:0:0]
	for _, r := range want {
		var i int
		if _, err := fmt.Sscanf(r.Topic, "page/%04d", &i); err == nil && i%2 == 1 {
			if ok, err := v.Remove(r.Topic); !ok || err != nil {
				t.Fatalf("Remove(%s) = %v, %v", r.Topic, ok, err)
			}
			continue
		}
		kept = append(kept, r)
	}
	checkValues(t, "after removing odd pages", v, uint64(len(want)+1), kept)

	// fn may call the store: nothing is held while it runs.
	seen := 0
	err := v.Scan(func(r storage.Record) bool {
		g, ok, err := v.Get(r.Topic)
		if err != nil || !ok || g.Offset != r.Offset {
			t.Errorf("Get(%q) inside Scan = offset %d, %v, %v; want %d", r.Topic, g.Offset, ok, err, r.Offset)
			return false
		}
		seen++
		if seen == 1 {
			if _, err := v.Put(storage.Record{MessageID: "inside", Topic: "page/9999", Payload: []byte("x")}); err != nil {
				t.Errorf("Put inside Scan: %v", err)
				return false
			}
		}
		return true
	})
	if err != nil || seen < len(kept) {
		t.Fatalf("Scan calling the store saw %d values, %v; want at least %d", seen, err, len(kept))
	}
	h.restart()
	v = h.values("retained")
	if v.Len() != len(kept)+1 || v.Next() != uint64(len(want)+2) {
		t.Fatalf("after restart Len %d, Next %d; want %d, %d", v.Len(), v.Next(), len(kept)+1, len(want)+2)
	}
}

// ValuesProviderBound guards invariant 2 on a value store: once Puts reach
// the provider's max_bytes less the reserve, a Put of a new topic is
// refused with ErrFull, takes no offset and evicts nothing; a Put
// replacing a value at least as large is never refused; Remove is never
// refused; relief stays within max_bytes; and room made by removal admits
// Puts again.
func ValuesProviderBound(t *testing.T, open OpenFunc) {
	const maxBytes, reserve = 256 << 10, 16 << 10
	h := newHarness(t, open, Opts{MaxBytes: maxBytes, Reserve: reserve})
	v := h.values("retained")
	val := func(i, n int) storage.Record {
		r := rec(fmt.Sprint("v", i), n, Base)
		r.Topic = fmt.Sprintf("v/%05d", i)
		return r
	}
	var held []storage.Record
	for i := 0; ; i++ {
		if i > 10*maxBytes/1024 {
			t.Fatalf("provider never refused: %d values of 1 KiB under max_bytes %d", i, maxBytes)
		}
		next, n := v.Next(), v.Len()
		got, err := v.Put(val(i, 1024))
		if errors.Is(err, storage.ErrFull) {
			if v.Next() != next || v.Len() != n {
				t.Fatalf("a refused Put moved Next %d -> %d, Len %d -> %d", next, v.Next(), n, v.Len())
			}
			if _, ok, err := v.Get(val(i, 0).Topic); ok || err != nil {
				t.Fatalf("the refused value is readable: %v, %v", ok, err)
			}
			break
		}
		if err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
		held = append(held, got)
	}
	if len(held) == 0 {
		t.Fatal("the first Put was refused")
	}
	next := v.Next()
	checkValues(t, "after the refusal: nothing evicted", v, next, held)

	// Replacing with a smaller or an equal value frees what it takes.
	smaller := mustPut(t, v, val(0, 512))
	held[0] = smaller
	equal := mustPut(t, v, val(1, 1024))
	held[1] = equal
	if ok, err := v.Remove(held[2].Topic); !ok || err != nil {
		t.Fatalf("Remove with the provider full = %v, %v", ok, err)
	}
	held = slices.Delete(held, 2, 3)
	checkValues(t, "after replacing and removing at the bound", v, next+2, held)
	if b := h.p.Bytes(); b > maxBytes {
		t.Fatalf("provider Bytes() = %d over max_bytes %d", b, maxBytes)
	}

	// Removal makes room; Puts are admitted again.
	for _, r := range held {
		if ok, err := v.Remove(r.Topic); !ok || err != nil {
			t.Fatalf("Remove(%s) = %v, %v", r.Topic, ok, err)
		}
	}
	again := mustPut(t, v, val(1<<16, 1024))
	checkValues(t, "after emptying", v, next+3, []storage.Record{again})
}

// ValuesConcurrentPuts: Puts from many goroutines to overlapping topics,
// with values growing and shrinking, take distinct consecutive offsets,
// and each topic ends with the value of its highest-offset Put (the last
// committed), with Len and Bytes to match.
func ValuesConcurrentPuts(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("retained")
	const writers, each, topicCount = 6, 40, 5
	var mu sync.Mutex
	var all []storage.Record
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				r := rec(fmt.Sprint("w", w, "-", i), (w*7+i*13)%97, Base)
				r.Topic = fmt.Sprint("c/", (w+i)%topicCount)
				got, err := v.Put(r)
				if err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				r.Offset = got.Offset
				if d := RecordDiff(r, got); d != "" {
					t.Errorf("Put returned %s", d)
				}
				mu.Lock()
				all = append(all, got)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.SortFunc(all, func(a, b storage.Record) int { return cmpOffset(a.Offset, b.Offset) })
	for i, r := range all {
		if r.Offset != uint64(i+1) {
			t.Fatalf("offsets are not 1..%d without gaps or repeats: position %d holds %d", len(all), i, r.Offset)
		}
	}
	last := map[string]storage.Record{}
	for _, r := range all {
		last[r.Topic] = r // ascending offsets: the last one wins
	}
	var want []storage.Record
	for _, r := range last {
		want = append(want, r)
	}
	checkValues(t, "after concurrent puts", v, uint64(len(all)+1), want)
	h.restart()
	checkValues(t, "after restart", h.values("retained"), uint64(len(all)+1), want)
}

func cmpOffset(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ValuesNameIsOneKind: asking twice for a value store returns the same
// store (one counter), and a name is one kind for good: a value store's
// name is refused as an append channel, a queue or a dead-letter channel,
// and a channel's name is refused as a value store, both while open and
// after a restart (when the wrong kind is asked for first).
func ValuesNameIsOneKind(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	a, b := h.values("retained"), h.values("retained")
	if a != b {
		t.Fatal("Values(retained) twice returned two stores")
	}
	put := mustPut(t, a, rec("s", 1, Base))
	if b.Next() != 2 || b.Len() != 1 {
		t.Fatalf("second handle sees Next %d, Len %d; want 2, 1", b.Next(), b.Len())
	}
	other := h.values("latest/other")
	if other == a || other.Len() != 0 || other.Next() != 1 {
		t.Fatal("a second value store shares the first one's values or counter")
	}
	l := h.log("events")
	mustAppend(t, l, rec("e", 1, Base))
	h.queue("jobs")

	refusals := func(when string) {
		t.Helper()
		for what, err := range map[string]error{
			"Append(retained)":                    second(h.p.Append("retained")),
			"Queue(retained, retained__dlq)":      second(h.p.Queue("retained", "retained__dlq")),
			"Queue(q2, retained) as dead letters": second(h.p.Queue("q2", "retained")),
			"Values(events)":                      second(h.p.Values("events")),
			"Values(jobs)":                        second(h.p.Values("jobs")),
			"Values(jobs__dlq)":                   second(h.p.Values("jobs__dlq")),
		} {
			if err == nil {
				t.Fatalf("%s: %s was accepted; a name is one kind", when, what)
			}
		}
	}
	refusals("while open")
	h.restart()
	refusals("after restart, wrong kind asked first")
	checkValues(t, "value store after the refusals", h.values("retained"), 2, []storage.Record{put})
	checkLog(t, "append channel after the refusals", h.log("events"), 2, 1, []storage.Record{func() storage.Record {
		r := rec("e", 1, Base)
		r.Offset = 1
		return r
	}()})
}

func second[T any](_ T, err error) error { return err }

// ValuesClosed: after Close nothing is stored and every call says why;
// what was stored before is there at the next open.
func ValuesClosed(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("retained")
	stored := mustPut(t, v, rec("c", 1, Base))
	if err := h.p.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := v.Put(rec("d", 1, Base))
	wantErr(t, "Put after Close", err, storage.ErrClosed)
	_, err = v.Remove(stored.Topic)
	wantErr(t, "Remove after Close", err, storage.ErrClosed)
	_, _, err = v.Get(stored.Topic)
	wantErr(t, "Get after Close", err, storage.ErrClosed)
	err = v.Scan(func(storage.Record) bool { return true })
	wantErr(t, "Scan after Close", err, storage.ErrClosed)
	_, err = v.Since(1, 10)
	wantErr(t, "Since after Close", err, storage.ErrClosed)
	_, err = v.RemoveIf(stored.Topic, stored.Offset)
	wantErr(t, "RemoveIf after Close", err, storage.ErrClosed)
	_, err = h.p.Values("retained")
	wantErr(t, "Provider.Values after Close", err, storage.ErrClosed)
	h.p = h.open(t, h.dir, h.opts)
	checkValues(t, "reopened", h.values("retained"), 2, []storage.Record{stored})
}

// sinceAll reads the whole store from offset from with Since, in pages of
// page values, going on from the last offset each page returned.
func sinceAll(t *testing.T, v storage.ValueStore, from uint64, page int) []storage.Record {
	t.Helper()
	var out []storage.Record
	for calls := 0; ; calls++ {
		if calls > 100000 {
			t.Fatal("Since never ran out of values")
		}
		got, err := v.Since(from, page)
		if err != nil {
			t.Fatalf("Since(%d, %d): %v", from, page, err)
		}
		if len(got) > page {
			t.Fatalf("Since(%d, %d) returned %d values", from, page, len(got))
		}
		out = append(out, got...)
		if len(got) < page {
			return out
		}
		from = got[len(got)-1].Offset + 1
	}
}

// byOffset is want sorted by offset, keeping those at or above from.
func byOffset(want []storage.Record, from uint64) []storage.Record {
	out := make([]storage.Record, 0, len(want))
	for _, r := range want {
		if r.Offset >= from {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b storage.Record) int { return cmpOffset(a.Offset, b.Offset) })
	return out
}

// ValuesSinceInOffsetOrder: Since passes the current values at or above an
// offset in offset order — never a replaced value, always its replacement
// — in pages that go on from the last offset returned; it is empty at
// Next, reads the same after a restart, and a reader that goes on from
// where it stopped sees exactly the values put (and still current) since.
func ValuesSinceInOffsetOrder(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("latest/state")
	if got, err := v.Since(1, 10); err != nil || len(got) != 0 {
		t.Fatalf("Since on an empty store = %d values, %v", len(got), err)
	}
	cur := map[string]storage.Record{}
	put := func(id string, n int) storage.Record {
		r := mustPut(t, v, rec(id, n, Base))
		cur[r.Topic] = r
		return r
	}
	for i := range 300 { // more than a provider's page
		put(fmt.Sprintf("k%03d", i%120), i%17+1)
	}
	current := func() []storage.Record {
		out := make([]storage.Record, 0, len(cur))
		for _, r := range cur {
			out = append(out, r)
		}
		return out
	}
	for _, from := range []uint64{0, 1, 150, 181, 250, 300, 301} {
		for _, page := range []int{1, 7, 256, 1000} {
			if d := recordsDiff(byOffset(current(), from), sinceAll(t, v, from, page)); d != "" {
				t.Fatalf("Since from %d in pages of %d: %s", from, page, d)
			}
		}
	}
	if got, err := v.Since(v.Next(), 10); err != nil || len(got) != 0 {
		t.Fatalf("Since(Next) = %d values, %v; want none", len(got), err)
	}

	// A reader caught up at mark sees what changed since, once each.
	mark := v.Next()
	put("k005", 3)
	put("k006", 3)
	put("k005", 4) // replaces the first: only this one is read
	if ok, err := v.Remove("t/k007"); !ok || err != nil {
		t.Fatalf("Remove(t/k007) = %v, %v", ok, err)
	}
	delete(cur, "t/k007")
	got := sinceAll(t, v, mark, 256)
	if len(got) != 2 || got[0].Topic != "t/k006" || got[1].Topic != "t/k005" || got[1].Offset != mark+2 {
		t.Fatalf("changes since %d: %v (offsets %v); want t/k006 then t/k005 at %d", mark, topics(got), offsets(got), mark+2)
	}
	// Removing values (replaced ones too) leaves nothing behind in the
	// order Since walks: remove most of the store and read it again.
	for i := range 110 {
		topic := fmt.Sprintf("t/k%03d", i)
		if _, ok := cur[topic]; !ok {
			continue
		}
		if ok, err := v.Remove(topic); !ok || err != nil {
			t.Fatalf("Remove(%s) = %v, %v", topic, ok, err)
		}
		delete(cur, topic)
	}
	if d := recordsDiff(byOffset(current(), 1), sinceAll(t, v, 1, 3)); d != "" {
		t.Fatalf("Since after removing most values: %s", d)
	}
	h.restart()
	v = h.values("latest/state")
	if d := recordsDiff(byOffset(current(), 1), sinceAll(t, v, 1, 5)); d != "" {
		t.Fatalf("Since after restart: %s", d)
	}
	after := put("after", 2)
	if got := sinceAll(t, v, after.Offset, 10); len(got) != 1 || got[0].Offset != after.Offset {
		t.Fatalf("Since(%d) after restart: offsets %v", after.Offset, offsets(got))
	}
}

// ValuesRemoveIf: RemoveIf removes a topic's value only while it is the one
// at the offset given; a value put in its place since stays, with Len,
// Bytes and Next untouched; the right offset removes it once.
func ValuesRemoveIf(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("latest/state")
	old := mustPut(t, v, rec("a", 10, Base))
	b := mustPut(t, v, rec("b", 20, Base))
	newer := mustPut(t, v, rec("a", 30, Base))
	if ok, err := v.RemoveIf(old.Topic, old.Offset); ok || err != nil {
		t.Fatalf("RemoveIf of a replaced value = %v, %v; want false", ok, err)
	}
	if ok, err := v.RemoveIf("t/never", 1); ok || err != nil {
		t.Fatalf("RemoveIf of a topic never put = %v, %v; want false", ok, err)
	}
	checkValues(t, "after stale RemoveIf", v, 4, []storage.Record{newer, b})
	if ok, err := v.RemoveIf(newer.Topic, newer.Offset); !ok || err != nil {
		t.Fatalf("RemoveIf of the current value = %v, %v; want true", ok, err)
	}
	if ok, err := v.RemoveIf(newer.Topic, newer.Offset); ok || err != nil {
		t.Fatalf("RemoveIf twice = %v, %v; want false", ok, err)
	}
	checkValues(t, "after RemoveIf", v, 4, []storage.Record{b})
	h.restart()
	v = h.values("latest/state")
	checkValues(t, "after restart", v, 4, []storage.Record{b})
	if r := mustPut(t, v, rec("a", 1, Base)); r.Offset != 4 {
		t.Fatalf("put after RemoveIf took offset %d, want 4", r.Offset)
	}
}

// ValuesEmptyPayload: a value with an empty payload (a latest channel's
// tombstone) is stored like any other — its own offset, readable by Get,
// Scan and Since, replacing the value before it — and comes back after a
// restart with its empty payload.
func ValuesEmptyPayload(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	v := h.values("latest/state")
	val := mustPut(t, v, rec("a", 10, Base))
	tomb := rec("a", 0, Base.Add(time.Second))
	tomb.Payload = nil
	gone := mustPut(t, v, tomb)
	if gone.Offset != val.Offset+1 || len(gone.Payload) != 0 {
		t.Fatalf("tombstone stored at %d with %d payload bytes", gone.Offset, len(gone.Payload))
	}
	checkValues(t, "tombstone", v, 3, []storage.Record{gone})
	if got := sinceAll(t, v, 1, 10); len(got) != 1 || got[0].Offset != 2 || len(got[0].Payload) != 0 {
		t.Fatalf("Since passes %v", offsets(got))
	}
	h.restart()
	v = h.values("latest/state")
	checkValues(t, "tombstone after restart", v, 3, []storage.Record{gone})
}
