package linearizability

import (
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"
)

// hist builds a history by hand; each op gets the next line number, as if
// read from a file.
type hist struct{ ops []Op }

func (h *hist) add(op Op) *hist {
	op.Line = len(h.ops) + 1
	h.ops = append(h.ops, op)
	return h
}

func (h *hist) apub(client int, ch, id string, call, ret int64, reason int) *hist {
	op := Op{Client: client, Op: OpAppendPublish, Channel: ch, Call: call, Return: ret, Input: &Input{ID: id, Payload: []byte("p-" + id)}}
	if ret >= 0 {
		op.Output = &Output{Reason: reason}
	}
	return h.add(op)
}

func (h *hist) aread(client int, ch string, t int64, off int64, id string) *hist {
	return h.add(Op{Client: client, Op: OpAppendRead, Channel: ch, Call: t, Return: t,
		Output: &Output{Offset: off, ID: id, Payload: []byte("p-" + id)}})
}

func (h *hist) ahead(client int, ch string, t, next int64) *hist {
	return h.add(Op{Client: client, Op: OpAppendHead, Channel: ch, Call: t, Return: t, Output: &Output{Next: next}})
}

func (h *hist) restart(call, ret int64) *hist {
	return h.add(Op{Client: 0, Op: OpBrokerRestart, Call: call, Return: ret})
}

func (h *hist) powerCut(call, ret, loss int64) *hist {
	return h.add(Op{Client: 0, Op: OpBrokerPowerCut, Call: call, Return: ret, Input: &Input{LossNs: loss}})
}

func (h *hist) qpub(client int, id string, call, ret int64, reason int) *hist {
	op := Op{Client: client, Op: OpQueuePublish, Channel: "jobs", Call: call, Return: ret, Input: &Input{ID: id, Payload: []byte(id)}}
	if ret >= 0 {
		op.Output = &Output{Reason: reason}
	}
	return h.add(op)
}

func (h *hist) qdeliver(worker int, id string, t int64, off int64, attempt int, d string) *hist {
	return h.add(Op{Client: worker, Op: OpQueueDeliver, Channel: "jobs", Call: t, Return: t, Input: &Input{},
		Output: &Output{ID: id, Offset: off, Attempt: attempt, Delivery: []byte(d), Payload: []byte(id)}})
}

func (h *hist) qanswer(worker int, id, d, result string, call, ret int64) *hist {
	op := Op{Client: worker, Op: OpQueueAnswer, Channel: "jobs", Call: call, Return: ret,
		Input: &Input{ID: id, Delivery: []byte(d), Result: result}}
	if ret >= 0 {
		op.Output = &Output{Reason: 0}
	}
	return h.add(op)
}

func (h *hist) qleaseEnd(worker int, id, d, cause string, call int64) *hist {
	return h.add(Op{Client: worker, Op: OpQueueLeaseEnd, Channel: "jobs", Call: call, Return: Pending,
		Input: &Input{ID: id, Delivery: []byte(d), Cause: cause}})
}

func (h *hist) qdead(reader int, id string, t int64, dlqOff int64, attempts int) *hist {
	return h.add(Op{Client: reader, Op: OpQueueDeadLetter, Channel: "jobs", Call: t, Return: t,
		Output: &Output{ID: id, Offset: dlqOff, Attempt: attempts}})
}

func (h *hist) lpub(client int, key, id, val string, call, ret int64) *hist {
	op := Op{Client: client, Op: OpLatestPublish, Channel: "state", Call: call, Return: ret,
		Input: &Input{Key: key, ID: id, Payload: []byte(val)}}
	if ret >= 0 {
		op.Output = &Output{Reason: 0}
	}
	return h.add(op)
}

func (h *hist) lread(client int, key string, call, ret int64, id, val string, off int64) *hist {
	return h.add(Op{Client: client, Op: OpLatestRead, Channel: "state", Call: call, Return: ret,
		Input: &Input{Key: key}, Output: &Output{ID: id, Payload: []byte(val), Offset: off}})
}

func mustCheck(t *testing.T, ops []Op, k Kind, opt Options) *Report {
	t.Helper()
	rep, err := Check(ops, k, opt)
	if err != nil {
		t.Fatalf("Check(%s): %v", k, err)
	}
	return rep
}

// wantLinearizable asserts the porcupine verdict alone.
func wantLinearizable(t *testing.T, h *hist, k Kind) {
	t.Helper()
	rep := mustCheck(t, h.ops, k, Options{})
	if rep.Result != porcupine.Ok {
		t.Fatalf("want %s history linearizable, got %s: %v", k, rep.Result, rep.Failed)
	}
}

// wantIllegal asserts porcupine rejects the history, naming the partition.
func wantIllegal(t *testing.T, h *hist, k Kind, partition string) {
	t.Helper()
	rep := mustCheck(t, h.ops, k, Options{})
	if rep.Result != porcupine.Illegal {
		t.Fatalf("want %s history rejected, got %s", k, rep.Result)
	}
	if !strings.Contains(strings.Join(rep.Failed, "\n"), partition) {
		t.Fatalf("failing partitions %v do not name %q", rep.Failed, partition)
	}
	if !rep.HasVisualization() {
		t.Fatalf("an illegal history must have a visualisation")
	}
}

func checks(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Check)
	}
	return out
}
