//go:build !(linux && (386 || arm || mips || mipsle))

// Package faultfs is a fault-injecting FUSE loopback filesystem for power-cut tests.
//
// It is not built for 32-bit Linux (386, arm, mips, mipsle): go-fuse
// v2.12.1, its newest release, does not compile there (its splice package
// assigns syscall.Splice's int, 32 bits on those targets, to an int64). The
// harness's power-cut nemesis is refused on those builds; the broker under
// test may still be a 32-bit binary run by a 64-bit harness.
//
// A mount serves a backing directory unchanged while remembering, for every file, what a power cut
// would leave of it: the contents and size it had at its last fsync, and, for every directory, the
// entries it had at its last fsync. PowerCut rejects all further I/O and rewrites the backing
// directory to that synced state (or, with torn=true, to a random mix of synced and unsynced
// pages). The caller then kills what used the mount, unmounts, and mounts again on the same
// backing directory before restarting it: the kernel page cache of the old mount still holds the
// lost data. README.md states the durability model.
//
// The backing directory stands for the disk: faultfs never fsyncs it, since only this layer's
// model of durability is under test.
//
// Never map a file of the mount in the process that serves it (SQLite in WAL mode maps -shm):
// a fault or munmap on the mapping waits for the server while holding the address-space lock
// the server's goroutines need, and the process deadlocks. Run the program under test as a
// separate process.
package faultfs

import (
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

const (
	// pageSize is the unit in which old contents are saved before their first unsynced overwrite.
	pageSize = 4096
	// sectorSize is the unit of a torn write: a disk persists whole sectors, in any order.
	sectorSize = 512
	// stateDirName is the hidden directory in the backing root that keeps an extra hard link to
	// every durable file whose name was removed since its directory's last fsync, so a cut can
	// put it back. It is invisible through the mount and removed by Unmount.
	stateDirName = ".faultfs"

	defaultMaxSavedBytes = 256 << 20
	defaultMaxTracked    = 1 << 16
)

// Options tune a mount. The zero value is ready to use.
type Options struct {
	// MaxSavedBytes bounds the old page contents kept in memory for rollback (invariant 13). A
	// write or truncate that would need more returns ENOSPC. Zero means 256 MiB.
	MaxSavedBytes int64
	// MaxTracked bounds the files and directories with unsynced changes plus the entries of the
	// directory listings saved for them (each tracked object holds a descriptor). An operation
	// that would exceed it returns ENOSPC. Zero means 65536.
	MaxTracked int
	// Debug logs every FUSE request.
	Debug bool
	// Logger receives go-fuse's and faultfs's diagnostics; nil means log.Default().
	Logger *log.Logger
	// ExplicitDataCacheControl asks the kernel not to drop a file's cached pages when it sees
	// the file's mtime change (FUSE's auto_inval_data, go-fuse's default). Every write and every
	// mmap writeback passes through this layer, so the kernel's cache never holds data the
	// backing file lacks, and a cut is always followed by a remount.
	ExplicitDataCacheControl bool
}

// Stats counts what reached the layer and what the last cut did.
type Stats struct {
	Writes     uint64 // WRITE requests applied (from write(2) and from mmap writeback)
	WriteBytes uint64
	Fsyncs     uint64 // file fsync/fdatasync (and O_SYNC/msync(MS_SYNC), which the kernel turns into FSYNC)
	DirFsyncs  uint64
	Rejected   uint64 // requests refused with EIO after the cut
	Cut        CutStats
}

// CutStats describes what PowerCut changed in the backing directory.
type CutStats struct {
	Files         int // files with unsynced data or size
	PagesRestored int // saved pages written back whole
	PagesKeptNew  int // torn mode: unsynced pages left as written
	PagesTorn     int // torn mode: pages left as a sector mix of old and new
	PagesZeroed   int // torn mode: appended pages wholly or partly zeroed
	Truncated     int // files whose size changed
	DirsRolled    int // directories put back to their synced listing
	DirsKept      int // torn mode: directories whose unsynced listing was kept
	NamesRemoved  int // entries created since the directory's last fsync, removed
	NamesRestored int // durable entries removed since the directory's last fsync, put back
	Duration      time.Duration
}

// FS is one mount of a backing directory.
type FS struct {
	backing    string
	mountpoint string
	opts       Options
	logger     *log.Logger
	server     *fuse.Server
	root       *node
	rootKey    inodeKey
	connID     uint64 // the kernel's FUSE connection number (fusectl directory name)

	// stopped is set (under mu) by PowerCut and by a forced unmount; requests that do not take mu
	// read it without waiting.
	stopped atomic.Bool

	// mu serialises every request that changes the backing directory with PowerCut, so a cut sees
	// no half-applied write and no write lands after it.
	mu         sync.Mutex
	cut        bool
	files      map[inodeKey]*fileState
	dirs       map[inodeKey]*dirState
	savedBytes int64
	tracked    int
	stateFd    int // the hidden state directory, flock'd for the lifetime of the mount
	handles    map[*fileHandle]struct{}
	dirHandles map[*dirHandle]struct{}
	stats      Stats

	unmountOnce sync.Once
	unmountErr  error
}

// inodeKey names a backing inode independently of its path.
type inodeKey struct{ dev, ino uint64 }

func keyOf(st *unix.Stat_t) inodeKey { return inodeKey{dev: uint64(st.Dev), ino: st.Ino} }

// CheckFUSE reports whether this machine can mount faultfs: /dev/fuse and fusermount3 (Debian
// package fuse3) must be present.
func CheckFUSE() error {
	st, err := os.Stat("/dev/fuse")
	if err != nil {
		return fmt.Errorf("faultfs: /dev/fuse is not available (%w): load the fuse kernel module and install the Debian package fuse3", err)
	}
	if st.Mode()&fs.ModeCharDevice == 0 {
		return fmt.Errorf("faultfs: /dev/fuse is not a character device")
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		if _, err2 := os.Stat("/bin/fusermount3"); err2 != nil {
			return fmt.Errorf("faultfs: fusermount3 not found (%w): install the Debian package fuse3 (apt-get install fuse3)", err)
		}
	}
	return nil
}

// Mount serves backingDir at mountpoint. Everything present in backingDir at this moment counts
// as durable. Only one faultfs may serve a backing directory at a time.
func Mount(backingDir, mountpoint string, opts Options) (*FS, error) {
	if err := CheckFUSE(); err != nil {
		return nil, err
	}
	if opts.MaxSavedBytes <= 0 {
		opts.MaxSavedBytes = defaultMaxSavedBytes
	}
	if opts.MaxTracked <= 0 {
		opts.MaxTracked = defaultMaxTracked
	}
	logger := opts.Logger
	if logger == nil {
		logger = log.Default()
	}
	backing, err := filepath.Abs(backingDir)
	if err != nil {
		return nil, fmt.Errorf("faultfs: backing dir: %w", err)
	}
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return nil, fmt.Errorf("faultfs: mountpoint: %w", err)
	}
	for _, d := range []string{backing, mp} {
		st, err := os.Stat(d)
		if err != nil {
			return nil, fmt.Errorf("faultfs: %w", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("faultfs: %s is not a directory", d)
		}
	}
	if backing == mp {
		return nil, errors.New("faultfs: backing dir and mountpoint must differ")
	}

	f := &FS{
		backing:    backing,
		mountpoint: mp,
		opts:       opts,
		logger:     logger,
		files:      make(map[inodeKey]*fileState),
		dirs:       make(map[inodeKey]*dirState),
		handles:    make(map[*fileHandle]struct{}),
		dirHandles: make(map[*dirHandle]struct{}),
		stateFd:    -1,
	}
	if err := f.openStateDir(); err != nil {
		return nil, err
	}
	var rootSt unix.Stat_t
	if err := unix.Stat(backing, &rootSt); err != nil {
		f.closeStateDir()
		return nil, fmt.Errorf("faultfs: stat %s: %w", backing, err)
	}
	f.rootKey = keyOf(&rootSt)

	lbRoot, err := gofs.NewLoopbackRoot(backing)
	if err != nil {
		f.closeStateDir()
		return nil, fmt.Errorf("faultfs: loopback root: %w", err)
	}
	lb := lbRoot.(*gofs.LoopbackNode)
	f.root = &node{LoopbackNode: lb, fs: f}
	lb.RootData.RootNode = f.root

	// One second of entry/attribute caching as go-fuse's defaults: it does not affect durability
	// (data and sizes are write-through, see below) and a cut is always followed by a remount.
	second := time.Second
	mopts := &gofs.Options{
		MountOptions: fuse.MountOptions{
			FsName: backing,
			Name:   "faultfs",
			Debug:  opts.Debug,
			Logger: logger,
			// Passthrough would let the kernel read and write the backing file directly,
			// bypassing every write and fsync this layer must see; the file handles offer no
			// passthrough descriptor either. Writeback caching would let the kernel hold
			// written data and send it later (or never, at a cut), so write(2) would no longer
			// reach us at the moment it returns; go-fuse never asks for it, and we make sure.
			// Without atomic O_TRUNC the kernel truncates with a SETATTR we can save pages for.
			DisabledCapabilities:     fuse.CAP_PASSTHROUGH | fuse.CAP_WRITEBACK_CACHE | fuse.CAP_ATOMIC_O_TRUNC,
			ExplicitDataCacheControl: opts.ExplicitDataCacheControl,
		},
		EntryTimeout:    &second,
		AttrTimeout:     &second,
		NegativeTimeout: &second,
		Logger:          logger,
	}
	server, err := gofs.Mount(mp, f.root, mopts)
	if err != nil {
		f.closeStateDir()
		return nil, fmt.Errorf("faultfs: mount %s on %s: %w", backing, mp, err)
	}
	f.server = server
	var mst unix.Stat_t
	if err := unix.Stat(mp, &mst); err == nil {
		// fusectl names a connection by the kernel's dev_t of the mount: major<<20 | minor.
		f.connID = uint64(unix.Major(mst.Dev))<<20 | uint64(unix.Minor(mst.Dev))
	}
	return f, nil
}

const fusectlDir = "/sys/fs/fuse/connections"

// Abort severs the kernel side of the mount at once: every request in flight or to come fails
// with ENOTCONN. It is the way out when something hangs on the mount (a process blocked in a
// request that will never be answered cannot be killed otherwise). It uses the fusectl
// filesystem, mounting it on /sys/fs/fuse/connections if it is not there. Unmount is still
// needed afterwards.
func (f *FS) Abort() error {
	if f.connID == 0 {
		return errors.New("faultfs: connection number unknown")
	}
	f.stopped.Store(true)
	p := filepath.Join(fusectlDir, strconv.FormatUint(f.connID, 10), "abort")
	if _, err := os.Stat(p); err != nil {
		if merr := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); merr != nil && !errors.Is(merr, unix.EBUSY) {
			return fmt.Errorf("faultfs: abort: %w; mounting fusectl: %w", err, merr)
		}
	}
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("faultfs: abort: %w", err)
	}
	return nil
}

// openStateDir creates, locks and empties the hidden state directory. Leftover links from a
// process that died without unmounting are surplus names of files already in place.
func (f *FS) openStateDir() error {
	p := filepath.Join(f.backing, stateDirName)
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("faultfs: state dir: %w", err)
	}
	fd, err := unix.Open(p, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("faultfs: open state dir: %w", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return fmt.Errorf("faultfs: %s is already served by another faultfs: %w", f.backing, err)
	}
	f.stateFd = fd
	if err := clearDirAt(fd); err != nil {
		f.closeStateDir()
		return fmt.Errorf("faultfs: clear state dir: %w", err)
	}
	return nil
}

func (f *FS) closeStateDir() {
	if f.stateFd >= 0 {
		unix.Close(f.stateFd)
		f.stateFd = -1
	}
}

// Mountpoint returns the absolute path the filesystem is mounted on.
func (f *FS) Mountpoint() string { return f.mountpoint }

// BackingDir returns the absolute path of the backing directory.
func (f *FS) BackingDir() string { return f.backing }

// Stats returns the counters so far.
func (f *FS) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Unmount detaches the filesystem. Without a preceding PowerCut it is a clean shutdown: all
// unsynced changes stay, as an orderly unmount syncs them. Files still open on the mount make
// the plain unmount fail; Unmount then refuses all further requests and detaches lazily
// (fusermount3 -u -z), so a process still holding files can change nothing. Unmount is
// idempotent.
func (f *FS) Unmount() error {
	f.unmountOnce.Do(func() { f.unmountErr = f.unmount() })
	return f.unmountErr
}

func (f *FS) unmount() error {
	var errs []error
	if err := f.server.Unmount(); err != nil {
		// Refuse everything first: after a lazy detach the open files still reach us.
		f.mu.Lock()
		f.stopped.Store(true)
		f.mu.Unlock()
		if lerr := lazyUnmount(f.mountpoint); lerr != nil {
			errs = append(errs, fmt.Errorf("faultfs: unmount %s: %w; lazy unmount: %w", f.mountpoint, err, lerr))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped.Store(true)
	// A clean shutdown keeps the backing directory as it is; after a cut it already holds the
	// synced state. Either way nothing is left to roll back.
	f.dropAllState()
	// Descriptors of handles the kernel never released (a forced detach) would leak otherwise.
	for h := range f.handles {
		h.closeFd()
	}
	clear(f.handles)
	for d := range f.dirHandles {
		d.closeInner()
	}
	clear(f.dirHandles)
	if err := clearDirAt(f.stateFd); err != nil {
		errs = append(errs, fmt.Errorf("faultfs: clear state dir: %w", err))
	}
	f.closeStateDir()
	if err := os.Remove(filepath.Join(f.backing, stateDirName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("faultfs: remove state dir: %w", err))
	}
	return errors.Join(errs...)
}

// lazyUnmount detaches a FUSE mount even while files on it are open.
func lazyUnmount(mountpoint string) error {
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		bin = "/bin/fusermount3"
	}
	out, err := exec.Command(bin, "-u", "-z", mountpoint).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -u -z: %w: %s", bin, err, out)
	}
	return nil
}

// IsMounted reports whether mountpoint is a mount point now, according to /proc/self/mountinfo.
func IsMounted(mountpoint string) (bool, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return false, err
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		// Field 5 is the mount point, with spaces and the like octal-escaped.
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == abs {
			return true, nil
		}
	}
	return false, nil
}

// ForceUnmount lazily detaches whatever is mounted at mountpoint. It is meant for test cleanup
// after a failure left a mount behind.
func ForceUnmount(mountpoint string) error {
	mounted, err := IsMounted(mountpoint)
	if err != nil || !mounted {
		return err
	}
	return lazyUnmount(mountpoint)
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space) in a mountinfo path.
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
