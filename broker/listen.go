package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"saguin.dev/broker/config"
)

// openListener binds one MQTT door (docs/configuration.md "`broker.mqtt`"). A tcp or ws door is a
// plain net.Listen (its TLS and WebSocket layers are put over each
// connection it accepts: doors.go); a unix door is bound as
// rfcs/process.md "Unix sockets" says: under a lock, never over a live
// server's socket nor over a file that is not a socket, with its mode set
// before anyone can connect.
func openListener(l config.Listener) (net.Listener, error) {
	switch l.Kind {
	case "tcp", "ws":
		return net.Listen("tcp", l.Address)
	case "unix":
		return openUnix(l.Path, l.Mode)
	}
	// The loader knows no other kind; reaching here is a broker bug, and a
	// door silently left unopened is not an answer.
	return nil, fmt.Errorf("a %s door is not served by this build of Sagüin", l.Kind)
}

// maxSunPath is the longest socket path bind takes (sun_path is 108 bytes
// with its terminating NUL).
const maxSunPath = 107

// probeTimeout bounds the connect that tells a live socket from a stale
// one; a live server answers a unix connect at once (the kernel does).
const probeTimeout = time.Second

func openUnix(path string, mode fs.FileMode) (net.Listener, error) {
	if strings.HasPrefix(path, "@") {
		// An abstract name has no file, so no mode, nothing stale and no
		// lock (docs/configuration.md "`broker.mqtt`"): the kernel refuses a second bind itself.
		return net.Listen("unix", path)
	}
	lockPath := path + ".lock"
	lock, err := lockSocketPath(lockPath)
	if err != nil {
		if errors.Is(err, errSocketLockHeld) {
			return nil, fmt.Errorf("unix socket %s: another broker is serving it (it holds %s); stop that broker or choose another path", path, lockPath)
		}
		return nil, fmt.Errorf("unix socket %s: taking its lock %s: %w", path, lockPath, err)
	}
	ln, err := bindUnix(path, mode)
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	return &unixListener{Listener: ln, path: path, lock: lock}, nil
}

// bindUnix replaces a stale socket at path (one nobody accepts on) and
// binds a new one with mode. It holds the path's lock, so no other Sagüin
// binds it meanwhile; the connect probe also keeps it off a socket another
// program (or a build without the lock) serves.
func bindUnix(path string, mode fs.FileMode) (net.Listener, error) {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode()&fs.ModeSocket == 0:
		// docs/operations.md "A start", at start as at load: the file may have appeared since.
		return nil, fmt.Errorf("unix socket %s: the path is taken by %s, not a socket; remove it or choose another path", path, fileKind(fi))
	case err == nil:
		if err := staleSocket(path); err != nil {
			return nil, err
		}
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("unix socket %s: removing the stale socket: %w", path, err)
		}
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("unix socket %s: %w", path, err)
	}
	return listenWithMode(path, mode)
}

// staleSocket returns nil when nobody serves the socket at path (a connect
// is refused), and an error naming why it is left alone otherwise.
func staleSocket(path string) error {
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("unix socket %s: another process is serving it; stop it or choose another path", path)
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	// Permission denied, a full backlog, a timeout: whether it is live
	// cannot be told, and removing a live server's socket is not undone.
	return fmt.Errorf("unix socket %s: cannot tell whether a process serves it (%v); remove it if it is stale, or choose another path", path, err)
}

// listenWithMode binds the socket in a fresh directory only this user can
// enter, sets its mode there, then renames it into place: nobody can
// connect while the socket still has the umask's permissions. A path too
// long for that detour (sun_path) is bound in place and chmod-ed at once.
func listenWithMode(path string, mode fs.FileMode) (net.Listener, error) {
	dir := filepath.Dir(path)
	private, err := os.MkdirTemp(dir, ".sock")
	if err != nil {
		return nil, fmt.Errorf("unix socket %s: %w", path, err)
	}
	defer os.Remove(private)
	tmp := filepath.Join(private, "s")
	if len(tmp) > maxSunPath {
		tmp = path
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("unix socket %s: %w", path, err)
	}
	// The socket file is removed by unixListener.Close under its final
	// name; the listener would unlink the name it was bound under.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("unix socket %s: %w", path, err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(err)
	}
	if tmp != path {
		if err := os.Rename(tmp, path); err != nil {
			return fail(err)
		}
	}
	return ln, nil
}

func fileKind(fi fs.FileInfo) string {
	switch {
	case fi.IsDir():
		return "a directory"
	case fi.Mode().IsRegular():
		return "a regular file"
	}
	return "a " + fi.Mode().Type().String() + " file"
}

// unixListener is a bound unix door: closing it removes its socket file
// and then lets its lock go, in that order, so a broker that takes the
// lock next never finds this one's socket.
type unixListener struct {
	net.Listener
	path string
	lock *os.File

	once sync.Once
	err  error
}

// Addr is the socket's path (it was bound under a temporary name).
func (u *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: u.path, Net: "unix"} }

func (u *unixListener) Close() error {
	u.once.Do(func() {
		u.err = u.Listener.Close()
		if err := os.Remove(u.path); err != nil && !os.IsNotExist(err) {
			u.err = errors.Join(u.err, err)
		}
		u.err = errors.Join(u.err, u.lock.Close())
	})
	return u.err
}
