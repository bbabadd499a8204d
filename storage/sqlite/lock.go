package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// providerLock keeps a second Sagüin off a provider (docs/operations.md "Storage files"). It is a
// tiny SQLite database beside the guarded one, claimed by an unconditional
// write in exclusive locking mode: after that write commits, the connection
// keeps SQLite's EXCLUSIVE file lock until it closes, so another broker
// cannot even read it. A conditional write (CREATE TABLE IF NOT EXISTS
// alone) would take only a shared lock and let both brokers start.
//
// The lock is the live connection, not the file: a lock file left by a
// killed broker is harmless, because the kernel dropped its locks with the
// process. It stops a second broker, not other writers (sqlite3 by hand).
//
// Nothing in this package ever opens and closes the lock file or the
// database with os.Open while SQLite holds them: closing any descriptor of
// a file drops every POSIX lock this process holds on it.
type providerLock struct {
	path string
	db   *sql.DB
	conn *sql.Conn
}

// ErrLocked is wrapped by Open when another running broker holds the
// provider's lock.
var ErrLocked = errors.New("held by another running broker")

func acquireLock(ctx context.Context, provider, path, writer string, now time.Time) (*providerLock, error) {
	dsn := "file:" + uriPath(path) + "?_pragma=busy_timeout(0)&_pragma=locking_mode(EXCLUSIVE)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("storage %s: lock %s: %w", provider, path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, lockError(provider, path, err)
	}
	l := &providerLock{path: path, db: db, conn: conn}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS lock (
		id       INTEGER PRIMARY KEY CHECK (id = 1),
		pid      INTEGER NOT NULL,
		writer   TEXT    NOT NULL,
		taken_at INTEGER NOT NULL
	) STRICT`); err != nil {
		l.release()
		return nil, lockError(provider, path, err)
	}
	// The unconditional write: this is what takes and keeps the lock.
	if _, err := conn.ExecContext(ctx, `INSERT OR REPLACE INTO lock (id, pid, writer, taken_at) VALUES (1, ?, ?, ?)`,
		os.Getpid(), writer, now.UnixNano()); err != nil {
		l.release()
		return nil, lockError(provider, path, err)
	}
	// SQLite created the file with its default permissions; chmod needs no
	// descriptor, so it cannot disturb the lock just taken.
	if err := os.Chmod(path, 0o600); err != nil {
		l.release()
		return nil, fmt.Errorf("storage %s: lock %s: %w", provider, path, err)
	}
	return l, nil
}

func lockError(provider, path string, err error) error {
	var se *msqlite.Error
	if errors.As(err, &se) && (se.Code()&0xff == sqlite3.SQLITE_BUSY || se.Code()&0xff == sqlite3.SQLITE_LOCKED) {
		return fmt.Errorf("storage %s: lock %s is %w (one broker per provider)", provider, path, ErrLocked)
	}
	return fmt.Errorf("storage %s: lock %s: %w", provider, path, err)
}

func (l *providerLock) release() error {
	return errors.Join(l.conn.Close(), l.db.Close())
}
