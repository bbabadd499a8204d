//go:build unix

package passwd

import (
	"fmt"
	"os"
	"syscall"
)

// keepOwner gives tmp the owner and group of the file it replaces (RFC
// 0002 §1.10: an existing file keeps its owner). When they already match
// — the usual case, the broker's user editing its own file — nothing is
// asked of the system; when they cannot be given (not root, not the
// owner), the error says so and nothing is written, rather than leave a
// file the broker's user may no longer read.
func keepOwner(tmp *os.File, was os.FileInfo) error {
	old, ok := was.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	info, err := tmp.Stat()
	if err != nil {
		return err
	}
	cur, ok := info.Sys().(*syscall.Stat_t)
	if !ok || (cur.Uid == old.Uid && cur.Gid == old.Gid) {
		return nil
	}
	if err := tmp.Chown(int(old.Uid), int(old.Gid)); err != nil {
		return fmt.Errorf("cannot keep its owner %d:%d (%v); run the command as that user or as root", old.Uid, old.Gid, err)
	}
	return nil
}
