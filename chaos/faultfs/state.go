//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// fileState is what a cut needs to put one file back to its last fsync: the size it had then
// and the old contents of every page changed since. It exists only while the file has unsynced
// changes; an fsync drops it. It is keyed by inode, not by path or handle, because an fsync
// through any descriptor commits the inode and writes arrive through whichever handle the
// kernel picks (mmap writeback included).
type fileState struct {
	fd         int // own read-write descriptor on the inode, valid after unlink and rename
	syncedSize int64
	saved      map[int64][]byte // page index -> synced bytes of that page (cut at syncedSize)
	savedBytes int64
}

// dirState is what a cut needs to put one directory back to its last fsync: its listing then.
// The snapshot is taken just before the first change to the directory since its last fsync.
type dirState struct {
	fd   int // descriptor on the directory, valid wherever it is renamed
	snap map[string]dirEntry
}

type dirEntry struct {
	key inodeKey
	dir bool
}

// graveName is the name, in the state directory, of the extra link kept to a durable inode.
func graveName(k inodeKey) string {
	return strconv.FormatUint(k.dev, 10) + "-" + strconv.FormatUint(k.ino, 10)
}

// stateForFd returns the tracking state of the inode open as fd, creating it if the inode has
// no unsynced change yet. In that case its current size is its synced size: every change since
// the last commit passes through this layer and creates the state first. Caller holds f.mu.
func (f *FS) stateForFd(fd int) (*fileState, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	k := keyOf(&st)
	if s, ok := f.files[k]; ok {
		return s, 0
	}
	if f.tracked+1 > f.opts.MaxTracked {
		f.logger.Printf("faultfs: more than %d tracked objects; refusing a change (raise Options.MaxTracked)", f.opts.MaxTracked)
		return nil, syscall.ENOSPC
	}
	// Reopen through /proc rather than dup: the handle may be write-only, and saving needs reads.
	own, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	s := &fileState{fd: own, syncedSize: st.Size, saved: make(map[int64][]byte)}
	f.files[k] = s
	f.tracked++
	return s, 0
}

// stateForPath is stateForFd for a change that arrives without a file handle (truncate(2)).
func (f *FS) stateForPath(p string) (*fileState, syscall.Errno) {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	defer unix.Close(fd)
	return f.stateForFd(fd)
}

// saveRange records the synced contents of every page overlapping [off, end) that has not been
// saved since the last fsync. Bytes at or past the synced size have no synced contents: a cut
// truncates them away. Caller holds f.mu.
func (f *FS) saveRange(s *fileState, off, end int64) syscall.Errno {
	end = min(end, s.syncedSize)
	if off < 0 || off >= end {
		return 0
	}
	for p := off / pageSize; p*pageSize < end; p++ {
		if _, ok := s.saved[p]; ok {
			continue
		}
		start := p * pageSize
		n := min(int64(pageSize), s.syncedSize-start)
		// invariant 13: the memory kept for rollback is bounded before it is allocated.
		if f.savedBytes+n > f.opts.MaxSavedBytes {
			f.logger.Printf("faultfs: more than %d bytes of unsynced pages; refusing a change (raise Options.MaxSavedBytes)", f.opts.MaxSavedBytes)
			return syscall.ENOSPC
		}
		buf := make([]byte, n)
		if err := preadFull(s.fd, buf, start); err != nil {
			// Every byte below the synced size is present until a change we saw removes
			// it, and truncation saves first; a short read means the model is broken.
			f.logger.Printf("faultfs: saving page %d: %v", p, err)
			return syscall.EIO
		}
		s.saved[p] = buf
		s.savedBytes += n
		f.savedBytes += n
	}
	return 0
}

// truncate sets the size of the inode behind s, saving what a shrink removes.
func (f *FS) truncate(s *fileState, size int64) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		return errnoOf(err)
	}
	if size < st.Size {
		if errno := f.saveRange(s, size, st.Size); errno != 0 {
			return errno
		}
	}
	return errnoOf(unix.Ftruncate(s.fd, size))
}

// commitFile makes the current contents and size of an inode its synced state. Caller holds f.mu.
func (f *FS) commitFile(k inodeKey) {
	s, ok := f.files[k]
	if !ok {
		return
	}
	f.dropFile(k, s)
}

func (f *FS) dropFile(k inodeKey, s *fileState) {
	unix.Close(s.fd)
	f.savedBytes -= s.savedBytes
	f.tracked--
	delete(f.files, k)
}

// prepareDir returns the tracking state of the directory at path p, snapshotting its listing if
// this is its first change since its last fsync. Caller holds f.mu.
func (f *FS) prepareDir(p string) (*dirState, inodeKey, syscall.Errno) {
	fd, err := unix.Open(p, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, inodeKey{}, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, inodeKey{}, errnoOf(err)
	}
	k := keyOf(&st)
	if d, ok := f.dirs[k]; ok {
		unix.Close(fd)
		return d, k, 0
	}
	room := f.opts.MaxTracked - f.tracked - 1
	snap, err := f.listDir(fd, k, room)
	if err != nil {
		unix.Close(fd)
		f.logger.Printf("faultfs: snapshot of %s: %v", p, err)
		if errors.Is(err, errTooMany) {
			return nil, inodeKey{}, syscall.ENOSPC
		}
		return nil, inodeKey{}, errnoOf(err)
	}
	d := &dirState{fd: fd, snap: snap}
	f.dirs[k] = d
	f.tracked += 1 + len(snap)
	return d, k, 0
}

var errTooMany = errors.New("more entries than Options.MaxTracked allows")

// listDir reads the entries of the directory open as fd, at most limit of them. The state
// directory is not an entry of the backing root.
func (f *FS) listDir(fd int, k inodeKey, limit int) (map[string]dirEntry, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	dir := os.NewFile(uintptr(dfd), "dir")
	defer dir.Close()
	out := make(map[string]dirEntry)
	for {
		// invariant 13: read in batches and check the bound before keeping more.
		names, err := dir.Readdirnames(256)
		for _, name := range names {
			if k == f.rootKey && name == stateDirName {
				continue
			}
			if len(out) >= limit {
				return nil, errTooMany
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return nil, fmt.Errorf("stat %s: %w", name, err)
			}
			out[name] = dirEntry{key: keyOf(&st), dir: st.Mode&unix.S_IFMT == unix.S_IFDIR}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// noteRemoval is called before the entry name leaves directory d (unlink, rmdir, rename from or
// over it). If the entry is durable (in the snapshot, still the same inode) and not a directory,
// an extra hard link in the state directory keeps the inode so a cut can put the name back. It
// reports whether the entry is a durable directory: removing one is not undone (see README) and
// commits the directories involved instead. Caller holds f.mu.
func (f *FS) noteRemoval(d *dirState, name string) (durableDir bool, errno syscall.Errno) {
	e, ok := d.snap[name]
	if !ok {
		return false, 0
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		// The operation itself will fail with the same error.
		return false, 0
	}
	if keyOf(&st) != e.key {
		// The durable inode left earlier and is kept already; this name is new.
		return false, 0
	}
	if e.dir {
		return true, 0
	}
	err := unix.Linkat(d.fd, name, f.stateFd, graveName(e.key), 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		f.logger.Printf("faultfs: keeping durable %q for rollback: %v (the backing tree must be one filesystem)", name, err)
		return false, syscall.EIO
	}
	return false, 0
}

// commitDir makes the current listing of a directory its synced state, then drops what no
// remaining snapshot needs. Caller holds f.mu.
func (f *FS) commitDir(k inodeKey) {
	d, ok := f.dirs[k]
	if !ok {
		return
	}
	f.dropDir(k, d)
	f.collect()
}

func (f *FS) dropDir(k inodeKey, d *dirState) {
	unix.Close(d.fd)
	f.tracked -= 1 + len(d.snap)
	delete(f.dirs, k)
}

// collect removes kept links that no snapshot refers to any more, and forgets unsynced data of
// inodes that no longer have any name: no cut can make either visible again.
func (f *FS) collect() {
	needed := make(map[string]bool)
	for _, d := range f.dirs {
		for _, e := range d.snap {
			if !e.dir {
				needed[graveName(e.key)] = true
			}
		}
	}
	names, err := readNamesAt(f.stateFd)
	if err != nil {
		f.logger.Printf("faultfs: reading state dir: %v", err)
	}
	for _, n := range names {
		if !needed[n] {
			if err := unix.Unlinkat(f.stateFd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				f.logger.Printf("faultfs: removing kept link %s: %v", n, err)
			}
		}
	}
	for k, s := range f.files {
		var st unix.Stat_t
		if err := unix.Fstat(s.fd, &st); err == nil && st.Nlink == 0 {
			f.dropFile(k, s)
		}
	}
}

// dropAllState forgets every unsynced change without touching the backing directory: a clean
// unmount, or the end of a cut. Caller holds f.mu.
func (f *FS) dropAllState() {
	for k, s := range f.files {
		f.dropFile(k, s)
	}
	for k, d := range f.dirs {
		f.dropDir(k, d)
	}
}

// readNamesAt lists the directory open as fd (all of it: used for the state directory, whose
// size is bounded by the tracked snapshots).
func readNamesAt(fd int) ([]string, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	dir := os.NewFile(uintptr(dfd), "dir")
	defer dir.Close()
	return dir.Readdirnames(-1)
}

// clearDirAt removes everything inside the directory open as fd.
func clearDirAt(fd int) error {
	names, err := readNamesAt(fd)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if err := removeAllAt(fd, n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeAllAt removes name in the directory open as dirFd, recursively if it is a directory.
func removeAllAt(dirFd int, name string) error {
	err := unix.Unlinkat(dirFd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("unlink %s: %w", name, err)
	}
	sub, err := unix.Openat(dirFd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	cerr := clearDirAt(sub)
	unix.Close(sub)
	if cerr != nil {
		return cerr
	}
	if err := unix.Unlinkat(dirFd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", name, err)
	}
	return nil
}

// preadFull reads len(buf) bytes at off or fails.
func preadFull(fd int, buf []byte, off int64) error {
	for len(buf) > 0 {
		n, err := unix.Pread(fd, buf, off)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		buf = buf[n:]
		off += int64(n)
	}
	return nil
}

// pwriteFull writes all of buf at off.
func pwriteFull(fd int, buf []byte, off int64) error {
	for len(buf) > 0 {
		n, err := unix.Pwrite(fd, buf, off)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		buf = buf[n:]
		off += int64(n)
	}
	return nil
}
