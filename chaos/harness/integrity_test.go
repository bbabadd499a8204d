package harness

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"
)

// fakeCut is a campaign whose backing disk holds what a cut left: the
// integrity check reads nothing else.
func fakeCut(t *testing.T) *campaign {
	t.Helper()
	return &campaign{opt: Options{OutDir: t.TempDir()}, backingDir: t.TempDir()}
}

// writeDB makes a WAL database with an indexed table at path and leaves
// part of it in the WAL, as a broker killed mid-run would.
func writeDB(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_journal_mode=WAL&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{`CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)`, `CREATE INDEX rv ON r (v)`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3000 {
		if _, err := db.Exec(`INSERT INTO r (v) VALUES (?)`, fmt.Sprintf("value-%06d-%s", i, strings.Repeat("x", 40))); err != nil {
			t.Fatal(err)
		}
		if i == 2000 {
			if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Keep the WAL beside the file: copy it out before the close
	// checkpoints it away.
	wal, err := os.ReadFile(path + "-wal")
	if err != nil || len(wal) == 0 {
		t.Fatalf("no WAL to keep: %d bytes, %v", len(wal), err)
	}
	db.Close()
	if err := os.WriteFile(path+"-wal", wal, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestIntegrityCheckPassesAWholeDatabaseAndItsWAL(t *testing.T) {
	c := fakeCut(t)
	writeDB(t, filepath.Join(c.backingDir, dbFile))
	if f, bad := c.checkIntegrity(1); bad {
		t.Fatalf("a whole database was flagged: %s", f)
	}
	// The broker's files are not touched: the WAL is still there to recover.
	if st, err := os.Stat(filepath.Join(c.backingDir, dbFile+"-wal")); err != nil || st.Size() == 0 {
		t.Fatalf("the check changed the broker's WAL: %v", err)
	}
}

// The check can fail: pages of the file overwritten (a torn write the WAL
// cannot repair) are reported as an invariant 14 finding.
func TestIntegrityCheckCatchesATornFile(t *testing.T) {
	c := fakeCut(t)
	path := filepath.Join(c.backingDir, dbFile)
	writeDB(t, path)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	// Garbage over the second half of every page from the third on: b-tree
	// pages of the table and its index, well past the header.
	junk := []byte(strings.Repeat("\xa5", 2048))
	for off := int64(2 * 4096); off+4096 <= st.Size(); off += 4096 {
		if _, err := f.WriteAt(junk, off+2048); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	finding, bad := c.checkIntegrity(1)
	if !bad {
		t.Fatal("a torn database passed the integrity check")
	}
	if finding.Check != "integrity" || finding.Invariant != 14 {
		t.Fatalf("finding %s, want integrity / invariant 14", finding)
	}
	t.Log(finding)
}

// A cut that took the file altogether is left to the loss checks.
func TestIntegrityCheckLeavesAMissingFileToTheLossChecks(t *testing.T) {
	if f, bad := fakeCut(t).checkIntegrity(1); bad {
		t.Fatalf("no database was flagged: %s", f)
	}
}
