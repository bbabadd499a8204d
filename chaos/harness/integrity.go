package harness

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // integrity_check on a copy of what a power cut left
)

// maxIntegrityLines bounds what integrity_check may report (invariant 13).
const maxIntegrityLines = 20

// checkIntegrity runs SQLite's integrity_check on what a power cut left of
// the broker's database (the issue: "the database passes integrity_check";
// by invariant 14 a power cut loses a tail, never the file). It works on a
// copy of the database and its WAL taken from the backing directory — the
// disk itself, not the FUSE mount, which this process serves and must never
// map (chaos/faultfs README) — so the broker's files stay exactly as the cut
// left them; n is the cut's number, for the finding. A database the cut
// removed altogether is not judged here: the loss checks see what went with
// it.
func (c *campaign) checkIntegrity(n int) (Finding, bool) {
	fail := func(format string, args ...any) (Finding, bool) {
		return Finding{Check: "integrity", Invariant: 14,
			Msg: fmt.Sprintf("after power cut %d: ", n) + fmt.Sprintf(format, args...)}, true
	}
	dir := filepath.Join(c.opt.OutDir, "integrity")
	if err := os.RemoveAll(dir); err != nil {
		return fail("clear %s: %v", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail("make %s: %v", dir, err)
	}
	defer os.RemoveAll(dir)
	db := filepath.Join(c.backingDir, dbFile)
	copied := filepath.Join(dir, dbFile)
	if err := copyFile(db, copied); errors.Is(err, fs.ErrNotExist) {
		return Finding{}, false
	} else if err != nil {
		return fail("copy the database: %v", err)
	}
	if err := copyFile(db+"-wal", copied+"-wal"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail("copy the WAL: %v", err)
	}
	res, err := integrityCheck(copied)
	if err != nil {
		return fail("SQLite cannot check the database: %v", err)
	}
	if res != "ok" {
		return fail("integrity_check: %s", res)
	}
	return Finding{}, false
}

// integrityCheck opens path (running WAL recovery, as the broker's next
// start would) and returns what PRAGMA integrity_check says, "ok" when
// nothing is wrong.
func integrityCheck(path string) (string, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return "", err
	}
	defer db.Close()
	rows, err := db.Query(fmt.Sprintf("PRAGMA integrity_check(%d)", maxIntegrityLines))
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			return "", err
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	return strings.Join(lines, "; "), nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
