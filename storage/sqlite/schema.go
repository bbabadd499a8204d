package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SchemaVersion is the PRAGMA user_version this build writes and reads. Any
// other version is refused by name: there is no in-place upgrade (rfcs/storage-sqlite.md "Open / close").
const SchemaVersion = 20

// schemaTables are the tables this build creates. rfcs/storage-sqlite.md and rfcs/storage-memory.md names eleven; the
// session tables (sessions, session_inflight, share_groups, share_returned)
// join this list, at this same version, when their stores are built —
// before any release writes a database (latest_values and held_publishes
// joined that way; storage-sqlite.md). All tables are STRICT, and none has an INSERT OR REPLACE path:
// the (channel, offset) primary keys make an offset reuse a failed insert
// (invariant 9).
var schemaTables = []struct{ name, ddl string }{
	{"meta", `CREATE TABLE meta (
		id         INTEGER PRIMARY KEY CHECK (id = 1),
		writer     TEXT    NOT NULL,
		created_at INTEGER NOT NULL
	) STRICT`},
	// next, floor and bytes are stored and never derived from surviving rows
	// (invariants 1 and 9): MAX(offset)+1 restarts at 1 on an emptied
	// channel, MIN(offset) says nothing was ever removed.
	{"channels", `CREATE TABLE channels (
		id    INTEGER PRIMARY KEY,
		name  TEXT    NOT NULL UNIQUE,
		kind  TEXT    NOT NULL CHECK (kind IN ('append', 'latest', 'queue')),
		next  INTEGER NOT NULL CHECK (next >= 1),
		floor INTEGER NOT NULL CHECK (floor >= 1 AND floor <= next),
		bytes INTEGER NOT NULL CHECK (bytes >= 0)
	) STRICT`},
	{"records", `CREATE TABLE records (
		channel    INTEGER NOT NULL,
		"offset"   INTEGER NOT NULL CHECK ("offset" >= 1),
		message_id TEXT    NOT NULL,
		topic      TEXT    NOT NULL,
		timestamp  INTEGER NOT NULL,
		headers    TEXT,
		payload    BLOB    NOT NULL,
		props      TEXT,
		retain     INTEGER NOT NULL,
		qos        INTEGER NOT NULL,
		publisher  TEXT    NOT NULL,
		bridge     TEXT    NOT NULL,
		size       INTEGER NOT NULL CHECK (size >= 0),
		PRIMARY KEY (channel, "offset")
	) STRICT`},
	// A queue row is an unresolved record only. Holder, Delivery ID,
	// deadline and epoch are deliberately absent (invariant 15).
	{"queue_items", `CREATE TABLE queue_items (
		channel         INTEGER NOT NULL,
		"offset"        INTEGER NOT NULL CHECK ("offset" >= 1),
		message_id      TEXT    NOT NULL,
		topic           TEXT    NOT NULL,
		timestamp       INTEGER NOT NULL,
		headers         TEXT,
		payload         BLOB    NOT NULL,
		props           TEXT,
		retain          INTEGER NOT NULL,
		qos             INTEGER NOT NULL,
		publisher       TEXT    NOT NULL,
		bridge          TEXT    NOT NULL,
		size            INTEGER NOT NULL CHECK (size >= 0),
		attempts        INTEGER NOT NULL CHECK (attempts >= 0),
		first_delivered INTEGER NOT NULL,
		last_delivered  INTEGER NOT NULL,
		PRIMARY KEY (channel, "offset")
	) STRICT`},
	// One row per topic: a value store's (retained store's, latest
	// channel's) current value. A Put deletes the topic's row and inserts
	// the new one in one transaction — never INSERT OR REPLACE — and the
	// UNIQUE (channel, offset) makes a reused offset a failed insert
	// (invariant 9). The store's next is its channels row's.
	{"latest_values", `CREATE TABLE latest_values (
		channel    INTEGER NOT NULL,
		topic      TEXT    NOT NULL CHECK (topic != ''),
		"offset"   INTEGER NOT NULL CHECK ("offset" >= 1),
		message_id TEXT    NOT NULL,
		timestamp  INTEGER NOT NULL,
		headers    TEXT,
		payload    BLOB    NOT NULL,
		props      TEXT,
		retain     INTEGER NOT NULL,
		qos        INTEGER NOT NULL,
		publisher  TEXT    NOT NULL,
		bridge     TEXT    NOT NULL,
		size       INTEGER NOT NULL CHECK (size >= 0),
		PRIMARY KEY (channel, topic),
		UNIQUE (channel, "offset")
	) STRICT`},
	// Unreleased QoS 2 publishes (rfcs/qos2-holds.md): no offset until the
	// release, which inserts the record at the channel's next offset and
	// deletes this row in one transaction. Keyed by the exchange.
	{"held_publishes", `CREATE TABLE held_publishes (
		channel    INTEGER NOT NULL,
		client     TEXT    NOT NULL CHECK (client != ''),
		packet_id  INTEGER NOT NULL CHECK (packet_id BETWEEN 1 AND 65535),
		held_at    INTEGER NOT NULL,
		message_id TEXT    NOT NULL,
		topic      TEXT    NOT NULL,
		timestamp  INTEGER NOT NULL,
		headers    TEXT,
		payload    BLOB    NOT NULL,
		props      TEXT,
		retain     INTEGER NOT NULL,
		qos        INTEGER NOT NULL,
		publisher  TEXT    NOT NULL,
		bridge     TEXT    NOT NULL,
		size       INTEGER NOT NULL CHECK (size >= 0),
		PRIMARY KEY (channel, client, packet_id)
	) STRICT`},
	{"positions", `CREATE TABLE positions (
		channel   INTEGER NOT NULL,
		reader    TEXT    NOT NULL,
		"offset"  INTEGER NOT NULL,
		last_seen INTEGER NOT NULL,
		expiry    INTEGER NOT NULL CHECK (expiry >= 0),
		PRIMARY KEY (channel, reader)
	) STRICT, WITHOUT ROWID`},
}

// VersionError is the refusal of a database this build does not read.
type VersionError struct {
	Path      string
	Version   int64
	Writer    string // build that created it, if its meta table says
	CreatedAt time.Time
	// NoVersion: the file has tables but no user_version, so it is not a
	// database this broker made.
	NoVersion bool
}

func (e *VersionError) Error() string {
	if e.NoVersion {
		return fmt.Sprintf("storage %s: holds tables but no schema version; this broker reads version %d and does not adopt foreign databases", e.Path, SchemaVersion)
	}
	by := ""
	if e.Writer != "" {
		by = fmt.Sprintf(" (created by saguin %s at %s)", e.Writer, e.CreatedAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("storage %s: schema version %d%s; this broker reads version %d", e.Path, e.Version, by, SchemaVersion)
}

// prepareSchema creates the schema on a new database, in one transaction
// with its user_version, or checks an existing one.
func prepareSchema(ctx context.Context, c *sql.Conn, path, writer string, now time.Time) error {
	var version int64
	if err := c.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return fmt.Errorf("storage %s: read schema version: %w", path, err)
	}
	var tables int
	if err := c.QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`).Scan(&tables); err != nil {
		return fmt.Errorf("storage %s: list tables: %w", path, err)
	}
	switch {
	case version == SchemaVersion:
		for _, t := range schemaTables {
			var n int
			if err := c.QueryRowContext(ctx,
				`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, t.name).Scan(&n); err != nil {
				return fmt.Errorf("storage %s: check table %s: %w", path, t.name, err)
			}
			if n != 1 {
				return fmt.Errorf("storage %s: schema version %d but table %s is missing", path, version, t.name)
			}
		}
		return nil
	case version == 0 && tables == 0:
		return createSchema(ctx, c, path, writer, now)
	case version == 0:
		return &VersionError{Path: path, NoVersion: true}
	default:
		e := &VersionError{Path: path, Version: version}
		// Best effort: a foreign version's meta table may have another shape.
		var ns int64
		if err := c.QueryRowContext(ctx, `SELECT writer, created_at FROM meta LIMIT 1`).Scan(&e.Writer, &ns); err == nil {
			e.CreatedAt = time.Unix(0, ns)
		} else {
			e.Writer = ""
		}
		return e
	}
}

func createSchema(ctx context.Context, c *sql.Conn, path, writer string, now time.Time) (err error) {
	if _, err := c.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("storage %s: begin schema: %w", path, err)
	}
	defer func() {
		if err != nil {
			if _, rbErr := c.ExecContext(ctx, `ROLLBACK`); rbErr != nil {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
			}
		}
	}()
	for _, t := range schemaTables {
		if _, err := c.ExecContext(ctx, t.ddl); err != nil {
			return fmt.Errorf("storage %s: create table %s: %w", path, t.name, err)
		}
	}
	if _, err := c.ExecContext(ctx, `INSERT INTO meta (id, writer, created_at) VALUES (1, ?, ?)`, writer, now.UnixNano()); err != nil {
		return fmt.Errorf("storage %s: write meta: %w", path, err)
	}
	// user_version lives in the file header and is transactional: the
	// version appears with the tables or not at all.
	if _, err := c.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion)); err != nil {
		return fmt.Errorf("storage %s: set schema version: %w", path, err)
	}
	if _, err := c.ExecContext(ctx, `COMMIT`); err != nil {
		return fmt.Errorf("storage %s: commit schema: %w", path, err)
	}
	return nil
}
