//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"fmt"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/memory"
)

// Invariant 14: the known-good snapshot is never overwritten before its
// replacement is fully written and synced. Two graceful stops on a
// power-cut mount: the second replaces the first snapshot by rename, its
// directory is synced, and then the power is cut — with no torn pages, so
// the outcome is exactly what was synced. A replacement renamed before its
// own data was synced survives the cut as a name over an empty file: the
// first snapshot is gone and the second was never on the disk, and the
// next start refuses a damaged file (or starts empty). With the fsync the
// second snapshot is whole.
func TestInvariant14_SnapshotReplacementSyncedBeforeItTakesTheName(t *testing.T) {
	r := newRig(t)
	dir := r.path("snapshots")
	open := func() *memory.Provider {
		t.Helper()
		p, err := memory.Open(memory.Options{Name: "mem", SnapshotDir: dir})
		if err != nil {
			t.Fatalf("open after the cut: %v", err)
		}
		return p
	}
	appendN := func(p *memory.Provider, from, n int) {
		t.Helper()
		log, err := p.Append("events")
		if err != nil {
			t.Fatal(err)
		}
		for i := from; i < from+n; i++ {
			if _, err := log.Append(storage.Record{Topic: "events/a", Payload: []byte(fmt.Sprint(i)), Timestamp: time.Unix(1, 0)}); err != nil {
				t.Fatalf("append %d: %v", i, err)
			}
		}
	}
	p := open()
	appendN(p, 1, 5)
	if err := p.Close(); err != nil { // the first snapshot, the known-good one
		t.Fatalf("close: %v", err)
	}
	p = open()
	appendN(p, 6, 3)
	if err := p.Close(); err != nil { // its replacement
		t.Fatalf("close: %v", err)
	}
	r.cut(false, nil)

	p = open()
	defer p.Close()
	log, err := p.Append("events")
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := log.Read(1, 20)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(recs) != 8 || log.Next() != 9 {
		t.Fatalf("after the cut: %d records, next %d; want the second snapshot whole (8 records, next 9)", len(recs), log.Next())
	}
}
