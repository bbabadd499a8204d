package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// rawDB opens a database file the way an operator's sqlite3 would.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+uriPath(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestNewDatabaseFileModePageSizeWALAndVersion(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	for _, f := range []string{path, path + ".lock"} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	if p.PageSize() != 4096 {
		t.Fatalf("page size %d", p.PageSize())
	}
	if _, err := mustLog(t, p, "events").Append(record("a", 10)); err != nil {
		t.Fatal(err)
	}
	if p.Bytes() < 4*4096 || p.Bytes()%4096 != 0 {
		t.Fatalf("Bytes() = %d: want whole pages of a database holding a schema", p.Bytes())
	}
	// An external reader sees a WAL database at our version, live.
	db := rawDB(t, path)
	var mode string
	var version, pageSize int64
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&version); err != nil || version != SchemaVersion {
		t.Fatalf("user_version %d, %v", version, err)
	}
	if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil || pageSize != 4096 {
		t.Fatalf("page_size %d, %v", pageSize, err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM records`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("records seen by an external reader: %d, %v", n, err)
	}
	var writer string
	if err := db.QueryRow(`SELECT writer FROM meta`).Scan(&writer); err != nil || writer != "test-build" {
		t.Fatalf("meta writer %q, %v", writer, err)
	}
}

func TestLockRefusesASecondBroker(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	o := testOptions(path)
	o.Name = "second"
	_, err := Open(o)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "second") || !strings.Contains(err.Error(), path+".lock") {
		t.Fatalf("refusal %q does not name the provider and the lock file", err)
	}
	// The first broker is undisturbed by the refused attempt.
	if _, err := mustLog(t, p, "events").Append(record("a", 1)); err != nil {
		t.Fatalf("first provider after the refused open: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// The lock file is still there; it is harmless once nobody holds it.
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Fatal(err)
	}
	p2, err := Open(o)
	if err != nil {
		t.Fatalf("Open after the first closed: %v", err)
	}
	p2.Close()
}

// TestLockIsTakenBeforeTheDatabaseIsTouched: with the lock held, Open
// refuses without creating the database file.
func TestLockIsTakenBeforeTheDatabaseIsTouched(t *testing.T) {
	path := newDB(t)
	l, err := acquireLock(context.Background(), "other", path+".lock", "x", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	if _, err := Open(testOptions(path)); !errors.Is(err, ErrLocked) {
		t.Fatalf("Open with the lock held = %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused Open touched the database: %v", err)
	}
}

func TestUnknownSchemaVersionIsRefused(t *testing.T) {
	path := newDB(t)
	db := rawDB(t, path)
	for _, s := range []string{
		`CREATE TABLE meta (id INTEGER PRIMARY KEY, writer TEXT, created_at INTEGER)`,
		fmt.Sprintf(`INSERT INTO meta VALUES (1, '0123456789ab', %d)`, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()),
		`CREATE TABLE records (x)`,
		`PRAGMA user_version = 5`,
	} {
		if _, err := db.Exec(s); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	_, err := Open(testOptions(path))
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Version != 5 {
		t.Fatalf("Open = %v, want a VersionError for version 5", err)
	}
	want := fmt.Sprintf("storage %s: schema version 5 (created by saguin 0123456789ab at 2026-01-01T00:00:00Z); this broker reads version 20", path)
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("refusal %q\nwant it to contain %q", err, want)
	}
	// Nothing was changed: still version 5, no tables of ours.
	db = rawDB(t, path)
	var v, n int64
	db.QueryRow(`PRAGMA user_version`).Scan(&v)
	db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = 'channels'`).Scan(&n)
	if v != 5 || n != 0 {
		t.Fatalf("refused database was modified: version %d, channels tables %d", v, n)
	}
}

func TestTablesWithoutVersionAreRefused(t *testing.T) {
	path := newDB(t)
	db := rawDB(t, path)
	if _, err := db.Exec(`CREATE TABLE something (x)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err := Open(testOptions(path))
	var ve *VersionError
	if !errors.As(err, &ve) || !ve.NoVersion || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open = %v, want a refusal naming %s", err, path)
	}
}

// TestNoInsertOrReplace: the primary keys are what make offset reuse a
// failed insert; an INSERT OR REPLACE would silently overwrite instead
// (invariant 9). Only the lock database may use it.
func TestNoInsertOrReplace(t *testing.T) {
	var all []string
	for _, s := range stmtSQL {
		all = append(all, s)
	}
	for _, tb := range schemaTables {
		all = append(all, tb.ddl)
	}
	for _, s := range all {
		u := strings.ToUpper(s)
		if strings.Contains(u, "OR REPLACE") || strings.Contains(u, "REPLACE INTO") {
			t.Fatalf("statement replaces rows: %s", s)
		}
	}
	p := openAt(t, newDB(t), nil)
	l := mustLog(t, p, "events")
	if _, err := l.Append(record("a", 1)); err != nil {
		t.Fatal(err)
	}
	// A second insert at a used offset fails rather than replacing.
	err := p.do(func(w *writer) error {
		_, err := w.conn.ExecContext(context.Background(),
			`INSERT INTO records (channel, "offset", message_id, topic, timestamp, payload, retain, qos, publisher, bridge, size)
			 VALUES (?, 1, 'dup', 't', 0, x'', 0, 0, '', '', 0)`, l.(*appendLog).ch.id)
		return err
	})
	if err == nil {
		t.Fatal("a second record at offset 1 was accepted")
	}
}

// TestOnDiskFormat checks the rows an operator reads with sqlite3.
func TestOnDiskFormat(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	l := mustLog(t, p, "events")
	full := storagetest.SampleRecords()[0]
	bare := storage.Record{MessageID: "bare", Topic: "t"}
	for _, r := range []storage.Record{full, bare} {
		if _, err := l.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	db := rawDB(t, path)
	type row struct {
		headers, props sql.NullString
		ts, size       int64
	}
	read := func(off int) row {
		var r row
		if err := db.QueryRow(`SELECT headers, props, timestamp, size FROM records WHERE "offset" = ?`, off).
			Scan(&r.headers, &r.props, &r.ts, &r.size); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r1, r2 := read(1), read(2)
	if r1.headers.String != `[["b","2"],["a","1"],["b","3"],["b","2"]]` {
		t.Fatalf("headers stored as %q", r1.headers.String)
	}
	if r1.props.String != `{"content_type":"application/json","response_topic":"replies/d1","correlation_data":"3q0Avu8=","payload_format":1,"message_expiry":3600}` {
		t.Fatalf("props stored as %q", r1.props.String)
	}
	if r1.ts != full.Timestamp.UnixNano() || r1.size != full.Size() {
		t.Fatalf("timestamp %d size %d", r1.ts, r1.size)
	}
	if r2.headers.Valid || r2.props.Valid || r2.ts != 0 || r2.size != bare.Size() {
		t.Fatalf("a bare record is stored as %+v: want NULL headers and props, timestamp 0", r2)
	}
	var next, floor, bytes int64
	if err := db.QueryRow(`SELECT next, floor, bytes FROM channels WHERE name = 'events'`).Scan(&next, &floor, &bytes); err != nil {
		t.Fatal(err)
	}
	if next != 3 || floor != 1 || bytes != full.Size()+bare.Size() {
		t.Fatalf("channels row next %d floor %d bytes %d", next, floor, bytes)
	}
}

func TestRecordTextMustBeUTF8(t *testing.T) {
	p := openAt(t, newDB(t), nil)
	l := mustLog(t, p, "events")
	r := record("a", 1)
	r.Headers = []storage.Header{{Name: "k", Value: "\xff"}}
	if _, err := l.Append(r); err == nil {
		t.Fatal("a header that JSON would rewrite was stored")
	}
	if l.Next() != 1 {
		t.Fatalf("the refused record took an offset: next %d", l.Next())
	}
}

func TestChannelKindsAreKept(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	mustQueue(t, p, "jobs")
	if _, err := p.Append("jobs"); err == nil {
		t.Fatal("a queue was opened as an append channel")
	}
	if _, err := p.Queue("jobs", "other__dlq"); err == nil {
		t.Fatal("a queue was reopened with another dead-letter channel")
	}
	if _, err := p.Queue("x", "x"); err == nil {
		t.Fatal("a queue was its own dead-letter channel")
	}
	mustLog(t, p, "events")
	if _, err := p.Queue("events", "events__dlq"); err == nil {
		t.Fatal("an append channel was opened as a queue")
	}
	p.Close()
	p = openAt(t, path, nil)
	_, err := p.Append("jobs")
	if err == nil || !strings.Contains(err.Error(), "stored as queue") {
		t.Fatalf("after restart Append(jobs) = %v, want a refusal naming the stored kind", err)
	}
}

// TestExpiredPositionsDroppedAtOpen covers the cap: a position whose own
// expiry is long is judged by MaxSessionExpiry.
func TestExpiredPositionsDroppedAtOpen(t *testing.T) {
	path := newDB(t)
	now := storagetest.Base
	p := openAt(t, path, nil)
	l := mustLog(t, p, "events")
	for _, pos := range []storage.Position{
		{Reader: "mqtt:capped", Offset: 1, LastSeen: now.Add(-2 * time.Hour), Expiry: 100 * time.Hour},
		{Reader: "mqtt:fresh", Offset: 1, LastSeen: now.Add(-30 * time.Minute), Expiry: 100 * time.Hour},
		{Reader: "mqtt:exact", Offset: 1, LastSeen: now.Add(-time.Hour), Expiry: time.Hour},
		{Reader: "bridge:old", Offset: 1, LastSeen: now.Add(-1000 * time.Hour)},
		{Reader: "mqtt", Offset: 1}, // not the mqtt: prefix
	} {
		if err := l.SavePosition(pos); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	p = openAt(t, path, func(o *Options) { o.MaxSessionExpiry = time.Hour })
	got, err := mustLog(t, p, "events").Positions()
	if err != nil {
		t.Fatal(err)
	}
	var readers []string
	for _, g := range got {
		readers = append(readers, g.Reader)
	}
	if strings.Join(readers, ",") != "bridge:old,mqtt,mqtt:fresh" {
		t.Fatalf("positions after open: %v", readers)
	}
}

// TestReliefRestoresTheCeiling: a relief transaction raises the page
// ceiling and restores it on commit and on rollback; a publish after either
// is still refused, and the reserve never pushes the file past max_bytes.
func TestReliefRestoresTheCeiling(t *testing.T) {
	const maxBytes, reserve = 128 << 10, 16 << 10
	p := openAt(t, newDB(t), func(o *Options) { o.MaxBytes, o.Reserve = maxBytes, reserve })
	l := mustLog(t, p, "events")
	q := mustQueue(t, p, "jobs")
	if _, err := q.Enqueue(record("job", 500)); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		_, err := l.Append(record(fmt.Sprint("r", i), 1000))
		if errors.Is(err, storage.ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	ceiling := func() int64 {
		var n int64
		if err := p.do(func(w *writer) error {
			return w.conn.QueryRowContext(context.Background(), `PRAGMA max_page_count`).Scan(&n)
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ordinary := max(p.opts.ordinaryPages, p.Bytes()/p.PageSize())
	if c := ceiling(); c != ordinary {
		t.Fatalf("ceiling %d before relief, want %d", c, ordinary)
	}
	stillRefused := func(after string) {
		t.Helper()
		if _, err := l.Append(record("more", 1000)); !errors.Is(err, storage.ErrFull) {
			t.Fatalf("after %s an append was not refused: %v", after, err)
		}
		if c, lim := ceiling(), max(p.opts.ordinaryPages, p.Bytes()/p.PageSize()); c != lim {
			t.Fatalf("after %s the ceiling is %d, want %d", after, c, lim)
		}
	}
	// Commit path.
	for i := range 20 {
		if err := l.SavePosition(storage.Position{Reader: fmt.Sprintf("mqtt:reader-with-a-long-name-%03d", i), Offset: 1, LastSeen: time.Now(), Expiry: time.Hour}); err != nil {
			t.Fatalf("SavePosition %d at the bound: %v", i, err)
		}
	}
	if _, err := q.CountAttempt(1, time.Now()); err != nil {
		t.Fatal(err)
	}
	stillRefused("committed relief")
	// Rollback path: a relief transaction that fails.
	if _, err := q.CountAttempt(99, time.Now()); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("CountAttempt(99) = %v", err)
	}
	if _, err := q.DeadLetter(99, "jobs/__dlq", nil, time.Now()); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("DeadLetter(99) = %v", err)
	}
	stillRefused("failed relief")
	if p.Bytes() > maxBytes {
		t.Fatalf("Bytes() %d over max_bytes %d", p.Bytes(), maxBytes)
	}
}

// TestFlushOnlyAfterCommits: the WAL is fsynced when something committed
// since the last fsync, and not otherwise (idle means no disk writes).
func TestFlushOnlyAfterCommits(t *testing.T) {
	p := openAt(t, newDB(t), func(o *Options) { o.FlushInterval = MaxFlushInterval })
	l := mustLog(t, p, "events")
	if _, err := l.Append(record("a", 10)); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	n := p.Stats().Flushes
	if n == 0 {
		t.Fatal("no fsync after a commit")
	}
	for range 3 {
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// An idle trim commits nothing and so asks for no fsync either.
	if _, _, err := l.Trim(time.Time{}, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := p.Stats().Flushes; got != n {
		t.Fatalf("%d fsyncs with nothing committed in between", got-n)
	}
	if _, err := l.Append(record("b", 10)); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Flushes != n+1 {
		t.Fatalf("flushes %d, want %d", p.Stats().Flushes, n+1)
	}
}

// TestCloseLeavesTheMainFileComplete: Close checkpoints with TRUNCATE, so
// the database file alone carries everything.
func TestCloseLeavesTheMainFileComplete(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	l := mustLog(t, p, "events")
	for i := range 50 {
		if _, err := l.Append(record(fmt.Sprint("r", i), 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path + "-wal"); err == nil && st.Size() != 0 {
		t.Fatalf("WAL still holds %d bytes after Close", st.Size())
	}
	copyPath := filepath.Join(t.TempDir(), "copy.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p = openAt(t, copyPath, nil)
	l = mustLog(t, p, "events")
	recs, _, err := l.Read(1, 100)
	if err != nil || len(recs) != 50 || l.Next() != 51 {
		t.Fatalf("the main file alone holds %d records, next %d, %v", len(recs), l.Next(), err)
	}
}

func TestClosedProviderRefusesEverything(t *testing.T) {
	p := openAt(t, newDB(t), nil)
	l := mustLog(t, p, "events")
	q := mustQueue(t, p, "jobs")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	checks := map[string]error{}
	_, _, checks["Read"] = l.Read(1, 1)
	_, _, checks["Trim"] = l.Trim(time.Time{}, 1)
	_, _, checks["Position"] = l.Position("mqtt:a")
	checks["SavePosition"] = l.SavePosition(storage.Position{Reader: "mqtt:a"})
	_, checks["Positions"] = l.Positions()
	_, _, checks["LowestPosition"] = l.LowestPosition()
	_, _, checks["FirstAtOrAfter"] = l.FirstAtOrAfter(time.Now())
	_, checks["Items"] = q.Items(0, 1)
	_, checks["Get"] = q.Get(1)
	checks["Resolve"] = q.Resolve(1)
	_, checks["CountAttempt"] = q.CountAttempt(1, time.Now())
	_, checks["DeadLetter"] = q.DeadLetter(1, "x", nil, time.Now())
	checks["Flush"] = p.Flush()
	for what, err := range checks {
		if !errors.Is(err, storage.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", what, err)
		}
	}
}

func TestCommitModes(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		p := openAt(t, newDB(t), func(o *Options) { o.PublishCommitNone = true })
		appendConcurrently(t, mustLog(t, p, "events"), 8, 10)
		if s := p.Stats(); s.CommitsUnbatched != 80 || s.CommittedRecords != 80 {
			t.Fatalf("stats %+v: want 80 unbatched transactions", s)
		}
		checkCommitCounters(t, p, storage.CommitCounters{Unbatched: 80, Records: 80, MaxRecords: 0})
	})
	t.Run("interval", func(t *testing.T) {
		p := openAt(t, newDB(t), func(o *Options) {
			o.PublishCommitInterval = 2 * time.Millisecond
			o.PublishCommitMaxRecords = 4
		})
		appendConcurrently(t, mustLog(t, p, "events"), 8, 10)
		s := p.Stats()
		commits := s.CommitsByRecords + s.CommitsByInterval
		if s.CommittedRecords != 80 || commits < 20 || s.CommitsByCommit != 0 || s.CommitsUnbatched != 0 {
			t.Fatalf("stats %+v: want 80 records in at least 20 transactions of at most 4", s)
		}
		checkCommitCounters(t, p, storage.CommitCounters{ByRecords: s.CommitsByRecords, ByInterval: s.CommitsByInterval,
			Records: 80, MaxRecords: 4})
	})
	t.Run("collect", func(t *testing.T) {
		p := openAt(t, newDB(t), nil)
		appendConcurrently(t, mustLog(t, p, "events"), 8, 10)
		s := p.Stats()
		if s.CommittedRecords != 80 || s.CommitsByCommit+s.CommitsByRecords == 0 || s.CommitsByInterval != 0 {
			t.Fatalf("stats %+v", s)
		}
		checkCommitCounters(t, p, storage.CommitCounters{ByRecords: s.CommitsByRecords, ByCommit: s.CommitsByCommit,
			Records: 80, MaxRecords: DefaultBatchRecords})
	})
}

// checkCommitCounters: what the broker's metrics read (Counters) is the
// provider's own count, and publish_commit_max_records as the mode has it.
func checkCommitCounters(t *testing.T, p *Provider, want storage.CommitCounters) {
	t.Helper()
	c := p.Counters()
	if c.Type != "sqlite" || c.Commits == nil || *c.Commits != want || c.Errors != 0 {
		t.Fatalf("Counters = %+v (commits %+v), want sqlite, %+v, no errors", c, c.Commits, want)
	}
}

// TestCountersErrors: a call that fails for a reason no caller expects is
// counted once (saguin_storage_errors_total); a refusal the caller is
// written for (no room, not found) is not.
func TestCountersErrors(t *testing.T) {
	fail := errors.New("injected")
	var failing atomic.Bool
	p := openAt(t, newDB(t), func(o *Options) {
		o.Faults = &Faults{BeforePublishCommit: func(int) error {
			if failing.Load() {
				return fail
			}
			return nil
		}}
	})
	l := mustLog(t, p, "events")
	q := mustQueue(t, p, "jobs")
	if _, err := q.Get(99); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Get of a missing job = %v, want ErrNotFound", err)
	}
	l.SetMaxBytes(1)
	if _, err := l.Append(record("big", 10)); !errors.Is(err, storage.ErrFull) {
		t.Fatalf("Append past max_bytes = %v, want ErrFull", err)
	}
	l.SetMaxBytes(0)
	if n := p.Counters().Errors; n != 0 {
		t.Fatalf("Errors after two expected refusals = %d, want 0", n)
	}
	failing.Store(true)
	if _, err := l.Append(record("x", 10)); !errors.Is(err, fail) {
		t.Fatalf("Append with a failing commit = %v, want the injected error", err)
	}
	if n := p.Counters().Errors; n != 1 {
		t.Fatalf("Errors after one failed publish = %d, want 1", n)
	}
}

func appendConcurrently(t *testing.T, l storage.AppendLog, workers, each int) {
	t.Helper()
	done := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				if _, err := l.Append(record(fmt.Sprintf("w%d-%d", w, i), 10)); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range workers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if want := uint64(workers*each) + 1; l.Next() != want {
		t.Fatalf("next %d, want %d", l.Next(), want)
	}
}

// TestCloseWhilePublishing: publishes racing Close either commit (and are
// there after reopening) or fail with ErrClosed; none hangs, none is
// acknowledged and lost.
func TestCloseWhilePublishing(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	l := mustLog(t, p, "events")
	acked := make(chan uint64, 1<<16)
	done := make(chan struct{})
	for w := range 16 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; ; i++ {
				r, err := l.Append(record(fmt.Sprintf("w%d-%d", w, i), 10))
				if errors.Is(err, storage.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				acked <- r.Offset
			}
		}()
	}
	for len(acked) < 200 {
		time.Sleep(time.Millisecond)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for range 16 {
		<-done
	}
	close(acked)
	l = mustLog(t, openAt(t, path, nil), "events")
	n := 0
	for off := range acked {
		n++
		if off >= l.Next() {
			t.Fatalf("acknowledged offset %d is past next %d after reopen", off, l.Next())
		}
	}
	if l.Next() != uint64(n)+1 {
		t.Fatalf("%d acknowledged, next %d after reopen: something was stored unacknowledged or lost", n, l.Next())
	}
}

// TestDeadLetterIgnoresTheLogsOwnBound: the dead-letter log's max_bytes
// refuses nothing the move brings (docs/configuration.md "`channels`" open point,
// decided in rfcs/storage-sqlite.md); a refused move would leave exhausted
// work live in the queue.
func TestDeadLetterIgnoresTheLogsOwnBound(t *testing.T) {
	p := openAt(t, newDB(t), nil)
	q := mustQueue(t, p, "jobs")
	q.DeadLetters().SetMaxBytes(1)
	for i := range 3 {
		if _, err := q.Enqueue(record(fmt.Sprint("j", i), 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := q.DeadLetter(uint64(i+1), "jobs/__dlq", nil, time.Now()); err != nil {
			t.Fatalf("DeadLetter with the log over its bound: %v", err)
		}
	}
	if d := q.DeadLetters(); d.Next() != 4 || q.Depth() != 0 {
		t.Fatalf("dead-letter next %d, queue depth %d", d.Next(), q.Depth())
	}
}
