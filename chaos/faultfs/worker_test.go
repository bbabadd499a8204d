//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"bufio"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Programs that map files of a faultfs mount must not run in the process that serves it: a page
// fault or munmap on the mapping holds the address-space lock while it waits for the server, and
// the server's goroutines need that lock to fault in or grow their own memory. SQLite in WAL mode
// maps its -shm file. So those programs run as workers: this test binary re-executed with
// workerEnv set, like a broker process the harness kills after the cut.
const workerEnv = "FAULTFS_TEST_WORKER"

func TestMain(m *testing.M) {
	if w := os.Getenv(workerEnv); w != "" {
		os.Exit(runWorker(w))
	}
	flag.Parse()
	stop := startWatchdog()
	code := m.Run()
	stop()
	os.Exit(code)
}

// liveMounts are the mounts of this test binary, for the watchdog.
var liveMounts sync.Map // *FS -> struct{}

// startWatchdog aborts every live mount shortly before the test binary's own timeout. A request
// stuck on a hung server cannot be interrupted, and the binary could then not even exit; with
// the connection aborted the stuck test fails and the timeout report comes out.
func startWatchdog() (stop func()) {
	fl := flag.Lookup("test.timeout")
	if fl == nil {
		return func() {}
	}
	timeout, ok := fl.Value.(flag.Getter).Get().(time.Duration)
	if !ok || timeout <= 0 {
		return func() {}
	}
	timer := time.AfterFunc(timeout-min(timeout/10, 15*time.Second), func() {
		liveMounts.Range(func(k, _ any) bool {
			f := k.(*FS)
			log.Printf("watchdog: aborting the FUSE connection of %s", f.Mountpoint())
			if err := f.Abort(); err != nil {
				log.Printf("watchdog: %v", err)
			}
			return true
		})
	})
	return func() { timer.Stop() }
}

// worker is a running child process that reports progress one line at a time.
type worker struct {
	t     *testing.T
	cmd   *exec.Cmd
	lines chan string
	stdin io.WriteCloser
}

// startWorker runs kind in a child process with the given environment additions.
func startWorker(t *testing.T, kind string, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{workerEnv + "=" + kind}, env...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker %s: %v", kind, err)
	}
	w := &worker{t: t, cmd: cmd, lines: make(chan string, 64), stdin: stdin}
	go func() { // owned by w: ends when the child's stdout closes (it exits or is killed)
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { w.kill() })
	return w
}

// next returns the next line, failing the test if the worker ends first or takes too long.
func (w *worker) next() string {
	w.t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			w.t.Fatal("worker exited early")
		}
		return l
	case <-time.After(30 * time.Second):
		w.t.Fatal("worker silent for 30s")
	}
	return ""
}

// kill SIGKILLs the worker, as a power cut stops the broker, waits for it, and returns the
// lines it printed that were not read yet.
func (w *worker) kill() []string {
	if w.cmd.ProcessState == nil {
		w.cmd.Process.Kill()
	}
	var rest []string
	for l := range w.lines {
		rest = append(rest, l)
	}
	if w.cmd.ProcessState == nil {
		w.cmd.Wait()
	}
	return rest
}

func runWorker(kind string) int {
	var err error
	switch kind {
	case "mmap":
		err = mmapWorker()
	case "sqlite":
		err = sqliteWorker()
	default:
		err = fmt.Errorf("unknown worker %q", kind)
	}
	if err != nil {
		fmt.Printf("err %v\n", err)
	}
	// Stay alive, like a running broker, until killed (or the parent goes away).
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// mmapWorker maps the first two pages of FAULTFS_PATH, writes page 0 and msyncs it, then
// dirties page 1 without syncing.
func mmapWorker() error {
	f, err := os.OpenFile(os.Getenv("FAULTFS_PATH"), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, 2*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	copy(m[:pageSize], pattern(13, pageSize))
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return fmt.Errorf("msync: %w", err)
	}
	copy(m[pageSize:], pattern(14, pageSize))
	fmt.Println("ready")
	return nil
}

// sqliteWorker opens FAULTFS_DB in WAL mode with synchronous=FAULTFS_SYNC and inserts rows
// FAULTFS_FROM..FAULTFS_TO, one transaction each, printing "ack ID" after each commit returns.
// After row FAULTFS_CHECKPOINT (if set) it checkpoints. It prints "done" at the end.
func sqliteWorker() error {
	from, _ := strconv.Atoi(os.Getenv("FAULTFS_FROM"))
	to, _ := strconv.Atoi(os.Getenv("FAULTFS_TO"))
	cp, _ := strconv.Atoi(os.Getenv("FAULTFS_CHECKPOINT"))
	db, err := sql.Open("sqlite", fmt.Sprintf(
		"file:%s?_pragma=journal_mode(WAL)&_pragma=synchronous(%s)&_pragma=wal_autocheckpoint(20)&_pragma=busy_timeout(5000)",
		os.Getenv("FAULTFS_DB"), os.Getenv("FAULTFS_SYNC")))
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB NOT NULL)"); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	for id := from; id <= to; id++ {
		if _, err := db.Exec("INSERT INTO t(id, v) VALUES(?, ?)", id, rowValue(id)); err != nil {
			return fmt.Errorf("insert %d: %w", id, err)
		}
		fmt.Printf("ack %d\n", id)
		if id == cp {
			if _, err := db.Exec("PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
		}
	}
	fmt.Println("done")
	return nil
}

// ackOf parses an "ack ID" line.
func ackOf(line string) (int, bool) {
	rest, ok := strings.CutPrefix(line, "ack ")
	if !ok {
		return 0, false
	}
	id, err := strconv.Atoi(rest)
	return id, err == nil
}
