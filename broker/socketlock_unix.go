//go:build unix

package broker

import (
	"errors"
	"os"
	"syscall"
)

var errSocketLockHeld = errors.New("lock held")

// lockSocketPath takes an exclusive flock on the lock file beside a unix
// door's socket (docs/operations.md "A start" "unix socket lock held by another broker").
// The kernel lets it go when the descriptor closes or the process dies, so
// a broker that was killed leaves no lock behind, only a stale socket,
// which the next one replaces. The file is opened read-only (flock needs
// no write access) and created 0644, so a broker of another user can still
// test it rather than fail on a permission.
func lockSocketPath(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errSocketLockHeld
		}
		return nil, err
	}
	return f, nil
}
