package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Statements are prepared once: on the write connection, and on the read
// pool (database/sql keeps one prepared copy per pooled connection). They
// are closed with the database (rfcs/storage-sqlite.md "Connections").
type stmtID int

const (
	// Writes.
	stBegin stmtID = iota
	stCommit
	stRollback
	stInsertRecord
	stInsertItem
	stUpdateNextBytes
	stUpdateNext
	stUpdateFloorBytes
	stTrimScan
	stTrimDelete
	stCountAttempt
	stResolve
	stItemForMove
	stSavePosition
	stDropPosition
	stValueSize
	stDeleteValue
	stDeleteValueAt
	stInsertValue
	stPageCount
	// Reads (prepared on the read pool too).
	stChannelBounds
	stReadRecords
	stFirstAtOrAfter
	stFirstHeld
	stItems
	stItem
	stPosition
	stPositions
	stValue
	stValuesAfter
	stValuesSince
	stLowestPosition
	numStmts
)

const firstReadStmt = stChannelBounds

var stmtSQL = [numStmts]string{
	stBegin:    `BEGIN`,
	stCommit:   `COMMIT`,
	stRollback: `ROLLBACK`,
	stInsertRecord: `INSERT INTO records (channel, ` + recordColumns + `, size)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	stInsertItem: `INSERT INTO queue_items (channel, ` + recordColumns + `, size, attempts, first_delivered, last_delivered)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, 0)`,
	stUpdateNextBytes:  `UPDATE channels SET next = ?, bytes = ? WHERE id = ?`,
	stUpdateNext:       `UPDATE channels SET next = ? WHERE id = ?`,
	stUpdateFloorBytes: `UPDATE channels SET floor = ?, bytes = ? WHERE id = ?`,
	stTrimScan:         `SELECT "offset", timestamp, size FROM records WHERE channel = ? AND "offset" >= ? ORDER BY "offset"`,
	stTrimDelete:       `DELETE FROM records WHERE channel = ? AND "offset" >= ? AND "offset" < ?`,
	stCountAttempt: `UPDATE queue_items SET attempts = attempts + 1,
		first_delivered = CASE WHEN first_delivered = 0 THEN ? ELSE first_delivered END,
		last_delivered = ?
		WHERE channel = ? AND "offset" = ? RETURNING ` + itemColumns,
	stResolve:     `DELETE FROM queue_items WHERE channel = ? AND "offset" = ? RETURNING size`,
	stItemForMove: `SELECT ` + itemColumns + `, size FROM queue_items WHERE channel = ? AND "offset" = ?`,
	stSavePosition: `INSERT INTO positions (channel, reader, "offset", last_seen, expiry) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (channel, reader) DO UPDATE SET "offset" = excluded."offset",
		last_seen = excluded.last_seen, expiry = excluded.expiry`,
	stDropPosition: `DELETE FROM positions WHERE channel = ? AND reader = ?`,
	stValueSize:    `SELECT size FROM latest_values WHERE channel = ? AND topic = ?`,
	stDeleteValue:  `DELETE FROM latest_values WHERE channel = ? AND topic = ? RETURNING size`,
	// RemoveIf: the value goes only while it is still the one at that offset.
	stDeleteValueAt: `DELETE FROM latest_values WHERE channel = ? AND topic = ? AND "offset" = ? RETURNING size`,
	stInsertValue: `INSERT INTO latest_values (channel, ` + recordColumns + `, size)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	stPageCount:      `PRAGMA page_count`,
	stChannelBounds:  `SELECT floor, next FROM channels WHERE id = ?`,
	stReadRecords:    `SELECT ` + readColumns + ` FROM records WHERE channel = ? AND "offset" >= ? ORDER BY "offset" LIMIT ?`,
	stFirstAtOrAfter: `SELECT min("offset") FROM records WHERE channel = ? AND timestamp >= ? AND timestamp != 0`,
	stFirstHeld:      `SELECT min("offset") FROM records WHERE channel = ?`,
	stItems:          `SELECT ` + itemColumns + ` FROM queue_items WHERE channel = ? AND "offset" > ? ORDER BY "offset" LIMIT ?`,
	stItem:           `SELECT ` + itemColumns + ` FROM queue_items WHERE channel = ? AND "offset" = ?`,
	stPosition:       `SELECT "offset", last_seen, expiry FROM positions WHERE channel = ? AND reader = ?`,
	stPositions:      `SELECT reader, "offset", last_seen, expiry FROM positions WHERE channel = ? ORDER BY reader`,
	stValue:          `SELECT ` + recordColumns + ` FROM latest_values WHERE channel = ? AND topic = ?`,
	stValuesAfter:    `SELECT ` + recordColumns + ` FROM latest_values WHERE channel = ? AND topic > ? ORDER BY topic LIMIT ?`,
	// Since: served by the UNIQUE (channel, offset) index.
	stValuesSince: `SELECT ` + recordColumns + ` FROM latest_values WHERE channel = ? AND "offset" >= ? ORDER BY "offset" LIMIT ?`,
	// One pass over the channel's positions (its primary key's prefix).
	stLowestPosition: `SELECT coalesce(min("offset"), 0), count(*) FROM positions WHERE channel = ?`,
}

type stmtSet [numStmts]*sql.Stmt

type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

func prepareStmts(ctx context.Context, on preparer, from stmtID) (stmtSet, error) {
	var set stmtSet
	for id := from; id < numStmts; id++ {
		s, err := on.PrepareContext(ctx, stmtSQL[id])
		if err != nil {
			set.close()
			return set, fmt.Errorf("prepare %q: %w", stmtSQL[id], err)
		}
		set[id] = s
	}
	return set, nil
}

func (set *stmtSet) close() error {
	var errs []error
	for i, s := range set {
		if s != nil {
			errs = append(errs, s.Close())
			set[i] = nil
		}
	}
	return errors.Join(errs...)
}

// querier runs read statements inside one read transaction, on the read
// pool or on the writer, so a read sees one snapshot (invariant 1: floor
// and records never straddle a trim).
type querier interface {
	query(ctx context.Context, id stmtID, args ...any) (*sql.Rows, error)
	queryRow(ctx context.Context, id stmtID, args ...any) *sql.Row
}

type writerQuerier struct{ w *writer }

func (q writerQuerier) query(ctx context.Context, id stmtID, args ...any) (*sql.Rows, error) {
	return q.w.st[id].QueryContext(ctx, args...)
}

func (q writerQuerier) queryRow(ctx context.Context, id stmtID, args ...any) *sql.Row {
	return q.w.st[id].QueryRowContext(ctx, args...)
}

type txQuerier struct {
	tx  *sql.Tx
	set *stmtSet
}

func (q txQuerier) query(ctx context.Context, id stmtID, args ...any) (*sql.Rows, error) {
	return q.tx.StmtContext(ctx, q.set[id]).QueryContext(ctx, args...)
}

func (q txQuerier) queryRow(ctx context.Context, id stmtID, args ...any) *sql.Row {
	return q.tx.StmtContext(ctx, q.set[id]).QueryRowContext(ctx, args...)
}
