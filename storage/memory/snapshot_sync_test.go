package memory

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage/storagetest"
)

// TestInvariant14_EverySnapshotReplacementIsSyncedWholeBeforeItsRename:
// the known-good snapshot is never overwritten before its replacement is
// fully written and synced. Renaming an unsynced file over the old one is
// invisible to every check that reads the files back (the page cache holds
// the bytes); only a power cut shows it, as an empty file where the last
// good snapshot was. So the provider's fsync goes through a seam: every
// replacement (the manifest and each store's file) must have been synced,
// at the size it has when it is renamed, before it takes the final name.
func TestInvariant14_EverySnapshotReplacementIsSyncedWholeBeforeItsRename(t *testing.T) {
	dir := t.TempDir()
	clock := storagetest.NewClock(storagetest.Base)
	var mu sync.Mutex
	synced := map[string]int64{} // replacement path → its size when synced
	renamed := 0
	faults := &Faults{
		SyncSnapshot: func(f *os.File) error {
			if err := f.Sync(); err != nil {
				return err
			}
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			mu.Lock()
			synced[f.Name()] = fi.Size()
			mu.Unlock()
			return nil
		},
		BeforeSnapshotRename: func(final string) error {
			tmps, _ := filepath.Glob(final + tmpMarker + "*")
			if len(tmps) != 1 {
				t.Errorf("want one replacement beside %s, found %v", final, tmps)
				return nil
			}
			fi, err := os.Stat(tmps[0])
			if err != nil {
				t.Error(err)
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			renamed++
			size, ok := synced[tmps[0]]
			switch {
			case !ok:
				t.Errorf("%s is renamed over %s without an fsync", filepath.Base(tmps[0]), filepath.Base(final))
			case size != fi.Size():
				t.Errorf("%s was synced at %d bytes and renamed at %d", filepath.Base(tmps[0]), size, fi.Size())
			}
			return nil
		},
	}
	// Two graceful stops: the first writes the snapshots, the second
	// replaces every one of them.
	for round := range 2 {
		p := mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now, Faults: faults})
		l, _ := p.Append("events")
		for i := range 3 {
			l.Append(job(fmt.Sprint(round, "-", i), 5))
		}
		v, err := p.Values("retained")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Put(job(fmt.Sprint("v", round), 5)); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Hour)
	}
	if renamed < 6 { // manifest, events and retained, twice
		t.Fatalf("the rename hook saw %d replacements, want at least 6", renamed)
	}
}
