// Package harness runs Sagüin under chaos and checks what its clients saw.
//
// It builds the real saguin binary, starts it on a configuration of its own,
// and runs concurrent workloads with stock paho.golang clients — producers,
// durable consumers, queue workers that stall past the visibility timeout,
// answer late, answer across a restart or disconnect — while nemeses chosen by
// a seed kill it (SIGKILL), stop it (SIGTERM), freeze it (SIGSTOP/SIGCONT),
// cut its clients' links at a TCP proxy, or cut its disk's power (the faultfs
// FUSE layer under the data directory). Everything the clients saw is recorded
// as a saguin.dev/linearizability history; after the run the history is
// checked against the porcupine models and by the harness's own whole-run
// checks (check.go), each tied to the invariant it guards.
//
// The broker is only ever a process: its binary, its configuration file and
// the wire (design.md). The harness imports nothing of it.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Providers.
const (
	ProviderSQLite = "sqlite"
	ProviderMemory = "memory"
)

// Controls prove the checks can fail: each must end in violations. Two are
// lies the harness tells its own checks about an honest broker; the others
// run a fault-injection build of the broker (FaultBuildTag), broken on
// purpose the way an invariant forbids, and the checks must catch it.
const (
	// ControlNone: an honest run.
	ControlNone = ""
	// ControlMemoryKillDurable records a SIGKILL of a memory-provider broker
	// as a plain restart, claiming kill -9 durability the memory provider
	// does not have (invariant 14): the acknowledged records it loses must
	// be flagged.
	ControlMemoryKillDurable = "memory-kill-durable"
	// ControlPowerCutNoLoss records a power cut with no loss window, claiming
	// that sqlite's synchronous=NORMAL loses nothing (invariant 14 says it
	// loses about the last flush interval): the acknowledged records a cut
	// drops must be flagged.
	ControlPowerCutNoLoss = "powercut-no-loss"
	// ControlNextOffsetMaxPlusOne runs a broker whose sqlite provider
	// recomputes each channel's next offset at open as MAX(offset)+1 over
	// the surviving rows (invariant 9's restart bug), and times every kill
	// to a moment the prober saw the ticks channel emptied by retention:
	// the restarted broker starts ticks again at offset 1 and floor 1.
	// Caught by floor-back (invariant 1) and linearizable/append-ticks
	// (invariant 9: a head that goes back).
	ControlNextOffsetMaxPlusOne = "next-offset-max-plus-one"
	// ControlSplitDeadLetter runs a broker whose dead-letter move is two
	// transactions, and which dies (exit 137, as kill -9) between them at
	// its first move, until it has once: the job is then in jobs__dlq and
	// still in the queue, attempts spent, so the restarted broker moves it
	// again (invariant 5). Caught by dead-letter-twice; broker-exit names
	// the deliberate death.
	ControlSplitDeadLetter = "split-dead-letter"
	// ControlSyncOff runs a broker whose sqlite provider never fsyncs
	// (synchronous=OFF, no WAL flush): a power cut takes everything since
	// the start, far beyond the loss window (invariant 14). Caught by
	// acked-lost — or, when a torn cut leaves a file SQLite cannot read, by
	// integrity or restart.
	ControlSyncOff = "sqlite-sync-off"
)

// FaultBuildTag is the build tag under which saguin reads SAGUIN_FAULTS and
// breaks itself (broker/internal/faults). Production builds lack it.
const FaultBuildTag = "saguinfaults"

// Controls lists every negative control.
func Controls() []string {
	return []string{ControlMemoryKillDurable, ControlPowerCutNoLoss, ControlNextOffsetMaxPlusOne, ControlSplitDeadLetter, ControlSyncOff}
}

// ControlBuildTags are the build tags the broker binary needs for control:
// FaultBuildTag for the controls that break the broker, none otherwise.
func ControlBuildTags(control string) []string {
	switch control {
	case ControlNextOffsetMaxPlusOne, ControlSplitDeadLetter, ControlSyncOff:
		return []string{FaultBuildTag}
	}
	return nil
}

// Options configure a campaign. Zero values take the defaults noted.
type Options struct {
	// Seed chooses the nemesis schedule, its timing, the workers'
	// behaviours and the producers' pacing: a failing run is replayed by
	// running its seed again.
	Seed uint64
	// Duration bounds the chaos phase; Cycles bounds the number of
	// nemeses applied. At least one must be set; with both, whichever
	// comes first ends it.
	Duration time.Duration
	Cycles   int
	// Provider is sqlite (default) or memory.
	Provider string
	// Nemeses and their weights (default: kill=2,term,stop,cut).
	Nemeses []NemesisWeight
	// OutDir receives the history, the notes, the broker's log and
	// configuration, and on failure the porcupine visualisation. Required.
	OutDir string
	// Binary is a prebuilt saguin; empty builds one from BrokerDir
	// (default: the broker module beside this one). A control that breaks
	// the broker needs a binary built with ControlBuildTags; the campaign
	// refuses one that does not say it is broken.
	Binary    string
	BrokerDir string

	// MinHealthy/MaxHealthy bound the healthy interval before each nemesis
	// (default 1.5s–3s).
	MinHealthy, MaxHealthy time.Duration
	// VisibilityTimeout of the queue (default 2s) and its max_attempts
	// (default 3).
	VisibilityTimeout time.Duration
	MaxAttempts       int
	// BrokerLogLevel is the broker's log_level (default info). debug makes
	// a replay show what the broker did at each takeover and each
	// acknowledgement it ignored, in broker.log beside the history.
	BrokerLogLevel string
	// Producers (append, default 2), Readers (durable consumers of the
	// events channel, default 2), Workers (default 3, one of which resumes
	// its session).
	Producers, Readers, Workers int
	// PublishInterval is the mean pause between one producer's publishes
	// (default 20ms).
	PublishInterval time.Duration
	// LossWindow is how far before a power cut an acknowledged sqlite write
	// may be lost (default 1s: flush_interval 150ms plus an fsync on a busy
	// machine, with room; invariant 14).
	LossWindow time.Duration
	// TornRate is the share of power cuts with torn writes (default 0.5).
	TornRate float64
	// OpTimeout bounds every client operation (default 5s).
	OpTimeout time.Duration
	// CheckTimeout bounds the porcupine search (default 5m); running out is
	// reported as inconclusive, never as a pass.
	CheckTimeout time.Duration
	// Control is a negative control (Control* constants).
	Control string
	// Waive names checks whose findings are a known, documented gap of the
	// broker: they are reported as Waived, not as violations, so a run can
	// pass while the gap is open and still shows it every time.
	Waive []string
	// Log receives progress lines (nil: none).
	Log io.Writer
}

func (o *Options) setDefaults() error {
	if o.Provider == "" {
		o.Provider = ProviderSQLite
	}
	if o.Provider != ProviderSQLite && o.Provider != ProviderMemory {
		return fmt.Errorf("provider %q: want %s or %s", o.Provider, ProviderSQLite, ProviderMemory)
	}
	if o.Duration <= 0 && o.Cycles <= 0 {
		return errors.New("set Duration or Cycles")
	}
	if o.OutDir == "" {
		return errors.New("OutDir is required")
	}
	if len(o.Nemeses) == 0 {
		o.Nemeses = []NemesisWeight{{NemesisKill, 2}, {NemesisTerm, 1}, {NemesisStop, 1}, {NemesisCut, 1}}
	}
	for _, n := range o.Nemeses {
		if !slices.Contains(AllNemeses(), n.Name) || n.Weight < 1 {
			return fmt.Errorf("nemesis %q weight %d: unknown or not positive", n.Name, n.Weight)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.MinHealthy, 1500*time.Millisecond)
	def(&o.MaxHealthy, 3*time.Second)
	if o.MaxHealthy < o.MinHealthy {
		o.MaxHealthy = o.MinHealthy
	}
	def(&o.VisibilityTimeout, 2*time.Second)
	def(&o.PublishInterval, 20*time.Millisecond)
	def(&o.LossWindow, time.Second)
	def(&o.OpTimeout, 5*time.Second)
	def(&o.CheckTimeout, 5*time.Minute)
	if o.BrokerLogLevel == "" {
		o.BrokerLogLevel = "info"
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if o.Producers <= 0 {
		o.Producers = 2
	}
	if o.Readers <= 0 {
		o.Readers = 2
	}
	if o.Workers <= 0 {
		o.Workers = 3
	}
	if o.TornRate < 0 || o.TornRate > 1 {
		return fmt.Errorf("TornRate %v: want 0..1", o.TornRate)
	}
	if o.TornRate == 0 {
		o.TornRate = 0.5
	}
	if o.hasNemesis(NemesisPowerCut) && errNoPowerCuts != nil {
		return errNoPowerCuts
	}
	switch o.Control {
	case ControlNone:
	case ControlMemoryKillDurable:
		if o.Provider != ProviderMemory {
			return fmt.Errorf("control %s needs the memory provider", o.Control)
		}
	case ControlPowerCutNoLoss:
		if !o.hasNemesis(NemesisPowerCut) {
			return fmt.Errorf("control %s needs the powercut nemesis", o.Control)
		}
	case ControlNextOffsetMaxPlusOne, ControlSplitDeadLetter, ControlSyncOff:
		if o.Provider != ProviderSQLite {
			return fmt.Errorf("control %s breaks the sqlite provider: it needs -provider %s", o.Control, ProviderSQLite)
		}
		need := map[string]string{ControlNextOffsetMaxPlusOne: NemesisKill, ControlSyncOff: NemesisPowerCut}[o.Control]
		if need != "" && !o.hasNemesis(need) {
			return fmt.Errorf("control %s needs the %s nemesis", o.Control, need)
		}
	default:
		return fmt.Errorf("unknown control %q", o.Control)
	}
	return nil
}

func (o *Options) hasNemesis(name string) bool {
	return slices.ContainsFunc(o.Nemeses, func(n NemesisWeight) bool { return n.Name == name })
}

// Run runs one campaign and checks it. The error is for the harness itself
// failing (no binary, no FUSE, a history it could not write); what the
// broker did wrong is in the report's Violations.
func Run(ctx context.Context, opt Options) (*Report, error) {
	if err := opt.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := os.MkdirAll(opt.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("out dir: %w", err)
	}
	c, err := newCampaign(ctx, opt)
	if err != nil {
		return nil, err
	}
	runErr := c.run(ctx)
	closeErr := c.close()
	if err := errors.Join(runErr, closeErr, c.env.err()); err != nil {
		return nil, err
	}
	rep := &Report{
		Seed: opt.Seed, Provider: opt.Provider, Control: opt.Control, Nemeses: FormatNemeses(opt.Nemeses),
		Cycles: c.cycles, Applied: c.applied, Aborted: c.aborted, MaxShutdown: c.maxShutdown,
		OutDir: opt.OutDir, History: c.histPath, NotesPath: c.notesPath,
	}
	checkStart := time.Now()
	res, err := CheckFiles(c.histPath, c.notesPath, CheckOptions{
		Timeout: opt.CheckTimeout, HTMLDir: opt.OutDir,
	})
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	rep.Stats = res.Stats
	rep.CheckTime = time.Since(checkStart)
	for _, f := range append(append(c.findings, c.env.protocol...), res.Violations...) {
		if slices.Contains(opt.Waive, f.Check) {
			rep.Waived = append(rep.Waived, f)
		} else {
			rep.Violations = append(rep.Violations, f)
		}
	}
	rep.Inconclusive = res.Inconclusive
	rep.HTML = res.HTML
	rep.Elapsed = time.Since(start)
	if err := os.WriteFile(filepath.Join(opt.OutDir, "report.txt"), []byte(rep.Details()), 0o644); err != nil {
		return nil, fmt.Errorf("write report: %w", err)
	}
	if err := writeReportJSON(opt.OutDir, rep); err != nil {
		return nil, err
	}
	return rep, nil
}
