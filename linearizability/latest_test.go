package linearizability

import (
	"slices"
	"testing"

	"github.com/anishathalye/porcupine"
	"pgregory.net/rapid"
)

func legalLatest() *hist {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(2, "k", "w2", "v2", 15, 25)      // concurrent with w1
	h.lread(9, "k", 18, 19, "w2", "v2", 0)  // w2 linearized first...
	h.lread(9, "k", 26, 27, "w1", "v1", 0)  // ...then w1 won
	h.lpub(1, "k", "w3", "", 30, 40)        // delete
	h.lread(9, "k", 41, 42, "", "", 0)      // no value
	h.lpub(1, "k", "w4", "v4", 50, Pending) // PUBACK lost, took effect
	h.lread(8, "k", 60, 61, "w4", "v4", 0)
	h.lread(7, "other", 10, 11, "", "", 0) // never set
	return h
}

func TestLatestLegalHistoryPasses(t *testing.T) {
	rep := mustCheck(t, legalLatest().ops, KindLatest, Options{})
	if !rep.OK() {
		t.Fatalf("legal history rejected: %s %v %v", rep.Result, rep.Failed, rep.Violations)
	}
	if rep.Partitions != 2 {
		t.Fatalf("partitions = %d, want 2 (one per key)", rep.Partitions)
	}
}

func TestLatestStaleReadRejected(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "w2", "v2", 30, 40)
	h.lread(9, "k", 50, 51, "w1", "v1", 0) // overwritten before the read began
	wantIllegal(t, h, KindLatest, `key "k"`)
}

func TestLatestReadAfterDeleteRejected(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "w2", "", 30, 40)
	h.lread(9, "k", 50, 51, "w1", "v1", 0)
	wantIllegal(t, h, KindLatest, `key "k"`)

	// and a value that is there must not read as absent
	h = &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lread(9, "k", 50, 51, "", "", 0)
	wantIllegal(t, h, KindLatest, `key "k"`)
}

func TestLatestReadOfNeverWrittenRejected(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lread(9, "k", 30, 31, "ghost", "boo", 0)
	wantIllegal(t, h, KindLatest, `key "k"`)

	// A refused write is never read.
	h = &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.ops[0].Output.Reason = 0x83
	h.lread(9, "k", 30, 31, "w1", "v1", 0)
	wantIllegal(t, h, KindLatest, `key "k"`)
}

// invariant 14: a power cut reverts a key only across its loss window.
func TestInvariant14_LatestPowerCutRevertsOnlyTheWindow(t *testing.T) {
	build := func(ack2 int64) *hist {
		h := &hist{}
		h.lpub(1, "k", "w1", "v1", 10, 20)
		h.lpub(1, "k", "w2", "v2", ack2-2, ack2)
		h.powerCut(100, 110, 10)
		h.lread(9, "k", 120, 121, "w1", "v1", 0)
		return h
	}
	wantLinearizable(t, build(95), KindLatest)
	wantIllegal(t, build(50), KindLatest, `key "k"`)
}

func TestLatestOrderChecker(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "w2", "v2", 30, 40)
	h.lread(9, "k", 5, 35, "w2", "v2", 2)
	h.lread(9, "k", 5, 36, "w1", "v1", 1) // older after newer on one connection
	h.lread(8, "k", 5, 37, "w1", "v1", 1)
	vs := CheckLatestOrder(h.ops)
	if got := checks(vs); !slices.Equal(got, []string{"latest-order"}) {
		t.Fatalf("violations = %v", vs)
	}
}

// A point read that returns a value older than one already acknowledged and
// read is stale, whether the newer write's PUBACK came or was lost.
func TestLatestStalePointReadAfterANewerReadRejected(t *testing.T) {
	for _, ack := range []int64{35, Pending} {
		h := &hist{}
		h.lpub(1, "k", "w1", "v1", 10, 20)
		h.lpub(2, "k", "w2", "v2", 25, ack)
		h.lread(9, "k", 30, 40, "w2", "v2", 0)
		h.lread(9, "k", 45, 50, "w1", "v1", 0) // w2 was read: w1 cannot be back
		wantIllegal(t, h, KindLatest, `key "k"`)

		// The same read, concurrent with the newer one, is legal.
		h = &hist{}
		h.lpub(1, "k", "w1", "v1", 10, 20)
		h.lpub(2, "k", "w2", "v2", 25, ack)
		h.lread(9, "k", 30, 40, "w2", "v2", 0)
		h.lread(8, "k", 22, 50, "w1", "v1", 0)
		wantLinearizable(t, h, KindLatest)
	}
}

// Deletes: acknowledged, lost to a crash and yet applied (a read shows the
// key empty), of a key never set; a pending set nobody read; a subscriber
// judged from its SUBSCRIBE, sent a deletion live with its offset.
func TestLatestLegalHistoryWithDeletesPasses(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lread(7, "k", 5, 21, "w1", "v1", 1) // subscriber, SUBSCRIBE at 5
	h.lpub(1, "k", "w2", "", 30, 40)      // delete
	h.lread(7, "k", 5, 41, "w2", "", 2)   // sent live, with its offset
	h.lread(9, "k", 42, 43, "", "", 0)    // point read: no value
	h.lpub(2, "k", "w3", "v3", 50, 60)
	h.lread(9, "k", 61, 62, "w3", "v3", 0)
	h.lpub(2, "k", "w4", "", 70, Pending) // the PUBACK lost to the restart...
	h.restart(80, 90)
	h.lread(9, "k", 95, 96, "", "", 0)       // ...and yet it applied
	h.lpub(1, "k", "w5", "v5", 100, Pending) // never acknowledged, never read
	h.lpub(3, "never", "w6", "", 100, 110)   // delete of a key never set
	h.lread(9, "never", 111, 112, "", "", 0) // still nothing
	h.restart(120, 130)
	h.lread(9, "k", 140, 141, "", "", 0)
	rep := mustCheck(t, h.ops, KindLatest, Options{})
	if !rep.OK() {
		t.Fatalf("legal history rejected: %s %v %v", rep.Result, rep.Failed, rep.Violations)
	}
}

// A pending write lands before the crash that ended its connection, or
// never: not after the restart.
func TestLatestPendingWriteCannotLandAfterItsRestart(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "w2", "v2", 30, Pending)
	h.restart(40, 50)
	h.lread(9, "k", 60, 61, "w1", "v1", 0) // w2 did not apply...
	h.lread(9, "k", 70, 71, "w2", "v2", 0) // ...so it cannot show now
	wantIllegal(t, h, KindLatest, `key "k"`)
}

// A subscriber's value was current at some moment after its SUBSCRIBE: a
// slow subscriber may be sent one a newer write has since replaced, but a
// SUBSCRIBE sent after that newer write was acknowledged must not bring the
// older value back.
func TestLatestSubscriptionReadJudgedFromItsSubscribe(t *testing.T) {
	build := func(subscribe int64) *hist {
		h := &hist{}
		h.lpub(1, "k", "w1", "v1", 10, 20)
		h.lpub(1, "k", "w2", "v2", 30, 40)
		h.lread(7, "k", subscribe, 100, "w1", "v1", 1)
		return h
	}
	wantLinearizable(t, build(5), KindLatest)
	wantIllegal(t, build(50), KindLatest, `key "k"`)
}

// invariant 14: a memory provider's kill loses everything since its last
// snapshot, told as a power cut whose window reaches back to it. A key may
// revert across every write acknowledged inside the window, a delete
// included, and to none acknowledged before it.
func TestInvariant14_LatestLongLossWindowRevertsAcrossDeletes(t *testing.T) {
	build := func(loss int64, id, val string) *hist {
		h := &hist{}
		h.lpub(1, "k", "w1", "v1", 10, 20)
		h.lpub(1, "k", "w2", "", 30, 40) // delete
		h.lpub(1, "k", "w3", "v3", 50, 60)
		h.powerCut(100, 110, loss)
		h.lread(9, "k", 120, 121, id, val, 0)
		return h
	}
	wantLinearizable(t, build(70, "w1", "v1"), KindLatest)       // window [30,100]: w2 and w3 undone
	wantLinearizable(t, build(70, "", ""), KindLatest)           // w3 undone, the delete kept
	wantLinearizable(t, build(70, "w3", "v3"), KindLatest)       // nothing undone
	wantLinearizable(t, build(50, "", ""), KindLatest)           // window [50,100]: w3 undone
	wantIllegal(t, build(50, "w1", "v1"), KindLatest, `key "k"`) // the delete is outside it
}

// narrowLatest only prunes porcupine's search: on random histories, legal
// and broken (a read given another value of its key, or none), the verdict
// with it is the verdict without it.
func TestPropertyNarrowLatestKeepsTheVerdict(t *testing.T) {
	raw := func(rt *rapid.T, ops []Op) porcupine.CheckResult {
		evs, err := prepare(ops, "latest.")
		if err != nil {
			rt.Fatal(err)
		}
		model := LatestModel()
		failed, unknown := checkPartitions(model, model.Partition(toPorcupine(evs)), 0)
		switch {
		case len(failed) > 0:
			return porcupine.Illegal
		case unknown:
			return porcupine.Unknown
		}
		return porcupine.Ok
	}
	rapid.Check(t, func(rt *rapid.T) {
		h := genLatestHistory(rapidDrawer{rt}, 60)
		ops := slices.Clone(h.ops)
		var reads, writes []int
		for i, op := range ops {
			switch op.Op {
			case OpLatestRead:
				reads = append(reads, i)
			case OpLatestPublish:
				writes = append(writes, i)
			}
		}
		if len(reads) > 0 && rapid.Bool().Draw(rt, "break") {
			r := reads[rapid.IntRange(0, len(reads)-1).Draw(rt, "read")]
			out := &Output{Offset: ops[r].Output.Offset}
			if len(writes) > 0 && rapid.Bool().Draw(rt, "other value") {
				w := ops[writes[rapid.IntRange(0, len(writes)-1).Draw(rt, "write")]]
				ops[r].Input = &Input{Key: w.Input.Key}
				out.ID, out.Payload = w.Input.ID, w.Input.Payload
			}
			ops[r].Output = out
		}
		rep, err := Check(ops, KindLatest, Options{})
		if err != nil {
			rt.Fatal(err)
		}
		if want := raw(rt, ops); rep.Result != want {
			rt.Fatalf("narrowed verdict %s, unnarrowed %s", rep.Result, want)
		}
	})
}

// A deletion a subscriber is sent names its tombstone: the delete that
// removed a value. A delete of a key with no value stores nothing (docs/channels.md "`latest`"), so a deletion naming it was never stored; nor can a tombstone be
// named after a value replaced it.
func TestLatestDeletionReadNamesItsTombstone(t *testing.T) {
	h := &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "d1", "", 30, 40)
	h.lread(7, "k", 5, 45, "d1", "", 2)
	wantLinearizable(t, h, KindLatest)

	h = &hist{}
	h.lpub(1, "k", "d0", "", 10, 20) // nothing to delete: nothing stored
	h.lread(7, "k", 5, 25, "d0", "", 1)
	wantIllegal(t, h, KindLatest, `key "k"`)

	h = &hist{}
	h.lpub(1, "k", "w1", "v1", 10, 20)
	h.lpub(1, "k", "d1", "", 30, 40)
	h.lpub(1, "k", "w2", "v2", 50, 60)
	h.lread(7, "k", 65, 70, "d1", "", 2) // SUBSCRIBE after w2 was acknowledged
	wantIllegal(t, h, KindLatest, `key "k"`)
}
