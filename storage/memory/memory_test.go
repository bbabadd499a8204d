package memory

import (
	"testing"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// open is the storagetest opener: the snapshot directory is dir, so the
// suite's restarts go through a real snapshot.
func open(t *testing.T, dir string, o storagetest.Opts) storage.Provider {
	t.Helper()
	p, err := Open(Options{Name: "mem", SnapshotDir: dir, MaxBytes: o.MaxBytes, Reserve: o.Reserve, Writer: "test-build", Now: o.Now,
		Faults: &Faults{BetweenReleaseHalves: o.BetweenReleaseHalves}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return p
}

func TestConformance(t *testing.T) { storagetest.Run(t, open) }

func TestProperty(t *testing.T) { storagetest.Property(t, open) }
