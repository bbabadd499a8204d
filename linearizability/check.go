package linearizability

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind names a model.
type Kind string

const (
	KindAppend Kind = "append"
	KindQueue  Kind = "queue"
	KindLatest Kind = "latest"
)

// Kinds lists every model, in a fixed order.
func Kinds() []Kind { return []Kind{KindAppend, KindQueue, KindLatest} }

// Model returns the porcupine model for k. Its operations' Input is internal
// (built by Check from a history), so use it through Check; it is exported for
// the visualisation and for callers composing their own checks.
func Model(k Kind) (porcupine.Model, error) {
	switch k {
	case KindAppend:
		return AppendModel(), nil
	case KindQueue:
		return QueueModel(), nil
	case KindLatest:
		return LatestModel(), nil
	}
	return porcupine.Model{}, fmt.Errorf("unknown model %q (want append, queue or latest)", k)
}

// Present lists the models whose operations appear in ops.
func Present(ops []Op) []Kind {
	var out []Kind
	for _, k := range Kinds() {
		for _, op := range ops {
			if strings.HasPrefix(op.Op, string(k)+".") {
				out = append(out, k)
				break
			}
		}
	}
	return out
}

// Options tune Check.
type Options struct {
	// Timeout bounds the porcupine search over all partitions; 0 = none.
	// A search that runs out reports porcupine.Unknown, never Ok.
	Timeout time.Duration
	// Dense: append reads on one connection must step by one offset
	// (CheckAppendReads).
	Dense bool
	// Resolution: run CheckQueueResolution, which needs a drained history.
	Resolution bool
}

// Report is the outcome of checking one model.
type Report struct {
	Kind       Kind
	Operations int                   // operations the model checked
	Partitions int                   // porcupine partitions (channels, jobs, keys)
	Result     porcupine.CheckResult // Ok, Illegal, or Unknown (timed out)
	// Failed describes each partition porcupine found illegal.
	Failed     []string
	Violations []Violation // whole-history checks

	model   porcupine.Model
	info    porcupine.LinearizationInfo
	hasInfo bool
}

// OK reports whether the history passed: linearizable and no violations.
func (r *Report) OK() bool { return r.Result == porcupine.Ok && len(r.Violations) == 0 }

// WriteHTML writes porcupine's visualisation of the partitions that failed —
// those porcupine rejected, or else those holding the operations a
// whole-history check named (lines known only for a history from Read).
func (r *Report) WriteHTML(w io.Writer) error {
	if !r.hasInfo {
		return fmt.Errorf("no failing partition to visualise for model %s", r.Kind)
	}
	if err := porcupine.Visualize(r.model, r.info, w); err != nil {
		return fmt.Errorf("visualise %s: %w", r.Kind, err)
	}
	return nil
}

// HasVisualization reports whether WriteHTML has something to draw.
func (r *Report) HasVisualization() bool { return r.hasInfo }

// Check runs model k over ops: porcupine per partition, then the model's
// whole-history checks. An error means the history itself is bad.
func Check(ops []Op, k Kind, opt Options) (*Report, error) {
	model, err := Model(k)
	if err != nil {
		return nil, err
	}
	evs, err := prepare(ops, string(k)+".")
	if err != nil {
		return nil, err
	}
	if err := checkUniqueIDs(evs, k); err != nil {
		return nil, err
	}
	rep := &Report{Kind: k, model: model}
	for _, e := range evs {
		if !isCrash(e.Op.Op) {
			rep.Operations++
		}
	}
	switch k {
	case KindAppend:
		markAppendPending(evs)
	case KindLatest:
		narrowLatest(evs)
	}
	parts := model.Partition(toPorcupine(evs))
	rep.Partitions = len(parts)
	rep.Result = porcupine.Ok
	failed, unknown := checkPartitions(model, parts, opt.Timeout)
	if len(failed) > 0 {
		rep.Result = porcupine.Illegal
		for _, i := range failed {
			rep.Failed = append(rep.Failed, describePartition(k, parts[i]))
		}
	} else if unknown {
		rep.Result = porcupine.Unknown
	}

	switch k {
	case KindAppend:
		rep.Violations = CheckAppendReads(ops, opt.Dense)
	case KindQueue:
		vs, err := CheckQueueOffsets(ops)
		if err != nil {
			return nil, err
		}
		rep.Violations = vs
		if opt.Resolution {
			vs, err := CheckQueueResolution(ops)
			if err != nil {
				return nil, err
			}
			rep.Violations = append(rep.Violations, vs...)
		}
	case KindLatest:
		rep.Violations = CheckLatestOrder(ops)
	}

	// The picture: the partitions porcupine rejected, or else those holding
	// the operations a whole-history check named.
	show := failed
	if len(show) == 0 && len(rep.Violations) > 0 {
		show = partitionsWithLines(parts, rep.Violations)
	}
	if len(show) > 0 {
		var union []porcupine.Operation
		seen := map[*event]bool{}
		for _, i := range show {
			for _, o := range parts[i] {
				if e := o.Input.(*event); !seen[e] {
					seen[e] = true
					union = append(union, o)
				}
			}
		}
		_, rep.info = porcupine.CheckOperationsVerbose(model, union, opt.Timeout)
		rep.hasInfo = true
	}
	return rep, nil
}

func partitionsWithLines(parts [][]porcupine.Operation, vs []Violation) []int {
	lines := map[int]bool{}
	for _, v := range vs {
		for _, l := range v.Lines {
			if l > 0 {
				lines[l] = true
			}
		}
	}
	var out []int
	for i, p := range parts {
		for _, o := range p {
			if e := o.Input.(*event); !isCrash(e.Op.Op) && lines[e.Line] {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// checkUniqueIDs refuses a queue history that publishes one Message ID twice
// in a channel: the queue model follows one record per ID, so the harness
// must give each queue publish its own id (a redrive included).
func checkUniqueIDs(evs []*event, k Kind) error {
	if k != KindQueue {
		return nil
	}
	seen := map[jobKey]int{}
	for _, e := range evs {
		if e.Op.Op != OpQueuePublish {
			continue
		}
		jk := jobKey{e.Channel, e.Input.ID}
		if line, ok := seen[jk]; ok {
			return fmt.Errorf("%w: lines %d and %d publish job %q to queue %q twice; queue ids must be unique",
				ErrBadHistory, line, e.Line, jk.id, jk.channel)
		}
		seen[jk] = e.Line
	}
	return nil
}

// checkPartitions checks each partition on its own, on up to GOMAXPROCS
// goroutines, and returns the failing partitions' indexes in order.
func checkPartitions(model porcupine.Model, parts [][]porcupine.Operation, timeout time.Duration) (failed []int, unknown bool) {
	single := model
	single.Partition = nil
	single.PartitionEvent = nil
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	results := make([]porcupine.CheckResult, len(parts))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(len(parts), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				var left time.Duration
				if !deadline.IsZero() {
					left = time.Until(deadline)
					if left <= 0 {
						results[i] = porcupine.Unknown
						continue
					}
				}
				results[i] = porcupine.CheckOperationsTimeout(single, parts[i], left)
			}
		}()
	}
	for i := range parts {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, r := range results {
		switch r {
		case porcupine.Illegal:
			failed = append(failed, i)
		case porcupine.Unknown:
			unknown = true
		}
	}
	return failed, unknown
}

func describePartition(k Kind, part []porcupine.Operation) string {
	for _, o := range part {
		e := o.Input.(*event)
		if isCrash(e.Op.Op) {
			continue
		}
		switch k {
		case KindQueue:
			return fmt.Sprintf("queue %q job %q", e.Channel, jobID(e.Op))
		case KindLatest:
			return fmt.Sprintf("latest %q key %q", e.Channel, e.Input.Key)
		}
		return fmt.Sprintf("append %q", e.Channel)
	}
	return "crashes only"
}
