//go:build !(linux && (386 || arm || mips || mipsle))

package harness

import (
	"fmt"
	"io"
	"log"
	"math/rand/v2"

	"saguin.dev/chaos/faultfs"
)

// checkPowerCuts reports what this machine lacks for the powercut nemesis.
func checkPowerCuts() error { return faultfs.CheckFUSE() }

// errNoPowerCuts is nil: this build has faultfs (disk_nofuse.go is the
// other side).
var errNoPowerCuts error

// disk is the broker's data directory served through faultfs, so a power cut
// can drop everything the broker wrote and did not sync (invariant 14).
type disk struct {
	backing, mount string
	logger         *log.Logger
	fs             *faultfs.FS
	cuts           []faultfs.CutStats
}

func mountDisk(backing, mount string, logTo io.Writer) (powerDisk, error) {
	d := &disk{backing: backing, mount: mount, logger: log.New(logTo, "faultfs: ", log.LstdFlags|log.Lmicroseconds)}
	fs, err := faultfs.Mount(backing, mount, d.options())
	if err != nil {
		return nil, fmt.Errorf("mount faultfs %s on %s: %w", backing, mount, err)
	}
	d.fs = fs
	return d, nil
}

func (d *disk) powerCut(torn bool, rng *rand.Rand) error { return d.fs.PowerCut(torn, rng) }

func (d *disk) cutCount() int { return len(d.cuts) }

// remount detaches the cut filesystem and mounts the backing directory again:
// the old mount's kernel page cache still holds the data the cut dropped
// (design.md), so the broker must not restart on it.
func (d *disk) remount() error {
	d.cuts = append(d.cuts, d.fs.Stats().Cut)
	if err := d.fs.Unmount(); err != nil {
		return fmt.Errorf("unmount after power cut: %w", err)
	}
	fs, err := faultfs.Mount(d.backing, d.mount, d.options())
	if err != nil {
		return fmt.Errorf("remount after power cut: %w", err)
	}
	d.fs = fs
	return nil
}

func (d *disk) unmount() error {
	if err := d.fs.Unmount(); err != nil {
		return fmt.Errorf("unmount faultfs: %w", err)
	}
	return nil
}

// options mounts with explicit data-cache control: the kernel never drops
// a file's cached pages on its own (rfcs/chaos-harness.md "The page cache
// of the power-cut mount": with go-fuse's default, sqlite's read
// connections now and then read a snapshot that was not the database's).
func (d *disk) options() faultfs.Options {
	return faultfs.Options{Logger: d.logger, ExplicitDataCacheControl: true}
}
