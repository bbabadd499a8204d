package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

const wait = 20 * time.Second

// memoryConfig is a broker on a memory provider whose snapshot keeps what
// was acknowledged across a graceful shutdown (invariant 14). {{.Dir}} is
// the data directory; more is appended under broker:.
func memoryConfig(t *testing.T, dir, more string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		t.Fatal(err)
	}
	return brokertest.Config(t, dir, `broker:
  id: test
  log_level: info
`+more+`  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: "{{.Dir}}/snapshots"
channels:
  events:
    type: append
    filter: "events/#"
`)
}

func publishAcked(t *testing.T, c *brokertest.Client, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		resp, err := c.Publish(&paho.Publish{Topic: "events/x", QoS: 1, Payload: []byte(fmt.Sprintf("record %d", i))})
		if err != nil || resp.ReasonCode != 0 {
			t.Fatalf("publish %d: %v %+v", i, err, resp)
		}
	}
}

// replayAll reads the events channel from its first record (a new session
// with no position starts at the oldest record) and returns the payloads.
func replayAll(t *testing.T, addr string, n int) []string {
	t.Helper()
	c := brokertest.Connect(t, addr, "reader", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("events/#", 1)
	var got []string
	for len(got) < n {
		select {
		case p := <-c.Msgs:
			got = append(got, string(p.Payload))
		case <-time.After(5 * time.Second):
			return got
		}
	}
	return got
}

// invariant 14, docs/operations.md "Signals": SIGHUP is caught and changes nothing —
// there is no configuration reload. An unhandled HUP (the Go default) ends
// the process without its shutdown, so a memory provider writes no snapshot
// and every record acknowledged since the start is gone at the next one:
// the broker would have acknowledged what it did not keep.
func TestInvariant14_SIGHUPKeepsTheBrokerAndEveryAcknowledgedRecord(t *testing.T) {
	dir := t.TempDir()
	cfg := memoryConfig(t, dir, "")
	proc := brokertest.StartProcess(t, cfg)
	pub := brokertest.Connect(t, proc.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	const n = 20
	publishAcked(t, pub, n)
	pub.Close()

	proc.Signal(syscall.SIGHUP)
	logged := proc.WaitOutput("no configuration reload", 10*time.Second)
	alive := !proc.Exited()
	code := proc.Stop(syscall.SIGTERM)

	proc.Restart()
	got := replayAll(t, proc.Address(), n)
	if !logged || !alive || code != 0 || len(got) != n {
		t.Fatalf("after SIGHUP: logged=%v alive=%v, exit after SIGTERM %d, %d of %d acknowledged records replayed after the restart:\n%s",
			logged, alive, code, len(got), n, proc.Output())
	}
	for i, p := range got {
		if want := fmt.Sprintf("record %d", i+1); p != want {
			t.Fatalf("replayed record %d is %q, want %q", i+1, p, want)
		}
	}
	for _, want := range []string{"level=WARN", "SIGHUP", "SIGUSR1"} {
		if !strings.Contains(lineWith(proc.Output(), "no configuration reload"), want) {
			t.Errorf("the SIGHUP line does not say %q: %q", want, lineWith(proc.Output(), "no configuration reload"))
		}
	}
}

// docs/operations.md "Signals": SIGUSR1 re-reads broker.log_level from the
// configuration file and says what it was and is now; a file that no longer
// loads changes nothing and stops nothing.
func TestSIGUSR1RereadsTheLogLevelAndSurvivesABadFile(t *testing.T) {
	dir := t.TempDir()
	cfg := memoryConfig(t, dir, "")
	proc := brokertest.StartProcess(t, cfg)

	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(text), "log_level: info", "log_level: debug", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	proc.Signal(syscall.SIGUSR1)
	if !proc.WaitOutput("now=debug", 10*time.Second) {
		t.Fatalf("no log-level announcement after SIGUSR1 (exited=%v):\n%s", proc.Exited(), proc.Output())
	}
	if l := lineWith(proc.Output(), "now=debug"); !strings.Contains(l, "was=info") {
		t.Errorf("the announcement does not say what the level was: %q", l)
	}

	if err := os.WriteFile(cfg, []byte(strings.Replace(string(text), "log_level: info", "log_level: verbose", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	proc.Signal(syscall.SIGUSR1)
	if !proc.WaitOutput("key=broker.log_level value=verbose", 10*time.Second) {
		t.Fatalf("the bad file's finding is not logged after SIGUSR1 (exited=%v):\n%s", proc.Exited(), proc.Output())
	}
	c := brokertest.Connect(t, proc.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	publishAcked(t, c, 1)
	c.Close()
	if code := proc.Stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, proc.Output())
	}
	t.Logf("SIGUSR1 lines:\n%s\n%s\n%s", lineWith(proc.Output(), "now=debug"), lineWith(proc.Output(), "has findings"), lineWith(proc.Output(), "value=verbose"))
}

// docs/operations.md "The pid file": broker.pid_file is written once the listeners are
// bound (so whoever reads it can connect), holds the broker's pid, mode
// 0644, is logged, and is removed by the clean shutdown.
func TestPIDFileIsWrittenAfterBindingAndRemovedOnShutdown(t *testing.T) {
	dir := t.TempDir()
	pidPath := filepath.Join(dir, "run", "saguin.pid")
	if err := os.Mkdir(filepath.Dir(pidPath), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := memoryConfig(t, dir, "  pid_file: \""+pidPath+"\"\n")
	proc := brokertest.StartProcess(t, cfg)
	if !proc.WaitOutput("pid file written", 10*time.Second) {
		t.Fatalf("no `pid file written` line:\n%s", proc.Output())
	}
	data, err := os.ReadFile(pidPath)
	if err != nil {
		t.Fatalf("pid file: %v", err)
	}
	if got := strings.TrimSpace(string(data)); got != strconv.Itoa(proc.Pid()) || !strings.HasSuffix(string(data), "\n") {
		t.Errorf("pid file holds %q, want %d and a newline", data, proc.Pid())
	}
	fi, err := os.Stat(pidPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("pid file mode %v, want 0644", fi.Mode().Perm())
	}
	// Written atomically: nothing but the pid file is left in its directory.
	if entries, _ := os.ReadDir(filepath.Dir(pidPath)); len(entries) != 1 {
		t.Errorf("the pid file's directory holds %d entries, want 1 (no temporary file left)", len(entries))
	}
	// Whoever reads the pid file can connect at once: the listener was bound first.
	c := brokertest.Connect(t, proc.Address(), "probe", brokertest.ClientOptions{CleanStart: true})
	c.Close()
	if code := proc.Stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, proc.Output())
	}
	if _, err := os.Stat(pidPath); !os.IsNotExist(err) {
		t.Errorf("the pid file is still there after a clean shutdown: %v", err)
	}
}

// docs/operations.md "The pid file": a pid file that cannot be written stops the start
// with exit 1 and an error naming it — a supervisor that waits for it
// would otherwise wait forever for a broker that runs.
func TestUnwritablePIDFileExitsOneNamingIt(t *testing.T) {
	dir := t.TempDir()
	pidPath := filepath.Join(dir, "no-such-dir", "saguin.pid")
	cfg := memoryConfig(t, dir, "  pid_file: \""+pidPath+"\"\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := brokertest.CommandContext(ctx, t, "--config", cfg).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the broker ran on without its pid file:\n%s", out)
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1:\n%s", err, out)
	}
	if !strings.Contains(string(out), pidPath) {
		t.Errorf("the error does not name the pid file %s:\n%s", pidPath, out)
	}
}

func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
