package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// makeDataDir creates a provider's directory and any missing parents, mode
// 0700, at start (rfcs/process.md "Data directories"): a user trying the
// example expects the broker to create its data directory, as the memory
// provider does its snapshot_dir. Each new entry's parent is synced, so a
// directory made just now cannot vanish in a power cut while the files
// later written into it survive — the next start would otherwise begin
// empty, a lost store that looks like a fresh install (invariant 14).
func makeDataDir(dir string) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if !os.IsNotExist(err) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := makeDataDir(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
