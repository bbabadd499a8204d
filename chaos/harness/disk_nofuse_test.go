//go:build linux && (386 || arm || mips || mipsle)

package harness

import (
	"errors"
	"testing"
)

// TestPowerCutNemesisRefusedWithoutFaultfs: a 32-bit harness has no
// faultfs, so a campaign asking for power cuts is refused before anything
// starts, saying why and what to run instead; every other nemesis stays.
func TestPowerCutNemesisRefusedWithoutFaultfs(t *testing.T) {
	o := Options{Cycles: 1, OutDir: t.TempDir(), Nemeses: []NemesisWeight{{NemesisKill, 1}, {NemesisPowerCut, 1}}}
	if err := o.setDefaults(); !errors.Is(err, errNoPowerCuts) {
		t.Fatalf("power cuts on a 32-bit harness: %v, want %v", err, errNoPowerCuts)
	}
	o = Options{Cycles: 1, OutDir: t.TempDir(), Nemeses: []NemesisWeight{{NemesisKill, 1}, {NemesisTerm, 1}, {NemesisStop, 1}, {NemesisCut, 1}}}
	if err := o.setDefaults(); err != nil {
		t.Fatalf("kill, term, stop and cut on a 32-bit harness: %v", err)
	}
}
