package broker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// writePIDFile writes broker.pid_file (docs/operations.md "The pid file"): the process id
// and a newline, mode 0644, written to a temporary file beside it and
// renamed into place, so a reader never sees a partial file. It is not
// synced: after a crash or a power cut it names a dead process anyway.
func (b *Broker) writePIDFile() error {
	path := b.cfg.Broker.PIDFile
	if path == "" {
		return nil
	}
	pid := os.Getpid()
	if err := writeFileAtomic(path, []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		// The cause alone: the temporary file's name would only confuse.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("broker.pid_file %s cannot be written: %w", path, err)
	}
	b.pidFile = path
	b.log.Info("pid file written", "path", path, "pid", pid)
	return nil
}

// removePIDFile removes the pid file on a clean shutdown — only while it
// still names this process: one a later broker wrote over it is that
// broker's.
func (b *Broker) removePIDFile() {
	if b.pidFile == "" {
		return
	}
	data, err := os.ReadFile(b.pidFile)
	if err != nil || strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		return
	}
	if err := os.Remove(b.pidFile); err != nil {
		b.log.Warn("pid file not removed", "path", b.pidFile, "error", err)
		return
	}
	b.log.Info("pid file removed", "path", b.pidFile)
	b.pidFile = ""
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // CreateTemp makes it 0600
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}
