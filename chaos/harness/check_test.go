package harness

import (
	"strings"
	"testing"
	"time"

	L "saguin.dev/linearizability"
)

// Negative controls for the checks: histories doctored the way each broken
// invariant would show on the wire must be flagged, naming the invariant; the
// honest version of each must pass, so no test passes vacuously.

const dlq = chanJobs + "__dlq"

// appendRun: two records, a reader that acknowledges both, a restart, a
// resumed reader that is replayed the last (a stored position lags, never
// leads), a third record, a head probe and a final read.
func appendRun(h *hist, mutate func(h *hist)) {
	h.publish(1, L.OpAppendPublish, chanEvents, "a")
	h.publish(1, L.OpAppendPublish, chanEvents, "b")
	h.note(Note{Kind: NoteConnack, Conn: 2, ClientID: "reader-1", Channel: chanEvents})
	h.read(2, chanEvents, 1, "a")
	h.read(2, chanEvents, 2, "b")
	h.note(Note{Kind: NoteAcked, Conn: 2, ClientID: "reader-1", Channel: chanEvents, Value: 2})
	h.note(Note{Kind: NoteFloor, Conn: 4, Channel: chanEvents, Value: 1})
	if mutate != nil {
		mutate(h)
		return
	}
	h.restart()
	h.note(Note{Kind: NoteConnack, Conn: 3, ClientID: "reader-1", Channel: chanEvents, SessionPresent: true})
	h.publish(1, L.OpAppendPublish, chanEvents, "c")
	h.read(3, chanEvents, 2, "b")
	h.read(3, chanEvents, 3, "c")
	h.note(Note{Kind: NoteFloor, Conn: 4, Channel: chanEvents, Value: 1})
	h.head(4, chanEvents, 4)
	h.finalRead(5, "final-events", chanEvents, "a", "b", "c")
}

// queueRun: an ack; a stall past the visibility timeout whose late ack is
// superseded; three returns and a dead letter; a drain and a final read of
// the dead-letter channel.
func queueRun(h *hist) {
	h.publish(10, L.OpQueuePublish, chanJobs, "j1")
	h.deliver(11, "j1", 1, 1, "d1")
	h.answer(11, "j1", "d1", L.ResultAck)

	h.publish(10, L.OpQueuePublish, chanJobs, "j2")
	h.deliver(11, "j2", 2, 1, "d2")
	h.leaseEnd(11, "j2", "d2", L.CauseTimeout)
	h.deliver(12, "j2", 2, 2, "d3")
	h.answer(11, "j2", "d2", L.ResultAck) // superseded: changes nothing
	h.answer(12, "j2", "d3", L.ResultAck)

	h.publish(10, L.OpQueuePublish, chanJobs, "j3")
	h.deliver(11, "j3", 3, 1, "d4")
	h.answer(11, "j3", "d4", L.ResultReturn)
	h.deliver(12, "j3", 3, 2, "d5")
	h.answer(12, "j3", "d5", L.ResultReturn)
	h.deliver(12, "j3", 3, 3, "d6")
	h.answer(12, "j3", "d6", L.ResultReturn)
	h.deadLetter(13, "j3", 1, 3)
}

func endQueueRun(h *hist) {
	h.note(Note{Kind: NoteDrained})
	h.finalRead(14, "final-"+dlq, dlq, "j3")
}

// latestRun: a key set, deleted and set again, each change sent to the
// subscriber (connection 21, SUBSCRIBE at the start) and read by a point
// reader (connection 22); and a key nobody writes. It returns the
// subscriber's SUBSCRIBE time.
func latestRun(h *hist) int64 {
	sub := h.tick()
	h.note(Note{Kind: NoteConnack, Conn: 21, ClientID: "latest-sub", Channel: chanState})
	h.lpub(20, "state/k0", "l1", "v1")
	h.lsub(21, sub, "state/k0", "l1", "v1", 1)
	h.lpoint(22, "state/k0", "l1", "v1")
	h.lpub(20, "state/k0", "l2", "") // delete
	h.lsub(21, sub, "state/k0", "l2", "", 2)
	h.lpoint(22, "state/k0", "", "")
	h.lpub(20, "state/k0", "l3", "v3")
	h.lsub(21, sub, "state/k0", "l3", "v3", 3)
	h.lpoint(22, "state/k0", "l3", "v3")
	h.lpoint(22, unsetKey, "", "")
	return sub
}

func TestHonestHistoryPasses(t *testing.T) {
	h := newHist()
	appendRun(h, nil)
	queueRun(h)
	latestRun(h)
	endQueueRun(h)
	res := check(t, h)
	mustPass(t, res)
	if res.Stats.Operations == 0 || res.Stats.Restarts != 1 || res.Stats.DeadLetters != 2 ||
		res.Stats.LatestWrites != 3 || res.Stats.LatestReads != 7 {
		t.Fatalf("stats %+v", res.Stats)
	}
}

// Invariant 14 (and 18): a point read answered with a value older than one
// acknowledged and read before it began — the newer write lost, or the
// read served from somewhere stale.
func TestInvariant14_StaleLatestPointReadIsFlagged(t *testing.T) {
	h := newHist()
	latestRun(h)
	h.lpoint(22, "state/k0", "l1", "v1")
	res := check(t, h)
	f := mustFind(t, res, "linearizable/latest-"+chanState, 14)
	if !strings.Contains(f.Msg, `key "state/k0"`) {
		t.Fatalf("finding does not name the key: %s", f)
	}

	// After a power cut whose window holds l2 and l3, v1 may be back.
	h = newHist()
	latestRun(h)
	h.powerCut(time.Second)
	h.lpoint(22, "state/k0", "l1", "v1")
	mustPass(t, check(t, h))
}

// docs/channels.md "`latest`" "never older after newer": on one connection the subscriber
// is sent a key's older value after a newer one. Each was the key's value
// at some moment after the SUBSCRIBE, so only the order check sees it.
func TestLatestOlderAfterNewerOnOneConnectionIsFlagged(t *testing.T) {
	h := newHist()
	sub := latestRun(h)
	h.lsub(21, sub, "state/k0", "l1", "v1", 1)
	res := check(t, h)
	mustFind(t, res, "latest-order", 0)
	if fs := findings(res, "linearizable/latest-"+chanState); len(fs) != 0 {
		t.Fatalf("the model flagged a value that was current after the SUBSCRIBE: %v", fs)
	}

	// The same value again on a new connection (a restart's full state)
	// is not older after newer on one connection.
	h = newHist()
	sub = latestRun(h)
	h.lsub(23, sub, "state/k0", "l3", "v3", 3)
	mustPass(t, check(t, h))
}

// Invariant 9 on a latest channel: one counter per channel, offsets never
// reused — a value sent at the offset its key's tombstone took.
func TestInvariant09_LatestOffsetReusedIsFlagged(t *testing.T) {
	h := newHist()
	sub := latestRun(h)
	h.lpub(20, "state/k1", "l4", "v4")
	h.lsub(21, sub, "state/k1", "l4", "v4", 2)
	res := check(t, h)
	mustFind(t, res, "offset-reused", 9)
	mustFind(t, res, "offset-order", 9)
}

// Invariant 9: after a restart, an offset read earlier as one record is
// read as another.
func TestInvariant09_ReusedOffsetIsFlagged(t *testing.T) {
	h := newHist()
	appendRun(h, func(h *hist) {
		h.restart()
		h.publish(1, L.OpAppendPublish, chanEvents, "c")
		h.note(Note{Kind: NoteConnack, Conn: 3, ClientID: "reader-1", Channel: chanEvents, SessionPresent: true})
		h.read(3, chanEvents, 2, "c") // offset 2 held b
		h.finalRead(5, "final-events", chanEvents, "a", "c")
	})
	res := check(t, h)
	f := mustFind(t, res, "offset-reused", 9)
	if !strings.Contains(f.Msg, "offset 2") || len(f.Lines) != 2 {
		t.Fatalf("finding does not name the offset and both reads: %s", f)
	}
	mustFind(t, res, "linearizable/append-events", 9)
	mustFind(t, res, "acked-lost", 14)

	// The same history with a power cut whose window holds b's
	// acknowledgement and read: b may be lost and its offset issued again.
	h = newHist()
	appendRun(h, func(h *hist) {
		h.powerCut(time.Second)
		h.publish(1, L.OpAppendPublish, chanEvents, "c")
		h.note(Note{Kind: NoteConnack, Conn: 3, ClientID: "reader-1", Channel: chanEvents, SessionPresent: true})
		h.read(3, chanEvents, 2, "c")
		h.finalRead(5, "final-events", chanEvents, "a", "c")
	})
	res = check(t, h)
	mustPass(t, res)
	if res.Stats.LostInWindow != 1 || res.Stats.PowerCuts != 1 {
		t.Fatalf("b was lost inside the window: lost-in-window %d, cuts %d", res.Stats.LostInWindow, res.Stats.PowerCuts)
	}
}

// Invariant 14: a record acknowledged to its publisher, with only kill -9
// restarts, is missing at the end.
func TestInvariant14_AcknowledgedRecordMissingIsFlagged(t *testing.T) {
	h := newHist()
	appendRun(h, func(h *hist) {
		h.restart()
		h.head(4, chanEvents, 3)
		h.finalRead(5, "final-events", chanEvents, "a") // b gone
	})
	res := check(t, h)
	f := mustFind(t, res, "acked-lost", 14)
	if !strings.Contains(f.Msg, "record b") {
		t.Fatalf("finding does not name record b: %s", f)
	}
}

// Invariant 9: a channel retention emptied restarts its offsets at 1 after a
// restart (MAX(offset)+1 over surviving rows).
func TestInvariant09_OffsetsRestartingAfterRetentionEmptiedTheChannelAreFlagged(t *testing.T) {
	h := newHist()
	for i, id := range []string{"t1", "t2"} {
		h.publish(1, L.OpAppendPublish, chanTicks, id)
		h.read(2, chanTicks, int64(1+i), id)
	}
	h.note(Note{Kind: NoteFloor, Channel: chanTicks, Value: 3}) // retention emptied it
	h.restart()
	h.publish(1, L.OpAppendPublish, chanTicks, "t3")
	h.read(3, chanTicks, 1, "t3")
	res := check(t, h)
	mustFind(t, res, "offset-order", 9)

	h = newHist()
	for i, id := range []string{"t1", "t2"} {
		h.publish(1, L.OpAppendPublish, chanTicks, id)
		h.read(2, chanTicks, int64(1+i), id)
	}
	h.restart()
	h.publish(1, L.OpAppendPublish, chanTicks, "t3")
	h.read(3, chanTicks, 3, "t3")
	mustPass(t, check(t, h))
}

// Invariant 1: the floor goes back after a restart; a channel nothing was
// removed from reports a floor other than 1.
func TestInvariant01_FloorGoingBackIsFlagged(t *testing.T) {
	h := newHist()
	h.note(Note{Kind: NoteFloor, Channel: chanTicks, Value: 5})
	h.restart()
	h.note(Note{Kind: NoteFloor, Channel: chanTicks, Value: 1})
	h.note(Note{Kind: NoteFloor, Channel: chanEvents, Value: 2})
	res := check(t, h)
	f := mustFind(t, res, "floor-back", 1)
	if !strings.Contains(f.Msg, "from 5 to 1") {
		t.Fatalf("finding %s", f)
	}
	mustFind(t, res, "floor-moved", 1)

	// Inside a power cut's window the deletion may be undone.
	h = newHist()
	h.note(Note{Kind: NoteFloor, Channel: chanTicks, Value: 5})
	h.powerCut(time.Second)
	h.note(Note{Kind: NoteFloor, Channel: chanTicks, Value: 4})
	mustPass(t, check(t, h))
}

// Invariant 1: a resumed durable consumer is served past what it
// acknowledged. Invariant 18: one told its session is new is served the old
// position.
func TestInvariant01_ResumedConsumerServedPastItsAcknowledgementsIsFlagged(t *testing.T) {
	h := newHist()
	for i := range 5 {
		h.publish(1, L.OpAppendPublish, chanEvents, string(rune('a'+i)))
	}
	h.note(Note{Kind: NoteConnack, Conn: 2, ClientID: "reader-1", Channel: chanEvents})
	h.read(2, chanEvents, 1, "a")
	h.read(2, chanEvents, 2, "b")
	h.note(Note{Kind: NoteAcked, Conn: 2, ClientID: "reader-1", Channel: chanEvents, Value: 2})
	h.note(Note{Kind: NoteConnack, Conn: 3, ClientID: "reader-1", Channel: chanEvents, SessionPresent: true})
	h.read(3, chanEvents, 4, "d") // 3 was never acknowledged
	h.read(3, chanEvents, 5, "e")
	h.note(Note{Kind: NoteAcked, Conn: 3, ClientID: "reader-1", Channel: chanEvents, Value: 5})
	h.note(Note{Kind: NoteConnack, Conn: 6, ClientID: "reader-2", Channel: chanEvents})
	h.read(6, chanEvents, 1, "a")
	h.note(Note{Kind: NoteAcked, Conn: 6, ClientID: "reader-2", Channel: chanEvents, Value: 1})
	h.note(Note{Kind: NoteConnack, Conn: 7, ClientID: "reader-2", Channel: chanEvents}) // Session Present 0
	h.read(7, chanEvents, 2, "b")
	res := check(t, h)
	f := mustFind(t, res, "resume-skip", 1)
	if !strings.Contains(f.Msg, "offsets 3..3 skipped") {
		t.Fatalf("finding %s", f)
	}
	mustFind(t, res, "resume-new-session", 18)
}

// Invariant 3: worker A stalls past its timeout, the job goes to B, A acks
// late with its superseded Delivery ID, B returns the job — and it never
// comes back: A's ack resolved it.
func TestInvariant03_SupersededAckResolvingTheJobIsFlagged(t *testing.T) {
	h := newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.leaseEnd(11, "j4", "d7", L.CauseTimeout)
	h.deliver(12, "j4", 4, 2, "d8")
	h.answer(11, "j4", "d7", L.ResultAck)
	h.answer(12, "j4", "d8", L.ResultReturn)
	endQueueRun(h) // drained, and j4 was never offered again
	res := check(t, h)
	f := mustFind(t, res, "queue-resolved", 3)
	if !strings.Contains(f.Msg, "superseded") {
		t.Fatalf("finding does not name the superseded ack: %s", f)
	}

	// Honest: j4 comes back after B's return and B acks it.
	h = newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.leaseEnd(11, "j4", "d7", L.CauseTimeout)
	h.deliver(12, "j4", 4, 2, "d8")
	h.answer(11, "j4", "d7", L.ResultAck)
	h.answer(12, "j4", "d8", L.ResultReturn)
	h.deliver(12, "j4", 4, 3, "d9")
	h.answer(12, "j4", "d9", L.ResultAck)
	endQueueRun(h)
	mustPass(t, check(t, h))
}

// Invariant 15: a worker acks, on its new connection after a restart, the
// Delivery ID it was handed before it; the job never comes back.
func TestInvariant15_AnswerCarriedAcrossARestartResolvingTheJobIsFlagged(t *testing.T) {
	h := newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.restart()
	h.answer(15, "j4", "d7", L.ResultAck)
	endQueueRun(h)
	res := check(t, h)
	f := mustFind(t, res, "queue-resolved", 15)
	if !strings.Contains(f.Msg, "restart") {
		t.Fatalf("finding does not name the restart: %s", f)
	}
}

// Invariant 4: one record held by two live leases.
func TestInvariant04_TwoLiveLeasesAreFlagged(t *testing.T) {
	h := newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.deliver(12, "j4", 4, 1, "d8") // A's lease never ended
	h.answer(11, "j4", "d7", L.ResultAck)
	endQueueRun(h)
	res := check(t, h)
	f := mustFind(t, res, "linearizable/queue-jobs", 4)
	if !strings.Contains(f.Msg, `"j4"`) {
		t.Fatalf("finding does not name job j4: %s", f)
	}
}

// Invariant 5: a job in the dead-letter channel twice, one that vanished
// from it, and one dead-lettered while a worker held it.
func TestInvariant05_DeadLetterMoveThatIsNotAtomicIsFlagged(t *testing.T) {
	h := newHist()
	queueRun(h)
	h.note(Note{Kind: NoteDrained})
	h.finalRead(14, "final-"+dlq, dlq, "j3", "j3")
	mustFind(t, check(t, h), "dead-letter-twice", 5)

	h = newHist()
	queueRun(h) // the durable dead-letter reader saw j3
	h.note(Note{Kind: NoteDrained})
	h.finalRead(14, "final-"+dlq, dlq)
	mustFind(t, check(t, h), "dead-letter-lost", 5)

	h = newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.deadLetter(13, "j4", 2, 1) // moved while held
	h.answer(11, "j4", "d7", L.ResultAck)
	endQueueRun(h)
	mustFind(t, check(t, h), "linearizable/queue-jobs", 4)
}

func TestNotesRoundTrip(t *testing.T) {
	var b strings.Builder
	in := []Note{{Kind: NoteFloor, T: 5, Conn: 2, Channel: "x", Value: 7}, {Kind: NoteDrained, T: 9}}
	if err := WriteNotes(&b, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadNotes(strings.NewReader(b.String()), 10)
	if err != nil || len(out) != 2 || out[0] != in[0] || out[1] != in[1] {
		t.Fatalf("round trip: %v %v", out, err)
	}
	if _, err := ReadNotes(strings.NewReader(b.String()), 1); err == nil {
		t.Fatal("more notes than the bound were accepted")
	}
	if _, err := ReadNotes(strings.NewReader(`{"kind":"floor","bogus":1}`), 10); err == nil {
		t.Fatal("an unknown field was accepted")
	}
}

// An ack of the last delivery whose PUBACK never came (the link was cut) may
// have applied: the job may be resolved, so it is not flagged.
func TestPendingAckOfTheLastDeliveryIsNotAViolation(t *testing.T) {
	h := newHist()
	queueRun(h)
	h.publish(10, L.OpQueuePublish, chanJobs, "j4")
	h.deliver(11, "j4", 4, 1, "d7")
	h.add(L.Op{Client: 11, Op: L.OpQueueAnswer, Channel: chanJobs, Call: h.tick(), Return: L.Pending,
		Input: &L.Input{ID: "j4", Delivery: []byte("d7"), Result: L.ResultAck}})
	h.leaseEnd(11, "j4", "d7", L.CauseDisconnect)
	endQueueRun(h)
	mustPass(t, check(t, h))
}

// The same record twice in a row on one connection is named a duplicate,
// not an offset reused.
func TestDuplicateDeliveryOnOneConnectionIsNamed(t *testing.T) {
	h := newHist()
	h.publish(1, L.OpAppendPublish, chanEvents, "a")
	h.publish(1, L.OpAppendPublish, chanEvents, "b")
	h.read(2, chanEvents, 1, "a")
	h.read(2, chanEvents, 1, "a")
	h.read(2, chanEvents, 2, "b")
	res := check(t, h)
	f := mustFind(t, res, "append-duplicate", 0)
	if !strings.Contains(f.Msg, "record a delivered twice") {
		t.Fatalf("finding %s", f)
	}
	if len(findings(res, "append-order")) != 0 {
		t.Fatalf("also reported as an order violation: %v", res.Violations)
	}
}
