//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// rig is one backing directory served at one mountpoint, remountable after a cut.
type rig struct {
	t       *testing.T
	backing string
	mp      string
	fs      *FS
	lastCut CutStats // of the mount before the last remount
}

// newRig mounts a fresh backing directory. A machine without FUSE fails the test: the power-cut
// suite must not pass by skipping.
func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, backing: t.TempDir(), mp: t.TempDir()}
	r.fs = mountT(t, r.backing, r.mp, Options{})
	return r
}

func mountT(t *testing.T, backing, mp string, opts Options) *FS {
	t.Helper()
	if err := CheckFUSE(); err != nil {
		t.Fatalf("power-cut tests need FUSE: %v", err)
	}
	f, err := Mount(backing, mp, opts)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	liveMounts.Store(f, struct{}{})
	// Registered after t.TempDir, so it runs before the directories are removed.
	t.Cleanup(func() {
		defer liveMounts.Delete(f)
		if err := f.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
		}
		if err := ForceUnmount(mp); err != nil {
			t.Errorf("lazy unmount of %s: %v", mp, err)
		}
	})
	return f
}

// cut cuts the power, unmounts and mounts again, as a harness does around a broker restart.
func (r *rig) cut(torn bool, rng *rand.Rand) {
	r.t.Helper()
	if err := r.fs.PowerCut(torn, rng); err != nil {
		r.t.Fatalf("PowerCut: %v", err)
	}
	r.remount()
}

func (r *rig) remount() {
	r.t.Helper()
	r.lastCut = r.fs.Stats().Cut
	if err := r.fs.Unmount(); err != nil {
		r.t.Fatalf("Unmount: %v", err)
	}
	r.fs = mountT(r.t, r.backing, r.mp, Options{})
}

func (r *rig) path(name string) string { return filepath.Join(r.mp, name) }

func (r *rig) backingPath(name string) string { return filepath.Join(r.backing, name) }

// write writes data at off in the mounted file name, creating it, and fsyncs it if sync.
func (r *rig) write(name string, data []byte, off int64, sync bool) {
	r.t.Helper()
	f, err := os.OpenFile(r.path(name), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		r.t.Fatalf("open %s: %v", name, err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		r.t.Fatalf("write %s: %v", name, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			r.t.Fatalf("fsync %s: %v", name, err)
		}
	}
}

// syncDir fsyncs a mounted directory ("" is the root).
func (r *rig) syncDir(name string) {
	r.t.Helper()
	d, err := os.Open(r.path(name))
	if err != nil {
		r.t.Fatalf("open dir %q: %v", name, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		r.t.Fatalf("fsync dir %q: %v", name, err)
	}
}

// durable creates name with data and makes it fully durable (file and directory fsync).
func (r *rig) durable(name string, data []byte) {
	r.t.Helper()
	r.write(name, data, 0, true)
	r.syncDir(filepath.Dir(name))
}

func (r *rig) read(name string) []byte {
	r.t.Helper()
	b, err := os.ReadFile(r.path(name))
	if err != nil {
		r.t.Fatalf("read %s: %v", name, err)
	}
	return b
}

func (r *rig) mustEqual(name string, want []byte) {
	r.t.Helper()
	got := r.read(name)
	if !bytes.Equal(got, want) {
		r.t.Fatalf("%s: got %d bytes (first diff at %d), want %d bytes", name, len(got), firstDiff(got, want), len(want))
	}
}

func (r *rig) mustNotExist(name string) {
	r.t.Helper()
	if _, err := os.Lstat(r.path(name)); !errors.Is(err, os.ErrNotExist) {
		r.t.Fatalf("%s: want it gone, Lstat says %v", name, err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// pattern returns n bytes that differ for every seed and position.
func pattern(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func isEIO(err error) bool { return errors.Is(err, syscall.EIO) }

func since(t0 time.Time) time.Duration { return time.Since(t0).Round(time.Microsecond) }
