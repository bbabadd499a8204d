//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"bytes"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

const (
	sqlRows     = 60    // committed before the cut is triggered
	sqlRowLimit = 20000 // bound on the writer if the cut were late
)

// openCheckDB opens a database on the mount from this process, which serves the mount: with
// locking_mode=EXCLUSIVE set first, SQLite keeps the WAL index in its heap and never maps -shm
// (see workerEnv for why that matters). It still runs WAL recovery.
func openCheckDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=locking_mode(EXCLUSIVE)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	db.SetMaxOpenConns(1)
	return db
}

// rowValue is what row id holds: a checksum-like value, so a page of another row or of garbage
// does not pass for it.
func rowValue(id int) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(id))
	sum := sha256.Sum256(b[:])
	return bytes.Repeat(sum[:], 10) // 320 bytes: several rows per page, checkpoints happen
}

// checkRows verifies the database after a cut: integrity, and exactly the rows 1..n with n in
// [lo, hi]. It returns n, or an error describing what is wrong.
func checkRows(db *sql.DB, lo, hi int) (int, error) {
	var integrity string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&integrity); err != nil {
		return 0, fmt.Errorf("integrity_check: %w", err)
	}
	if integrity != "ok" {
		return 0, fmt.Errorf("integrity_check: %s", integrity)
	}
	rows, err := db.Query("SELECT id, v FROM t ORDER BY id")
	if err != nil {
		return 0, fmt.Errorf("select: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id int
		var v []byte
		if err := rows.Scan(&id, &v); err != nil {
			return n, fmt.Errorf("scan: %w", err)
		}
		n++
		if id != n {
			return n, fmt.Errorf("row %d missing (next id is %d)", n, id)
		}
		if !bytes.Equal(v, rowValue(id)) {
			return n, fmt.Errorf("row %d holds the wrong value", id)
		}
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("rows: %w", err)
	}
	if n < lo || n > hi {
		return n, fmt.Errorf("%d rows, want between %d and %d", n, lo, hi)
	}
	return n, nil
}

// A WAL database with synchronous=FULL keeps every transaction whose commit returned, through
// a cut in the middle of a stream of commits by another process, whether unsynced pages are
// rolled back or torn.
func TestSQLiteWALFullSurvivesPowerCut(t *testing.T) {
	cases := []struct {
		name string
		torn bool
		seed uint64
	}{
		{"clean", false, 0}, {"torn-1", true, 1}, {"torn-2", true, 2}, {"torn-3", true, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			dbPath := r.path("broker.db")
			w := startWorker(t, "sqlite", "FAULTFS_DB="+dbPath, "FAULTFS_SYNC=FULL",
				"FAULTFS_FROM=1", fmt.Sprintf("FAULTFS_TO=%d", sqlRowLimit))
			acked := 0
			for acked < sqlRows {
				l := w.next()
				id, ok := ackOf(l)
				if !ok {
					t.Fatalf("worker: %s", l)
				}
				acked = id
			}
			var rng *rand.Rand
			if tc.torn {
				rng = rand.New(rand.NewPCG(tc.seed, 99))
			}
			t0 := time.Now()
			if err := r.fs.PowerCut(tc.torn, rng); err != nil {
				t.Fatal(err)
			}
			cutTime := since(t0)
			// Commits acknowledged before the cut may still be in the pipe.
			for _, l := range w.kill() {
				if id, ok := ackOf(l); ok {
					acked = id
				}
			}
			t1 := time.Now()
			r.remount()
			remountTime := since(t1)

			db := openCheckDB(t, dbPath)
			defer db.Close()
			n, err := checkRows(db, acked, acked+1)
			if err != nil {
				t.Fatalf("after a cut with %d commits acknowledged: %v (%+v)", acked, err, r.lastCut)
			}
			t.Logf("acknowledged %d, found %d; cut %v (%+v), unmount+mount %v", acked, n, cutTime, r.lastCut, remountTime)
		})
	}
}

// Negative control: with synchronous=OFF SQLite never fsyncs, so a torn cut must cost committed
// rows or corrupt the database, and the checks above must notice. If they never do, the layer is
// not cutting anything.
func TestSQLiteSyncOffTornCutIsDetected(t *testing.T) {
	const seeds = 8
	for seed := uint64(1); seed <= seeds; seed++ {
		r := newRig(t)
		dbPath := r.path("broker.db")
		env := []string{"FAULTFS_DB=" + dbPath}

		// The schema and a first row, durably; then commits that are never synced, with a
		// checkpoint into the main file half way.
		run := func(sync string, from, to, checkpoint int) {
			w := startWorker(t, "sqlite", append(env, "FAULTFS_SYNC="+sync, fmt.Sprintf("FAULTFS_FROM=%d", from),
				fmt.Sprintf("FAULTFS_TO=%d", to), fmt.Sprintf("FAULTFS_CHECKPOINT=%d", checkpoint))...)
			for {
				l := w.next()
				if l == "done" {
					break
				}
				if _, ok := ackOf(l); !ok {
					t.Fatalf("worker: %s", l)
				}
			}
			if sync == "OFF" {
				if err := r.fs.PowerCut(true, rand.New(rand.NewPCG(seed, 42))); err != nil {
					t.Fatal(err)
				}
			}
			w.kill()
		}
		run("FULL", 1, 1, 0)
		committed := 1 + 2*sqlRows
		run("OFF", 2, committed, 1+sqlRows)
		r.remount()

		db := openCheckDB(t, dbPath)
		n, err := checkRows(db, committed, committed)
		db.Close()
		if err != nil {
			t.Logf("seed %d: detected: %v (%+v)", seed, err, r.lastCut)
			return
		}
		t.Logf("seed %d: all %d rows survived a torn cut without fsync", seed, n)
	}
	t.Fatalf("no seed out of %d made the synchronous=OFF database lose a committed row or fail its integrity check", seeds)
}
