package linearizability

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// appendState is the acknowledged log of one append channel: record i is at
// offset i+1 (offsets start at 1, spec "Seek").
type appendState struct {
	log pvec
	// tokens counts pending publishes nobody read that may still take
	// effect (until their connection's crash); tokenCut is the power cut
	// that would drop them if they did.
	tokens, tokenCut int
	// read is every offset some read in the history shows (the same map for
	// the whole partition; not part of the state's identity). An anonymous
	// record can never sit at one: that read would find it.
	read map[int64]bool
}

// AppendModel is a channel's log as its clients see it. A publish appends at
// the next offset; a read of offset n must return the record at n; a head must
// equal the length + 1. So:
//   - an offset holds one record for ever — two reads of n that disagree
//     cannot both be satisfied (invariant 9: offsets never reused);
//   - a read of a record nobody published, or whose publish was refused, has
//     no linearization;
//   - a pending publish may be in the log or not, but once at most: one op
//     appends once;
//   - an acknowledged publish followed by a head and reads of every offset
//     below it must appear among them: an acknowledged record cannot be lost
//     (except within a power cut's loss window, invariant 14).
//
// It is nondeterministic only where the client cannot know. A pending
// publish whose record a read saw, and the only publish of that id, took
// effect. A pending publish nobody read may have taken effect at any moment
// before its connection's crash, or never: it is linearized at its call as a
// token, and the token becomes an anonymous record (or nothing) at the next
// step that depends on the log's length. That keeps porcupine's search
// linear where a pending publish left open to the end of the history would
// make it try every placement, and keeps the state set small: which unread
// record took an offset is nothing any read can tell. A power cut keeps or
// drops its window's tail.
func AppendModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(h, func(e *event) string { return e.Channel })
		},
		Init: func() []any { return []any{appendState{}} },
		Step: appendStep,
		Equal: func(a, b any) bool {
			x, y := a.(appendState), b.(appendState)
			return x.tokens == y.tokens && x.tokenCut == y.tokenCut && x.log.equal(y.log)
		},
		Hash: func(s any) uint64 {
			x := s.(appendState)
			return x.log.hash ^ uint64(x.log.n) ^ uint64(x.tokens)<<40 ^ uint64(x.tokenCut)<<52
		},
		DescribeOperation: func(in, _ any) string { return describeEvent(in.(*event)) },
		DescribeState:     describeAppend,
	}
	return nm.ToModel()
}

// markAppendPending tells each pending publish whether a read saw its record:
// seenOnce when its id was read and it is the only publish of that id in the
// channel (so it took effect, before the first such read); unseen when no read
// shows its id. It also hands every publish the set of offsets read in its
// channel (placeAnonymous), and, where the reads pin it, the offset it must
// have taken (wantOffset).
func markAppendPending(evs []*event) {
	type key struct{ channel, id string }
	read := map[key]bool{}
	pubs := map[key]int{}
	offsets := map[string]map[int64]bool{}
	firstRead := map[key]int64{}
	at := map[key]int64{} // the one offset reads show an id at; -1: several
	for _, e := range evs {
		switch e.Op.Op {
		case OpAppendRead:
			k := key{e.Channel, e.Output.ID}
			if o, ok := at[k]; !ok {
				at[k] = e.Output.Offset
			} else if o != e.Output.Offset {
				at[k] = -1
			}
			if t, ok := firstRead[k]; !ok || e.Return < t {
				firstRead[k] = e.Return
			}
			read[k] = true
			if offsets[e.Channel] == nil {
				offsets[e.Channel] = map[int64]bool{}
			}
			offsets[e.Channel][e.Output.Offset] = true
		case OpAppendPublish:
			pubs[key{e.Channel, e.Input.ID}]++
		}
	}
	for _, e := range evs {
		if e.Op.Op != OpAppendPublish {
			continue
		}
		e.channelReads = offsets[e.Channel]
		k := key{e.Channel, e.Input.ID}
		e.everRead = read[k]
		if o := at[k]; o > 0 && pubs[k] == 1 {
			// The only publish of an id read at one offset appended
			// when the log held offset-1 records. This is what keeps the
			// search linear: it fixes the order of every record read.
			e.wantOffset = o
		}
		if !e.pending {
			continue
		}
		e.seenOnce = read[k] && pubs[k] == 1
		e.unseen = !read[k]
		if e.seenOnce {
			// It took effect before the first read that shows it: a
			// short interval keeps porcupine from trying it everywhere.
			e.boundReturn = max(e.Call, min(e.boundReturn, firstRead[k]))
		}
	}
}

func appendStep(state, input, _ any) []any {
	s := state.(appendState)
	e := input.(*event)
	op := e.Op
	switch op.Op {
	case OpAppendPublish:
		r := logRec{id: op.Input.ID, payload: string(op.Input.Payload), lossCut: e.lossCut}
		if !e.everRead {
			// No read shows this id, so no read can tell its record
			// from any other unread one: storing it anonymously lets
			// logs that differ only in where unread records sit merge.
			r.id, r.payload = "", ""
		}
		s.read = e.channelReads
		switch {
		case !e.pending && !Succeeded(op.Output.Reason):
			return []any{s} // refused: nothing was written
		case e.unseen:
			// Nobody read it: it may take effect at any later moment
			// before its crash, or never (placeAnonymous).
			n := s
			n.tokens++
			n.tokenCut = e.lossCut
			return []any{n}
		}
		var out []any
		for _, x := range s.placeAnonymous() {
			if e.pending && !e.seenOnce {
				out = append(out, x) // took effect or not
			}
			if e.wantOffset != 0 && int64(x.log.len())+1 != e.wantOffset {
				continue // the reads put it elsewhere: not here, not now
			}
			out = append(out, appendState{log: x.log.push(r), tokens: x.tokens, tokenCut: x.tokenCut, read: x.read})
		}
		return out
	case OpAppendRead:
		n := op.Output.Offset
		if n < 1 || n > int64(s.log.len()) {
			return nil // read a record not (yet) in the log
		}
		r := s.log.get(int(n - 1))
		if r.id != op.Output.ID || r.payload != string(op.Output.Payload) {
			return nil // offset n holds another record
		}
		return []any{s}
	case OpAppendHead:
		var out []any
		for _, x := range s.placeAnonymous() {
			if op.Output.Next == int64(x.log.len())+1 {
				out = append(out, x)
			}
		}
		return out
	case OpBrokerRestart:
		// kill -9: every committed record survives whole (invariant 14);
		// pending publishes took effect before it or never.
		var out []any
		for _, x := range s.placeAnonymous() {
			out = append(out, appendState{log: x.log, read: x.read})
		}
		return out
	case OpBrokerPowerCut:
		// The tail written within the loss window may go, as a suffix:
		// storage loses the last commits, never one from the middle.
		var out []any
		for _, x := range s.placeAnonymous() {
			out = append(out, appendState{log: x.log, read: x.read})
			for k := x.log.len(); k > 0 && x.log.get(k-1).lossCut == e.cut; k-- {
				out = append(out, appendState{log: x.log.truncate(k - 1), read: x.read})
			}
		}
		return out
	}
	return nil
}

// placeAnonymous returns the states in which 0..tokens of the unread pending
// publishes have taken effect, as anonymous records at the end of the log —
// the choice that matters before anything that depends on the log's length.
// A placement that would put an anonymous record at an offset some read shows
// is left out: that read, which must come later, would reject it anyway.
func (s appendState) placeAnonymous() []appendState {
	out := make([]appendState, 0, 1)
	x := s
	for {
		out = append(out, x)
		if x.tokens == 0 || x.read[int64(x.log.len())+1] {
			return out
		}
		x = appendState{log: x.log.push(logRec{lossCut: x.tokenCut}), tokens: x.tokens - 1, tokenCut: x.tokenCut, read: x.read}
	}
}

// Violation is a failed whole-history check (one that is not a
// linearizability question).
type Violation struct {
	Check   string // which check
	Channel string
	Lines   []int // history lines involved (0 when not read from a file)
	Msg     string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: channel %q: %s (lines %v)", v.Check, v.Channel, v.Msg, v.Lines)
}

// CheckAppendReads checks replay order: on each reader connection, the offsets
// delivered from a channel strictly increase — and with dense, step by exactly
// one, so a reader is never silently moved past records (invariant 1: the
// "you are caught up" vs "your position was deleted" failure shows up here as
// a gap). Use dense only where nothing makes a reader skip on purpose
// (retention, partitioning, No Local).
func CheckAppendReads(ops []Op, dense bool) []Violation {
	type key struct {
		channel string
		client  int
	}
	streams := map[key][]Op{}
	var order []key
	for _, op := range ops {
		if op.Op != OpAppendRead || op.IsPending() || op.Output == nil {
			continue
		}
		k := key{op.Channel, op.Client}
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
			prev, cur := s[i-1].Output.Offset, s[i].Output.Offset
			switch {
			case cur <= prev:
				vs = append(vs, Violation{Check: "append-order", Channel: k.channel, Lines: []int{s[i-1].Line, s[i].Line},
					Msg: fmt.Sprintf("client %d read offset %d after %d", k.client, cur, prev)})
			case dense && cur != prev+1:
				vs = append(vs, Violation{Check: "append-dense", Channel: k.channel, Lines: []int{s[i-1].Line, s[i].Line},
					Msg: fmt.Sprintf("client %d read offset %d after %d, skipping %d record(s)", k.client, cur, prev, cur-prev-1)})
			}
		}
	}
	return vs
}

func describeAppend(state any) string {
	x := state.(appendState)
	l := x.log
	var b strings.Builder
	fmt.Fprintf(&b, "%d records", l.len())
	from := max(0, l.len()-3)
	if from > 0 {
		b.WriteString(" …")
	}
	for i := from; i < l.len(); i++ {
		id := l.get(i).id
		if id == "" {
			id = "(unread pending)"
		}
		fmt.Fprintf(&b, " %d:%s", i+1, id)
	}
	if x.tokens > 0 {
		fmt.Fprintf(&b, "; %d unread pending publish(es) may yet land", x.tokens)
	}
	return b.String()
}
