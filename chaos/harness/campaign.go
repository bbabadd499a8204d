package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	L "saguin.dev/linearizability"
)

// powerDisk is the broker's data directory behind a power switch: faultfs
// on the builds that have it (disk.go), none on 32-bit Linux
// (disk_nofuse.go).
type powerDisk interface {
	// powerCut drops what was not synced (torn: a random mix of pages).
	powerCut(torn bool, rng *rand.Rand) error
	// remount mounts the backing directory afresh after a cut.
	remount() error
	unmount() error
	// cutCount is how many cuts have been remounted after.
	cutCount() int
}

// campaign is one run: a broker, its proxy, the actors and the nemeses.
type campaign struct {
	opt  Options
	rng  *rand.Rand
	env  *env
	conf brokerConfig

	bin, cfgPath        string
	histPath, notesPath string
	histFile, notesFile *os.File
	logFile             *os.File
	dataDir, backingDir string
	disk                powerDisk // the FUSE layer, when power cuts are on
	proc                *brokerProc
	exits               int   // ... that exited with no nemesis
	lastSnapshot        int64 // memory: when the last graceful stop began
	cycles              int
	maxShutdown         time.Duration // the longest a SIGTERM took
	applied             map[string]int
	findings            []Finding
	aborted             string
	actors              sync.WaitGroup
	workers             []*worker
	producersStop       chan struct{}
	producers           sync.WaitGroup
	cancelActors        context.CancelFunc
}

func newCampaign(ctx context.Context, opt Options) (*campaign, error) {
	c := &campaign{opt: opt, applied: map[string]int{},
		rng:           rand.New(rand.NewPCG(opt.Seed, 0x5a6775696e)),
		producersStop: make(chan struct{})}
	if err := c.init(ctx); err != nil {
		_ = c.close()
		return nil, err
	}
	return c, nil
}

func (c *campaign) init(ctx context.Context) error {
	opt := c.opt
	var err error
	c.bin = opt.Binary
	if c.bin == "" {
		binDir := filepath.Join(opt.OutDir, "bin")
		if err := os.MkdirAll(binDir, 0o755); err != nil {
			return err
		}
		tags := ControlBuildTags(opt.Control)
		c.logf("building saguin (tags %v)", tags)
		if c.bin, err = BuildBroker(ctx, opt.BrokerDir, binDir, tags...); err != nil {
			return err
		}
	}
	c.dataDir = filepath.Join(opt.OutDir, "data")
	c.backingDir = filepath.Join(opt.OutDir, "disk")
	for _, d := range []string{c.dataDir, c.backingDir} {
		// A fresh campaign: what an earlier run left would be read back.
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("clear %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return err
	}
	if c.logFile, err = os.Create(filepath.Join(opt.OutDir, "broker.log")); err != nil {
		return err
	}
	c.conf = brokerConfig{provider: opt.Provider, dataDir: c.dataDir, visibilityTimeout: opt.VisibilityTimeout, maxAttempts: opt.MaxAttempts,
		logLevel: opt.BrokerLogLevel}
	if opt.hasNemesis(NemesisPowerCut) {
		// What the provider needs is made on the disk itself, before the
		// mount: whatever is there at mount time is durable, while a
		// directory made through the mount without a sync would be undone
		// by the first cut — the harness's loss, blamed on the broker.
		onDisk := c.conf
		onDisk.dataDir = c.backingDir
		if err := os.MkdirAll(c.backingDir, 0o755); err != nil {
			return err
		}
		if err := onDisk.prepareDataDir(); err != nil {
			return err
		}
		if c.disk, err = mountDisk(c.backingDir, c.dataDir, c.logFile); err != nil {
			return err
		}
	} else if err := c.conf.prepareDataDir(); err != nil {
		return err
	}
	yaml, err := c.conf.render()
	if err != nil {
		return err
	}
	c.cfgPath = filepath.Join(opt.OutDir, "saguin.yaml")
	if err := os.WriteFile(c.cfgPath, []byte(yaml), 0o644); err != nil {
		return err
	}
	c.histPath = filepath.Join(opt.OutDir, "history.jsonl")
	c.notesPath = filepath.Join(opt.OutDir, "notes.jsonl")
	if c.histFile, err = os.Create(c.histPath); err != nil {
		return err
	}
	if c.notesFile, err = os.Create(c.notesPath); err != nil {
		return err
	}
	hist := L.NewWriter(c.histFile, L.WriterOptions{})
	c.env = &env{hist: hist, notes: newNoteWriter(c.notesFile, 10_000_000), vt: opt.VisibilityTimeout, opTimeout: opt.OpTimeout,
		wills: newWillTracker()}
	c.env.proxy, err = NewProxy("127.0.0.1:1", hist.Now)
	if err != nil {
		return err
	}
	c.lastSnapshot = hist.Now()
	return nil
}

func (c *campaign) logf(format string, args ...any) {
	if c.opt.Log != nil {
		fmt.Fprintf(c.opt.Log, "chaos: "+format+"\n", args...)
	}
}

// errAbort ends a campaign early because of what the broker did (it would
// not start again); the run is still checked.
var errAbort = errors.New("campaign aborted")

func (c *campaign) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.env.mu.Lock()
	c.env.cancel = cancel
	c.env.mu.Unlock()

	p, err := c.start(ctx)
	if err != nil {
		return fmt.Errorf("first start: %w", err)
	}
	c.proc = p
	c.env.proxy.SetUpstream(p.addr)
	c.logf("seed %d: saguin (%s) listening on %s behind proxy %s; out %s", c.opt.Seed, c.opt.Provider, p.addr, c.env.proxy.Addr(), c.opt.OutDir)

	actorsCtx, cancelActors := context.WithCancel(ctx)
	c.cancelActors = cancelActors
	c.startActors(actorsCtx)
	// However the campaign ends, every client is gone before the history
	// is closed.
	defer c.stopActors()

	chaosErr := c.chaos(ctx)
	if chaosErr == nil && !c.proc.alive() {
		// Died after the last nemesis: the end needs a broker.
		chaosErr = c.exitedOnItsOwn(ctx)
	}
	if chaosErr != nil && !errors.Is(chaosErr, errAbort) {
		return chaosErr
	}
	if chaosErr == nil && ctx.Err() == nil {
		if err := c.final(actorsCtx); err != nil && !errors.Is(err, errAbort) {
			return err
		}
	}
	return nil
}

func (c *campaign) startActors(ctx context.Context) {
	e := c.env
	seed := c.opt.Seed
	mean := c.opt.PublishInterval
	spawn := func(f func(context.Context)) {
		c.actors.Add(1)
		go func() {
			defer c.actors.Done()
			f(ctx)
		}()
	}
	spawnProducer := func(p *producer) {
		c.producers.Add(1)
		go func() {
			defer c.producers.Done()
			p.run(ctx)
		}()
	}
	for i := range c.opt.Producers {
		rng := newLockedRand(seed + 100 + uint64(i))
		spawnProducer(&producer{env: e, name: fmt.Sprintf("prod-%d", i+1), op: L.OpAppendPublish, channel: chanEvents,
			topic: topicEvents + fmt.Sprintf("p%d/", i+1), stop: c.producersStop,
			interval: func() time.Duration { return rng.between(mean/2, mean*3/2) }})
	}
	// ticks: bursts, then a pause longer than the retention so the channel
	// empties and a restart finds no surviving row (invariant 9's trap).
	tickRng := newLockedRand(seed + 200)
	spawnProducer(&producer{env: e, name: "ticker", op: L.OpAppendPublish, channel: chanTicks, topic: topicTicks + "t/",
		stop: c.producersStop, burst: 10, pause: ticksRetention*2 + 500*time.Millisecond,
		interval: func() time.Duration { return tickRng.between(5*time.Millisecond, 30*time.Millisecond) }})
	qRng := newLockedRand(seed + 300)
	spawnProducer(&producer{env: e, name: "jobber", op: L.OpQueuePublish, channel: chanJobs, topic: topicJobs + "work/",
		stop: c.producersStop, interval: func() time.Duration { return qRng.between(30*time.Millisecond, 90*time.Millisecond) }})

	// state: a latest channel's keys, set and deleted by two producers,
	// read by point readers and a durable subscriber (docs/channels.md "`latest`").
	keys := stateKeys()
	for i := range latestProducers {
		rng := newLockedRand(seed + 500 + uint64(i))
		spawnProducer(&producer{env: e, name: fmt.Sprintf("lprod-%d", i+1), op: L.OpLatestPublish, channel: chanState,
			stop: c.producersStop, keys: keys, rng: rng, deleteOneIn: latestDeleteOneIn,
			interval: func() time.Duration { return rng.between(latestInterval/2, latestInterval*3/2) }})
	}
	for i := range pointReaders {
		pr := newPointReader(e, fmt.Sprintf("kv-reader-%d", i+1), append(keys[:len(keys):len(keys)], unsetKey), seed+600+uint64(i))
		spawn(pr.run)
	}
	ls := &latestSubscriber{env: e, name: "latest-sub"}
	spawn(ls.run)

	for i := range c.opt.Readers {
		r := &reader{env: e, name: fmt.Sprintf("reader-%d", i+1), filter: filterEvents, channel: chanEvents, topic: topicEvents}
		spawn(r.run)
	}
	tr := &reader{env: e, name: "tick-reader", filter: filterTicks, channel: chanTicks, topic: topicTicks}
	spawn(tr.run)
	dr := &dlqReader{env: e, name: "dlq-reader"}
	spawn(dr.run)
	pr := newProber(e, "prober", 500*time.Millisecond)
	spawn(pr.run)

	// Session takeover (invariants 17, 18) and Wills (docs/channels.md "Last
	// Will"): takeover.go, wills.go. Will clients stop with the producers,
	// so the end waits out the last delays with nothing new armed.
	for i := range takeoverClients {
		tc := newTakeoverClient(e, fmt.Sprintf("tk-%d", i+1), seed+700+uint64(i))
		spawn(tc.run)
	}
	ww := &willWatcher{env: e, name: "will-watch", track: e.wills}
	spawn(ww.run)
	for i := range willClients {
		wc := &willClient{env: e, name: fmt.Sprintf("will-%d", i+1), rng: newLockedRand(seed + 800 + uint64(i)),
			stop: c.producersStop, track: e.wills}
		c.producers.Add(1)
		go func() {
			defer c.producers.Done()
			wc.run(ctx)
		}()
	}
	for i := range c.opt.Workers {
		w := newWorker(e, fmt.Sprintf("worker-%d", i+1), i == 0, seed+400+uint64(i))
		c.workers = append(c.workers, w)
		spawn(w.run)
	}
}

// stopActors ends every client and waits for them, leases included.
func (c *campaign) stopActors() {
	c.closeProducers()
	c.cancelActors()
	c.producers.Wait()
	c.actors.Wait()
	for _, w := range c.workers {
		w.leases.Wait()
	}
}

func (c *campaign) closeProducers() {
	select {
	case <-c.producersStop:
	default:
		close(c.producersStop)
	}
}

// chaos applies nemeses until Cycles or Duration runs out.
func (c *campaign) chaos(ctx context.Context) error {
	d := newDeck(c.opt.Nemeses, c.rng)
	start := time.Now()
	for {
		if c.opt.Cycles > 0 && c.cycles >= c.opt.Cycles {
			return nil
		}
		healthy := jitter(c.rng, c.opt.MinHealthy, c.opt.MaxHealthy)
		if c.opt.Duration > 0 && time.Since(start)+healthy > c.opt.Duration {
			return nil
		}
		if err := c.wait(ctx, healthy); err != nil {
			return err
		}
		if err := c.env.err(); err != nil {
			return err
		}
		name := d.deal()
		t0 := time.Now()
		if err := c.apply(ctx, name); err != nil {
			return err
		}
		c.cycles++
		c.applied[name]++
		c.logf("cycle %d: %s (%s)", c.cycles, name, time.Since(t0).Round(time.Millisecond))
	}
}

// crashOp is how a stop and start is told to the models: a plain restart
// keeps every committed write (sqlite under kill -9, either provider under
// SIGTERM); a power cut may lose what was acknowledged within lossNs of it.
func (c *campaign) apply(ctx context.Context, name string) error {
	e := c.env
	if !c.proc.alive() {
		// A nemesis needs a live broker to act on.
		if err := c.exitedOnItsOwn(ctx); err != nil {
			return err
		}
	}
	if name == NemesisKill && c.opt.Control == ControlNextOffsetMaxPlusOne {
		c.awaitTicksEmpty(ctx)
	}
	if name != NemesisPowerCut {
		e.note(Note{Kind: NoteNemesis, Detail: name})
	}
	switch name {
	case NemesisKill, NemesisTerm, NemesisPowerCut:
		e.stops.Add(1) // restart adds the other
	}
	switch name {
	case NemesisKill:
		t0 := e.now()
		c.proc.kill()
		return c.crashRestart(ctx, t0)
	case NemesisTerm:
		t0 := e.now()
		stopStart := time.Now()
		err := c.proc.term(30 * time.Second)
		c.maxShutdown = max(c.maxShutdown, time.Since(stopStart))
		if err != nil {
			c.findings = append(c.findings, Finding{Check: "graceful-shutdown", Invariant: 14,
				Msg: fmt.Sprintf("SIGTERM: %v", err)})
			if c.opt.Provider == ProviderMemory {
				return c.restart(ctx, t0, L.OpBrokerPowerCut, t0-c.lastSnapshot)
			}
			return c.restart(ctx, t0, L.OpBrokerRestart, 0)
		}
		if c.opt.Provider == ProviderMemory {
			c.lastSnapshot = t0
		}
		return c.restart(ctx, t0, L.OpBrokerRestart, 0)
	case NemesisStop:
		d := jitter(c.rng, c.opt.VisibilityTimeout/2, 2*c.opt.VisibilityTimeout)
		if err := c.proc.signal(sigStop); err != nil {
			return fmt.Errorf("SIGSTOP: %w", err)
		}
		sleepCtx(ctx, d)
		if err := c.proc.signal(sigCont); err != nil {
			return fmt.Errorf("SIGCONT: %w", err)
		}
		// The Will check counts the broker's running time from here.
		e.note(Note{Kind: NoteNemesis, Detail: nemesisCont})
		return nil
	case NemesisCut:
		d := jitter(c.rng, 200*time.Millisecond, 1500*time.Millisecond)
		e.proxy.Cut(true)
		sleepCtx(ctx, d)
		e.proxy.Unblock()
		return nil
	case NemesisPowerCut:
		torn := c.rng.Float64() < c.opt.TornRate
		cutRng := rand.New(rand.NewPCG(c.rng.Uint64(), c.rng.Uint64()))
		t0 := e.now()
		e.note(Note{Kind: NoteNemesis, Detail: fmt.Sprintf("powercut torn=%v", torn), T: t0})
		// The cut first, then the kill: the kernel writes a dying process's
		// dirty shared pages (SQLite's -shm) back on exit (design.md).
		if err := c.disk.powerCut(torn, cutRng); err != nil {
			return fmt.Errorf("power cut: %w", err)
		}
		c.proc.kill()
		if err := c.disk.remount(); err != nil {
			return err
		}
		if c.opt.Provider == ProviderSQLite {
			if f, bad := c.checkIntegrity(c.disk.cutCount()); bad {
				c.findings = append(c.findings, f)
			}
		}
		loss := c.opt.LossWindow.Nanoseconds()
		if c.opt.Provider == ProviderMemory {
			loss = t0 - c.lastSnapshot
		}
		if c.opt.Control == ControlPowerCutNoLoss {
			loss = 0
		}
		return c.restart(ctx, t0, L.OpBrokerPowerCut, loss)
	}
	return fmt.Errorf("unknown nemesis %q", name)
}

// restart starts the broker again and records the crash operation. A broker
// that will not start is a finding (what it kept could not be read back, or
// it refuses its own files) and ends the campaign.
func (c *campaign) restart(ctx context.Context, t0 int64, op string, lossNs int64) error {
	defer c.env.stops.Add(1) // the stop its caller began has ended
	p, err := c.start(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errNotFaultBuild) {
			return err
		}
		c.findings = append(c.findings, Finding{Check: "restart", Invariant: 14,
			Msg: fmt.Sprintf("the broker did not start again: %v", err)})
		c.aborted = "the broker did not start again"
		c.env.note(Note{Kind: NoteAbort, Detail: c.aborted})
		return errAbort
	}
	c.proc = p
	c.env.proxy.SetUpstream(p.addr)
	o := L.Op{Op: op, Call: t0, Return: c.env.now()}
	if op == L.OpBrokerPowerCut {
		o.Input = &L.Input{LossNs: max(lossNs, 0)}
	}
	c.env.write(o)
	return nil
}

// crashRestart starts the broker after it died without a graceful stop
// (SIGKILL, or an exit of its own) at t0, telling the models what survives:
// sqlite keeps every committed write; memory keeps exactly its last
// snapshot (invariant 14) — unless the control claims otherwise.
func (c *campaign) crashRestart(ctx context.Context, t0 int64) error {
	if c.opt.Provider == ProviderMemory && c.opt.Control != ControlMemoryKillDurable {
		return c.restart(ctx, t0, L.OpBrokerPowerCut, t0-c.lastSnapshot)
	}
	return c.restart(ctx, t0, L.OpBrokerRestart, 0)
}

// errNotFaultBuild: a control that breaks the broker ran a binary that did
// not say it was broken — a harness failure, never a pass.
var errNotFaultBuild = errors.New("not the fault-injection build the control needs")

// faultsFor is what a fault-injection build is told to break at its next
// start: nothing in an honest run.
func (c *campaign) faultsFor() string {
	switch c.opt.Control {
	case ControlNextOffsetMaxPlusOne:
		return "next-offset-max-plus-one"
	case ControlSplitDeadLetter:
		// Processes die between the halves of their first move until one
		// has (a kill may come before any move): those after it must live
		// to find the job in both places and move it again.
		if c.exits == 0 {
			return "split-dead-letter,crash-between-dead-letter-halves"
		}
		return "split-dead-letter"
	case ControlSyncOff:
		return "sqlite-sync-off"
	}
	return ""
}

// start starts one broker process, broken as the control says, and checks
// that it says it is.
func (c *campaign) start(ctx context.Context) (*brokerProc, error) {
	want := c.faultsFor()
	p, err := startBroker(ctx, c.bin, c.cfgPath, want, c.logFile, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if p.faults != want {
		p.kill()
		return nil, fmt.Errorf("control %q: %s was told %s=%q and reports %q (build it with -tags %s): %w",
			c.opt.Control, c.bin, faultsEnv, want, p.faults, FaultBuildTag, errNotFaultBuild)
	}
	return p, nil
}

// maxExits bounds the broker's own exits one campaign restarts it after
// (invariant 13): a broker that keeps dying ends the campaign.
const maxExits = 20

// wait sleeps d; a broker that exits meanwhile with no nemesis is a finding
// and is started again at once, so the run goes on and the checks still see
// what it left.
func (c *campaign) wait(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-c.proc.exited:
			if err := c.exitedOnItsOwn(ctx); err != nil {
				return err
			}
		}
	}
}

// exitedOnItsOwn records a broker that died with no nemesis (a crash, an
// exit: nothing any client asked for) and starts it again, told to the
// models like a kill.
func (c *campaign) exitedOnItsOwn(ctx context.Context) error {
	t0 := c.env.now()
	c.env.stops.Add(1) // crashRestart adds the other
	c.proc.wait()
	c.exits++
	c.env.note(Note{Kind: NoteNemesis, Detail: "exit (the broker's own)", T: t0})
	c.findings = append(c.findings, Finding{Check: "broker-exit",
		Msg: fmt.Sprintf("the broker exited with no nemesis (%v); its last output:\n%s", c.proc.err, c.proc.tail.last(3))})
	c.logf("the broker exited on its own (%v)", c.proc.err)
	if c.exits > maxExits {
		c.aborted = fmt.Sprintf("the broker exited on its own %d times", c.exits)
		c.env.note(Note{Kind: NoteAbort, Detail: c.aborted})
		return errAbort
	}
	return c.crashRestart(ctx, t0)
}

// awaitTicksEmpty holds a kill until the prober has seen the ticks channel
// emptied by retention with no tick published since (bounded: a few burst
// cycles), so the restart meets invariant 9's trap — a channel with no
// surviving row — every time.
func (c *campaign) awaitTicksEmpty(ctx context.Context) {
	e := c.env
	bound := time.Now().Add(4 * (ticksRetention*2 + 500*time.Millisecond + time.Second))
	for !e.ticksEmpty() {
		if time.Now().After(bound) {
			c.logf("the ticks channel was never seen empty: killing anyway")
			return
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			return
		}
	}
}

// close stops the broker gracefully, unmounts, and closes the files. It
// runs whatever happened before.
func (c *campaign) close() error {
	var errs []error
	if c.proc != nil && c.proc.alive() {
		_ = c.proc.signal(sigCont) // a stopped broker cannot shut down
		if err := c.proc.term(30 * time.Second); err != nil {
			c.findings = append(c.findings, Finding{Check: "graceful-shutdown", Invariant: 14, Msg: fmt.Sprintf("final SIGTERM: %v", err)})
		}
	}
	if c.env != nil && c.env.proxy != nil {
		_ = c.env.proxy.Close()
	}
	if c.disk != nil {
		if err := c.disk.unmount(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.env != nil {
		if err := c.env.hist.Close(); err != nil && !errors.Is(err, L.ErrClosed) {
			errs = append(errs, err)
		}
		if err := c.env.notes.flush(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range []*os.File{c.histFile, c.notesFile, c.logFile} {
		if f != nil {
			if err := f.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
