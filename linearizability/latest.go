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
// register per key where an empty payload deletes (RFC 0003 §9). A read must
// return the value of the latest write linearized before it, or nothing after
// a delete or before any write. A write refused by its PUBACK never shows; a
// pending one may. A power cut may revert a key across the writes in its loss
// window, newest first (invariant 14).
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
			if !s.present {
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
		n := &latestState{present: len(op.Input.Payload) > 0, id: op.Input.ID, payload: string(op.Input.Payload), lossCut: e.lossCut}
		if e.lossCut != 0 {
			// Keep what a revert by this cut can reach, and no further.
			p := *s
			if p.lossCut != e.lossCut {
				p.prev = nil
			}
			n.prev = &p
		}
		if !n.present {
			n.id = "" // a delete leaves no value to tell apart
		}
		switch {
		case e.pending:
			return []any{s, n}
		case !Succeeded(op.Output.Reason):
			return []any{s}
		}
		return []any{n}
	case OpLatestRead:
		out := op.Output
		if len(out.Payload) == 0 {
			if s.present {
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

// CheckLatestOrder checks "never older after newer" (RFC 0003 §9): on each
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
