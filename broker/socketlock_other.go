//go:build !unix

package broker

import (
	"errors"
	"os"
	"runtime"
)

var errSocketLockHeld = errors.New("lock held")

// lockSocketPath refuses: a unix door's lock is an flock, which this
// system does not have, and a door without it could take over a live
// broker's socket.
func lockSocketPath(string) (*os.File, error) {
	return nil, errors.New("a unix door's lock needs flock, which " + runtime.GOOS + " does not have")
}
