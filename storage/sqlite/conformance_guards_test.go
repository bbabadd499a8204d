package sqlite

import (
	"path/filepath"
	"testing"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// TestInvariantConformance runs the conformance cases named for an
// invariant (storagetest.RunGuards) on the default options, so make
// invariants runs and counts them: among them
// Invariant09_ValueOffsetsNeverReusedAfterReplaceRemoveAndRestart, the one
// guard of a latest store's next offset across a restart. TestConformance
// runs them again under every commit mode.
func TestInvariantConformance(t *testing.T) {
	storagetest.RunGuards(t, func(t *testing.T, dir string, so storagetest.Opts) storage.Provider {
		t.Helper()
		o := testOptions(filepath.Join(dir, "saguin.db"))
		o.MaxBytes, o.Reserve, o.Now = so.MaxBytes, so.Reserve, so.Now
		if so.BetweenReleaseHalves != nil {
			o.Faults = &Faults{BetweenReleaseHalves: so.BetweenReleaseHalves}
		}
		p, err := Open(o)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return p
	})
}
