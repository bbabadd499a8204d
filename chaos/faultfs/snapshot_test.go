//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/memory"
)

// Invariant 14: memory durability is exactly the last successful snapshot.
// A snapshot_dir that did not exist is created by the provider at its first
// start; the snapshot written into it at a graceful stop is synced, and the
// directory entry must be too — otherwise a power cut after the stop undoes
// the directory, the synced snapshot goes with it, and the next start
// creates the directory afresh and begins empty, indistinguishable from a
// fresh install. (The chaos harness's power cuts found this.)
func TestInvariant14_CreatedSnapshotDirSurvivesAPowerCut(t *testing.T) {
	r := newRig(t)
	dir := r.path("var/lib/saguin/snapshots") // none of it exists yet
	open := func() *memory.Provider {
		t.Helper()
		p, err := memory.Open(memory.Options{Name: "mem", SnapshotDir: dir})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		return p
	}
	p := open()
	log, err := p.Append("events")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ {
		if _, err := log.Append(storage.Record{Topic: "events/a", Payload: []byte(fmt.Sprint(i)), Timestamp: time.Unix(1, 0)}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := p.Close(); err != nil { // the graceful stop: the snapshot is written
		t.Fatalf("close: %v", err)
	}
	r.cut(true, rand.New(rand.NewPCG(14, 14)))

	p = open()
	defer p.Close()
	log, err = p.Append("events")
	if err != nil {
		t.Fatal(err)
	}
	recs, floor, err := log.Read(1, 10)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(recs) != 5 || floor != 1 || log.Next() != 6 {
		t.Fatalf("after the cut: %d records, floor %d, next %d; want the 5 snapshotted records, floor 1, next 6",
			len(recs), floor, log.Next())
	}
}
