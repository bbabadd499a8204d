package linearizability

import (
	"slices"
	"testing"
)

// A legal queue history: a return, a timeout with a late stale ack, an ack,
// a restart, a dead letter.
func legalQueue() *hist {
	h := &hist{}
	h.qpub(1, "j1", 10, 20, 0)
	h.qpub(1, "j2", 21, 30, 0)
	h.qpub(1, "j3", 31, 35, 0)
	// j1: A returns it, B takes attempt 2 and acks.
	h.qdeliver(100, "j1", 40, 1, 1, "d1")
	h.qanswer(100, "j1", "d1", ResultReturn, 45, 46)
	h.qdeliver(101, "j1", 50, 1, 2, "d2")
	h.qanswer(101, "j1", "d2", ResultAck, 55, 56)
	// j2: A stalls past its timeout; B gets it; A's late ack resolves
	// nothing (invariant 3); B acks.
	h.qdeliver(100, "j2", 60, 2, 1, "d3")
	h.qleaseEnd(100, "j2", "d3", CauseTimeout, 70)
	h.qdeliver(101, "j2", 75, 2, 2, "d4")
	h.qanswer(100, "j2", "d3", ResultAck, 76, 77)
	h.qanswer(101, "j2", "d4", ResultAck, 80, 81)
	// j3: held across a restart (invariant 15), then exhausted: dead-lettered.
	h.qdeliver(102, "j3", 82, 3, 1, "d5")
	h.restart(85, 90)
	h.qdeliver(103, "j3", 95, 3, 1, "d6") // never PUBACKed before: attempt unspent
	h.qanswer(103, "j3", "d6", ResultReturn, 96, 97)
	h.qdead(104, "j3", 99, 1, 1)
	h.qdead(105, "j3", 100, 1, 1) // another reader of the same dead letter
	return h
}

func TestInvariant04_QueueLegalHistoryPasses(t *testing.T) {
	rep := mustCheck(t, legalQueue().ops, KindQueue, Options{Resolution: true})
	if !rep.OK() {
		t.Fatalf("legal history rejected: %s %v %v", rep.Result, rep.Failed, rep.Violations)
	}
	if rep.Partitions != 3 {
		t.Fatalf("partitions = %d, want 3 (one per job)", rep.Partitions)
	}
}

// invariant 4: a delivery to B while A's lease is live.
func TestInvariant04_QueueTwoLiveLeasesRejected(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qdeliver(101, "j", 40, 1, 1, "d2")
	wantIllegal(t, h, KindQueue, `job "j"`)

	// A lease that could only have ended after B's delivery does not help.
	h.qleaseEnd(100, "j", "d1", CauseDisconnect, 45)
	wantIllegal(t, h, KindQueue, `job "j"`)

	// Control: ended before B's delivery, it is legal.
	h.ops[len(h.ops)-1].Call = 35
	wantLinearizable(t, h, KindQueue)
}

// invariant 3: a stale answer changes nothing — the lease it does not name
// stays live, so a third delivery is still a second live lease.
func TestInvariant03_QueueStaleAnswerResolvesNothing(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qleaseEnd(100, "j", "d1", CauseTimeout, 35)
	h.qdeliver(101, "j", 40, 1, 2, "d2")
	h.qanswer(100, "j", "d1", ResultReturn, 45, 46) // stale: B's lease stands
	h.qdeliver(102, "j", 50, 1, 3, "d3")
	wantIllegal(t, h, KindQueue, `job "j"`)

	// An answer from another connection naming B's delivery is not B's.
	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qanswer(101, "j", "d1", ResultReturn, 45, 46)
	h.qdeliver(102, "j", 50, 1, 2, "d2")
	wantIllegal(t, h, KindQueue, `job "j"`)
}

// An applied ack is final.
func TestInvariant03_QueueDeliveryAfterAppliedAckRejected(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qanswer(100, "j", "d1", ResultAck, 35, 36)
	h.qdeliver(101, "j", 40, 1, 2, "d2")
	wantIllegal(t, h, KindQueue, `job "j"`)

	// Control: the ack was never PUBACKed and a restart came — it may not
	// have applied, so the redelivery is legal.
	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qanswer(100, "j", "d1", ResultAck, 35, Pending)
	h.restart(37, 39)
	h.qdeliver(101, "j", 40, 1, 1, "d2")
	wantLinearizable(t, h, KindQueue)

	// A restart does not undo an ack that was PUBACKed (invariant 18).
	h.ops[2].Return, h.ops[2].Output = 36, &Output{}
	wantIllegal(t, h, KindQueue, `job "j"`)
}

func TestQueueDeliveryOfUnpublishedJobRejected(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0x97) // refused
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	wantIllegal(t, h, KindQueue, `job "j"`)

	h = &hist{}
	h.qdeliver(100, "ghost", 30, 1, 1, "d1")
	wantIllegal(t, h, KindQueue, `job "ghost"`)

	// A pending publish may have taken effect.
	h = &hist{}
	h.qpub(1, "j", 10, Pending, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	wantLinearizable(t, h, KindQueue)
}

func TestQueueAttemptsOnlyGrow(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 2, "d1")
	h.qleaseEnd(100, "j", "d1", CauseDisconnect, 35)
	h.qdeliver(101, "j", 40, 1, 1, "d2") // went down
	wantIllegal(t, h, KindQueue, `job "j"`)

	// After an answered attempt the next must be higher.
	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qanswer(100, "j", "d1", ResultReturn, 35, 36)
	h.qdeliver(101, "j", 40, 1, 1, "d2")
	wantIllegal(t, h, KindQueue, `job "j"`)

	// Control: a disconnect before any PUBACK burns nothing.
	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qleaseEnd(100, "j", "d1", CauseDisconnect, 35)
	h.qdeliver(101, "j", 40, 1, 1, "d2")
	wantLinearizable(t, h, KindQueue)
}

func TestQueueDeliveryIDReuseAndOffsetChangeRejected(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qleaseEnd(100, "j", "d1", CauseDisconnect, 35)
	h.qdeliver(101, "j", 40, 1, 1, "d1")
	wantIllegal(t, h, KindQueue, `job "j"`)

	h.ops[3].Output.Delivery = []byte("d2")
	h.ops[3].Output.Offset = 7
	wantIllegal(t, h, KindQueue, `job "j"`)

	h.ops[3].Output.Offset = 1
	wantLinearizable(t, h, KindQueue)

	// A DUP resend of a delivery already seen is not a new lease.
	h.add(Op{Client: 101, Op: OpQueueDeliver, Channel: "jobs", Call: 41, Return: 41, Input: &Input{Dup: true},
		Output: &Output{ID: "j", Offset: 1, Attempt: 1, Delivery: []byte("d2")}})
	wantLinearizable(t, h, KindQueue)
}

// invariant 5: a dead letter is in one place — never while a live lease holds
// the job, never after an applied ack, never twice.
func TestInvariant05_QueueDeadLetterOnlyFromAvailable(t *testing.T) {
	h := &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qdead(9, "j", 40, 1, 1)
	wantIllegal(t, h, KindQueue, `job "j"`)

	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdeliver(100, "j", 30, 1, 1, "d1")
	h.qanswer(100, "j", "d1", ResultAck, 35, 36)
	h.qdead(9, "j", 40, 1, 1)
	wantIllegal(t, h, KindQueue, `job "j"`)

	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdead(9, "j", 40, 1, 0) // expired before any worker: legal
	wantLinearizable(t, h, KindQueue)
	h.qdead(9, "j", 41, 2, 0) // a second dead letter
	wantIllegal(t, h, KindQueue, `job "j"`)

	h = &hist{}
	h.qpub(1, "j", 10, 20, 0)
	h.qdead(9, "j", 40, 1, 0)
	h.qdeliver(100, "j", 50, 1, 1, "d1") // delivered after dead-lettering
	wantIllegal(t, h, KindQueue, `job "j"`)
}

// invariant 14: a power cut may undo an ack acknowledged within its window.
func TestInvariant14_QueuePowerCutMayUndoOnlyWindowedAck(t *testing.T) {
	build := func(ackReturn int64) *hist {
		h := &hist{}
		h.qpub(1, "j", 10, 20, 0)
		h.qdeliver(100, "j", 30, 1, 1, "d1")
		h.qanswer(100, "j", "d1", ResultAck, ackReturn-1, ackReturn)
		h.powerCut(100, 110, 10)
		h.qdeliver(101, "j", 120, 1, 1, "d2")
		return h
	}
	wantLinearizable(t, build(95), KindQueue)
	wantIllegal(t, build(50), KindQueue, `job "j"`)
}

func TestQueueResolutionChecker(t *testing.T) {
	if vs, err := CheckQueueResolution(legalQueue().ops); err != nil || len(vs) != 0 {
		t.Fatalf("legal: %v %v", vs, err)
	}
	h := &hist{}
	h.qpub(1, "never", 10, 20, 0)        // acknowledged, never offered
	h.qpub(1, "dropped", 11, 21, 0)      // returned, never came back
	h.qpub(1, "refused", 12, 22, 0x97)   // refused: owed nothing
	h.qpub(1, "unknown", 13, Pending, 0) // PUBACK lost: owed nothing
	h.qpub(1, "stale", 14, 24, 0)        // acked only by a superseded delivery
	h.qdeliver(100, "dropped", 30, 2, 1, "d1")
	h.qanswer(100, "dropped", "d1", ResultReturn, 31, 32)
	h.qdeliver(100, "stale", 40, 3, 1, "d2")
	h.qleaseEnd(100, "stale", "d2", CauseTimeout, 41)
	h.qdeliver(101, "stale", 42, 3, 2, "d3")
	h.qanswer(100, "stale", "d2", ResultAck, 43, 44)
	// An ack of the last delivery whose PUBACK never came resolves the job:
	// had it not applied, the drain would have offered the job again.
	h.qpub(1, "ackpending", 15, 25, 0)
	h.qdeliver(102, "ackpending", 50, 6, 1, "d4")
	h.qanswer(102, "ackpending", "d4", ResultAck, 51, Pending)
	// A pending ack of a superseded delivery resolves nothing.
	h.qpub(1, "stalepending", 16, 26, 0)
	h.qdeliver(103, "stalepending", 60, 7, 1, "d5")
	h.qleaseEnd(103, "stalepending", "d5", CauseTimeout, 61)
	h.qdeliver(104, "stalepending", 62, 7, 2, "d6")
	h.qanswer(103, "stalepending", "d5", ResultAck, 63, Pending)
	vs, err := CheckQueueResolution(h.ops)
	if err != nil {
		t.Fatal(err)
	}
	if got := checks(vs); !slices.Equal(got, []string{"queue-offered", "queue-resolved", "queue-resolved", "queue-resolved"}) {
		t.Fatalf("violations = %v", vs)
	}
	// Through Check, with and without the option.
	if rep := mustCheck(t, h.ops, KindQueue, Options{Resolution: true}); rep.OK() || !rep.HasVisualization() {
		t.Fatalf("Check passed an unresolved history: %+v", rep)
	}
	if rep := mustCheck(t, h.ops, KindQueue, Options{}); !rep.OK() {
		t.Fatalf("without Resolution: %+v", rep)
	}
}

func TestInvariant09_QueueOffsetsChecker(t *testing.T) {
	if vs, err := CheckQueueOffsets(legalQueue().ops); err != nil || len(vs) != 0 {
		t.Fatalf("legal: %v %v", vs, err)
	}
	h := &hist{}
	h.qpub(1, "a", 10, 20, 0)
	h.qpub(1, "b", 21, 30, 0)
	h.qpub(1, "c", 31, 40, 0)
	h.qdeliver(100, "a", 50, 5, 1, "d1")
	h.qdeliver(101, "b", 51, 5, 1, "d2") // a's offset reused
	h.qdeliver(102, "c", 52, 4, 1, "d3") // published after a, lower offset
	vs, err := CheckQueueOffsets(h.ops)
	if err != nil {
		t.Fatal(err)
	}
	if got := checks(vs); !slices.Equal(got, []string{"queue-offset-unique", "queue-offset-order", "queue-offset-order"}) {
		t.Fatalf("violations = %v", vs)
	}
}

func TestQueueDuplicatePublishIDIsBadInput(t *testing.T) {
	h := &hist{}
	h.qpub(1, "a", 10, 20, 0)
	h.qpub(1, "a", 21, 30, 0)
	if _, err := Check(h.ops, KindQueue, Options{}); err == nil {
		t.Fatal("two queue publishes with one id accepted")
	}
}
