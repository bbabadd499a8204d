package passwd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// newFileMode is a created file's mode (docs/configuration.md "Password files and `saguin --passwd`"): the hashes are
// for the broker's user alone.
const newFileMode = 0o600

// Write replaces the file with Bytes atomically: a temporary file in the
// same directory, written, synced, given the old file's mode and owner (or
// mode 0600 for a new file), then renamed over it, so a reader — the
// broker at SIGUSR1, mosquitto — sees the old file or the new one, never
// half of one. A symbolic link is followed and its target replaced, so the
// link stays. Write refuses, changing nothing, when the file changed (or
// appeared) since it was read: a second editor's change would otherwise be
// lost without a word.
func (f *File) Write() error {
	target, err := filepath.EvalSymlinks(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		target, err = f.path, nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	if err := f.unchanged(target); err != nil {
		return err
	}
	dir := filepath.Dir(target)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(target)+".saguin-*")
	if err != nil {
		return fmt.Errorf("%s: cannot create a temporary file beside it: %w", f.path, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(f.Bytes()); err != nil {
		return fmt.Errorf("%s: writing %s: %w", f.path, tmp.Name(), err)
	}
	mode := os.FileMode(newFileMode)
	if f.read != nil {
		mode = f.read.Mode().Perm()
		// The owner first: changing it may clear mode bits.
		if err := keepOwner(tmp, f.read); err != nil {
			return fmt.Errorf("%s: %w; nothing written", f.path, err)
		}
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("%s: setting mode %04o: %w", f.path, mode, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("%s: syncing %s: %w", f.path, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%s: closing %s: %w", f.path, tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fmt.Errorf("%s: replacing it: %w", f.path, err)
	}
	done = true
	// The rename is durable once the directory is synced; a failure here
	// leaves a complete file, so it is not reported as one.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// unchanged checks that target is still the file that was read (or still
// absent, for a file that was not there).
func (f *File) unchanged(target string) error {
	now, err := os.Stat(target)
	switch {
	case f.read == nil && err == nil:
		return fmt.Errorf("%s appeared while it was being edited; nothing written: run the command again", f.path)
	case f.read == nil && errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w", f.path, err)
	case !os.SameFile(now, f.read) || now.Size() != f.read.Size() || !now.ModTime().Equal(f.read.ModTime()):
		return fmt.Errorf("%s changed while it was being edited; nothing written: run the command again", f.path)
	}
	return nil
}
