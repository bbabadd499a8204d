package harness

import (
	"slices"
	"testing"
	"time"

	L "saguin.dev/linearizability"
)

// Negative controls for the takeover and Will checks on synthetic
// histories: each doctored run is the way its broken invariant would show,
// and each honest twin passes.

const ms = int64(time.Millisecond)

func takeoverRun(h *hist, firstOnNew int64) *run {
	h.note(Note{Kind: NoteConnack, Conn: 1, ClientID: "tk-1", Channel: chanEvents, Detail: "clean"})
	for off := int64(1); off <= 20; off++ {
		h.read(1, chanEvents, off, "r"+string(rune('a'+off)))
	}
	received := h.tick()
	h.note(Note{Kind: NoteTakeover, Conn: 2, Peer: 1, ClientID: "tk-1", Sent: h.tick(), End: received, Received: 20, SessionPresent: true})
	h.note(Note{Kind: NoteConnack, Conn: 2, ClientID: "tk-1", Channel: chanEvents, SessionPresent: true, Detail: "takeover"})
	h.note(Note{Kind: NoteConnEnd, Conn: 1, ClientID: "tk-1", Value: 0x8E})
	for off := firstOnNew; off <= 24; off++ {
		h.read(2, chanEvents, off, "r"+string(rune('a'+off)))
	}
	return newRun(h.ops, h.notes)
}

func TestInvariant17_TakeoverServingAcknowledgedRecordsAgainIsCaught(t *testing.T) {
	// The old connection had received 20 with Receive Maximum 8: the broker
	// had its acks through 12, so 13 is the lowest the new owner may see.
	if fs := takeoverRun(newHist(), 13).checkTakeovers(); len(fs) != 0 {
		t.Fatalf("an honest takeover was flagged: %v", fs)
	}
	fs := takeoverRun(newHist(), 5).checkTakeovers()
	if len(fs) != 1 || fs[0].Check != "takeover-replay" || fs[0].Invariant != 17 {
		t.Fatalf("a new owner served offset 5 after the old one received 20 was not flagged as takeover-replay: %v", fs)
	}
	// A restart in between excuses it: what was acknowledged since the
	// last stored write may come again after an unclean stop.
	h := newHist()
	h.note(Note{Kind: NoteConnack, Conn: 1, ClientID: "tk-1", Channel: chanEvents, Detail: "clean"})
	h.read(1, chanEvents, 20, "x")
	h.restart()
	h.note(Note{Kind: NoteTakeover, Conn: 2, Peer: 1, ClientID: "tk-1", Sent: h.tick(), End: h.tick(), Received: 20})
	h.read(2, chanEvents, 3, "y")
	if fs := newRun(h.ops, h.notes).checkTakeovers(); len(fs) != 0 {
		t.Fatalf("a replay across a restart was flagged: %v", fs)
	}
}

func TestInvariant17_TakeoverDisconnectReasonAndOpenOldConnection(t *testing.T) {
	h := newHist()
	takeoverRun(h, 15)
	h.note(Note{Kind: NoteConnack, Conn: 3, ClientID: "tk-1", Channel: chanEvents, SessionPresent: true, Detail: "takeover"})
	h.note(Note{Kind: NoteTakeover, Conn: 3, Peer: 2, ClientID: "tk-1", Sent: h.tick(), End: h.tick(), Received: 0})
	h.note(Note{Kind: NoteConnEnd, Conn: 2, ClientID: "tk-1", Value: 0x8B})
	fs := newRun(h.ops, h.notes).checkTakeovers()
	if len(fs) != 1 || fs[0].Check != "takeover-reason" {
		t.Fatalf("a taken-over connection sent 0x8B with the broker running was not flagged: %v", fs)
	}
	// A SIGTERM between the takeover and the end explains 0x8B.
	h = newHist()
	takeoverRun(h, 15)
	h.note(Note{Kind: NoteTakeover, Conn: 3, Peer: 2, ClientID: "tk-1", Sent: h.tick(), End: h.tick()})
	h.note(Note{Kind: NoteNemesis, Detail: NemesisTerm})
	h.note(Note{Kind: NoteConnEnd, Conn: 2, ClientID: "tk-1", Value: 0x8B})
	if fs := newRun(h.ops, h.notes).checkTakeovers(); len(fs) != 0 {
		t.Fatalf("0x8B during a SIGTERM was flagged: %v", fs)
	}
	h = newHist()
	takeoverRun(h, 15)
	h.note(Note{Kind: NoteTakeover, Conn: 3, Peer: 2, ClientID: "tk-1", Sent: h.tick(), End: h.tick()})
	h.note(Note{Kind: NoteConnEnd, Conn: 2, ClientID: "tk-1", Value: -2, Detail: "still open"})
	fs = newRun(h.ops, h.notes).checkTakeovers()
	if len(fs) != 1 || fs[0].Check != "takeover-old-open" {
		t.Fatalf("a taken-over connection left open was not flagged: %v", fs)
	}
}

func TestInvariant17_RefusedConnectThatTakesTheIdOverIsCaught(t *testing.T) {
	h := newHist()
	h.note(Note{Kind: NoteConnack, Conn: 1, ClientID: "tk-1", Channel: chanEvents, Detail: "clean"})
	sent := h.tick()
	h.note(Note{Kind: NoteRefused, ClientID: "tk-1", Peer: 1, Sent: sent, Value: 0x90})
	h.note(Note{Kind: NoteConnEnd, Conn: 1, ClientID: "tk-1", Value: 0x8E})
	fs := newRun(h.ops, h.notes).checkTakeovers()
	if len(fs) != 1 || fs[0].Check != "taken-over-unasked" || fs[0].Invariant != 17 {
		t.Fatalf("an owner sent 0x8E after a refused CONNECT was not flagged: %v", fs)
	}
}

func TestInvariant18_SessionPresentZeroForAStoredSessionIsCaught(t *testing.T) {
	build := func(sp bool, cut bool) *run {
		h := newHist()
		h.note(Note{Kind: NoteConnack, Conn: 1, ClientID: "tk-1", Channel: chanEvents, Detail: "clean"})
		h.note(Note{Kind: NoteRefused, ClientID: "tk-1", Peer: 1, Sent: h.tick(), Value: 0x90})
		if cut {
			h.powerCut(time.Second)
		} else {
			h.restart()
		}
		h.note(Note{Kind: NoteConnack, Conn: 2, ClientID: "tk-1", Channel: chanEvents, SessionPresent: sp, Detail: "resume"})
		return newRun(h.ops, h.notes)
	}
	if fs := build(true, false).checkSessionPresent(); len(fs) != 0 {
		t.Fatalf("Session Present 1 after a restart was flagged: %v", fs)
	}
	fs := build(false, false).checkSessionPresent()
	if len(fs) != 1 || fs[0].Check != "session-present" || fs[0].Invariant != 18 {
		t.Fatalf("Session Present 0 for a stored session after a kill was not flagged: %v", fs)
	}
	if fs := build(false, true).checkSessionPresent(); len(fs) != 0 {
		t.Fatalf("a session created inside a power cut's loss window was required: %v", fs)
	}
}

// willRun is one episode ending as detail at end, with the watcher's reads
// at the given offsets from end, and the end of the campaign 10 s later.
func willRun(h *hist, detail string, delay time.Duration, readAfter ...time.Duration) (int64, *hist) {
	end := h.tick()
	ep := Note{Kind: NoteWillEpisode, ClientID: "will-1-1", Delay: delay.Nanoseconds(), Sent: end - 300*ms, T: end - 290*ms,
		End: end, Detail: detail}
	switch detail {
	case willEndClean:
		ep.Closed = end
	case willEndResumed:
		ep.Resumed, ep.Closed = end+200*ms, end+400*ms
	}
	h.note(ep)
	for i, d := range readAfter {
		h.note(Note{Kind: NoteWillSeen, T: end + d.Nanoseconds(), Conn: 9, ClientID: "will-1-1", Value: int64(i + 1), Detail: "will-1-1"})
	}
	h.t = end + 10*int64(time.Second)
	h.note(Note{Kind: NoteWillsDone})
	return end, h
}

func willFindings(h *hist) ([]Finding, willFigures) {
	return newRun(h.ops, h.notes).checkWills()
}

func TestInvariant18_WillPublishedAfterAnsweredDisconnectIsCaught(t *testing.T) {
	if fs, fig := willFindings(second(willRun(newHist(), willEndClean, time.Second))); len(fs) != 0 || fig.forbidden != 1 {
		t.Fatalf("an honest withdrawal: %v %+v", fs, fig)
	}
	fs, _ := willFindings(second(willRun(newHist(), willEndClean, time.Second, 2*time.Second)))
	if len(fs) != 1 || fs[0].Check != "will-withdrawn-published" || fs[0].Invariant != 18 {
		t.Fatalf("a Will published after DISCONNECT 0x00 was answered was not flagged: %v", fs)
	}
	fs, _ = willFindings(second(willRun(newHist(), willEndResumed, 2*time.Second, 3*time.Second)))
	if len(fs) != 1 || fs[0].Check != "will-cancelled-published" {
		t.Fatalf("a Will published after its client resumed within the delay was not flagged: %v", fs)
	}
	// A power cut whose window reaches the DISCONNECT may take the
	// withdrawal back (invariant 14): no finding.
	h := newHist()
	end, h := willRun(h, willEndClean, time.Second, 2*time.Second)
	h.add(opPowerCut(end+500*ms, end+600*ms, time.Second))
	if fs, _ := willFindings(h); len(fs) != 0 {
		t.Fatalf("a withdrawal a power cut may have undone was required: %v", fs)
	}
}

func TestInvariant14_WillOwedAndNeverPublishedIsCaught(t *testing.T) {
	for _, detail := range []string{willEndKeep, willEndReset, willEndCut} {
		if fs, fig := willFindings(second(willRun(newHist(), detail, time.Second, 1500*time.Millisecond))); len(fs) != 0 || fig.required != 1 {
			t.Fatalf("%s: an honest Will: %v %+v", detail, fs, fig)
		}
		fs, _ := willFindings(second(willRun(newHist(), detail, time.Second)))
		if len(fs) != 1 || fs[0].Check != "will-missing" || fs[0].Invariant != 14 {
			t.Fatalf("%s: a Will owed and never published was not flagged: %v", detail, fs)
		}
	}
	// A kill right after the end: the due moment may not be written, so
	// the Will is not owed. A kill after willSettle: it is, and a Will read
	// after the restart counts as crossing it.
	h := newHist()
	end, h := willRun(h, willEndReset, time.Second)
	h.notes = append(h.notes, Note{Kind: NoteNemesis, T: end + 100*ms, Detail: NemesisKill})
	if fs, fig := willFindings(h); len(fs) != 0 || fig.required != 0 {
		t.Fatalf("a Will whose end a kill followed at once was required: %v %+v", fs, fig)
	}
	h = newHist()
	end, h = willRun(h, willEndReset, 3*time.Second, 4*time.Second)
	h.notes = append(h.notes, Note{Kind: NoteNemesis, T: end + 2500*ms, Detail: NemesisKill})
	h.add(opRestart(end+2500*ms, end+2700*ms))
	if fs, fig := willFindings(h); len(fs) != 0 || fig.required != 1 || fig.acrossCrash != 1 {
		t.Fatalf("a Will owed across a kill and read after it: %v %+v", fs, fig)
	}
	h = newHist()
	end, h = willRun(h, willEndReset, 3*time.Second)
	h.notes = append(h.notes, Note{Kind: NoteNemesis, T: end + 2500*ms, Detail: NemesisKill})
	h.add(opRestart(end+2500*ms, end+2700*ms))
	fs, _ := willFindings(h)
	if len(fs) != 1 || fs[0].Check != "will-missing" {
		t.Fatalf("a Will owed across a kill and lost by it was not flagged: %v", fs)
	}
	// A kill already under way when the client reset its socket (seen in a
	// real run: the reset came 0.3 ms after the kill began).
	h = newHist()
	end, h = willRun(h, willEndReset, 3*time.Second)
	h.notes = append(h.notes, Note{Kind: NoteNemesis, T: end - ms/3, Detail: NemesisKill})
	h.add(opRestart(end-ms/3, end+40*ms))
	if fs, fig := willFindings(h); len(fs) != 0 || fig.required != 0 {
		t.Fatalf("a Will whose connection ended during a kill was required: %v %+v", fs, fig)
	}
	// Frozen by SIGSTOP when it ended: the broker's time runs from SIGCONT.
	h = newHist()
	end, h = willRun(h, willEndReset, time.Second)
	h.notes = append(h.notes, Note{Kind: NoteNemesis, T: end - 100*ms, Detail: NemesisStop},
		Note{Kind: NoteNemesis, T: end + 3000*ms, Detail: nemesisCont},
		Note{Kind: NoteNemesis, T: end + 4000*ms, Detail: NemesisKill})
	if fs, fig := willFindings(h); len(fs) != 0 || fig.required != 0 {
		t.Fatalf("a Will whose broker was frozen and then killed within willSettle of the SIGCONT was required: %v %+v", fs, fig)
	}
}

func TestWillPublishedBeforeItsDelayIsCaught(t *testing.T) {
	fs, _ := willFindings(second(willRun(newHist(), willEndReset, 2*time.Second, 500*time.Millisecond)))
	if len(fs) != 1 || fs[0].Check != "will-early" {
		t.Fatalf("a Will read 0.5 s into a 2 s delay was not flagged: %v", fs)
	}
}

func second(_ int64, h *hist) *hist { return h }

func opRestart(call, ret int64) L.Op {
	return L.Op{Op: L.OpBrokerRestart, Call: call, Return: ret}
}

func opPowerCut(call, ret int64, loss time.Duration) L.Op {
	return L.Op{Op: L.OpBrokerPowerCut, Call: call, Return: ret, Input: &L.Input{LossNs: loss.Nanoseconds()}}
}

// doctorSessions: negative controls on a real history's takeover and Will
// workloads. Each doctored copy must be flagged by the check that passed
// the original: an extra publication of a Will its client withdrew, a Will
// owed and never read, a new owner served from far below what the old one
// had acknowledged, and a new owner first served past it (a gap).
func doctorSessions(t *testing.T, r *run, ops []L.Op, notes []Note, recheck func([]L.Op, []Note) *CheckResult) {
	t.Helper()
	seen := map[string]bool{}
	for _, n := range notes {
		if n.Kind == NoteWillSeen {
			seen[n.ClientID] = true
		}
	}
	var withdrawn, owed *Note
	var nemeses []Note
	for _, n := range notes {
		if n.Kind == NoteNemesis {
			nemeses = append(nemeses, n)
		}
	}
	for i, n := range notes {
		switch {
		case n.Kind != NoteWillEpisode:
		case withdrawn == nil && n.Detail == willEndClean && !r.mayBeLost(n.Closed, 1<<62):
			withdrawn = &notes[i]
		case owed == nil && seen[n.ClientID] && (n.Detail == willEndReset || n.Detail == willEndKeep || n.Detail == willEndCut) &&
			r.willSettled(n.End, nemeses):
			owed = &notes[i]
		}
	}
	if withdrawn == nil || owed == nil {
		t.Fatalf("the Will workload did not run: withdrawn %v, owed and read %v", withdrawn, owed)
	}
	extra := Note{Kind: NoteWillSeen, T: withdrawn.Closed + 5*int64(time.Second), Conn: 1 << 20, ClientID: withdrawn.ClientID, Value: 1 << 20, Detail: withdrawn.ClientID}
	if res := recheck(ops, append(slices.Clone(notes), extra)); len(findings(res, "will-withdrawn-published")) == 0 {
		t.Fatalf("a Will published after its withdrawal in the real history was not flagged: %v", checksOf(res))
	}
	gone := slices.DeleteFunc(slices.Clone(notes), func(n Note) bool { return n.Kind == NoteWillSeen && n.ClientID == owed.ClientID })
	if res := recheck(ops, gone); len(findings(res, "will-missing")) == 0 {
		t.Fatalf("the Will of %s (%s) taken out of the real history was not flagged: %v", owed.ClientID, owed.Detail, checksOf(res))
	}

	// Takeovers: the new connection's first read, with no restart since
	// the old connection's CONNACK.
	connack := map[int]Note{}
	acked := map[int]int64{}
	for _, n := range notes {
		switch n.Kind {
		case NoteConnack:
			connack[n.Conn] = n
		case NoteAcked:
			acked[n.Conn] = max(acked[n.Conn], n.Value)
		}
	}
	firstIdx := map[int]int{}
	for i, o := range ops {
		if o.Op == L.OpAppendRead && o.Channel == chanEvents && o.Output != nil {
			if j, ok := firstIdx[o.Client]; !ok || o.Return < ops[j].Return {
				firstIdx[o.Client] = i
			}
		}
	}
	replayed, skipped := false, false
	for _, n := range notes {
		if n.Kind != NoteTakeover || n.Received < 3*takeoverReceiveMax {
			continue
		}
		i, ok := firstIdx[n.Conn]
		if !ok || r.crashBetween(connack[n.Peer].T, ops[i].Return) {
			continue
		}
		if !replayed {
			doctored := slices.Clone(ops)
			out := *doctored[i].Output
			out.Offset = n.Received - 2*takeoverReceiveMax
			doctored[i].Output = &out
			if res := recheck(doctored, notes); len(findings(res, "takeover-replay")) == 0 {
				t.Fatalf("a new owner served offset %d after the old one received %d was not flagged: %v", out.Offset, n.Received, checksOf(res))
			}
			replayed = true
		}
		bound := int64(0) // acknowledged by every earlier connection of the id
		for conn, c := range connack {
			if c.ClientID == n.ClientID && c.Channel == chanEvents && c.T < connack[n.Conn].T {
				bound = max(bound, acked[conn])
			}
		}
		if !skipped && bound > 0 {
			doctored := slices.Clone(ops)
			out := *doctored[i].Output
			out.Offset = bound + 5
			doctored[i].Output = &out
			if res := recheck(doctored, notes); len(findings(res, "resume-skip")) == 0 {
				t.Fatalf("a new owner first served %d after its id acknowledged %d was not flagged: %v", out.Offset, bound, checksOf(res))
			}
			skipped = true
		}
	}
	if !replayed || !skipped {
		t.Fatalf("no takeover in the real history to doctor (replay %v, gap %v)", replayed, skipped)
	}
}
