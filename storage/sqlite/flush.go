package sqlite

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// flusher bounds the power-cut loss window (invariant 14).
//
// With synchronous=NORMAL a commit writes its frames to the WAL file and
// returns without an fsync; the frames sit in the page cache, safe from a
// crash of this process but not from a power cut. SQLite itself syncs only
// at a checkpoint. Every FlushInterval the flusher fsyncs the WAL file — if,
// and only if, some transaction committed since the previous fsync, so an
// idle provider causes no disk writes. All frames of every commit counted
// before the fsync starts are on stable storage when it returns, and WAL
// recovery stops at the first frame that fails its checksum, so a power cut
// loses only a tail of commits: about one flush interval plus one fsync,
// never a hole below a surviving record.
//
// It fsyncs the file directly rather than running a checkpoint, so it never
// takes the write connection and never delays a publish. It opens the WAL
// by path for each fsync; SQLite holds no POSIX locks on the WAL file
// (WAL locks live in the -shm file), so closing that descriptor drops none.
// The directory is synced once, so the WAL file's own entry survives too.
type flusher struct {
	p        *Provider
	walPath  string
	dir      string
	interval time.Duration

	mu        sync.Mutex // one fsync at a time (ticker or Flush)
	synced    uint64     // commit count covered by the last fsync
	dirSynced bool
	failing   bool // inside a streak of failures: only the first is logged

	errors  atomic.Uint64
	flushes atomic.Uint64
	quit    chan struct{}
	done    chan struct{}
}

func newFlusher(p *Provider) *flusher {
	return &flusher{
		p:        p,
		walPath:  p.path + "-wal",
		dir:      filepath.Dir(p.path),
		interval: p.opts.FlushInterval,
		synced:   p.stats.commits.Load(),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
}

func (f *flusher) run() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-f.quit:
			return
		case <-t.C:
			// A failure is counted, the first of a streak logged at ERROR,
			// and retried at the next tick.
			_ = f.flush()
		}
	}
}

func (f *flusher) stop() {
	close(f.quit)
	<-f.done
}

func (f *flusher) flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	commits := f.p.stats.commits.Load()
	if commits == f.synced {
		return nil
	}
	if fa := f.p.opts.Faults; fa != nil && fa.SyncOff {
		// Negative control: nothing is made durable (invariant 14 broken on
		// purpose), and nothing is counted as flushed.
		return nil
	}
	// invariant 14: this fsync bounds what a power cut loses to about one interval.
	err := f.sync()
	if err != nil {
		f.errors.Add(1)
		if !f.failing {
			f.p.opts.Logger.Error("storage could not fsync its WAL; acknowledged writes since the last fsync would not survive a power cut; retrying every flush interval",
				"provider", f.p.opts.Name, "path", f.walPath, "error", err)
		}
		f.failing = true
		return fmt.Errorf("storage %s: flush: %w", f.p.opts.Name, err)
	}
	if f.failing {
		f.p.opts.Logger.Info("storage WAL fsync works again", "provider", f.p.opts.Name)
	}
	f.failing = false
	f.synced = commits
	f.flushes.Add(1)
	return nil
}

func (f *flusher) sync() error {
	if err := fsyncPath(f.walPath); err != nil {
		return err
	}
	if !f.dirSynced {
		if err := fsyncPath(f.dir); err != nil {
			return err
		}
		f.dirSynced = true
	}
	return nil
}

func fsyncPath(path string) error {
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	err = fd.Sync()
	if cerr := fd.Close(); err == nil {
		err = cerr
	}
	return err
}
