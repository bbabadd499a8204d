//go:build unix

package memory

import (
	"errors"
	"os"
	"syscall"
)

var errLockHeld = errors.New("lock held")

// lockFile takes an exclusive flock on path. The kernel releases it when
// the descriptor closes or the process dies, so a stale file is harmless
// and a live holder refuses a second broker (docs/operations.md "Storage files").
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}
