package storagetest

import (
	"testing"
	"time"

	"saguin.dev/storage"
)

func mustEnqueue(t *testing.T, q storage.QueueStore, r storage.Record) storage.QueueItem {
	t.Helper()
	want := q.Next()
	got, err := q.Enqueue(r)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	r.Offset = want
	if d := RecordDiff(r, got); d != "" {
		t.Fatalf("Enqueue returned %s", d)
	}
	return storage.QueueItem{Record: got}
}

func checkQueue(t *testing.T, what string, q storage.QueueStore, next uint64, want []storage.QueueItem) {
	t.Helper()
	if q.Next() != next {
		t.Fatalf("%s: queue Next() = %d, want %d", what, q.Next(), next)
	}
	if q.Depth() != len(want) {
		t.Fatalf("%s: queue Depth() = %d, want %d", what, q.Depth(), len(want))
	}
	var b int64
	for i := range want {
		b += want[i].Size()
	}
	if q.Bytes() != b {
		t.Fatalf("%s: queue Bytes() = %d, want %d", what, q.Bytes(), b)
	}
	got, err := q.Items(0, len(want)+10)
	if err != nil {
		t.Fatalf("%s: Items: %v", what, err)
	}
	checkItems(t, what, want, got)
	for _, w := range want {
		g, err := q.Get(w.Offset)
		if err != nil {
			t.Fatalf("%s: Get(%d): %v", what, w.Offset, err)
		}
		if d := ItemDiff(w, g); d != "" {
			t.Fatalf("%s: Get(%d): %s", what, w.Offset, d)
		}
	}
}

// QueueLifecycle drives a queue from enqueue through items, attempt
// counts, resolution and the dead-letter move, checking every answer.
func QueueLifecycle(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	q := h.queue("jobs")
	checkQueue(t, "new queue", q, 1, nil)
	if items, err := q.Items(0, 10); err != nil || len(items) != 0 {
		t.Fatalf("Items on a new queue = %d, %v", len(items), err)
	}
	samples := SampleRecords()
	var items []storage.QueueItem
	for _, r := range samples {
		items = append(items, mustEnqueue(t, q, r))
	}
	n := uint64(len(items))
	checkQueue(t, "enqueued", q, n+1, items)

	page, err := q.Items(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkItems(t, "Items(1, 2)", items[1:3], page)
	if page, err := q.Items(n, 10); err != nil || len(page) != 0 {
		t.Fatalf("Items(after the last) = %d, %v", len(page), err)
	}
	if page, err := q.Items(0, 0); err != nil || len(page) != 0 {
		t.Fatalf("Items(0, 0) = %d, %v", len(page), err)
	}

	t1, t2 := Base.Add(time.Second+3), Base.Add(time.Minute)
	got, err := q.CountAttempt(2, t1)
	items[1].Attempts, items[1].FirstDelivered, items[1].LastDelivered = 1, t1, t1
	if err != nil || ItemDiff(items[1], got) != "" {
		t.Fatalf("CountAttempt(2) = %s, %v", ItemDiff(items[1], got), err)
	}
	got, err = q.CountAttempt(2, t2)
	items[1].Attempts, items[1].LastDelivered = 2, t2
	if err != nil || ItemDiff(items[1], got) != "" {
		t.Fatalf("second CountAttempt(2) = %s, %v", ItemDiff(items[1], got), err)
	}
	checkQueue(t, "after attempts", q, n+1, items)

	if err := q.Resolve(1); err != nil {
		t.Fatalf("Resolve(1): %v", err)
	}
	items = items[1:]
	checkQueue(t, "after resolving 1", q, n+1, items)
	wantErr(t, "Resolve(1) twice", q.Resolve(1), storage.ErrNotFound)
	_, err = q.Get(1)
	wantErr(t, "Get of a resolved item", err, storage.ErrNotFound)
	_, err = q.CountAttempt(1, t2)
	wantErr(t, "CountAttempt of a resolved item", err, storage.ErrNotFound)
	_, err = q.Get(n + 1)
	wantErr(t, "Get past the end", err, storage.ErrNotFound)

	// Resolve from the middle, then page across the hole.
	if err := q.Resolve(4); err != nil {
		t.Fatal(err)
	}
	items = append(items[:2:2], items[3:]...)
	checkQueue(t, "after resolving 4", q, n+1, items)
	page, err = q.Items(2, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkItems(t, "Items(2, 2) across a resolved item", items[1:3], page)

	d := q.DeadLetters()
	at := Base.Add(time.Hour)
	moved, err := q.DeadLetter(2, "jobs/__dlq/d1", []storage.Header{{Name: "saguin-dlq-reason", Value: "attempts_exhausted"}}, at)
	if err != nil {
		t.Fatalf("DeadLetter(2): %v", err)
	}
	if moved.Offset != 1 || moved.MessageID != items[0].MessageID {
		t.Fatalf("DeadLetter(2) = offset %d id %q; want 1, %q", moved.Offset, moved.MessageID, items[0].MessageID)
	}
	items = items[1:]
	checkQueue(t, "after the move", q, n+1, items)
	if d.Next() != 2 {
		t.Fatalf("dead-letter Next = %d, want 2", d.Next())
	}
	_, err = q.DeadLetter(2, "jobs/__dlq/d1", nil, at)
	wantErr(t, "DeadLetter of a moved item", err, storage.ErrNotFound)
	_, err = q.DeadLetter(99, "jobs/__dlq", nil, at)
	wantErr(t, "DeadLetter of an unknown offset", err, storage.ErrNotFound)
	if d.Next() != 2 {
		t.Fatalf("a refused move consumed a dead-letter offset: Next = %d, want 2", d.Next())
	}

	h.restart()
	q = h.queue("jobs")
	checkQueue(t, "after restart", q, n+1, items)
	if r := mustEnqueue(t, q, rec("late", 5, Base)); r.Offset != n+1 {
		t.Fatalf("enqueue after restart took offset %d, want %d", r.Offset, n+1)
	}
}

// DeadLetterKeepsMessageID guards invariant 8: the dead-lettered record is
// the same message - same Message ID, payload and properties - at a new
// offset in the dead-letter log, with the given topic, its own headers
// followed by the extra ones, and the move's moment as its timestamp.
func DeadLetterKeepsMessageID(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	q := h.queue("jobs")
	mustEnqueue(t, q, rec("filler", 1, Base))
	orig := mustEnqueue(t, q, SampleRecords()[0]).Record
	if _, err := q.CountAttempt(2, Base.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	extra := []storage.Header{
		{Name: "saguin-dlq-channel", Value: "jobs"}, {Name: "saguin-dlq-offset", Value: "2"}, {Name: "saguin-dlq-attempts", Value: "1"},
		{Name: "b", Value: "dup"}, {Name: "saguin-dlq-reason", Value: "expired"},
	}
	at := Base.Add(time.Hour + 5)
	got, err := q.DeadLetter(2, "devices/__dlq/d1/temp", extra, at)
	if err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	want := orig
	want.Offset = 1
	want.Topic = "devices/__dlq/d1/temp"
	want.Headers = append(append([]storage.Header(nil), orig.Headers...), extra...)
	want.Timestamp = at
	if d := RecordDiff(want, got); d != "" {
		t.Fatalf("DeadLetter returned %s", d)
	}
	checkLog(t, "dead-letter log", q.DeadLetters(), 2, 1, []storage.Record{want})
	// A second move lands at the next dead-letter offset, same identity rule.
	got2, err := q.DeadLetter(1, "jobs/__dlq/filler", nil, at)
	if err != nil || got2.Offset != 2 || got2.MessageID != "filler" {
		t.Fatalf("second DeadLetter = offset %d id %q, %v; want 2, filler", got2.Offset, got2.MessageID, err)
	}
	h.restart()
	d := h.queue("jobs").DeadLetters()
	recs := readAll(t, d)
	if len(recs) != 2 {
		t.Fatalf("dead-letter log after restart holds %d records, want 2", len(recs))
	}
	if diff := RecordDiff(want, recs[0]); diff != "" {
		t.Fatalf("dead-letter record after restart: %s", diff)
	}
}

// AttemptsSurviveRestart guards the half of invariant 15 storage keeps:
// after a restart every unresolved item is back with its attempt count and
// first and last delivery times, so an exhausted record is still
// dead-lettered rather than starting over; nothing else about a delivery
// was stored to come back.
func AttemptsSurviveRestart(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	q := h.queue("jobs")
	var items []storage.QueueItem
	for _, r := range SampleRecords()[:3] {
		items = append(items, mustEnqueue(t, q, r))
	}
	for i, n := range []int{3, 1, 0} {
		for k := range n {
			at := Base.Add(time.Duration(10*i+k) * time.Second)
			it, err := q.CountAttempt(items[i].Offset, at)
			if err != nil {
				t.Fatal(err)
			}
			items[i] = it
		}
	}
	for range 2 {
		h.restart()
		q = h.queue("jobs")
		checkQueue(t, "after restart", q, 4, items)
	}
	if items[0].Attempts != 3 || !items[0].FirstDelivered.Equal(Base) || !items[0].LastDelivered.Equal(Base.Add(2*time.Second)) {
		t.Fatalf("attempt history not as counted: %+v", items[0])
	}
	it, err := q.CountAttempt(1, Base.Add(time.Minute))
	if err != nil || it.Attempts != 4 || !it.FirstDelivered.Equal(Base) {
		t.Fatalf("CountAttempt after restart = %d attempts, first %v, %v; want 4, %v", it.Attempts, it.FirstDelivered, err, Base)
	}
}
