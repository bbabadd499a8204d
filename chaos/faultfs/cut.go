//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// PowerCut cuts the power. From the moment it takes effect every further request on the mount
// fails with EIO — in particular the WRITEs the kernel sends when the process using the mount
// exits and its dirty shared mappings (SQLite's -shm) are written back, which is why the cut
// must come before that process is killed. Then the backing directory is rewritten to what
// survives a power cut:
//
//   - torn=false: exactly the synced state. Every file gets back the contents and size it had at
//     its last fsync; every directory gets back the entries it had at its last fsync.
//   - torn=true: a random outcome of a disk that persisted unsynced data partly and in any order,
//     drawn from rng (required): each unsynced page is restored, kept as written, or torn (a mix
//     of old and new 512-byte sectors); the size is the synced one, the current one or in
//     between; pages appended since the fsync may read back zeroed in whole or in part; each
//     directory keeps its unsynced entries or loses them. Synced data is never touched, so a
//     program that fsyncs correctly must survive this too.
//
// Afterwards the caller kills what used the mount, calls Unmount, and Mounts the backing
// directory again before restarting it. PowerCut can be called once per mount.
func (f *FS) PowerCut(torn bool, rng *rand.Rand) error {
	if torn && rng == nil {
		return errors.New("faultfs: a torn power cut needs a random source")
	}
	start := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return errors.New("faultfs: power already cut")
	}
	if f.stopped.Load() {
		return errors.New("faultfs: filesystem already unmounted")
	}
	// From here on, nothing reaches the backing directory through the mount.
	f.cut = true
	f.stopped.Store(true)

	var cs CutStats
	var errs []error
	// Sorted so a seed reproduces the same outcome.
	for _, k := range slices.SortedFunc(maps.Keys(f.files), compareKeys) {
		cs.Files++
		if err := f.restoreFile(f.files[k], torn, rng, &cs); err != nil {
			errs = append(errs, fmt.Errorf("faultfs: restoring inode %d: %w", k.ino, err))
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(f.dirs), compareKeys) {
		if torn && rng.IntN(2) == 0 {
			cs.DirsKept++
			continue
		}
		cs.DirsRolled++
		if err := f.rollbackDir(f.dirs[k], &cs); err != nil {
			errs = append(errs, fmt.Errorf("faultfs: restoring directory inode %d: %w", k.ino, err))
		}
	}
	f.dropAllState()
	if err := clearDirAt(f.stateFd); err != nil {
		errs = append(errs, fmt.Errorf("faultfs: clearing state dir: %w", err))
	}
	cs.Duration = time.Since(start)
	f.stats.Cut = cs
	return errors.Join(errs...)
}

func compareKeys(a, b inodeKey) int {
	if c := cmp.Compare(a.dev, b.dev); c != 0 {
		return c
	}
	return cmp.Compare(a.ino, b.ino)
}

// restoreFile rewrites one file to its synced state, or to a torn version of it.
func (f *FS) restoreFile(s *fileState, torn bool, rng *rand.Rand, cs *CutStats) error {
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		return err
	}
	cur := st.Size
	newSize := s.syncedSize
	if torn {
		lo, hi := min(s.syncedSize, cur), max(s.syncedSize, cur)
		switch rng.IntN(3) {
		case 0:
			newSize = s.syncedSize
		case 1:
			newSize = cur
		default:
			newSize = min(hi, lo+rng.Int64N((hi-lo)/sectorSize+1)*sectorSize)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(s.saved)) {
		old := s.saved[p]
		off := p * pageSize
		if !torn {
			if err := pwriteFull(s.fd, old, off); err != nil {
				return err
			}
			cs.PagesRestored++
			continue
		}
		switch rng.IntN(3) {
		case 0:
			if err := pwriteFull(s.fd, old, off); err != nil {
				return err
			}
			cs.PagesRestored++
		case 1:
			cs.PagesKeptNew++
		default:
			for i := 0; i < len(old); i += sectorSize {
				if rng.IntN(2) == 0 {
					if err := pwriteFull(s.fd, old[i:min(i+sectorSize, len(old))], off+int64(i)); err != nil {
						return err
					}
				}
			}
			cs.PagesTorn++
		}
	}
	if err := unix.Ftruncate(s.fd, newSize); err != nil {
		return err
	}
	if newSize != cur {
		cs.Truncated++
	}
	if torn && newSize > s.syncedSize {
		// The size reached the disk but some appended data may not have.
		for p := s.syncedSize / pageSize; p*pageSize < newSize; p++ {
			from, to := max(p*pageSize, s.syncedSize), min((p+1)*pageSize, newSize)
			zeroed := false
			switch rng.IntN(3) {
			case 0:
			case 1:
				if err := pwriteFull(s.fd, make([]byte, to-from), from); err != nil {
					return err
				}
				zeroed = true
			default:
				for i := from; i < to; i += sectorSize {
					if rng.IntN(2) == 0 {
						if err := pwriteFull(s.fd, make([]byte, min(sectorSize, to-i)), i); err != nil {
							return err
						}
						zeroed = true
					}
				}
			}
			if zeroed {
				cs.PagesZeroed++
			}
		}
	}
	return nil
}

// rollbackDir puts a directory's listing back to its snapshot: entries that are not in it (or
// name another inode) go, durable entries that went come back from the kept links.
func (f *FS) rollbackDir(d *dirState, cs *CutStats) error {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return err
	}
	if st.Nlink == 0 {
		// The directory itself was created since its parent's fsync and is gone with it.
		return nil
	}
	cur, err := f.listDir(d.fd, keyOf(&st), int(^uint(0)>>1))
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(cur)) {
		if e, ok := d.snap[name]; ok && e.key == cur[name].key {
			continue
		}
		if err := removeAllAt(d.fd, name); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(cur, name)
		cs.NamesRemoved++
	}
	for _, name := range slices.Sorted(maps.Keys(d.snap)) {
		e := d.snap[name]
		if c, ok := cur[name]; ok && c.key == e.key {
			continue
		}
		if e.dir {
			// Removing a durable directory commits its parent, so this cannot happen.
			errs = append(errs, fmt.Errorf("durable directory %q is missing", name))
			continue
		}
		if err := unix.Linkat(f.stateFd, graveName(e.key), d.fd, name, 0); err != nil {
			errs = append(errs, fmt.Errorf("restoring %q: %w", name, err))
			continue
		}
		cs.NamesRestored++
	}
	return errors.Join(errs...)
}
