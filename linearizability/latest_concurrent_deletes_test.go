package linearizability

import "testing"

// Chaos seed 4000, key state/k2 (lines 87493-87498 of its history, times
// shifted): two overlapping deletes of a key holding a value. One of them
// removes the value and stores its tombstone; the other, ordered before or
// after it, deletes a key with no value and stores nothing (docs/channels.md "`latest`"). A
// subscriber sent both tombstones saw a history no order explains; sent
// either one alone it did not. The broker stored both (broker/latest.go
// storeLatest looked, then stored, with no lock between two deletes).
func TestLatestConcurrentDeletesStoreOneTombstone(t *testing.T) {
	base := func() *hist {
		h := &hist{}
		h.lpub(7, "state/k2", "lprod-2-2817", "lprod-2 #2817", 10, 20)
		h.lpub(4, "state/k2", "lprod-1-2882", "", 30, 60)
		h.lpub(7, "state/k2", "lprod-2-2818", "", 35, 61)
		return h
	}
	for _, id := range []string{"lprod-1-2882", "lprod-2-2818"} {
		h := base()
		h.lread(9, "state/k2", 5, 62, id, "", 5548)
		wantLinearizable(t, h, KindLatest)
	}

	h := base()
	h.lread(9, "state/k2", 5, 62, "lprod-1-2882", "", 5548)
	h.lread(9, "state/k2", 5, 63, "lprod-2-2818", "", 5549)
	wantIllegal(t, h, KindLatest, `key "state/k2"`)
}
