//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"context"
	"path/filepath"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node wraps go-fuse's loopback node. Lookups, attributes and the mechanics of namespace
// changes stay the loopback's; node adds the bookkeeping a cut needs, refuses everything after
// the cut, hides the state directory, and replaces the loopback's file handles with ones that
// offer no passthrough descriptor.
type node struct {
	*gofs.LoopbackNode
	fs *FS
}

var (
	_ gofs.NodeWrapChilder    = (*node)(nil)
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeTmpfiler       = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeStatxer        = (*node)(nil)
	_ gofs.NodeFsyncer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeCopyFileRanger = (*node)(nil)
	_ gofs.NodeSetxattrer     = (*node)(nil)
	_ gofs.NodeRemovexattrer  = (*node)(nil)
	_ gofs.NodeReadlinker     = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
)

// WrapChild makes every node the loopback creates one of ours.
func (n *node) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	if lb, ok := ops.(*gofs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, fs: n.fs}
	}
	return ops
}

// backingPath is the node's path in the backing directory.
func (n *node) backingPath() string {
	return filepath.Join(n.RootData.Path, n.Path(n.RootData.RootNode.EmbeddedInode()))
}

func (n *node) childPath(name string) string { return filepath.Join(n.backingPath(), name) }

// hidden reports whether name in this directory is the state directory.
func (n *node) hidden(name string) bool {
	return name == stateDirName && n.EmbeddedInode() == n.fs.root.EmbeddedInode()
}

// down reports whether the power is off; the request is then refused like a dead disk would.
func (f *FS) down() bool {
	if f.stopped.Load() {
		f.mu.Lock()
		f.stats.Rejected++
		f.mu.Unlock()
		return true
	}
	return false
}

// lockUp takes f.mu for a change, or reports that the power is off.
func (f *FS) lockUp() bool {
	f.mu.Lock()
	if f.stopped.Load() {
		f.stats.Rejected++
		f.mu.Unlock()
		return false
	}
	return true
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.fs.down() {
		return nil, syscall.EIO
	}
	if n.hidden(name) {
		return nil, syscall.ENOENT
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.fs.down() {
		return syscall.EIO
	}
	return n.LoopbackNode.Getattr(ctx, f, out)
}

func (n *node) Statx(ctx context.Context, f gofs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if n.fs.down() {
		return syscall.EIO
	}
	return n.LoopbackNode.Statx(ctx, f, flags, mask, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.fs.down() {
		return nil, syscall.EIO
	}
	return n.LoopbackNode.Readlink(ctx)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if n.fs.down() {
		return syscall.EIO
	}
	return n.LoopbackNode.Statfs(ctx, out)
}

// Open returns our own handle. O_TRUNC never arrives here (atomic O_TRUNC is disabled, so the
// kernel truncates through Setattr), but is honoured with saving if it does.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.fs.down() {
		return nil, 0, syscall.EIO
	}
	// O_DIRECT on the backing file would demand aligned buffers; the backing store is a model
	// disk, so the flag has nothing to bypass.
	flags &^= syscall.O_DIRECT
	if flags&syscall.O_TRUNC != 0 {
		if errno := n.fs.truncatePath(n.backingPath(), 0); errno != 0 {
			return nil, 0, errno
		}
		flags &^= syscall.O_TRUNC
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	h, errno := n.fs.adoptHandle(ctx, fh)
	return h, fuseFlags, errno
}

// truncatePath truncates a file by path, saving what it removes.
func (f *FS) truncatePath(p string, size int64) syscall.Errno {
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	s, errno := f.stateForPath(p)
	if errno != 0 {
		return errno
	}
	return f.truncate(s, size)
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.hidden(name) {
		return nil, nil, 0, syscall.EACCES
	}
	f := n.fs
	if !f.lockUp() {
		return nil, nil, 0, syscall.EIO
	}
	p := n.childPath(name)
	if _, _, errno := f.prepareDir(n.backingPath()); errno != 0 {
		f.mu.Unlock()
		return nil, nil, 0, errno
	}
	flags &^= syscall.O_DIRECT
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_EXCL == 0 {
		// Creating over an existing file truncates it: save first.
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			s, errno := f.stateForPath(p)
			if errno == 0 {
				errno = f.truncate(s, 0)
			}
			if errno != 0 {
				f.mu.Unlock()
				return nil, nil, 0, errno
			}
			flags &^= syscall.O_TRUNC
		}
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	f.mu.Unlock()
	if errno != 0 {
		return nil, nil, 0, errno
	}
	h, errno := f.adoptHandle(ctx, fh)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return ch, h, fuseFlags, 0
}

// Tmpfile is refused: an O_TMPFILE file has no directory entry for the model to track, and the
// loopback cannot link it into the tree later anyway.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// CopyFileRange is refused so the kernel falls back to reads and writes, which we track.
func (n *node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut, length, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

// addEntry runs an operation that adds name to this directory, after snapshotting it.
func (n *node) addEntry(name string, op func() (*gofs.Inode, syscall.Errno)) (*gofs.Inode, syscall.Errno) {
	if n.hidden(name) {
		return nil, syscall.EACCES
	}
	f := n.fs
	if !f.lockUp() {
		return nil, syscall.EIO
	}
	defer f.mu.Unlock()
	if _, _, errno := f.prepareDir(n.backingPath()); errno != 0 {
		return nil, errno
	}
	return op()
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.addEntry(name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Mkdir(ctx, name, mode, out) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.addEntry(name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.addEntry(name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Symlink(ctx, target, name, out) })
}

func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return n.addEntry(name, func() (*gofs.Inode, syscall.Errno) { return n.LoopbackNode.Link(ctx, target, name, out) })
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.hidden(name) {
		return syscall.EACCES
	}
	f := n.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	d, _, errno := f.prepareDir(n.backingPath())
	if errno != 0 {
		return errno
	}
	if _, errno := f.noteRemoval(d, name); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.hidden(name) {
		return syscall.EACCES
	}
	f := n.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	d, dk, errno := f.prepareDir(n.backingPath())
	if errno != 0 {
		return errno
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errnoOf(err)
	}
	durableDir, errno := f.noteRemoval(d, name)
	if errno != 0 {
		return errno
	}
	if errno := n.LoopbackNode.Rmdir(ctx, name); errno != 0 {
		return errno
	}
	// The removed directory's own snapshot can never be restored into it.
	if cd, ok := f.dirs[keyOf(&st)]; ok {
		f.dropDir(keyOf(&st), cd)
	}
	if durableDir {
		// Removing a durable directory is durable at once and takes the parent with it.
		f.commitDir(dk)
	}
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if n.hidden(name) || np.hidden(newName) {
		return syscall.EACCES
	}
	f := n.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	src, sk, errno := f.prepareDir(n.backingPath())
	if errno != 0 {
		return errno
	}
	dst, dk, errno := f.prepareDir(np.backingPath())
	if errno != 0 {
		return errno
	}
	// The source name leaves its directory; a replaced (or, for RENAME_EXCHANGE, swapped)
	// destination leaves its own.
	srcDir, errno := f.noteRemoval(src, name)
	if errno != 0 {
		return errno
	}
	dstDir, errno := f.noteRemoval(dst, newName)
	if errno != 0 {
		return errno
	}
	if errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags); errno != 0 {
		return errno
	}
	if srcDir || dstDir {
		// Moving or replacing a durable directory is durable at once, in both parents.
		f.commitDir(sk)
		f.commitDir(dk)
	}
	return 0
}

// Setattr saves what a shrinking truncate removes; the other attributes are metadata that the
// model treats as durable at once.
func (n *node) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f := n.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	h, _ := fh.(*fileHandle)
	if size, ok := in.GetSize(); ok {
		var s *fileState
		var errno syscall.Errno
		if h != nil {
			s, errno = f.stateForFd(h.fd)
		} else {
			s, errno = f.stateForPath(n.backingPath())
		}
		if errno != 0 {
			return errno
		}
		if errno := f.truncate(s, int64(size)); errno != 0 {
			return errno
		}
	}
	rest := *in
	rest.Valid &^= fuse.FATTR_SIZE
	if h != nil {
		// By descriptor: the file may have no name any more.
		return h.setattr(&rest, out)
	}
	return n.LoopbackNode.Setattr(ctx, nil, &rest, out)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if !n.fs.lockUp() {
		return syscall.EIO
	}
	defer n.fs.mu.Unlock()
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if !n.fs.lockUp() {
		return syscall.EIO
	}
	defer n.fs.mu.Unlock()
	return n.LoopbackNode.Removexattr(ctx, attr)
}

// Fsync commits: for a file (fsync, fdatasync, O_SYNC writes, msync(MS_SYNC)) its contents and
// size, for a directory its listing. The kernel flushes dirty mmap pages with WRITEs before it
// sends FSYNC, so they are committed too.
func (n *node) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	f := n.fs
	if !f.lockUp() {
		return syscall.EIO
	}
	defer f.mu.Unlock()
	var st unix.Stat_t
	if h, ok := fh.(*fileHandle); ok {
		if err := unix.Fstat(h.fd, &st); err != nil {
			return errnoOf(err)
		}
	} else if err := unix.Lstat(n.backingPath(), &st); err != nil {
		return errnoOf(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		f.stats.DirFsyncs++
		f.commitDir(keyOf(&st))
		return 0
	}
	f.stats.Fsyncs++
	f.commitFile(keyOf(&st))
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.fs.down() {
		return nil, 0, syscall.EIO
	}
	inner, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	d := &dirHandle{inner: inner, node: n, hide: n.EmbeddedInode() == n.fs.root.EmbeddedInode()}
	n.fs.mu.Lock()
	n.fs.dirHandles[d] = struct{}{}
	n.fs.mu.Unlock()
	return d, fuseFlags, 0
}

// adoptHandle turns the loopback's file handle into ours: it takes a duplicate of the
// descriptor and releases the loopback handle, which would otherwise offer the kernel a
// passthrough descriptor.
func (f *FS) adoptHandle(ctx context.Context, fh gofs.FileHandle) (*fileHandle, syscall.Errno) {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		if r, ok := fh.(gofs.FileReleaser); ok {
			r.Release(ctx)
		}
		f.logger.Printf("faultfs: unexpected loopback handle type %T", fh)
		return nil, syscall.EIO
	}
	// PassthroughFd is only the accessor for the loopback's descriptor here; the kernel never
	// sees the returned handle.
	fd, ok := lf.PassthroughFd()
	var dup int
	var err error
	if ok {
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	lf.Release(ctx)
	if !ok {
		return nil, syscall.EBADF
	}
	if err != nil {
		return nil, errnoOf(err)
	}
	h := &fileHandle{fs: f, fd: dup}
	f.mu.Lock()
	f.handles[h] = struct{}{}
	f.mu.Unlock()
	return h, 0
}
