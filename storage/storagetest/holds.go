package storagetest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"saguin.dev/storage"
)

// HoldCases are the conformance script for held QoS 2 publishes (rfcs/qos2-holds.md): a hold takes no offset and is invisible until released; a release
// is one atomic write at the next offset; the channel's own bound may
// refuse a release, the provider's may not.
var HoldCases = []Case{
	{"Invariant01_HeldPublishTakesNoOffsetUntilReleased", HeldPublishTakesNoOffsetUntilReleased},
	{"HoldReleaseIntoEveryKind", HoldReleaseIntoEveryKind},
	{"HoldChannelMaxBytes", HoldChannelMaxBytes},
	{"HoldProviderBoundAndReserve", HoldProviderBoundAndReserve},
	{"HoldReleaseIsAtomic", HoldReleaseIsAtomic},
	{"HoldReleaseAtStampsTheRecord", HoldReleaseAtStampsTheRecord},
}

// HoldReleaseAtStampsTheRecord: a release may stamp the record with the
// moment it is written (the broadcast log's timestamps rise with its
// offsets), and that stamp is what is stored and read back, across a
// restart too; everything else of the record is as held.
func HoldReleaseAtStampsTheRecord(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	hs := holdStore(t, h.p)
	sample := SampleRecords()[0]
	mustHold(t, hs, held("events", "pub", 3, sample))
	at := Base.Add(90 * time.Minute)
	got, err := hs.ReleaseAt("events", "pub", 3, at)
	if err != nil {
		t.Fatalf("ReleaseAt: %v", err)
	}
	want := sample
	want.Offset, want.Timestamp = 1, at
	if d := RecordDiff(want, got); d != "" {
		t.Fatalf("released record: %s", d)
	}
	h.restart()
	l = h.log("events")
	recs := readAll(t, l)
	if len(recs) != 1 {
		t.Fatalf("%d records after restart, want 1", len(recs))
	}
	if d := RecordDiff(want, recs[0]); d != "" {
		t.Fatalf("stored record: %s", d)
	}
}

func holdStore(t *testing.T, p storage.Provider) storage.HoldStore {
	t.Helper()
	hs, ok := p.(storage.HoldStore)
	if !ok {
		t.Fatalf("provider %T does not keep held publishes (storage.HoldStore)", p)
	}
	return hs
}

func held(channel, client string, pid uint16, r storage.Record) storage.Held {
	return storage.Held{Channel: channel, ClientID: client, PacketID: pid, HeldAt: Base.Add(time.Duration(pid) * time.Second), Record: r}
}

func checkHolds(t *testing.T, what string, hs storage.HoldStore, want []storage.Held) {
	t.Helper()
	got, err := hs.Holds()
	if err != nil {
		t.Fatalf("%s: Holds: %v", what, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d holds, want %d: %+v", what, len(got), len(want), got)
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.Channel != g.Channel || w.ClientID != g.ClientID || w.PacketID != g.PacketID || !sameTime(w.HeldAt, g.HeldAt) {
			t.Fatalf("%s: hold %d is %s/%s/%d at %v, want %s/%s/%d at %v", what, i,
				g.Channel, g.ClientID, g.PacketID, g.HeldAt, w.Channel, w.ClientID, w.PacketID, w.HeldAt)
		}
		if d := RecordDiff(w.Record, g.Record); d != "" {
			t.Fatalf("%s: hold %d record: %s", what, i, d)
		}
	}
}

func mustHold(t *testing.T, hs storage.HoldStore, h storage.Held) {
	t.Helper()
	if err := hs.Hold(h); err != nil {
		t.Fatalf("Hold(%s, %s, %d): %v", h.Channel, h.ClientID, h.PacketID, err)
	}
}

// HeldPublishTakesNoOffsetUntilReleased: between hold and release the
// message is no record — no offset, not read, not trimmed, not counted in
// the channel's bytes — and survives a restart as a hold. The release
// writes it at the channel's next offset then, once.
func HeldPublishTakesNoOffsetUntilReleased(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	hs := holdStore(t, h.p)
	mustAppend(t, l, rec("a", 10, Base))
	sample := SampleRecords()[0]
	hA := held("events", "pub", 7, sample)
	mustHold(t, hs, hA)
	hB := held("events", "other", 7, rec("b-held", 5, Base))
	mustHold(t, hs, hB)
	err := hs.Hold(held("events", "pub", 7, rec("dup", 5, Base)))
	wantErr(t, "a second hold of the same exchange", err, storage.ErrExists)
	ra := rec("a", 10, Base)
	if l.Next() != 2 || l.Bytes() != ra.Size() {
		t.Fatalf("holding moved the channel: next %d bytes %d, want 2 and %d", l.Next(), l.Bytes(), ra.Size())
	}
	b := mustAppend(t, l, rec("b", 10, Base))
	if b.Offset != 2 {
		t.Fatalf("a publish after the holds took offset %d, want 2", b.Offset)
	}
	if got := readAll(t, l); len(got) != 2 {
		t.Fatalf("a reader sees %d records, want the 2 appended (holds are invisible)", len(got))
	}
	if n, _, err := l.Trim(time.Time{}, ra.Size()); err != nil || n != 1 {
		t.Fatalf("Trim = %d, %v; want the oldest record only", n, err)
	}
	checkHolds(t, "after trim", hs, []storage.Held{hB, hA})

	h.restart()
	l = h.log("events")
	hs = holdStore(t, h.p)
	checkHolds(t, "after restart", hs, []storage.Held{hB, hA})
	if l.Next() != 3 {
		t.Fatalf("next after restart %d, want 3", l.Next())
	}
	got, err := hs.Release("events", "pub", 7)
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	want := sample
	want.Offset = 3
	if d := RecordDiff(want, got); d != "" {
		t.Fatalf("Release returned %s", d)
	}
	recs := readAll(t, l)
	if len(recs) != 2 || RecordDiff(want, recs[1]) != "" {
		t.Fatalf("after release the log holds %v, want offsets [2 3] with the held record at 3", offsets(recs))
	}
	_, err = hs.Release("events", "pub", 7)
	wantErr(t, "a second release", err, storage.ErrNotFound)
	if l.Next() != 4 {
		t.Fatalf("a refused release moved next to %d", l.Next())
	}
	checkHolds(t, "after release", hs, []storage.Held{hB})
	if ok, err := hs.DropHold("events", "other", 7); err != nil || !ok {
		t.Fatalf("DropHold = %v, %v; want true", ok, err)
	}
	if ok, err := hs.DropHold("events", "other", 7); err != nil || ok {
		t.Fatalf("second DropHold = %v, %v; want false", ok, err)
	}
	_, err = hs.Release("events", "other", 7)
	wantErr(t, "release of a dropped hold", err, storage.ErrNotFound)
	if l.Next() != 4 || len(readAll(t, l)) != 2 {
		t.Fatalf("a dropped hold was written: next %d", l.Next())
	}
	h.restart()
	checkHolds(t, "after the second restart", holdStore(t, h.p), nil)
	if l := h.log("events"); l.Next() != 4 {
		t.Fatalf("next after restart %d, want 4", l.Next())
	}
}

// HoldReleaseIntoEveryKind: a queue's release is a new job at its next
// offset; a latest channel's replaces the topic's value at its next offset.
func HoldReleaseIntoEveryKind(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	q := h.queue("jobs")
	v := h.values("state")
	hs := holdStore(t, h.p)
	mustEnqueue(t, q, rec("j1", 10, Base))
	mustHold(t, hs, held("jobs", "c", 1, rec("j2", 20, Base)))
	mustPut(t, v, storage.Record{MessageID: "v1", Topic: "room/1", Payload: []byte("old"), Timestamp: Base})
	newValue := storage.Record{MessageID: "v2", Topic: "room/1", Payload: []byte("new"), Timestamp: Base, QoS: 2}
	mustHold(t, hs, held("state", "c", 1, newValue))
	mustPut(t, v, storage.Record{MessageID: "v3", Topic: "room/2", Payload: []byte("x"), Timestamp: Base})
	if q.Depth() != 1 || q.Next() != 2 || v.Next() != 3 || v.Len() != 2 {
		t.Fatalf("holds moved the stores: queue depth %d next %d, values next %d len %d", q.Depth(), q.Next(), v.Next(), v.Len())
	}
	if got, ok, _ := v.Get("room/1"); !ok || got.MessageID != "v1" {
		t.Fatalf("the held value is visible before its release: %+v", got)
	}

	h.restart()
	q, v, hs = h.queue("jobs"), h.values("state"), holdStore(t, h.p)
	job, err := hs.Release("jobs", "c", 1)
	if err != nil || job.Offset != 2 || job.MessageID != "j2" {
		t.Fatalf("Release into the queue = %+v, %v; want j2 at offset 2", job, err)
	}
	it, err := q.Get(2)
	if err != nil || it.MessageID != "j2" || it.Attempts != 0 {
		t.Fatalf("released job: %+v, %v", it, err)
	}
	if q.Depth() != 2 || q.Next() != 3 {
		t.Fatalf("queue depth %d next %d after release, want 2 and 3", q.Depth(), q.Next())
	}
	val, err := hs.Release("state", "c", 1)
	newValue.Offset = 3
	if err != nil || RecordDiff(newValue, val) != "" {
		t.Fatalf("Release into the value store = %+v, %v", val, err)
	}
	if got, ok, _ := v.Get("room/1"); !ok || RecordDiff(newValue, got) != "" {
		t.Fatalf("room/1 after release: %+v, %v", got, ok)
	}
	if v.Len() != 2 || v.Next() != 4 {
		t.Fatalf("value store len %d next %d, want 2 and 4 (the release replaced room/1)", v.Len(), v.Next())
	}
	since, err := v.Since(3, 10)
	if err != nil || len(since) != 1 || since[0].MessageID != "v2" {
		t.Fatalf("Since(3) = %+v, %v; want the released value only", since, err)
	}
	h.restart()
	q, v = h.queue("jobs"), h.values("state")
	if q.Depth() != 2 || q.Next() != 3 || v.Len() != 2 || v.Next() != 4 {
		t.Fatalf("after restart: queue depth %d next %d, values len %d next %d", q.Depth(), q.Next(), v.Len(), v.Next())
	}
	checkHolds(t, "after restart", holdStore(t, h.p), nil)
}

// HoldChannelMaxBytes: a channel already at its own max_bytes refuses the
// hold; a channel that filled between hold and release refuses the
// release with the hold kept, until room is made.
func HoldChannelMaxBytes(t *testing.T, open OpenFunc) {
	h := newHarness(t, open, Opts{})
	l := h.log("events")
	hs := holdStore(t, h.p)
	re := rec("e", 100, Base)
	one := re.Size()
	l.SetMaxBytes(2 * one)
	mustHold(t, hs, held("events", "c", 1, rec("e", 100, Base)))
	mustAppend(t, l, rec("e", 100, Base))
	mustAppend(t, l, rec("e", 100, Base))
	err := hs.Hold(held("events", "c", 2, rec("e", 100, Base)))
	wantErr(t, "Hold on a full channel", err, storage.ErrFull)
	_, err = hs.Release("events", "c", 1)
	wantErr(t, "Release into a full channel", err, storage.ErrFull)
	if l.Next() != 3 {
		t.Fatalf("a refused release moved next to %d", l.Next())
	}
	checkHolds(t, "after the refused release", hs, []storage.Held{held("events", "c", 1, rec("e", 100, Base))})
	if _, _, err := l.Trim(time.Time{}, one); err != nil {
		t.Fatal(err)
	}
	r, err := hs.Release("events", "c", 1)
	if err != nil || r.Offset != 3 {
		t.Fatalf("Release once room was made = %d, %v; want offset 3", r.Offset, err)
	}

	q := h.queue("jobs")
	q.SetMaxBytes(one)
	mustHold(t, hs, held("jobs", "c", 1, rec("e", 100, Base)))
	mustEnqueue(t, q, rec("e", 100, Base))
	_, err = hs.Release("jobs", "c", 1)
	wantErr(t, "Release into a full queue", err, storage.ErrFull)
	if err := q.Resolve(1); err != nil {
		t.Fatal(err)
	}
	if r, err := hs.Release("jobs", "c", 1); err != nil || r.Offset != 2 {
		t.Fatalf("Release once the queue resolved a job = %d, %v; want offset 2", r.Offset, err)
	}
}

// HoldProviderBoundAndReserve: holds count against the provider's bound
// less its reserve (a full provider refuses a hold and a publish alike);
// a release is never refused by that bound.
func HoldProviderBoundAndReserve(t *testing.T, open OpenFunc) {
	const maxBytes, reserve = 256 << 10, 16 << 10
	h := newHarness(t, open, Opts{MaxBytes: maxBytes, Reserve: reserve})
	l := h.log("events")
	hs := holdStore(t, h.p)
	pid := uint16(0)
	for {
		pid++
		if int(pid) > 10*maxBytes/1024 {
			t.Fatalf("provider never refused a hold: %d holds of 1 KiB under max_bytes %d", pid, maxBytes)
		}
		err := hs.Hold(held("events", "c", pid, rec(fmt.Sprint("h", pid), 1024, Base)))
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil {
			t.Fatalf("Hold %d: %v", pid, err)
		}
	}
	if pid == 1 {
		t.Fatal("the first hold was refused")
	}
	// The holds filled the provider: a publish is refused too (sqlite
	// counts pages, so a few records may still fit into pages the holds'
	// table left partly free).
	appended := 0
	for ; ; appended++ {
		_, err := l.Append(rec("e", 1024, Base))
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if appended > 16 {
			t.Fatalf("the provider took %d more records of 1 KiB after refusing a hold: holds do not count against it", appended)
		}
	}
	for i := uint16(1); i <= 3; i++ {
		r, err := hs.Release("events", "c", i)
		if err != nil {
			t.Fatalf("Release %d with the provider full: %v", i, err)
		}
		if r.Offset != uint64(appended)+uint64(i) {
			t.Fatalf("release %d took offset %d, want %d", i, r.Offset, appended+int(i))
		}
	}
	if b := h.p.Bytes(); b > maxBytes {
		t.Fatalf("provider Bytes() = %d over max_bytes %d", b, maxBytes)
	}
	all, err := hs.Holds()
	if err != nil || len(all) != int(pid)-4 {
		t.Fatalf("%d holds left, %v; want %d", len(all), err, pid-4)
	}
}

// HoldReleaseIsAtomic: a failure between the release's two halves leaves
// the hold and no record — never both, never neither — in every kind,
// and a later release writes the record exactly once.
func HoldReleaseIsAtomic(t *testing.T, open OpenFunc) {
	var fail atomic.Bool
	injected := errors.New("failing between the release's halves")
	calls := 0
	h := newHarness(t, open, Opts{BetweenReleaseHalves: func() error {
		calls++
		if fail.Load() {
			return injected
		}
		return nil
	}})
	l, q, v := h.log("events"), h.queue("jobs"), h.values("state")
	hs := holdStore(t, h.p)
	mustAppend(t, l, rec("a", 10, Base))
	mustPut(t, v, storage.Record{MessageID: "v1", Topic: "room/1", Payload: []byte("old"), Timestamp: Base})
	mustHold(t, hs, held("events", "c", 1, rec("held-e", 10, Base)))
	mustHold(t, hs, held("jobs", "c", 1, rec("held-j", 10, Base)))
	mustHold(t, hs, held("state", "c", 1, storage.Record{MessageID: "v2", Topic: "room/1", Payload: []byte("new"), Timestamp: Base}))
	lBytes, qBytes, vBytes, pBytes := l.Bytes(), q.Bytes(), v.Bytes(), h.p.Bytes()

	fail.Store(true)
	for _, ch := range []string{"events", "jobs", "state"} {
		if _, err := hs.Release(ch, "c", 1); !errors.Is(err, injected) {
			t.Fatalf("Release(%s) = %v, want the injected failure", ch, err)
		}
	}
	if calls != 3 {
		t.Fatalf("the fault hook ran %d times, want once per release", calls)
	}
	check := func(what string) {
		t.Helper()
		if l.Next() != 2 || len(readAll(t, l)) != 1 || l.Bytes() != lBytes {
			t.Fatalf("%s: the append channel took the record: next %d bytes %d", what, l.Next(), l.Bytes())
		}
		if q.Next() != 1 || q.Depth() != 0 || q.Bytes() != qBytes {
			t.Fatalf("%s: the queue took the job: next %d depth %d", what, q.Next(), q.Depth())
		}
		if got, _, _ := v.Get("room/1"); got.MessageID != "v1" || v.Next() != 2 || v.Bytes() != vBytes {
			t.Fatalf("%s: the value store took the value: %+v, next %d", what, got, v.Next())
		}
		if all, err := hs.Holds(); err != nil || len(all) != 3 {
			t.Fatalf("%s: %d holds left, %v; want all 3", what, len(all), err)
		}
	}
	check("after the failed releases")
	if b := h.p.Bytes(); b != pBytes {
		t.Fatalf("provider bytes %d after the failed releases, want %d", b, pBytes)
	}
	h.restart()
	l, q, v, hs = h.log("events"), h.queue("jobs"), h.values("state"), holdStore(t, h.p)
	check("after restart")

	fail.Store(false)
	for _, ch := range []string{"events", "jobs", "state"} {
		if _, err := hs.Release(ch, "c", 1); err != nil {
			t.Fatalf("Release(%s) without the fault: %v", ch, err)
		}
		if _, err := hs.Release(ch, "c", 1); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("second Release(%s) = %v, want ErrNotFound", ch, err)
		}
	}
	if l.Next() != 3 || q.Next() != 2 || q.Depth() != 1 || v.Next() != 3 {
		t.Fatalf("after the releases: log next %d, queue next %d depth %d, values next %d", l.Next(), q.Next(), q.Depth(), v.Next())
	}
	if got, _, _ := v.Get("room/1"); got.MessageID != "v2" {
		t.Fatalf("room/1 is %q after release, want v2", got.MessageID)
	}
}
