package memory

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
)

// Files in the snapshot directory (rfcs/storage-memory.md "Files in snapshot_dir").
const (
	manifestName = "saguin.manifest"
	lockName     = "saguin.lock"
	// tmpMarker is in the name of every replacement being written. A
	// channel file's name never contains a dot before its extension
	// (FileName encodes dots), so nothing else can carry it.
	tmpMarker = ".tmp-"
	// writers bounds how many files are written at once (rfcs/storage-memory.md).
	writers = 4
)

// Channel kinds inside a channels file.
const (
	kindAppend uint8 = 1
	kindLatest uint8 = 2
	kindQueue  uint8 = 3
)

// unit is what one channel file holds: an append log, a queue with its
// dead-letter log (they share a file so they are restored together), or a
// value store (log and queue nil).
type unit struct {
	log    *appendLog
	queue  *queueStore
	values *valueStore
}

func (u *unit) name() string {
	switch {
	case u.values != nil:
		return u.values.name
	case u.queue != nil:
		return u.queue.name
	}
	return u.log.name
}

// kind is the unit's kind byte, in the manifest and its file.
func (u *unit) kind() uint8 {
	switch {
	case u.values != nil:
		return kindLatest
	case u.queue != nil:
		return kindQueue
	}
	return kindAppend
}

// what names the unit's kind in a refusal.
func (u *unit) what() string {
	switch u.kind() {
	case kindLatest:
		return "a value store"
	case kindQueue:
		return "a queue"
	}
	return "an append channel"
}

func (p *Provider) fileErr(path string, err error) error {
	return fmt.Errorf("memory provider %q: snapshot %s: %w", p.name, path, err)
}

// ---- writing ----

// save writes the manifest and then every channel file. Invariant 14: each
// file is written to a temporary file in the same directory, synced, and
// only then renamed over the known-good one, and the directory is synced
// after the renames. The manifest is made durable before any channel file,
// so a crash part-way leaves channel files older than the manifest, which
// the next start reports as unfinished. Every failure is reported.
func (p *Provider) save(units []*unit) error {
	at := p.now()
	if !at.After(p.lastAt) {
		at = p.lastAt.Add(time.Nanosecond) // moments must order shutdowns even on a stepped clock
	}
	slices.SortFunc(units, func(a, b *unit) int { return cmp.Compare(a.name(), b.name()) })

	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	if err := p.writeFile(manifestName, encodeManifest(p.writer, at, units)); err != nil {
		fail(err)
	} else if err := syncDir(p.dir); err != nil {
		fail(p.fileErr(p.dir, err))
	}
	sem := make(chan struct{}, writers)
	var wg sync.WaitGroup
	for _, u := range units {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := p.writeFile(snapshot.FileName(u.name()), u.encode(p.writer, at)); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	if err := syncDir(p.dir); err != nil {
		fail(p.fileErr(p.dir, err))
	}
	return errors.Join(errs...)
}

// writeFile replaces name in the snapshot directory with data, atomically:
// on any failure the old file is whole and the replacement is removed.
func (p *Provider) writeFile(name string, data []byte) (err error) {
	final := filepath.Join(p.dir, name)
	f, err := os.CreateTemp(p.dir, name+tmpMarker+"*")
	if err != nil {
		return p.fileErr(final, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			err = p.fileErr(final, fmt.Errorf("not replaced, the previous file is untouched: %w", err))
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	// invariant 14: the replacement is synced before it takes the known-good file's name.
	if err = p.syncSnapshot(f); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if hook := p.faults.BeforeSnapshotRename; hook != nil {
		if err = hook(final); err != nil {
			return err
		}
	}
	return os.Rename(tmp, final)
}

// syncSnapshot fsyncs a snapshot file's replacement, through the fault seam
// when a test set one.
func (p *Provider) syncSnapshot(f *os.File) error {
	if hook := p.faults.SyncSnapshot; hook != nil {
		return hook(f)
	}
	return f.Sync()
}

// mkdirDurable creates dir and any missing parents, syncing each parent
// after the entry is made. A directory created without that sync can vanish
// in a power cut while the snapshots later written into it are synced, and
// the next start would then create it again and begin empty — a lost store
// that looks like a fresh install (invariant 14). The chaos harness's power
// cuts found it.
func mkdirDurable(dir string) error {
	dir = filepath.Clean(dir)
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	} else if !os.IsNotExist(err) {
		return err
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirDurable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

func encodeManifest(writer string, at time.Time, units []*unit) []byte {
	e := snapshot.NewFile(snapshot.KindManifest, writer, at, 64*int64(len(units)))
	e.Count(len(units))
	for _, u := range units {
		e.String(u.name())
		e.Uint8(u.kind())
	}
	return e.Finish()
}

// encode writes one channel file. The writer holds the unit's locks (queue
// before log, the fixed order); the provider is closed, so they are not
// contended and nothing changes while the file is built.
//
// Body: kind u8, name; a queue adds next u64, its items and then its
// dead-letter log; every log is name, next u64, floor u64, its records
// (the dead prefix skipped) and its positions. A value store (kind 2) is
// name, next u64 and its values in topic order.
func (u *unit) encode(writer string, at time.Time) []byte {
	if u.values != nil {
		return u.values.encode(writer, at)
	}
	// The hint is added up in int64: a byte count can pass 2^31 on a
	// 32-bit build.
	var hint int64
	if q := u.queue; q != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		hint += q.bytes + int64(q.live)*snapshot.MinQueueItemSize
	}
	l := u.log
	l.mu.RLock()
	defer l.mu.RUnlock()
	hint += l.bytes + int64(l.recs.Len())*snapshot.MinRecordSize + int64(len(l.positions))*64 + 256

	e := snapshot.NewFile(snapshot.KindChannels, writer, at, hint)
	if q := u.queue; q != nil {
		e.Uint8(kindQueue)
		e.String(q.name)
		e.Uint64(q.next)
		e.Count(q.live)
		for i := q.head; i < len(q.items); i++ {
			if !q.items[i].gone {
				e.QueueItem(&q.items[i].QueueItem)
			}
		}
	} else {
		e.Uint8(kindAppend)
		e.String(l.name)
	}
	e.String(l.name)
	e.Uint64(l.next)
	e.Uint64(l.floor)
	e.Count(l.recs.Len())
	for i := range l.recs.Len() {
		e.Record(l.recs.At(i))
	}
	e.Count(len(l.positions))
	for _, r := range slices.Sorted(maps.Keys(l.positions)) {
		pos := l.positions[r]
		e.Position(&pos)
	}
	// The channel's unreleased QoS 2 publishes end the file (rfcs/storage-memory.md);
	// a queue's are the queue's (its dead-letter log takes none).
	if q := u.queue; q != nil {
		encodeHolds(e, q.holds)
	} else {
		encodeHolds(e, l.holds)
	}
	return e.Finish()
}

// ---- loading ----

// load takes the directory lock and restores every channel file. Any
// damaged, truncated or wrong-version file is an error naming it: never an
// empty start (invariant 14). Manifest disagreements are warnings.
func (p *Provider) load() error {
	if err := mkdirDurable(p.dir); err != nil {
		return p.fileErr(p.dir, err)
	}
	if err := p.takeLock(); err != nil {
		return err
	}
	if err := p.loadDir(); err != nil {
		return errors.Join(err, p.unlock())
	}
	return nil
}

func (p *Provider) takeLock() error {
	path := filepath.Join(p.dir, lockName)
	f, err := lockFile(path)
	if errors.Is(err, errLockHeld) {
		return fmt.Errorf("memory provider %q: lock %s is held by another running broker: %w", p.name, path, err)
	}
	if err != nil {
		return fmt.Errorf("memory provider %q: lock %s: %w", p.name, path, err)
	}
	p.lock = f
	return nil
}

func (p *Provider) unlock() error {
	if p.lock == nil {
		return nil
	}
	err := p.lock.Close() // closing the descriptor releases the lock
	p.lock = nil
	if err != nil {
		return fmt.Errorf("memory provider %q: releasing lock: %w", p.name, err)
	}
	return nil
}

type manifest struct {
	at    time.Time
	kinds map[string]uint8
}

type loadedFile struct {
	path string
	at   time.Time
}

func (p *Provider) loadDir() error {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return p.fileErr(p.dir, err)
	}
	var m *manifest
	files := map[string]loadedFile{} // channel (queue or append) -> its file
	owner := map[string]string{}     // every log and queue name -> file, to refuse duplicates
	for _, e := range entries {
		name, path := e.Name(), filepath.Join(p.dir, e.Name())
		switch {
		case strings.Contains(name, tmpMarker):
			// A replacement a crash interrupted before its rename: it
			// never replaces the known-good file (invariant 14).
			p.log.Warn("removing an unfinished snapshot file left by an interrupted shutdown", "provider", p.name, "file", path)
			if err := os.Remove(path); err != nil {
				return p.fileErr(path, err)
			}
		case name == manifestName:
			if m, err = p.readManifest(path); err != nil {
				return err
			}
		case strings.HasSuffix(name, snapshot.ChannelExt) && e.Type().IsRegular():
			u, at, err := p.readChannel(path)
			if err != nil {
				return err
			}
			if want := snapshot.FileName(u.name()); want != name {
				return p.fileErr(path, fmt.Errorf("holds channel %q, whose file is %s", u.name(), want))
			}
			var names []string
			switch {
			case u.values != nil:
				names = []string{u.values.name}
			case u.queue != nil:
				names = []string{u.log.name, u.queue.name}
			default:
				names = []string{u.log.name}
			}
			for _, n := range names {
				if other, dup := owner[n]; dup {
					return p.fileErr(path, fmt.Errorf("channel %q is also in %s", n, other))
				}
				owner[n] = path
			}
			p.restored[u.name()] = u
			if u.queue != nil {
				p.dlqOf[u.log.name] = u.queue.name
			}
			files[u.name()] = loadedFile{path, at}
			p.lastAt = maxTime(p.lastAt, at)
		}
	}
	p.checkManifest(m, files)
	now := p.now()
	for _, u := range p.restored {
		if u.log == nil {
			continue // a value store keeps no positions
		}
		if dropped := u.log.expirePositions(now); len(dropped) > 0 {
			p.log.Info("dropped positions of sessions that expired while stopped",
				"provider", p.name, "channel", u.log.name, "readers", dropped)
		}
	}
	return nil
}

// checkManifest warns about what the manifest and the files disagree on
// (rfcs/storage-memory.md "Loading"). None of it stops a start: every file present
// was whole.
func (p *Provider) checkManifest(m *manifest, files map[string]loadedFile) {
	if m == nil {
		if len(files) > 0 {
			p.log.Warn("snapshot directory has channel files but no manifest: cannot tell whether the last shutdown finished",
				"provider", p.name, "dir", p.dir)
		}
		return
	}
	p.lastAt = maxTime(p.lastAt, m.at)
	for _, name := range slices.Sorted(maps.Keys(m.kinds)) {
		if _, ok := files[name]; !ok {
			p.log.Warn("channel listed in the manifest has no snapshot file: its records are gone",
				"provider", p.name, "channel", name, "file", snapshot.FileName(name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		f := files[name]
		if _, listed := m.kinds[name]; !listed {
			continue // a channel no longer configured: nothing to say
		}
		switch {
		case f.at.Before(m.at):
			// Its holds are of an exchange the later shutdown may have
			// finished: dropped and counted abandoned (rfcs/storage-memory.md).
			if n := p.restored[name].dropHolds(); n > 0 {
				p.abandonedAtOpen += n
				p.log.Warn("dropped the held QoS 2 publishes of a channel file older than the manifest",
					"provider", p.name, "channel", name, "holds", n)
			}
			p.log.Warn("channel file is from an earlier shutdown than the manifest: everything after that moment is gone",
				"provider", p.name, "channel", name, "file", f.path, "written", f.at, "shutdown", m.at)
		case f.at.After(m.at):
			p.log.Warn("channel file is newer than the manifest: the channels were written, the manifest was not",
				"provider", p.name, "channel", name, "file", f.path, "written", f.at, "manifest", m.at)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// readFile reads a whole file and checks its frame before anything in it
// is trusted: checksum, then version, then kind.
func (p *Provider) readFile(path string, kind snapshot.Kind) (snapshot.Header, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return snapshot.Header{}, nil, p.fileErr(path, err)
	}
	// invariant 14: a damaged file is a startup error naming it, never an empty start.
	h, body, err := snapshot.Parse(data)
	if err != nil {
		return h, nil, p.fileErr(path, err)
	}
	if h.Kind != kind {
		return h, nil, p.fileErr(path, fmt.Errorf("file kind %d, want %d", h.Kind, kind))
	}
	return h, body, nil
}

func (p *Provider) readManifest(path string) (*manifest, error) {
	h, body, err := p.readFile(path, snapshot.KindManifest)
	if err != nil {
		return nil, err
	}
	d := snapshot.NewDecoder(body)
	m := &manifest{at: h.WrittenAt, kinds: map[string]uint8{}}
	for range d.Count("manifest entry", 4+1) {
		name := d.String("channel name")
		m.kinds[name] = d.Uint8()
	}
	if err := d.End(); err != nil {
		return nil, p.fileErr(path, err)
	}
	return m, nil
}

func (p *Provider) readChannel(path string) (*unit, time.Time, error) {
	h, body, err := p.readFile(path, snapshot.KindChannels)
	if err != nil {
		return nil, time.Time{}, err
	}
	u, err := p.decodeUnit(body)
	if err != nil {
		return nil, time.Time{}, p.fileErr(path, err)
	}
	return u, h.WrittenAt, nil
}

// decodeUnit reads a channel file's body and post-checks it (rfcs/storage-memory.md).
func (p *Provider) decodeUnit(body []byte) (*unit, error) {
	d := snapshot.NewDecoder(body)
	u := &unit{}
	kind := d.Uint8()
	name := d.String("channel name")
	switch kind {
	case kindAppend:
		u.log = p.decodeLog(d)
		if d.Err() == nil && u.log.name != name {
			d.Fail("append channel %q holds a log named %q", name, u.log.name)
		}
		u.log.holds = decodeHolds(d, name)
	case kindQueue:
		q := &queueStore{p: p, name: name, next: d.Uint64()}
		if n := d.Count("queue item", snapshot.MinQueueItemSize); n > 0 {
			q.items = make([]qitem, 0, n)
			for range n {
				it := d.QueueItem()
				if d.Err() != nil {
					break
				}
				q.items = append(q.items, qitem{QueueItem: it})
				q.bytes += it.Size()
			}
		}
		q.live = len(q.items)
		u.log = p.decodeLog(d)
		u.log.queue, q.dlq, u.queue = name, u.log, q
		if d.Err() == nil && (u.log.name == "" || u.log.name == name) {
			d.Fail("queue %q has dead-letter channel %q", name, u.log.name)
		}
		q.holds = decodeHolds(d, name)
	case kindLatest:
		u.values = p.decodeValues(d, name)
		u.values.holds = decodeHolds(d, name)
	default:
		d.Fail("channel %q has unknown kind %d", name, kind)
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, errors.New("channel with an empty name")
	}
	if u.values != nil {
		if err := u.values.checkLoaded(); err != nil {
			return nil, err
		}
		return u, nil
	}
	if err := u.log.checkLoaded(); err != nil {
		return nil, err
	}
	if u.queue != nil {
		if err := u.queue.checkLoaded(); err != nil {
			return nil, err
		}
	}
	return u, nil
}

func (p *Provider) decodeLog(d *snapshot.Decoder) *appendLog {
	l := newLog(p, d.String("log name"))
	l.next = d.Uint64()
	l.floor = d.Uint64()
	for range d.Count("record", snapshot.MinRecordSize) {
		r := d.Record()
		if d.Err() != nil {
			break
		}
		l.recs.Push(r)
		l.bytes += r.Size()
	}
	for range d.Count("position", snapshot.MinPositionSize) {
		pos := d.Position()
		if d.Err() != nil {
			break
		}
		if _, dup := l.positions[pos.Reader]; dup || !validReader(pos.Reader) {
			d.Fail("position reader %q invalid or repeated", pos.Reader)
			break
		}
		l.positions[pos.Reader] = pos
	}
	return l
}

// encode writes a value store's file: kind 2, name, next u64, then the
// count and the values in topic order, each a whole record with its offset.
// The writer holds the store's lock; the provider is closed, so it is not
// contended and nothing changes while the file is built.
func (v *valueStore) encode(writer string, at time.Time) []byte {
	v.mu.RLock()
	defer v.mu.RUnlock()
	e := snapshot.NewFile(snapshot.KindChannels, writer, at,
		v.bytes+int64(len(v.vals))*snapshot.MinRecordSize+64+int64(len(v.name)))
	e.Uint8(kindLatest)
	e.String(v.name)
	e.Uint64(v.next)
	e.Count(len(v.vals))
	for _, r := range v.vals {
		e.Record(r)
	}
	encodeHolds(e, v.holds)
	return e.Finish()
}

// decodeValues reads a value store's body after its kind and name. The
// count is checked against the bytes present before the slice is made
// (invariant 13); the order and offsets are post-checked by checkLoaded.
func (p *Provider) decodeValues(d *snapshot.Decoder, name string) *valueStore {
	v := newValues(p, name)
	v.next = d.Uint64()
	if n := d.Count("value", snapshot.MinRecordSize); n > 0 {
		v.vals = make([]*storage.Record, 0, n)
		for range n {
			r := d.Record()
			if d.Err() != nil {
				break
			}
			v.vals = append(v.vals, &r)
			v.bytes += r.Size()
		}
	}
	return v
}
