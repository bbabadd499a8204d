//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

func TestFsyncedWriteSurvivesCut(t *testing.T) {
	r := newRig(t)
	a := pattern(1, 3*pageSize+17)
	r.durable("f", a)
	// A second synced write on top of the first.
	b := pattern(2, 1000)
	r.write("f", b, 5000, true)
	want := append([]byte(nil), a...)
	copy(want[5000:], b)

	r.cut(false, nil)
	r.mustEqual("f", want)
}

func TestUnsyncedWriteRolledBackToSyncedContentsAndSize(t *testing.T) {
	r := newRig(t)
	a := pattern(3, 8*pageSize+100)
	r.durable("f", a)

	// An unaligned overwrite across pages, and an append of three pages, never fsynced.
	r.write("f", pattern(4, 2*pageSize+300), 3*pageSize-150, false)
	r.write("f", pattern(5, 3*pageSize), int64(len(a)), false)
	// The kernel does not cache writes: they are in the backing file already.
	if got, err := os.ReadFile(r.backingPath("f")); err != nil || len(got) != len(a)+3*pageSize {
		t.Fatalf("backing file before the cut: %d bytes, %v; want the unsynced append there", len(got), err)
	}

	r.cut(false, nil)
	r.mustEqual("f", a)
	if st := r.fs.Stats(); st.Writes != 0 {
		t.Fatalf("a fresh mount counts %d writes", st.Writes)
	}
}

func TestPartialSyncKeepsOnlyWhatWasSynced(t *testing.T) {
	r := newRig(t)
	a := pattern(6, 4*pageSize)
	r.durable("f", a)
	b := pattern(7, pageSize)
	r.write("f", b, pageSize, true)                       // page 1: synced
	r.write("f", pattern(8, pageSize), 2*pageSize, false) // page 2: not

	r.cut(false, nil)
	want := append([]byte(nil), a...)
	copy(want[pageSize:], b)
	r.mustEqual("f", want)
}

func TestTruncateRolledBack(t *testing.T) {
	r := newRig(t)
	a := pattern(9, 5*pageSize+3)
	r.durable("f", a)
	if err := os.Truncate(r.path("f"), 100); err != nil {
		t.Fatal(err)
	}
	// Grow it again sparsely: the bytes between were truncated away and must come back.
	r.write("f", []byte("tail"), 9*pageSize, false)
	f, err := os.OpenFile(r.path("f"), os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	r.cut(false, nil)
	r.mustEqual("f", a)
}

func TestOSyncWriteIsDurable(t *testing.T) {
	r := newRig(t)
	a := pattern(10, 2*pageSize)
	r.durable("f", a)
	f, err := os.OpenFile(r.path("f"), os.O_RDWR|os.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := pattern(11, 100)
	if _, err := f.WriteAt(b, 10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if st := r.fs.Stats(); st.Fsyncs == 0 {
		t.Fatal("an O_SYNC write did not reach the layer as an fsync")
	}

	r.cut(false, nil)
	copy(a[10:], b)
	r.mustEqual("f", a)
}

// The kernel writes dirty pages of a shared mapping back when they are synced, and when the
// process unmaps them — on exit too, which is why the cut must come before the process is killed
// (design.md). msync(MS_SYNC) commits; pages still dirty at the cut must not land afterwards.
func TestMmapSyncedPagesSurviveAndDirtyPagesAfterCutAreLost(t *testing.T) {
	r := newRig(t)
	a := pattern(12, 2*pageSize)
	r.durable("f", a)
	w := startWorker(t, "mmap", "FAULTFS_PATH="+r.path("f"))
	if l := w.next(); l != "ready" {
		t.Fatalf("mmap worker: %s", l)
	}
	if err := r.fs.PowerCut(false, nil); err != nil {
		t.Fatal(err)
	}
	w.kill() // its exit writes the dirty page back: refused
	if st := r.fs.Stats(); st.Rejected == 0 {
		t.Error("the dying process's writeback did not reach the layer")
	}
	r.remount()

	want := append([]byte(nil), a...)
	copy(want, pattern(13, pageSize))
	r.mustEqual("f", want)
}

func TestRequestsAfterCutFail(t *testing.T) {
	r := newRig(t)
	r.durable("f", pattern(15, 100))
	r.durable("g", pattern(16, 100))
	f, err := os.OpenFile(r.path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.fs.PowerCut(false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("late"), 0); !isEIO(err) {
		t.Errorf("write after cut: %v, want EIO", err)
	}
	if err := f.Sync(); !isEIO(err) {
		t.Errorf("fsync after cut: %v, want EIO", err)
	}
	if err := os.WriteFile(r.path("new"), []byte("x"), 0o644); err == nil {
		t.Error("creating a file after the cut succeeded")
	}
	if err := os.Remove(r.path("g")); err == nil {
		t.Error("unlink after the cut succeeded")
	}
	if err := os.Rename(r.path("g"), r.path("h")); err == nil {
		t.Error("rename after the cut succeeded")
	}
	if err := os.Mkdir(r.path("d"), 0o755); err == nil {
		t.Error("mkdir after the cut succeeded")
	}
	if err := os.Truncate(r.path("g"), 0); err == nil {
		t.Error("truncate after the cut succeeded")
	}
	if st := r.fs.Stats(); st.Rejected == 0 {
		t.Error("no request counted as rejected")
	}
	if err := r.fs.PowerCut(false, nil); err == nil {
		t.Error("a second cut on one mount succeeded")
	}
	f.Close()
	r.remount()
	r.mustEqual("f", pattern(15, 100))
	r.mustEqual("g", pattern(16, 100))
	r.mustNotExist("new")
	r.mustNotExist("h")
	r.mustNotExist("d")
}

// A torn cut must leave something that is neither the synced nor the written state, made of
// whole sectors of one or the other: the negative control relies on it.
func TestTornCutLeavesSectorMix(t *testing.T) {
	r := newRig(t)
	const size = 16 * pageSize
	a := pattern(17, size)
	b := pattern(18, size)
	r.durable("f", a)
	r.write("f", b, 0, false)

	if err := r.fs.PowerCut(true, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	cs := r.fs.Stats().Cut
	r.remount()

	got := r.read("f")
	if len(got) != size {
		t.Fatalf("size %d, want %d (the size was synced)", len(got), size)
	}
	if bytes.Equal(got, a) || bytes.Equal(got, b) {
		t.Fatal("torn cut left exactly one of the two states")
	}
	var fromA, fromB int
	for i := 0; i < size; i += sectorSize {
		s := got[i : i+sectorSize]
		switch {
		case bytes.Equal(s, a[i:i+sectorSize]):
			fromA++
		case bytes.Equal(s, b[i:i+sectorSize]):
			fromB++
		default:
			t.Fatalf("sector at %d is neither old nor new", i)
		}
	}
	if fromA == 0 || fromB == 0 {
		t.Fatalf("sectors: %d old, %d new; want both", fromA, fromB)
	}
	if cs.PagesTorn == 0 || cs.PagesKeptNew == 0 || cs.PagesRestored == 0 {
		t.Fatalf("cut stats %+v: want restored, kept and torn pages", cs)
	}
	t.Logf("torn cut: %d old sectors, %d new sectors, %+v", fromA, fromB, cs)
}

// Torn cuts with appended data: the size may land without all of the data, which reads back
// as zeros, and never beyond what was written.
func TestTornCutOfAppendZeroesOrKeeps(t *testing.T) {
	var sawZero, sawNewSize bool
	for seed := uint64(1); seed <= 6 && !(sawZero && sawNewSize); seed++ {
		r := newRig(t)
		a := pattern(19, pageSize)
		r.durable("f", a)
		appended := pattern(20, 8*pageSize)
		r.write("f", appended, pageSize, false)
		if err := r.fs.PowerCut(true, rand.New(rand.NewPCG(seed, 7))); err != nil {
			t.Fatal(err)
		}
		r.remount()
		got := r.read("f")
		if len(got) < pageSize || len(got) > 9*pageSize {
			t.Fatalf("seed %d: size %d outside [synced, written]", seed, len(got))
		}
		if !bytes.Equal(got[:pageSize], a) {
			t.Fatalf("seed %d: synced page changed", seed)
		}
		if len(got) > pageSize {
			sawNewSize = true
		}
		for i := pageSize; i < len(got); i += sectorSize {
			s := got[i:min(i+sectorSize, len(got))]
			if bytes.Equal(s, make([]byte, len(s))) {
				sawZero = true
			} else if !bytes.Equal(s, appended[i-pageSize:i-pageSize+len(s)]) {
				t.Fatalf("seed %d: sector at %d is neither written data nor zeros", seed, i)
			}
		}
	}
	if !sawZero || !sawNewSize {
		t.Fatalf("six seeds: zeroed sectors seen %v, grown size seen %v", sawZero, sawNewSize)
	}
}

// Passthrough would hand the backing descriptor to the kernel and bypass the layer; writeback
// caching would delay writes. Both would show as writes that never reach us.
func TestWritesAndFsyncsReachTheLayer(t *testing.T) {
	var h any = &fileHandle{}
	if _, ok := h.(gofs.FilePassthroughFder); ok {
		t.Fatal("fileHandle offers a passthrough descriptor")
	}
	r := newRig(t)
	f, err := os.Create(r.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := pattern(21, 3*pageSize)
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	st := r.fs.Stats()
	if st.Writes == 0 || st.WriteBytes != uint64(len(data)) {
		t.Fatalf("stats after write: %+v, want %d bytes written through the layer", st, len(data))
	}
	if got, err := os.ReadFile(r.backingPath("f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("backing file right after write(2): %d bytes, %v", len(got), err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	r.syncDir("")
	st = r.fs.Stats()
	if st.Fsyncs != 1 || st.DirFsyncs != 1 {
		t.Fatalf("stats after fsyncs: %+v, want one file and one directory fsync", st)
	}
}

func TestCleanUnmountKeepsEverything(t *testing.T) {
	r := newRig(t)
	a := pattern(22, 2*pageSize)
	r.durable("f", a)
	r.write("f", pattern(23, 10), 0, false)
	r.write("new", []byte("never synced"), 0, false)
	if err := os.Remove(r.path("f")); err != nil {
		t.Fatal(err)
	}
	r.remount()
	r.mustNotExist("f")
	r.mustEqual("new", []byte("never synced"))
	if _, err := os.Lstat(r.backingPath(stateDirName)); err != nil {
		t.Fatalf("state dir while mounted: %v", err)
	}
	if err := r.fs.Unmount(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(r.backingPath(stateDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir after unmount: %v, want it removed", err)
	}
}

func TestStateDirIsHidden(t *testing.T) {
	r := newRig(t)
	r.durable("f", []byte("x"))
	ents, err := os.ReadDir(r.mp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == stateDirName {
			t.Fatal("state dir listed through the mount")
		}
	}
	if len(ents) != 1 {
		t.Fatalf("root lists %d entries, want 1", len(ents))
	}
	if _, err := os.Lstat(r.path(stateDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lookup of state dir: %v", err)
	}
	if err := os.Mkdir(r.path(stateDirName), 0o755); err == nil {
		t.Fatal("mkdir of the state dir name succeeded")
	}
	if _, err := Mount(r.backing, t.TempDir(), Options{}); err == nil {
		t.Fatal("a second mount of the same backing dir succeeded")
	}
}

// invariant 13: the memory kept for rollback is bounded; past the bound a write fails cleanly.
func TestSavedBytesBound(t *testing.T) {
	backing, mp := t.TempDir(), t.TempDir()
	if err := os.WriteFile(backing+"/f", pattern(24, 4*pageSize), 0o644); err != nil {
		t.Fatal(err)
	}
	fs := mountT(t, backing, mp, Options{MaxSavedBytes: 2 * pageSize})
	f, err := os.OpenFile(mp+"/f", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 2*pageSize), 0); err != nil {
		t.Fatalf("write within the bound: %v", err)
	}
	if _, err := f.WriteAt(make([]byte, 1), 3*pageSize); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past the bound: %v, want ENOSPC", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// A commit frees the saved pages.
	if _, err := f.WriteAt(make([]byte, 1), 3*pageSize); err != nil {
		t.Fatalf("write after fsync: %v", err)
	}
	_ = fs
}

// invariant 13: so are the tracked files, directories and saved directory entries.
func TestTrackedObjectsBound(t *testing.T) {
	backing, mp := t.TempDir(), t.TempDir()
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(backing, fmt.Sprint(i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mountT(t, backing, mp, Options{MaxTracked: 4})
	// The first change to the root must save its five entries: more than allowed.
	if err := os.WriteFile(filepath.Join(mp, "new"), nil, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("create past the bound: %v, want ENOSPC", err)
	}
	// Data changes of existing files need one object each.
	if err := os.WriteFile(filepath.Join(mp, "0"), []byte("y"), 0o644); err != nil {
		t.Fatalf("write within the bound: %v", err)
	}
}

// Abort is the way out of a hung mount: requests fail at once instead of waiting forever.
func TestAbortSeversTheMount(t *testing.T) {
	r := newRig(t)
	r.durable("f", []byte("x"))
	f, err := os.Open(r.path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.fs.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("read after abort: %v, want ENOTCONN", err)
	}
	f.Close()
	if err := r.fs.Unmount(); err != nil {
		t.Fatalf("unmount after abort: %v", err)
	}
	if mounted, err := IsMounted(r.mp); err != nil || mounted {
		t.Fatalf("still mounted after abort and unmount: %v %v", mounted, err)
	}
}
