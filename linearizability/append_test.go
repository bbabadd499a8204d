package linearizability

import (
	"slices"
	"testing"
)

// A legal history with concurrency, a refused publish, a pending publish that
// took effect and one that did not.
func legalAppend() *hist {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.apub(2, "ev", "b", 12, 25, 0)      // concurrent with a: either order
	h.apub(3, "ev", "r", 13, 14, 0x97)   // refused: never in the log
	h.apub(1, "ev", "c", 30, Pending, 0) // PUBACK lost, but it took effect
	h.apub(2, "ev", "d", 31, Pending, 0) // PUBACK lost, never took effect
	h.aread(9, "ev", 40, 1, "b")
	h.aread(9, "ev", 41, 2, "a")
	h.aread(9, "ev", 42, 3, "c")
	h.ahead(8, "ev", 43, 4)
	// a second channel is independent
	h.apub(1, "other", "x", 10, 11, 0)
	h.aread(7, "other", 12, 1, "x")
	return h
}

func TestInvariant09_AppendLegalHistoryPasses(t *testing.T) {
	rep := mustCheck(t, legalAppend().ops, KindAppend, Options{Dense: true})
	if !rep.OK() {
		t.Fatalf("legal history rejected: %s %v %v", rep.Result, rep.Failed, rep.Violations)
	}
	if rep.Partitions != 2 {
		t.Fatalf("partitions = %d, want 2 (one per channel)", rep.Partitions)
	}
}

// invariant 9: one offset, two different records.
func TestInvariant09_AppendReusedOffsetRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.apub(1, "ev", "b", 21, 30, 0)
	h.aread(9, "ev", 31, 1, "a")
	h.aread(9, "ev", 32, 2, "b")
	h.aread(8, "ev", 33, 2, "a") // offset 2 now holds a
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// An acknowledged record missing from a complete read of the channel.
func TestAppendLostAcknowledgedRecordRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.apub(1, "ev", "b", 21, 30, 0)
	h.apub(1, "ev", "c", 31, 40, 0)
	h.aread(9, "ev", 50, 1, "a")
	h.aread(9, "ev", 51, 2, "c")
	h.ahead(8, "ev", 52, 3) // two records: b is gone
	wantIllegal(t, h, KindAppend, `append "ev"`)

	// Control: the same history with b refused is legal.
	h.ops[1].Output.Reason = 0x97
	wantLinearizable(t, h, KindAppend)
}

func TestAppendReadOfNeverWrittenRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.aread(9, "ev", 30, 1, "ghost")
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

func TestAppendRefusedPublishVisibleRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0x97)
	h.aread(9, "ev", 30, 1, "a")
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

func TestAppendPendingPublishAtMostOnce(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, Pending, 0)
	h.aread(9, "ev", 30, 1, "a")
	wantLinearizable(t, h, KindAppend)
	h.aread(9, "ev", 31, 2, "a") // the one publish stored twice
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

func TestAppendReadBeforePublishRejected(t *testing.T) {
	h := &hist{}
	h.aread(9, "ev", 5, 1, "a")
	h.apub(1, "ev", "a", 10, 20, 0)
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// A payload that differs from the one acknowledged at that offset.
func TestAppendPayloadMismatchRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.aread(9, "ev", 30, 1, "a")
	h.ops[1].Output.Payload = []byte("something else")
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// invariant 9 across a restart: kill -9 keeps every committed record, so an
// offset read before the restart is never reissued after it.
func TestInvariant09_AppendOffsetReusedAfterRestartRejected(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.aread(9, "ev", 21, 1, "a")
	h.restart(30, 40)
	h.apub(2, "ev", "b", 50, 60, 0)
	h.aread(8, "ev", 61, 1, "b")
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// invariant 14: a power cut may lose what was acknowledged within its loss
// window — and only that.
func TestInvariant14_AppendPowerCutLosesOnlyTheWindow(t *testing.T) {
	build := func(ackOfB int64) *hist {
		h := &hist{}
		h.apub(1, "ev", "a", 10, 20, 0)
		h.apub(1, "ev", "b", ackOfB-5, ackOfB, 0)
		h.aread(9, "ev", 96, 1, "a")
		h.aread(9, "ev", 97, 2, "b")
		h.powerCut(100, 110, 10) // acks in [90, 110] may be lost
		h.apub(2, "ev", "c", 120, 130, 0)
		h.aread(8, "ev", 131, 1, "a")
		h.aread(8, "ev", 132, 2, "c") // b's offset, reissued
		return h
	}
	wantLinearizable(t, build(95), KindAppend) // b acked inside the window
	wantIllegal(t, build(50), KindAppend, `append "ev"`)

	// a, acked long before the window, is never lost.
	h := &hist{}
	h.apub(1, "ev", "a", 10, 20, 0)
	h.powerCut(100, 110, 10)
	h.ahead(8, "ev", 120, 1)
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// A pending publish cannot take effect after the restart that ended its
// connection.
func TestAppendPendingPublishBoundedByRestart(t *testing.T) {
	h := &hist{}
	h.apub(1, "ev", "a", 10, Pending, 0)
	h.restart(20, 30)
	h.ahead(8, "ev", 40, 1) // a did not take effect before the restart
	h.aread(9, "ev", 50, 1, "a")
	wantIllegal(t, h, KindAppend, `append "ev"`)
}

// invariant 1 / replay order: a reader is never moved backwards or silently
// past records.
func TestInvariant01_AppendReadsOrderAndDensity(t *testing.T) {
	h := &hist{}
	for i, id := range []string{"a", "b", "c"} {
		h.apub(1, "ev", id, int64(10*i+1), int64(10*i+5), 0)
	}
	h.aread(9, "ev", 40, 1, "a")
	h.aread(9, "ev", 41, 3, "c") // skipped b
	h.aread(8, "ev", 40, 2, "b")
	h.aread(8, "ev", 41, 1, "a") // went back
	h.aread(7, "ev", 40, 2, "b") // a new connection may start anywhere
	h.aread(7, "ev", 41, 3, "c")
	vs := CheckAppendReads(h.ops, true)
	if got := checks(vs); !slices.Equal(got, []string{"append-dense", "append-order"}) {
		t.Fatalf("dense violations = %v", vs)
	}
	if got := checks(CheckAppendReads(h.ops, false)); !slices.Equal(got, []string{"append-order"}) {
		t.Fatalf("non-dense violations = %v", got)
	}
	rep := mustCheck(t, h.ops, KindAppend, Options{Dense: true})
	if rep.OK() || len(rep.Violations) != 2 || !rep.HasVisualization() {
		t.Fatalf("Check must report the read violations with a picture: %+v", rep)
	}
}
