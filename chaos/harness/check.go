package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	L "saguin.dev/linearizability"
)

// CheckOptions tune CheckFiles and Check.
type CheckOptions struct {
	// Timeout bounds the porcupine search per model (0: none).
	Timeout time.Duration
	// HTMLDir receives porcupine's visualisation of each failing model
	// ("": none written).
	HTMLDir string
}

// Stats are a run's figures.
type Stats struct {
	Operations   int // operations the porcupine models checked
	Publishes    int // append and queue publishes
	Acked        int // ... acknowledged with success
	Pending      int // ... never answered
	Reads        int // append records delivered
	Deliveries   int // queue offers
	Answers      int // queue acks and returns
	DeadLetters  int // dead letters read
	LatestWrites int // latest sets and deletes (all, acknowledged or not)
	LatestReads  int // latest values read: point reads and the subscriber's
	Restarts     int // stops and starts that keep committed writes
	PowerCuts    int // crashes that may lose a window of acknowledged writes
	LostInWindow int // acknowledged records a power cut dropped inside its window (allowed)
	// The takeover workload: takeovers accepted, CONNECTs refused for a
	// live id, and old connections seen sent DISCONNECT 0x8E.
	Takeovers, Refusals, Disconnect8E int
	// The Will workload: episodes, Wills read, Wills that had to be
	// published (and of those, read after a restart), and Wills that must
	// not be.
	WillEpisodes, WillsSeen, WillsRequired, WillsAcrossCrash, WillsForbidden int
	// MaxLoss is how long before its cut the oldest acknowledgement of a
	// record a power cut dropped came (within the window, or it is a
	// violation).
	MaxLoss time.Duration
}

func (s Stats) String() string {
	return fmt.Sprintf("publishes=%d acked=%d pending=%d reads=%d deliveries=%d answers=%d dead-letters=%d latest-writes=%d latest-reads=%d restarts=%d power-cuts=%d lost-in-window=%d max-loss=%s"+
		"\n  takeovers=%d refused-connects=%d disconnect-0x8e=%d will-episodes=%d wills-read=%d wills-owed=%d (after a restart %d) wills-forbidden=%d",
		s.Publishes, s.Acked, s.Pending, s.Reads, s.Deliveries, s.Answers, s.DeadLetters, s.LatestWrites, s.LatestReads,
		s.Restarts, s.PowerCuts, s.LostInWindow, s.MaxLoss.Round(time.Millisecond),
		s.Takeovers, s.Refusals, s.Disconnect8E, s.WillEpisodes, s.WillsSeen, s.WillsRequired, s.WillsAcrossCrash, s.WillsForbidden)
}

// CheckResult is what Check found.
type CheckResult struct {
	Stats        Stats
	Violations   []Finding
	Inconclusive []string
	HTML         []string
}

// OK reports no violation and nothing inconclusive.
func (r *CheckResult) OK() bool { return len(r.Violations) == 0 && len(r.Inconclusive) == 0 }

// maxNotes bounds a notes file read back (invariant 13).
const maxNotes = 10_000_000

// CheckFiles reads a history and its notes and checks them.
func CheckFiles(historyPath, notesPath string, opt CheckOptions) (*CheckResult, error) {
	hf, err := os.Open(historyPath)
	if err != nil {
		return nil, err
	}
	defer hf.Close()
	ops, err := L.Read(hf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", historyPath, err)
	}
	nf, err := os.Open(notesPath)
	if err != nil {
		return nil, err
	}
	defer nf.Close()
	notes, err := ReadNotes(nf, maxNotes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", notesPath, err)
	}
	return Check(ops, notes, opt)
}

// modelRun is one porcupine check of part of the history.
type modelRun struct {
	name  string
	kind  L.Kind
	keep  func(L.Op) bool
	opt   L.Options
	inv   int
	about string
}

// Check runs the porcupine models and the harness's own checks over a run.
func Check(ops []L.Op, notes []Note, opt CheckOptions) (*CheckResult, error) {
	res := &CheckResult{}
	r := newRun(ops, notes)
	res.Stats = r.stats()

	drained := r.hasNote(NoteDrained) && !r.hasNote(NoteAbort)
	runs := []modelRun{
		// The events channel has no retention, so a reader steps by one
		// offset on a connection (Dense), and the model's "the floor stays
		// at 1" holds.
		{name: "append-" + chanEvents, kind: L.KindAppend, keep: onChannel(chanEvents), inv: 9,
			opt:   L.Options{Dense: true},
			about: "the append log its clients saw has no linearization: a record at two offsets, an offset holding two records, a refused or lost acknowledged record, or a head that disagrees with the log"},
		// ticks has retention: a reader overtaken by the floor skips on
		// purpose, so reads only have to increase.
		{name: "append-" + chanTicks, kind: L.KindAppend, keep: onChannel(chanTicks), inv: 9,
			opt:   L.Options{Dense: false},
			about: "the append log its clients saw has no linearization (offsets reused or moved)"},
		{name: "queue-" + chanJobs, kind: L.KindQueue, keep: isQueueOp, inv: 4,
			opt:   L.Options{Resolution: drained},
			about: "the queue's jobs have no linearization: two live leases, a delivery after an ack that applied or after a dead letter, a reused Delivery ID, or a dead letter of a held job"},
		// Point reads and the subscriber's values against a register with
		// delete per key; power cuts (and memory kills) may revert a key
		// across the writes in their loss window, nothing else may.
		{name: "latest-" + chanState, kind: L.KindLatest, keep: onLatest(chanState), inv: 14,
			about: "the latest channel's keys have no linearization: a read of a value older than one acknowledged (or read) before it began, of a deleted value, of one never written or refused, or an acknowledged value lost outside every loss window"},
	}
	for _, m := range runs {
		sub := filterOps(ops, m.keep)
		if !slices.ContainsFunc(sub, func(o L.Op) bool { return !isCrash(o.Op) }) {
			continue
		}
		m.opt.Timeout = opt.Timeout
		rep, err := L.Check(sub, m.kind, m.opt)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", m.name, err)
		}
		res.Stats.Operations += rep.Operations
		switch rep.Result {
		case porcupine.Illegal:
			res.Violations = append(res.Violations, Finding{Check: "linearizable/" + m.name, Invariant: m.inv,
				Msg: fmt.Sprintf("%s; failing partitions: %s", m.about, strings.Join(rep.Failed, "; "))})
		case porcupine.Unknown:
			res.Inconclusive = append(res.Inconclusive, fmt.Sprintf("%s: the search ran out of %s", m.name, opt.Timeout))
		}
		for _, v := range rep.Violations {
			if f, keep := r.fromModelViolation(v); keep {
				res.Violations = append(res.Violations, f)
			}
		}
		if !rep.OK() && rep.HasVisualization() && opt.HTMLDir != "" {
			path := filepath.Join(opt.HTMLDir, m.name+".html")
			if err := writeHTML(rep, path); err != nil {
				return nil, err
			}
			res.HTML = append(res.HTML, path)
		}
	}

	res.Violations = append(res.Violations, r.checkFinalRead(chanEvents)...)
	res.Violations = append(res.Violations, r.checkRefusedNeverStored()...)
	res.Violations = append(res.Violations, r.checkOffsets()...)
	res.Violations = append(res.Violations, r.checkOffsetOrder(chanEvents)...)
	res.Violations = append(res.Violations, r.checkOffsetOrder(chanTicks)...)
	res.Violations = append(res.Violations, r.checkOffsetOrder(chanState)...)
	res.Violations = append(res.Violations, r.checkFloors()...)
	res.Violations = append(res.Violations, r.checkResume(chanEvents)...)
	res.Violations = append(res.Violations, r.checkDeadLetters()...)
	res.Violations = append(res.Violations, r.checkTakeovers()...)
	res.Violations = append(res.Violations, r.checkSessionPresent()...)
	wf, fig := r.checkWills()
	res.Violations = append(res.Violations, wf...)
	res.Stats.WillEpisodes, res.Stats.WillsSeen, res.Stats.WillsRequired = fig.episodes, fig.seen, fig.required
	res.Stats.WillsAcrossCrash, res.Stats.WillsForbidden = fig.acrossCrash, fig.forbidden
	res.Stats.Takeovers, res.Stats.Refusals, res.Stats.Disconnect8E = r.takeoverFigures()
	lost, maxLoss := r.lossFigures(chanEvents)
	res.Stats.LostInWindow, res.Stats.MaxLoss = lost, maxLoss
	return res, nil
}

func writeHTML(rep *L.Report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteHTML(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func isCrash(op string) bool { return op == L.OpBrokerRestart || op == L.OpBrokerPowerCut }

func onChannel(ch string) func(L.Op) bool {
	return func(o L.Op) bool {
		return isCrash(o.Op) || (strings.HasPrefix(o.Op, "append.") && o.Channel == ch)
	}
}

func onLatest(ch string) func(L.Op) bool {
	return func(o L.Op) bool {
		return isCrash(o.Op) || (strings.HasPrefix(o.Op, "latest.") && o.Channel == ch)
	}
}

func isQueueOp(o L.Op) bool { return isCrash(o.Op) || strings.HasPrefix(o.Op, "queue.") }

func filterOps(ops []L.Op, keep func(L.Op) bool) []L.Op {
	var out []L.Op
	for _, o := range ops {
		if keep(o) {
			out = append(out, o)
		}
	}
	return out
}

// modelInvariant ties a whole-history check of the linearizability module to
// the invariant it guards.
var modelInvariant = map[string]int{
	"append-order":        9, // offsets on a reader's connection go back: a reused or moved offset
	"append-dense":        1, // a reader silently moved past records
	"queue-offered":       5, // acknowledged, and neither in the queue nor dead-lettered
	"queue-resolved":      3, // the last holder never acked and nothing came back
	"queue-offset-unique": 9,
	"queue-offset-order":  9,
	"latest-order":        0,
}

func (r *run) fromModelViolation(v L.Violation) (Finding, bool) {
	f := Finding{Check: v.Check, Invariant: modelInvariant[v.Check], Channel: v.Channel, Msg: v.Msg, Lines: v.Lines}
	switch v.Check {
	case "queue-resolved":
		// An ack of the last delivery whose PUBACK never came may have
		// applied: the job may be resolved, and nothing after it could
		// say. Ambiguous, so not a violation (the module's resolution
		// check counts only acknowledged acks).
		if r.pendingAckOfLastDelivery(v.Lines) {
			return f, false
		}
		fallthrough
	case "queue-offered":
		// Name the scenario: an answer carrying a Delivery ID that was no
		// longer current, sent before the job went missing, is the
		// superseded delivery resolving it (invariant 3) — or, when the
		// Delivery ID predates a restart, a lease resurrected (invariant 15).
		if inv, why := r.explainUnresolved(v.Channel, v.Lines); inv != 0 {
			f.Invariant = inv
			f.Msg += "; " + why
		}
	case "append-order":
		// The same record twice in a row on one connection is a duplicate
		// delivery, not an offset reused: name it so.
		if len(v.Lines) == 2 {
			a, okA := r.byLine[v.Lines[0]]
			b, okB := r.byLine[v.Lines[1]]
			if okA && okB && a.Output != nil && b.Output != nil && a.Output.Offset == b.Output.Offset && a.Output.ID == b.Output.ID {
				f.Check, f.Invariant = "append-duplicate", 0
				f.Msg += fmt.Sprintf(" (record %s delivered twice on one connection, DUP flags %v then %v: a resumed session's resend and its pump both served it?)",
					a.Output.ID, a.Input != nil && a.Input.Dup, b.Input != nil && b.Input.Dup)
			}
		}
	}
	return f, true
}

// pendingAckOfLastDelivery reports whether the delivery a queue-resolved
// violation names as the job's last was answered with an ack that never got
// its PUBACK.
func (r *run) pendingAckOfLastDelivery(ls []int) bool {
	for _, l := range ls {
		d, ok := r.byLine[l]
		if !ok || d.Op != L.OpQueueDeliver || d.Output == nil {
			continue
		}
		for _, o := range r.ops {
			if o.Op == L.OpQueueAnswer && o.IsPending() && o.Input.Result == L.ResultAck && o.Client == d.Client &&
				o.Input.ID == d.Output.ID && bytes.Equal(o.Input.Delivery, d.Output.Delivery) {
				return true
			}
		}
	}
	return false
}
