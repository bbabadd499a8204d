//go:build !unix

package memory

import (
	"errors"
	"os"
	"runtime"
)

var errLockHeld = errors.New("lock held")

// lockFile refuses: the snapshot directory lock is an flock, and a
// snapshot directory without its lock could be shared by two brokers.
func lockFile(string) (*os.File, error) {
	return nil, errors.New("a snapshot directory lock needs flock, which " + runtime.GOOS + " does not have")
}
