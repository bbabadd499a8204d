//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"context"
	"strconv"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fileHandle is an open file. It deliberately does not implement gofs.FilePassthroughFder: as
// root, go-fuse would register that descriptor with the kernel and the kernel would then read
// and write the backing file itself, never telling us (design.md, power-cut pitfalls).
// Locking is left to the kernel (EnableLocks is off), which is right for processes on one host.
type fileHandle struct {
	fs     *FS
	fd     int
	closed bool // under fs.mu
}

var (
	_ gofs.FileReader    = (*fileHandle)(nil)
	_ gofs.FileWriter    = (*fileHandle)(nil)
	_ gofs.FileReleaser  = (*fileHandle)(nil)
	_ gofs.FileFlusher   = (*fileHandle)(nil)
	_ gofs.FileGetattrer = (*fileHandle)(nil)
	_ gofs.FileStatxer   = (*fileHandle)(nil)
	_ gofs.FileAllocater = (*fileHandle)(nil)
)

func (h *fileHandle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h.fs.down() {
		return nil, syscall.EIO
	}
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(h.fd, buf[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, errnoOf(err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	return fuse.ReadResultData(buf[:n]), 0
}

// Write saves the synced contents of the pages it overwrites, then writes through. It reaches us
// when write(2) is called (no writeback cache) and when the kernel writes back mmap pages.
func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f := h.fs
	if !f.lockUp() {
		return 0, syscall.EIO
	}
	defer f.mu.Unlock()
	s, errno := f.stateForFd(h.fd)
	if errno != 0 {
		return 0, errno
	}
	if errno := f.saveRange(s, off, off+int64(len(data))); errno != 0 {
		return 0, errno
	}
	if err := pwriteFull(h.fd, data, off); err != nil {
		return 0, errnoOf(err)
	}
	f.stats.Writes++
	f.stats.WriteBytes += uint64(len(data))
	return uint32(len(data)), 0
}

// Allocate supports the modes that keep the file's bytes where they are: plain allocation
// (which may grow the file) and punching or zeroing a range, whose old contents are saved.
func (h *fileHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	f := h.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	const keep = unix.FALLOC_FL_KEEP_SIZE
	switch mode &^ keep {
	case 0:
	case unix.FALLOC_FL_PUNCH_HOLE, unix.FALLOC_FL_ZERO_RANGE:
		s, errno := f.stateForFd(h.fd)
		if errno != 0 {
			return errno
		}
		if errno := f.saveRange(s, int64(off), int64(off+size)); errno != 0 {
			return errno
		}
	default:
		// Collapsing or inserting ranges moves bytes; the page model does not follow them.
		return syscall.EOPNOTSUPP
	}
	return errnoOf(unix.Fallocate(h.fd, mode, int64(off), int64(size)))
}

// Flush answers ENOSYS, which tells the kernel never to send FLUSH again on this mount: nothing
// is buffered here, and a close(2) that does not wait for us cannot hang a process whose FUSE
// server died (a test binary that serves the mount and panics with files open).
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno { return syscall.ENOSYS }

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	delete(h.fs.handles, h)
	h.closeFd()
	return 0
}

// closeFd closes the descriptor once. Caller holds fs.mu.
func (h *fileHandle) closeFd() {
	if !h.closed {
		h.closed = true
		unix.Close(h.fd)
	}
}

func (h *fileHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(h.fd, &st); err != nil {
		return errnoOf(err)
	}
	out.FromStat(&st)
	return 0
}

func (h *fileHandle) Statx(ctx context.Context, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	var st unix.Statx_t
	if err := unix.Statx(h.fd, "", int(flags)|unix.AT_EMPTY_PATH, int(mask), &st); err != nil {
		return errnoOf(err)
	}
	out.FromStatx(&st)
	return 0
}

// setattr applies mode, owner and times by descriptor. Caller holds fs.mu.
func (h *fileHandle) setattr(in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if mode, ok := in.GetMode(); ok {
		if err := unix.Fchmod(h.fd, mode&07777); err != nil {
			return errnoOf(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := unix.Fchown(h.fd, u, g); err != nil {
			return errnoOf(err)
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		var err error
		if aok {
			if ts[0], err = unix.TimeToTimespec(atime); err != nil {
				return errnoOf(err)
			}
		}
		if mok {
			if ts[1], err = unix.TimeToTimespec(mtime); err != nil {
				return errnoOf(err)
			}
		}
		// The /proc link reaches the inode even after unlink.
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(h.fd), ts, 0); err != nil {
			return errnoOf(err)
		}
	}
	return h.Getattr(context.Background(), out)
}

// dirHandle is an open directory: the loopback's stream, without the state directory in the
// backing root, and with fsync routed to the model instead of the backing directory.
type dirHandle struct {
	inner  gofs.FileHandle
	node   *node
	hide   bool
	closed bool // under fs.mu
}

var (
	_ gofs.FileReaddirenter = (*dirHandle)(nil)
	_ gofs.FileSeekdirer    = (*dirHandle)(nil)
	_ gofs.FileReleasedirer = (*dirHandle)(nil)
	_ gofs.FileFsyncdirer   = (*dirHandle)(nil)
)

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if d.node.fs.down() {
		return nil, syscall.EIO
	}
	rd, ok := d.inner.(gofs.FileReaddirenter)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	for {
		de, errno := rd.Readdirent(ctx)
		if errno != 0 || de == nil {
			return de, errno
		}
		if d.hide && de.Name == stateDirName {
			continue
		}
		return de, 0
	}
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if sd, ok := d.inner.(gofs.FileSeekdirer); ok {
		return sd.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {
	f := d.node.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.dirHandles, d)
	d.closeInner()
}

// closeInner releases the loopback stream once. Caller holds fs.mu.
func (d *dirHandle) closeInner() {
	if d.closed {
		return
	}
	d.closed = true
	if r, ok := d.inner.(gofs.FileReleasedirer); ok {
		r.Releasedir(context.Background(), 0)
	}
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.node.Fsync(ctx, nil, flags)
}
