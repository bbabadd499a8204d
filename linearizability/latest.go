package linearizability

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/anishathalye/porcupine"
)

// latestState is one key of a latest channel: a register with delete.
type latestState struct {
	present bool
	// id is the value's Message ID; with no value, the tombstone's — the
	// delete that removed it — or "" (never set, or reverted before it).
	id      string
	payload string
	// lossCut: the power cut that may undo the write that made this state;
	// prev is the state before it, kept only while such a cut may revert to
	// it (a chain of writes all in one cut's loss window).
	lossCut int
	prev    *latestState
}

func latestEqual(a, b *latestState) bool {
	for {
		if a == b {
			return true
		}
		if a == nil || b == nil || a.present != b.present || a.id != b.id || a.payload != b.payload || a.lossCut != b.lossCut {
			return false
		}
		a, b = a.prev, b.prev
	}
}

// LatestModel is a latest channel's keys, partitioned per channel and key: a
// register per key where an empty payload deletes (docs/channels.md "`latest`"). A read must
// return the value of the latest write linearized before it, or nothing after
// a delete or before any write. A write refused by its PUBACK never shows; a
// pending one may. A power cut may revert a key across the writes in its loss
// window, newest first (invariant 14).
//
// A delete of a key with a value stores a tombstone under the delete's
// Message ID, which is what a subscriber is sent live (empty payload, the
// delete's saguin-id and offset); a delete of a key with no value stores
// nothing (docs/channels.md "`latest`"). So a read of "no value" that names an id must name
// the tombstone in place; one that names none (a point read's empty answer)
// fits any absence.
func LatestModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(h, func(e *event) string { return e.Channel + "\x00" + e.Input.Key })
		},
		Init: func() []any { return []any{&latestState{}} },
		Step: latestStep,
		Equal: func(a, b any) bool {
			return latestEqual(a.(*latestState), b.(*latestState))
		},
		DescribeOperation: func(in, _ any) string { return describeEvent(in.(*event)) },
		DescribeState: func(state any) string {
			s := state.(*latestState)
			switch {
			case !s.present && s.id != "":
				return "no value (deleted by " + s.id + ")"
			case !s.present:
				return "no value"
			}
			return fmt.Sprintf("%s = %s", s.id, short([]byte(s.payload)))
		},
	}
	return nm.ToModel()
}

func latestStep(state, input, _ any) []any {
	s := state.(*latestState)
	e := input.(*event)
	op := e.Op
	switch op.Op {
	case OpLatestPublish:
		if len(op.Input.Payload) == 0 && !s.present {
			return []any{s} // a delete of no value stores nothing
		}
		n := &latestState{present: len(op.Input.Payload) > 0, id: op.Input.ID, payload: string(op.Input.Payload), lossCut: e.lossCut}
		if e.lossCut != 0 {
			// Keep what a revert by this cut can reach, and no further.
			p := *s
			if p.lossCut != e.lossCut {
				p.prev = nil
			}
			n.prev = &p
		}
		switch {
		case e.pending && e.seenOnce:
			return []any{n} // a read shows it: it took effect
		case e.pending:
			return []any{s, n}
		case !Succeeded(op.Output.Reason):
			return []any{s}
		}
		return []any{n}
	case OpLatestRead:
		out := op.Output
		if len(out.Payload) == 0 {
			if s.present || (out.ID != "" && out.ID != s.id) {
				return nil
			}
			return []any{s}
		}
		if !s.present || s.payload != string(out.Payload) || (out.ID != "" && out.ID != s.id) {
			return nil
		}
		return []any{s}
	case OpBrokerRestart:
		return []any{s}
	case OpBrokerPowerCut:
		out := []any{s}
		for cur := s; cur.lossCut == e.cut && cur.prev != nil; cur = cur.prev {
			out = append(out, cur.prev)
		}
		return out
	}
	return nil
}

// narrowLatest shrinks porcupine's search over a latest history without
// changing its verdict. Where values are unique (every value a chaos history
// writes is), a read names the write it saw; then:
//   - a read of a value cannot be linearized before that write's call, so
//     its call moves up to it. A subscriber's value is recorded from its
//     SUBSCRIBE on (all it knows for sure), which left to itself makes every
//     such read concurrent with the whole run and the search exponential;
//     a deletion the subscriber was sent names its tombstone's delete by
//     saguin-id (which the model holds it to), and moves up the same way;
//   - a pending write a read names alone took effect, before the first such
//     read returned (seenOnce, and a shorter interval).
//
// A write refused by its PUBACK, or begun after the read returned, is not a
// candidate: a read of it is left as it is, for the model to reject.
// (TestPropertyNarrowLatestKeepsTheVerdict holds this to "same verdict".)
func narrowLatest(evs []*event) {
	type valKey struct{ channel, key, payload string }
	writes := map[valKey][]*event{}
	for _, e := range evs {
		if e.Op.Op == OpLatestPublish && (e.pending || Succeeded(e.Output.Reason)) {
			k := valKey{e.Channel, e.Input.Key, string(e.Input.Payload)}
			writes[k] = append(writes[k], e)
		}
	}
	firstRead := map[*event]int64{} // a pending write a read names alone: that read's earliest return
	for _, e := range evs {
		if e.Op.Op != OpLatestRead {
			continue
		}
		out := e.Output
		if len(out.Payload) == 0 && out.ID == "" {
			continue // "no value": any delete, or none, explains it
		}
		var cands []*event
		for _, w := range writes[valKey{e.Channel, e.Input.Key, string(out.Payload)}] {
			// A write begun after the read returned cannot be what it saw.
			if (out.ID == "" || w.Input.ID == out.ID) && w.Call <= e.Return {
				cands = append(cands, w)
			}
		}
		if len(cands) == 0 {
			continue
		}
		from := cands[0].Call
		for _, w := range cands {
			from = min(from, w.Call)
		}
		e.Call = max(e.Call, from)
		if len(cands) == 1 && cands[0].pending {
			w := cands[0]
			if t, ok := firstRead[w]; !ok || e.Return < t {
				firstRead[w] = e.Return
			}
		}
	}
	for w, t := range firstRead {
		w.seenOnce = true
		w.boundReturn = max(w.Call, min(w.boundReturn, t))
	}
	slices.SortStableFunc(evs, func(a, b *event) int { return cmp.Compare(a.Call, b.Call) })
}

// CheckLatestOrder checks "never older after newer" (docs/channels.md "`latest`"): on each
// reader connection, the offsets of one key's values never go back. Reads
// without an offset (point reads) are not part of it.
func CheckLatestOrder(ops []Op) []Violation {
	type key struct {
		channel, key string
		client       int
	}
	streams := map[key][]Op{}
	var order []key
	for _, op := range ops {
		if op.Op != OpLatestRead || op.IsPending() || op.Output == nil || op.Output.Offset == 0 || op.Input == nil {
			continue
		}
		k := key{op.Channel, op.Input.Key, op.Client}
		if _, ok := streams[k]; !ok {
			order = append(order, k)
		}
		streams[k] = append(streams[k], op)
	}
	var vs []Violation
	for _, k := range order {
		s := streams[k]
		slices.SortStableFunc(s, func(a, b Op) int { return cmp.Compare(a.Return, b.Return) })
		for i := 1; i < len(s); i++ {
			if s[i].Output.Offset < s[i-1].Output.Offset {
				vs = append(vs, Violation{Check: "latest-order", Channel: k.channel, Lines: []int{s[i-1].Line, s[i].Line},
					Msg: fmt.Sprintf("client %d got key %q at offset %d after offset %d", k.client, k.key, s[i].Output.Offset, s[i-1].Output.Offset)})
			}
		}
	}
	return vs
}
