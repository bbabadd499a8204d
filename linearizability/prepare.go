package linearizability

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// event is what every model's Step receives as its input: the operation plus
// what preprocessing learned about it from the crashes around it. Output is
// unused (nil): the operation carries its own.
type event struct {
	Op
	// pending: the response never came. The write may have taken effect or
	// not, at any moment between its call and the end of the next crash
	// (the connection it was sent on died with the process).
	pending bool
	// lossCut is the 1-based number of the power cut that may undo this
	// write: the cut whose loss window holds its acknowledgement, or, for a
	// pending write, the cut that ended its connection. 0: nothing can undo it
	// (invariant 14: a committed record survives kill -9 whole).
	lossCut int
	// cut is this operation's own number when it is a broker.power_cut.
	cut int
	// boundReturn is, for a pending write, the end of the first crash to
	// begin after its call (or the end of the history): it takes effect
	// before that crash completes, or never.
	boundReturn int64
	// For a pending append.publish (markAppendPending): a read saw its
	// record and no other publish has its id / no read saw its id.
	seenOnce, unseen bool
	channelReads     map[int64]bool // append.publish: offsets read in its channel
	wantOffset       int64          // append.publish: the offset reads pin it to (0: none)
	everRead         bool           // append.publish: some read shows its id
}

func (e *event) String() string {
	return describeEvent(e)
}

// isObservation reports whether op only tells what the client saw; a pending
// observation carries no information and is dropped.
func isObservation(op string) bool {
	switch op {
	case OpAppendRead, OpAppendHead, OpQueueDeliver, OpQueueDeadLetter, OpLatestRead:
		return true
	}
	return false
}

func isWrite(op string) bool {
	switch op {
	case OpAppendPublish, OpQueuePublish, OpQueueAnswer, OpLatestPublish:
		return true
	}
	return false
}

func isCrash(op string) bool { return op == OpBrokerRestart || op == OpBrokerPowerCut }

// prepare turns the operations a model checks (those whose op starts with
// prefix, plus the broker's crashes) into porcupine operations. It:
//   - drops pending observations;
//   - bounds a pending write by the end of the next crash (or the end of the
//     history), because a publish cannot take effect after the process it was
//     sent to has gone and come back;
//   - marks the writes a power cut may undo (lossCut).
//
// The result is sorted by call time, so partitions are deterministic.
func prepare(ops []Op, prefix string) ([]*event, error) {
	var crashes []*event
	var evs []*event
	var maxT int64
	for _, op := range ops {
		if err := Validate(op); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadHistory, op.Line, err)
		}
		maxT = max(maxT, op.Call, op.Return)
		if !strings.HasPrefix(op.Op, prefix) && !isCrash(op.Op) {
			continue
		}
		if op.IsPending() && isObservation(op.Op) {
			continue
		}
		e := &event{Op: op, pending: op.IsPending()}
		if isCrash(op.Op) {
			if op.IsPending() {
				// A crash we never saw end bounds nothing after it.
				e.Return = math.MaxInt64 - 1
			}
			crashes = append(crashes, e)
		}
		evs = append(evs, e)
	}
	if maxT >= math.MaxInt64-2 {
		return nil, fmt.Errorf("%w: timestamp too large", ErrBadHistory)
	}
	slices.SortStableFunc(crashes, func(a, b *event) int { return cmp.Compare(a.Call, b.Call) })
	ncut := 0
	for _, c := range crashes {
		if c.Op.Op == OpBrokerPowerCut {
			ncut++
			c.cut = ncut
		}
		if c.Return == math.MaxInt64-1 {
			c.Return = maxT + 1
		}
	}
	for _, e := range evs {
		if isCrash(e.Op.Op) {
			continue
		}
		if e.pending {
			e.Return = maxT + 1
			e.boundReturn = maxT + 1
			// The first crash to begin after the call ends the connection.
			for _, c := range crashes {
				if c.Call >= e.Call {
					e.boundReturn = max(c.Return, e.Call)
					e.lossCut = c.cut // 0 for a plain restart: committed survives
					break
				}
			}
			continue
		}
		if !isWrite(e.Op.Op) && e.Op.Op != OpQueueDeadLetter {
			continue
		}
		// An acknowledgement that arrived within a power cut's loss window
		// (or after the cut, before the restart) may describe a lost write.
		for _, c := range crashes {
			if c.cut == 0 {
				continue
			}
			if e.Return >= c.Call-c.Input.LossNs && e.Return <= c.Return {
				e.lossCut = c.cut
				break
			}
		}
	}
	slices.SortStableFunc(evs, func(a, b *event) int { return cmp.Compare(a.Call, b.Call) })
	return evs, nil
}

// toPorcupine wraps events as porcupine operations; Metadata is the history
// line, shown in the visualisation. A pending write's interval ends with the
// crash that bounds it: the model offers "took effect" and "did not" as
// states, and keeping the window short keeps porcupine's search — which must
// try the write at every point of its interval — small.
func toPorcupine(evs []*event) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(evs))
	for _, e := range evs {
		ret := e.Return
		switch {
		case e.unseen:
			ret = e.Call // a token; see AppendModel
		case e.pending && !isCrash(e.Op.Op):
			ret = e.boundReturn
		}
		out = append(out, porcupine.Operation{
			ClientId: e.Client,
			Input:    e,
			Call:     e.Call,
			Return:   ret,
			Metadata: fmt.Sprintf("line %d", e.Line),
		})
	}
	return out
}

// partitionBy groups operations by key; crash operations are copied into
// every group whose span they overlap, since a restart touches every channel.
// Groups come back in first-appearance order.
func partitionBy(history []porcupine.Operation, key func(*event) string) [][]porcupine.Operation {
	var crashes []porcupine.Operation
	idx := map[string]int{}
	var groups [][]porcupine.Operation
	for _, o := range history {
		e := o.Input.(*event)
		if isCrash(e.Op.Op) {
			crashes = append(crashes, o)
			continue
		}
		k := key(e)
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], o)
	}
	if len(crashes) == 0 {
		return groups
	}
	for i, g := range groups {
		// Only crashes within the group's span matter: before its first
		// call the state is the initial one, which a crash leaves alone,
		// and after its last return nothing observes the state. Copying
		// every crash into every job's partition would make a long run's
		// queue check quadratic.
		// A lease_end is always legal and open to the end of the history;
		// a crash after everything else in the group changes nothing any
		// operation could object to, so it does not stretch the span.
		lo, hi := g[0].Call, g[0].Call
		for _, o := range g {
			lo, hi = min(lo, o.Call), max(hi, o.Call)
			if o.Input.(*event).Op.Op != OpQueueLeaseEnd {
				hi = max(hi, o.Return)
			}
		}
		var last *porcupine.Operation
		for j := range crashes {
			c := &crashes[j]
			if c.Return < lo || c.Call > hi {
				continue
			}
			// Two kill -9 restarts with nothing of this group between
			// them act as one: a restart ends the leases and nothing else.
			if last != nil && isRestart(*last) && isRestart(*c) && !anyBetween(g, last.Call, c.Return) {
				continue
			}
			groups[i] = append(groups[i], *c)
			last = c
		}
	}
	return groups
}

func isRestart(o porcupine.Operation) bool { return o.Input.(*event).Op.Op == OpBrokerRestart }

// anyBetween reports whether an operation of g other than a lease_end (which
// a restart makes moot) could be linearized within [from, to].
func anyBetween(g []porcupine.Operation, from, to int64) bool {
	for _, o := range g {
		if o.Input.(*event).Op.Op == OpQueueLeaseEnd {
			continue
		}
		if o.Call <= to && o.Return >= from {
			return true
		}
	}
	return false
}

func describeEvent(e *event) string {
	var b strings.Builder
	op := e.Op
	b.WriteString(op.Op)
	in, out := op.Input, op.Output
	switch op.Op {
	case OpAppendPublish, OpQueuePublish:
		fmt.Fprintf(&b, "(%s)", in.ID)
	case OpLatestPublish:
		if len(in.Payload) == 0 {
			fmt.Fprintf(&b, "(%s, %s, delete)", in.Key, in.ID)
		} else {
			fmt.Fprintf(&b, "(%s, %s, %s)", in.Key, in.ID, short(in.Payload))
		}
	case OpQueueAnswer:
		fmt.Fprintf(&b, "(%s, %s, d=%x)", in.ID, in.Result, in.Delivery)
	case OpQueueLeaseEnd:
		fmt.Fprintf(&b, "(%s, %s, d=%x)", in.ID, in.Cause, in.Delivery)
	case OpLatestRead:
		fmt.Fprintf(&b, "(%s)", in.Key)
	case OpBrokerPowerCut:
		fmt.Fprintf(&b, "(#%d, loss %dns)", e.cut, in.LossNs)
	}
	switch {
	case e.pending:
		b.WriteString(" -> pending")
	case out == nil:
	case op.Op == OpAppendRead:
		fmt.Fprintf(&b, " -> %d: %s", out.Offset, out.ID)
	case op.Op == OpAppendHead:
		fmt.Fprintf(&b, " -> next %d", out.Next)
	case op.Op == OpQueueDeliver:
		fmt.Fprintf(&b, " -> %s @%d attempt %d d=%x", out.ID, out.Offset, out.Attempt, out.Delivery)
		if op.Input != nil && op.Input.Dup {
			b.WriteString(" dup")
		}
	case op.Op == OpQueueDeadLetter:
		fmt.Fprintf(&b, " -> %s dlq@%d attempts %d", out.ID, out.Offset, out.Attempt)
	case op.Op == OpLatestRead:
		if len(out.Payload) == 0 {
			b.WriteString(" -> none")
		} else {
			fmt.Fprintf(&b, " -> %s %s", out.ID, short(out.Payload))
		}
	default:
		fmt.Fprintf(&b, " -> 0x%02x", out.Reason)
	}
	if e.lossCut != 0 {
		fmt.Fprintf(&b, " [may be lost at cut #%d]", e.lossCut)
	}
	return b.String()
}

func short(p []byte) string {
	const n = 24
	if len(p) > n {
		return fmt.Sprintf("%q…", p[:n])
	}
	return fmt.Sprintf("%q", p)
}
