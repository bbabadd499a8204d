package memory

import (
	"testing"

	"saguin.dev/storage/storagetest"
)

// TestInvariantConformance runs the conformance cases named for an
// invariant (storagetest.RunGuards), so make invariants runs and counts
// them: among them Invariant09_ValueOffsetsNeverReusedAfterReplaceRemoveAndRestart,
// the one guard of a latest store's next offset across a restart.
func TestInvariantConformance(t *testing.T) { storagetest.RunGuards(t, open) }
