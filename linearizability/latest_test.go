package linearizability

import (
	"slices"
	"testing"
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
