package harness

import (
	"slices"
	"testing"
	"time"

	L "saguin.dev/linearizability"
)

// hist builds a synthetic history and its notes, one operation per line, on
// a clock that advances a millisecond per step.
type hist struct {
	t     int64
	ops   []L.Op
	notes []Note
}

func newHist() *hist { return &hist{t: 1_000_000_000} }

func (h *hist) tick() int64 {
	h.t += int64(time.Millisecond)
	return h.t
}

func (h *hist) add(o L.Op) L.Op {
	o.Line = len(h.ops) + 1
	h.ops = append(h.ops, o)
	return o
}

func (h *hist) note(n Note) {
	if n.T == 0 {
		n.T = h.tick()
	}
	h.notes = append(h.notes, n)
}

func (h *hist) publish(client int, op, channel, id string) L.Op {
	call := h.tick()
	return h.add(L.Op{Client: client, Op: op, Channel: channel, Call: call, Return: h.tick(),
		Input: &L.Input{ID: id, Payload: []byte(id)}, Output: &L.Output{Reason: 0}})
}

func (h *hist) read(client int, channel string, offset int64, id string) L.Op {
	t := h.tick()
	return h.add(L.Op{Client: client, Op: L.OpAppendRead, Channel: channel, Call: t, Return: t,
		Output: &L.Output{ID: id, Offset: offset, Payload: []byte(id)}})
}

func (h *hist) head(client int, channel string, next int64) {
	call := h.tick()
	h.add(L.Op{Client: client, Op: L.OpAppendHead, Channel: channel, Call: call, Return: h.tick(), Output: &L.Output{Next: next}})
}

func (h *hist) restart() {
	call := h.tick()
	h.add(L.Op{Op: L.OpBrokerRestart, Call: call, Return: h.tick()})
}

func (h *hist) powerCut(loss time.Duration) {
	call := h.tick()
	h.add(L.Op{Op: L.OpBrokerPowerCut, Call: call, Return: h.tick(), Input: &L.Input{LossNs: loss.Nanoseconds()}})
}

func (h *hist) deliver(client int, id string, offset int64, attempt int, delivery string) {
	t := h.tick()
	h.add(L.Op{Client: client, Op: L.OpQueueDeliver, Channel: chanJobs, Call: t, Return: t, Input: &L.Input{},
		Output: &L.Output{ID: id, Offset: offset, Attempt: attempt, Delivery: []byte(delivery), Payload: []byte(id)}})
}

func (h *hist) answer(client int, id, delivery, result string) {
	call := h.tick()
	h.add(L.Op{Client: client, Op: L.OpQueueAnswer, Channel: chanJobs, Call: call, Return: h.tick(),
		Input: &L.Input{ID: id, Delivery: []byte(delivery), Result: result}, Output: &L.Output{Reason: 0}})
}

func (h *hist) leaseEnd(client int, id, delivery, cause string) {
	h.add(L.Op{Client: client, Op: L.OpQueueLeaseEnd, Channel: chanJobs, Call: h.tick(), Return: L.Pending,
		Input: &L.Input{ID: id, Delivery: []byte(delivery), Cause: cause}})
}

func (h *hist) deadLetter(client int, id string, offset int64, attempts int) {
	t := h.tick()
	h.add(L.Op{Client: client, Op: L.OpQueueDeadLetter, Channel: chanJobs, Call: t, Return: t,
		Output: &L.Output{ID: id, Offset: offset, Attempt: attempts}})
}

// lpub records an acknowledged publish to the latest channel: a set, or a
// delete when val is "".
func (h *hist) lpub(client int, key, id, val string) {
	call := h.tick()
	h.add(L.Op{Client: client, Op: L.OpLatestPublish, Channel: chanState, Call: call, Return: h.tick(),
		Input: &L.Input{Key: key, ID: id, Payload: []byte(val)}, Output: &L.Output{Reason: 0}})
}

// lpoint records a point read answered with val (id "" and val "": no value).
func (h *hist) lpoint(client int, key, id, val string) {
	call := h.tick()
	h.add(L.Op{Client: client, Op: L.OpLatestRead, Channel: chanState, Call: call, Return: h.tick(),
		Input: &L.Input{Key: key}, Output: &L.Output{ID: id, Payload: []byte(val)}})
}

// lsub records a value the latest subscriber was sent, judged from its
// SUBSCRIBE at subscribed.
func (h *hist) lsub(client int, subscribed int64, key, id, val string, offset int64) {
	h.add(L.Op{Client: client, Op: L.OpLatestRead, Channel: chanState, Call: subscribed, Return: h.tick(),
		Input: &L.Input{Key: key}, Output: &L.Output{ID: id, Payload: []byte(val), Offset: offset}})
}

// finalRead records a complete final read by connection conn of client id
// name, reading ids at offsets 1..n.
func (h *hist) finalRead(conn int, name, channel string, ids ...string) {
	h.note(Note{Kind: NoteConnack, Conn: conn, ClientID: name, Channel: channel})
	for i, id := range ids {
		if channel == chanJobs+"__dlq" {
			h.deadLetter(conn, id, int64(i+1), 3)
		} else {
			h.read(conn, channel, int64(i+1), id)
		}
	}
	h.note(Note{Kind: NoteFinalRead, ClientID: name, Channel: channel, Value: int64(len(ids) + 1), Detail: "complete"})
}

func check(t *testing.T, h *hist) *CheckResult {
	t.Helper()
	res, err := Check(h.ops, h.notes, CheckOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	return res
}

func findings(res *CheckResult, check string) []Finding {
	var out []Finding
	for _, v := range res.Violations {
		if v.Check == check {
			out = append(out, v)
		}
	}
	return out
}

// mustFind fails unless the check reported a finding for invariant inv.
func mustFind(t *testing.T, res *CheckResult, check string, inv int) Finding {
	t.Helper()
	fs := findings(res, check)
	if len(fs) == 0 {
		t.Fatalf("no %s finding; got %v", check, res.Violations)
	}
	if fs[0].Invariant != inv {
		t.Fatalf("%s finding names invariant %d, want %d: %s", check, fs[0].Invariant, inv, fs[0])
	}
	return fs[0]
}

func mustPass(t *testing.T, res *CheckResult) {
	t.Helper()
	if !res.OK() {
		t.Fatalf("an honest history was flagged: %v (inconclusive %v)", res.Violations, res.Inconclusive)
	}
}

func checksOf(res *CheckResult) []string {
	var out []string
	for _, v := range res.Violations {
		if !slices.Contains(out, v.Check) {
			out = append(out, v.Check)
		}
	}
	return out
}
