package harness

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// The negative controls that break the broker itself: each campaign runs a
// fault-injection build (FaultBuildTag) switched, through SAGUIN_FAULTS, to
// re-create a bug an invariant forbids, and must fail — caught by the check
// named, the one that guards that invariant. A check that cannot fail is a
// defect (issue 4); these are the proof that each can.

// caught fails the test unless the campaign failed with a finding of one of
// checks (on channel, when not ""). It logs every check that fired.
func caught(t *testing.T, rep *Report, channel string, checks ...string) {
	t.Helper()
	var fired []string
	for _, v := range rep.Violations {
		if !slices.Contains(fired, v.Check+"["+v.Channel+"]") {
			fired = append(fired, v.Check+"["+v.Channel+"]")
		}
	}
	t.Logf("caught by: %v", fired)
	if rep.OK() {
		t.Fatalf("control %s passed: a check that cannot fail is a defect\n%s", rep.Control, rep.Details())
	}
	if !slices.ContainsFunc(rep.Violations, func(f Finding) bool {
		return slices.Contains(checks, f.Check) && (channel == "" || f.Channel == channel)
	}) {
		t.Fatalf("control %s failed, but not by %v on %q:\n%s", rep.Control, checks, channel, rep.Details())
	}
}

// A sqlite provider that recomputes the next offset as MAX(offset)+1 when it
// opens a channel, killed while retention has emptied ticks: the restarted
// broker gives ticks floor 1 and next 1 again. The prober saw the floor at
// 11 or more before; seeing 1 after is floor-back (invariant 1), and the
// head going back is what the append model of ticks cannot linearize
// (invariant 9).
func TestNegativeControlNextOffsetMaxPlusOneIsCaught(t *testing.T) {
	rep := runCampaign(t, Options{Seed: seed(t, 6), Cycles: 2, Provider: ProviderSQLite, Control: ControlNextOffsetMaxPlusOne,
		Nemeses: []NemesisWeight{{NemesisKill, 1}}})
	if rep.Applied[NemesisKill] != 2 {
		t.Fatalf("applied %v, want two kills", rep.Applied)
	}
	caught(t, rep, chanTicks, "floor-back")
}

// A sqlite provider that moves a dead letter in two transactions, and a
// first process that dies between them at its first move: the job is in
// jobs__dlq and still in the queue with its attempt spent, so the next
// process moves it again. With max_attempts 1 every job a worker does not
// ack is dead-lettered at once, so the first move comes early. The final
// read of jobs__dlq finds the job twice: dead-letter-twice (invariant 5).
func TestNegativeControlSplitDeadLetterIsCaught(t *testing.T) {
	rep := runCampaign(t, Options{Seed: seed(t, 7), Cycles: 2, Provider: ProviderSQLite, Control: ControlSplitDeadLetter,
		MaxAttempts: 1, Nemeses: []NemesisWeight{{NemesisKill, 1}}})
	if !slices.ContainsFunc(rep.Violations, func(f Finding) bool { return f.Check == "broker-exit" }) {
		t.Fatalf("the fault build never died between the halves of a dead-letter move:\n%s", rep.Details())
	}
	caught(t, rep, chanJobs+"__dlq", "dead-letter-twice")
}

// A sqlite provider that never fsyncs (synchronous=OFF, no WAL flush) under
// power cuts: what a cut takes reaches back to the start, far past the loss
// window, so acknowledged records are missing at the end: acked-lost
// (invariant 14). A torn cut may instead leave a file SQLite finds corrupt
// (integrity) or the broker refuses (restart): each is the same loss seen
// sooner. The healthy interval is longer than the loss window, so every cut
// has records to lose outside it.
func TestNegativeControlSyncOffIsCaught(t *testing.T) {
	needFUSE(t)
	rep := runCampaign(t, Options{Seed: seed(t, 8), Cycles: 2, Provider: ProviderSQLite, Control: ControlSyncOff,
		MinHealthy: 2500 * time.Millisecond, MaxHealthy: 3 * time.Second,
		Nemeses: []NemesisWeight{{NemesisPowerCut, 1}}})
	caught(t, rep, "", "acked-lost", "integrity", "restart")
}

// A control that breaks the broker, run on a binary built without the fault
// tag, is a harness failure — never a campaign that passes because the
// broker was not broken after all.
func TestControlRefusesABrokerThatIsNotBroken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := Run(ctx, Options{Seed: 1, Cycles: 1, Provider: ProviderSQLite, Control: ControlSplitDeadLetter,
		Nemeses: []NemesisWeight{{NemesisKill, 1}}, OutDir: t.TempDir(), Binary: testBinary(t)})
	if !errors.Is(err, errNotFaultBuild) {
		t.Fatalf("Run with a production build = %v, want %v", err, errNotFaultBuild)
	}
}
