package harness

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	L "saguin.dev/linearizability"
)

// The harness's own whole-run checks. Each reads only what clients were told
// (the history) and what the harness itself saw (the notes), and each names
// the invariant whose failure it would see.

// maxFindingsPerCheck bounds what one check reports (invariant 13); the last
// finding says how many more there were.
const maxFindingsPerCheck = 20

type crashEvent struct {
	call, ret, loss int64
	cut             bool // a power cut: acknowledged writes within loss of it may be lost
}

// run indexes a history and its notes for the checks.
type run struct {
	ops     []L.Op
	notes   []Note
	crashes []crashEvent // by call time
	byLine  map[int]L.Op
}

func newRun(ops []L.Op, notes []Note) *run {
	r := &run{ops: ops, notes: notes, byLine: map[int]L.Op{}}
	for _, o := range ops {
		if o.Line > 0 {
			r.byLine[o.Line] = o
		}
		if !isCrash(o.Op) {
			continue
		}
		c := crashEvent{call: o.Call, ret: o.Return, cut: o.Op == L.OpBrokerPowerCut}
		if c.ret < 0 {
			c.ret = math.MaxInt64
		}
		if c.cut && o.Input != nil {
			c.loss = o.Input.LossNs
		}
		r.crashes = append(r.crashes, c)
	}
	slices.SortFunc(r.crashes, func(a, b crashEvent) int { return cmp.Compare(a.call, b.call) })
	return r
}

func (r *run) hasNote(kind string) bool {
	return slices.ContainsFunc(r.notes, func(n Note) bool { return n.Kind == kind })
}

// lossCut returns the power cut, beginning no later than before, whose loss
// window holds t: a write acknowledged (or a record seen) at t may have been
// undone by it (invariant 14). ok is false when nothing may undo it.
func (r *run) lossCut(t, before int64) (crashEvent, bool) {
	for _, c := range r.crashes {
		if c.call > before {
			break
		}
		if c.cut && t >= c.call-c.loss && t <= c.ret {
			return c, true
		}
	}
	return crashEvent{}, false
}

func (r *run) mayBeLost(t, before int64) bool {
	_, ok := r.lossCut(t, before)
	return ok
}

// connsOf lists the connections of a client id, from its CONNACK notes.
func (r *run) connsOf(clientID string) map[int]bool {
	out := map[int]bool{}
	for _, n := range r.notes {
		if n.Kind == NoteConnack && n.ClientID == clientID {
			out[n.Conn] = true
		}
	}
	return out
}

func (r *run) finalRead(channel string) (Note, bool) {
	var out Note
	found := false
	for _, n := range r.notes {
		if n.Kind == NoteFinalRead && n.Channel == channel {
			out, found = n, true
		}
	}
	return out, found
}

func (r *run) stats() Stats {
	var s Stats
	for _, o := range r.ops {
		switch o.Op {
		case L.OpAppendPublish, L.OpQueuePublish:
			s.Publishes++
			switch {
			case o.IsPending():
				s.Pending++
			case o.Output != nil && L.Succeeded(o.Output.Reason):
				s.Acked++
			}
		case L.OpAppendRead:
			s.Reads++
		case L.OpQueueDeliver:
			s.Deliveries++
		case L.OpQueueAnswer:
			s.Answers++
		case L.OpQueueDeadLetter:
			s.DeadLetters++
		case L.OpLatestPublish:
			s.LatestWrites++
		case L.OpLatestRead:
			s.LatestReads++
		case L.OpBrokerRestart:
			s.Restarts++
		case L.OpBrokerPowerCut:
			s.PowerCuts++
		}
	}
	return s
}

// capped collects findings of one check up to the bound.
type capped struct {
	out   []Finding
	extra int
	proto Finding
}

func (c *capped) add(f Finding) {
	if len(c.out) < maxFindingsPerCheck {
		c.out = append(c.out, f)
		return
	}
	c.extra++
	c.proto = f
}

func (c *capped) done() []Finding {
	if c.extra > 0 {
		f := c.proto
		f.Msg = fmt.Sprintf("... and %d more like this", c.extra)
		f.Lines = nil
		c.out = append(c.out, f)
	}
	return c.out
}

// checkFinalRead: every record acknowledged to a publisher is read back at the
// end (invariant 14: sqlite keeps every committed record through kill -9;
// either provider keeps everything through SIGTERM), except what a power cut
// may drop inside its window. And the channel is readable from its floor up
// to the head the broker reports (invariant 1).
func (r *run) checkFinalRead(channel string) []Finding {
	note, ok := r.finalRead(channel)
	if !ok {
		return nil
	}
	var c capped
	conns := r.connsOf(note.ClientID)
	read := map[string]bool{}
	highest := int64(0)
	for _, o := range r.ops {
		if o.Op == L.OpAppendRead && o.Channel == channel && conns[o.Client] && o.Output != nil {
			read[o.Output.ID] = true
			highest = max(highest, o.Output.Offset)
		}
	}
	if note.Detail != "complete" {
		c.add(Finding{Check: "final-read", Invariant: 1, Channel: channel,
			Msg: fmt.Sprintf("the broker reported head %d, but a fresh consumer reading from the floor got no further than offset %d", note.Value, highest)})
	}
	for _, o := range r.ops {
		if o.Op != L.OpAppendPublish || o.Channel != channel || o.IsPending() || o.Output == nil ||
			!L.Succeeded(o.Output.Reason) || o.Return > note.T {
			continue
		}
		if read[o.Input.ID] || r.mayBeLost(o.Return, math.MaxInt64) {
			continue
		}
		c.add(Finding{Check: "acked-lost", Invariant: 14, Channel: channel, Lines: lines(o.Line),
			Msg: fmt.Sprintf("record %s was acknowledged to its publisher (reason 0x%02x) outside any power cut's loss window and is not in the channel at the end",
				o.Input.ID, o.Output.Reason)})
	}
	return c.done()
}

// lossFigures counts the acknowledged records power cuts dropped inside
// their windows, and how old the oldest such acknowledgement was at its cut.
func (r *run) lossFigures(channel string) (int, time.Duration) {
	note, ok := r.finalRead(channel)
	if !ok || note.Detail != "complete" {
		return 0, 0
	}
	conns := r.connsOf(note.ClientID)
	read := map[string]bool{}
	for _, o := range r.ops {
		if o.Op == L.OpAppendRead && o.Channel == channel && conns[o.Client] && o.Output != nil {
			read[o.Output.ID] = true
		}
	}
	n := 0
	var worst int64
	for _, o := range r.ops {
		if o.Op != L.OpAppendPublish || o.Channel != channel || o.IsPending() || o.Output == nil ||
			!L.Succeeded(o.Output.Reason) || o.Return > note.T || read[o.Input.ID] {
			continue
		}
		if c, ok := r.lossCut(o.Return, math.MaxInt64); ok {
			n++
			worst = max(worst, c.call-o.Return)
		}
	}
	return n, time.Duration(worst)
}

// checkRefusedNeverStored: a publish refused on its PUBACK is never in the
// channel (invariant 18: what a client is told matches what is stored).
func (r *run) checkRefusedNeverStored() []Finding {
	refused := map[string]L.Op{}
	for _, o := range r.ops {
		if o.Op == L.OpAppendPublish && !o.IsPending() && o.Output != nil && !L.Succeeded(o.Output.Reason) {
			refused[o.Channel+"\x00"+o.Input.ID] = o
		}
	}
	if len(refused) == 0 {
		return nil
	}
	var c capped
	seen := map[string]bool{}
	for _, o := range r.ops {
		if o.Op != L.OpAppendRead || o.Output == nil {
			continue
		}
		k := o.Channel + "\x00" + o.Output.ID
		if p, ok := refused[k]; ok && !seen[k] {
			seen[k] = true
			c.add(Finding{Check: "refused-stored", Invariant: 18, Channel: o.Channel, Lines: lines(p.Line, o.Line),
				Msg: fmt.Sprintf("record %s was refused to its publisher (0x%02x) and read at offset %d", o.Output.ID, p.Output.Reason, o.Output.Offset)})
		}
	}
	return c.done()
}

// observation is a record seen at an offset of a channel.
type observation struct {
	channel string
	offset  int64
	id      string
	t       int64
	line    int
}

func (r *run) observations() []observation {
	var obs []observation
	for _, o := range r.ops {
		if o.Output == nil || o.IsPending() {
			continue
		}
		switch o.Op {
		case L.OpAppendRead:
			obs = append(obs, observation{o.Channel, o.Output.Offset, o.Output.ID, o.Return, o.Line})
		case L.OpQueueDeadLetter:
			obs = append(obs, observation{o.Channel + "__dlq", o.Output.Offset, o.Output.ID, o.Return, o.Line})
		case L.OpLatestRead:
			// A latest value is a record too: its offset is its own for
			// ever (one counter per channel, docs/channels.md "`latest`"). Point reads
			// are recorded without one.
			if o.Output.Offset > 0 && o.Output.ID != "" {
				obs = append(obs, observation{o.Channel, o.Output.Offset, o.Output.ID, o.Return, o.Line})
			}
		}
	}
	slices.SortStableFunc(obs, func(a, b observation) int { return cmp.Compare(a.t, b.t) })
	return obs
}

// checkOffsets: an offset holds one record for ever, and a record has one
// offset for ever (invariants 8, 9) — through restarts, retention emptying a
// channel, and dead-lettering. The one exception is a power cut: what it may
// drop, its offset may be issued again (invariant 14).
func (r *run) checkOffsets() []Finding {
	type offKey struct {
		channel string
		offset  int64
	}
	type idKey struct{ channel, id string }
	byOff := map[offKey]observation{}
	byID := map[idKey]observation{}
	var reused, moved capped
	for _, o := range r.observations() {
		ok := offKey{o.channel, o.offset}
		if f, seen := byOff[ok]; !seen {
			byOff[ok] = o
		} else if f.id != o.id {
			if r.mayBeLost(f.t, o.t) {
				byOff[ok] = o
			} else {
				reused.add(Finding{Check: "offset-reused", Invariant: 9, Channel: o.channel, Lines: lines(f.line, o.line),
					Msg: fmt.Sprintf("offset %d was read as record %s and later as record %s", o.offset, f.id, o.id)})
			}
		}
		ik := idKey{o.channel, o.id}
		if f, seen := byID[ik]; !seen {
			byID[ik] = o
		} else if f.offset != o.offset {
			if r.mayBeLost(f.t, o.t) {
				byID[ik] = o
			} else {
				moved.add(Finding{Check: "offset-moved", Invariant: 8, Channel: o.channel, Lines: lines(f.line, o.line),
					Msg: fmt.Sprintf("record %s was read at offset %d and later at offset %d", o.id, f.offset, o.offset)})
			}
		}
	}
	return append(reused.done(), moved.done()...)
}

// checkOffsetOrder: offsets are monotonic within a channel (invariant 9). A
// record whose publish began after another's was acknowledged has the higher
// offset — including across a restart that found the channel emptied by
// retention, where MAX(offset)+1 over surviving rows starts again at 1. On
// the latest channel the records are its values and deletions, read by the
// subscriber (a deletion of a key with no value stores nothing, and is
// never read, so it takes no part).
func (r *run) checkOffsetOrder(channel string) []Finding {
	pubOp, readOp := L.OpAppendPublish, L.OpAppendRead
	if channel == chanState {
		pubOp, readOp = L.OpLatestPublish, L.OpLatestRead
	}
	offset := map[string]int64{}
	for _, o := range r.ops {
		if o.Op == readOp && o.Channel == channel && o.Output != nil && o.Output.Offset > 0 && o.Output.ID != "" {
			if _, ok := offset[o.Output.ID]; !ok {
				offset[o.Output.ID] = o.Output.Offset
			}
		}
	}
	type pub struct {
		op       L.Op
		off      int64
		lossCall int64 // the call of the cut that may undo it (MaxInt64: none)
	}
	var pubs []pub
	for _, o := range r.ops {
		if o.Op != pubOp || o.Channel != channel || o.IsPending() || o.Output == nil || !L.Succeeded(o.Output.Reason) {
			continue
		}
		off, ok := offset[o.Input.ID]
		if !ok {
			continue
		}
		p := pub{op: o, off: off, lossCall: math.MaxInt64}
		if c, ok := r.lossCut(o.Return, math.MaxInt64); ok {
			p.lossCall = c.call
		}
		pubs = append(pubs, p)
	}
	byCall := slices.Clone(pubs)
	slices.SortFunc(byCall, func(a, b pub) int { return cmp.Compare(a.op.Call, b.op.Call) })
	byRet := slices.Clone(pubs)
	slices.SortFunc(byRet, func(a, b pub) int { return cmp.Compare(a.op.Return, b.op.Return) })
	var safe *pub             // the highest offset no cut can undo
	lossy := map[int64]*pub{} // per cut: the highest offset it may undo
	var c capped
	i := 0
	for _, b := range byCall {
		for i < len(byRet) && byRet[i].op.Return < b.op.Call {
			a := &byRet[i]
			if a.lossCall == math.MaxInt64 {
				if safe == nil || a.off > safe.off {
					safe = a
				}
			} else if g := lossy[a.lossCall]; g == nil || a.off > g.off {
				lossy[a.lossCall] = a
			}
			i++
		}
		best := safe
		for call, g := range lossy {
			// A record a cut before b's publish may have undone does not
			// bound b's offset: its offset may have been issued again.
			if call > b.op.Call && (best == nil || g.off > best.off) {
				best = g
			}
		}
		if best != nil && b.off <= best.off {
			c.add(Finding{Check: "offset-order", Invariant: 9, Channel: channel, Lines: lines(best.op.Line, b.op.Line),
				Msg: fmt.Sprintf("record %s got offset %d although its publish began after record %s (offset %d) was acknowledged",
					b.op.Input.ID, b.off, best.op.Input.ID, best.off)})
		}
	}
	return c.done()
}

// checkFloors: a channel's floor only advances (invariant 1), across
// restarts too; a channel without retention keeps it at 1. A power cut may
// take back a deletion inside its window (invariant 14).
func (r *run) checkFloors() []Finding {
	byChannel := map[string][]Note{}
	var channels []string
	for _, n := range r.notes {
		if n.Kind != NoteFloor {
			continue
		}
		if _, ok := byChannel[n.Channel]; !ok {
			channels = append(channels, n.Channel)
		}
		byChannel[n.Channel] = append(byChannel[n.Channel], n)
	}
	var back, moved capped
	for _, ch := range channels {
		ns := byChannel[ch]
		slices.SortStableFunc(ns, func(a, b Note) int { return cmp.Compare(a.T, b.T) })
		prev := ns[0]
		for i, n := range ns {
			if ch == chanEvents && n.Value != 1 {
				moved.add(Finding{Check: "floor-moved", Invariant: 1, Channel: ch,
					Msg: fmt.Sprintf("floor %d on a channel nothing was ever removed from (its floor is 1)", n.Value)})
			}
			if i == 0 {
				continue
			}
			switch {
			case n.Value >= prev.Value:
				prev = n
			case r.mayBeLost(prev.T, n.T):
				prev = n
			default:
				back.add(Finding{Check: "floor-back", Invariant: 1, Channel: ch,
					Msg: fmt.Sprintf("floor went back from %d to %d", prev.Value, n.Value)})
			}
		}
	}
	return append(back.done(), moved.done()...)
}

// checkResume: a durable consumer is served from its stored position, which
// may lag what it acknowledged but never lead it — whatever the CONNACK said
// — so no record is skipped unseen (invariant 1). And one told its session is
// new (Session Present 0) inherits nothing: on a channel with no retention it
// starts at the floor, 1 (invariant 18: "a device told its session is new is
// served the old one").
func (r *run) checkResume(channel string) []Finding {
	first := map[int]L.Op{}
	for _, o := range r.ops {
		if o.Op != L.OpAppendRead || o.Channel != channel || o.Output == nil {
			continue
		}
		if f, ok := first[o.Client]; !ok || o.Return < f.Return {
			first[o.Client] = o
		}
	}
	acked := map[int]int64{}
	for _, n := range r.notes {
		if n.Kind == NoteAcked && n.Channel == channel {
			acked[n.Conn] = max(acked[n.Conn], n.Value)
		}
	}
	byClient := map[string][]Note{}
	var clients []string
	for _, n := range r.notes {
		if n.Kind == NoteConnack && n.Channel == channel {
			if _, ok := byClient[n.ClientID]; !ok {
				clients = append(clients, n.ClientID)
			}
			byClient[n.ClientID] = append(byClient[n.ClientID], n)
		}
	}
	var skip, inherited capped
	for _, id := range clients {
		ns := byClient[id]
		slices.SortStableFunc(ns, func(a, b Note) int { return cmp.Compare(a.T, b.T) })
		bound := int64(0) // acknowledged through, over every earlier connection
		for _, n := range ns {
			if f, has := first[n.Conn]; has {
				if f.Output.Offset > bound+1 {
					skip.add(Finding{Check: "resume-skip", Invariant: 1, Channel: channel, Lines: lines(f.Line),
						Msg: fmt.Sprintf("%s reconnected (Session Present %v) and was first served offset %d, having acknowledged only through %d: offsets %d..%d skipped",
							id, b01(n.SessionPresent), f.Output.Offset, bound, bound+1, f.Output.Offset-1)})
				}
				if !n.SessionPresent && f.Output.Offset != 1 {
					inherited.add(Finding{Check: "resume-new-session", Invariant: 18, Channel: channel, Lines: lines(f.Line),
						Msg: fmt.Sprintf("%s was told its session is new (Session Present 0) and was first served offset %d, not the floor 1: it was served the old session's position", id, f.Output.Offset)})
				}
			}
			bound = max(bound, acked[n.Conn])
		}
	}
	return append(skip.done(), inherited.done()...)
}

func b01(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkDeadLetters: the dead-letter move is atomic (invariant 5). At the
// end, the dead-letter channel holds each job at most once (twice means it
// was moved while still in the queue), and every dead letter read during the
// run is still there (gone means it left the queue and is nowhere) unless a
// power cut may have undone the move inside its window.
func (r *run) checkDeadLetters() []Finding {
	channel := chanJobs + "__dlq"
	note, ok := r.finalRead(channel)
	if !ok {
		return nil
	}
	var c capped
	conns := r.connsOf(note.ClientID)
	final := map[string][]int64{}
	var order []string
	for _, o := range r.ops {
		if o.Op != L.OpQueueDeadLetter || !conns[o.Client] || o.Output == nil {
			continue
		}
		id := o.Output.ID
		if _, ok := final[id]; !ok {
			order = append(order, id)
		}
		if !slices.Contains(final[id], o.Output.Offset) {
			final[id] = append(final[id], o.Output.Offset)
		}
	}
	if note.Detail != "complete" {
		c.add(Finding{Check: "final-read", Invariant: 1, Channel: channel,
			Msg: fmt.Sprintf("the broker reported head %d, but a fresh consumer reading from the floor did not get there", note.Value)})
	}
	for _, id := range order {
		if offs := final[id]; len(offs) > 1 {
			c.add(Finding{Check: "dead-letter-twice", Invariant: 5, Channel: channel,
				Msg: fmt.Sprintf("job %s is in the dead-letter channel %d times (offsets %v)", id, len(offs), offs)})
		}
	}
	reported := map[string]bool{}
	for _, o := range r.ops {
		if o.Op != L.OpQueueDeadLetter || conns[o.Client] || o.Output == nil || o.Return > note.T {
			continue
		}
		id := o.Output.ID
		if _, ok := final[id]; ok || reported[id] || r.mayBeLost(o.Return, math.MaxInt64) {
			continue
		}
		reported[id] = true
		c.add(Finding{Check: "dead-letter-lost", Invariant: 5, Channel: channel, Lines: lines(o.Line),
			Msg: fmt.Sprintf("job %s was read from the dead-letter channel at offset %d and is not there at the end", id, o.Output.Offset)})
	}
	return c.done()
}

// explainUnresolved looks, for a job the queue resolution check found
// unresolved, for an acknowledgement that named a Delivery ID no longer
// current when it was applied: one carried across a restart (invariant 15),
// or one whose lease could already have timed out, or whose job had already
// been offered again (invariant 3).
func (r *run) explainUnresolved(channel string, ls []int) (int, string) {
	var id string
	for _, l := range ls {
		if o, ok := r.byLine[l]; ok {
			switch o.Op {
			case L.OpQueuePublish:
				id = o.Input.ID
			case L.OpQueueDeliver:
				id = o.Output.ID
			}
		}
	}
	if id == "" {
		return 0, ""
	}
	var deliveries, acks, ends []L.Op
	for _, o := range r.ops {
		if o.Channel != channel {
			continue
		}
		switch {
		case o.Op == L.OpQueueDeliver && o.Output != nil && o.Output.ID == id:
			deliveries = append(deliveries, o)
		case o.Op == L.OpQueueAnswer && o.Input.ID == id && o.Input.Result == L.ResultAck && !o.IsPending():
			acks = append(acks, o)
		case o.Op == L.OpQueueLeaseEnd && o.Input.ID == id:
			ends = append(ends, o)
		}
	}
	for _, a := range acks {
		var d *L.Op
		for i := range deliveries {
			if bytes.Equal(deliveries[i].Output.Delivery, a.Input.Delivery) {
				d = &deliveries[i]
				break
			}
		}
		if d == nil {
			continue
		}
		for _, c := range r.crashes {
			if c.call > d.Return && c.call < a.Call {
				return 15, fmt.Sprintf("an ack of Delivery ID %x, received before a restart, was sent after it (history line %d): a lease the restart should have ended appears to have resolved the job", a.Input.Delivery, a.Line)
			}
		}
		var endedBefore *L.Op
		for i, e := range ends {
			if bytes.Equal(e.Input.Delivery, a.Input.Delivery) && e.Call < a.Return {
				endedBefore = &ends[i]
				break
			}
		}
		for _, other := range deliveries {
			if other.Return <= d.Return || bytes.Equal(other.Output.Delivery, d.Output.Delivery) {
				continue
			}
			if other.Return < a.Call || endedBefore != nil {
				why := "after the job was offered again"
				if other.Return >= a.Call {
					why = fmt.Sprintf("after its lease could have ended (%s, history line %d), and the job was offered again", endedBefore.Input.Cause, endedBefore.Line)
				}
				return 3, fmt.Sprintf("connection %d acked Delivery ID %x (history line %d) %s as %x (attempt %d, line %d), which then went nowhere: the superseded ack appears to have resolved the job",
					a.Client, a.Input.Delivery, a.Line, why, other.Output.Delivery, other.Output.Attempt, other.Line)
			}
		}
	}
	return 0, ""
}

func lines(ls ...int) []int {
	var out []int
	for _, l := range ls {
		if l > 0 {
			out = append(out, l)
		}
	}
	return out
}
