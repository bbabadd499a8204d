package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"saguin.dev/broker/internal/loadgen"
)

// The broker announces its MQTT listener on stdout; with the configured
// address 127.0.0.1:0 that line is the only way to learn the port, and its
// arrival is what start-up time is measured to.
var listeningLine = regexp.MustCompile(`msg="?listening"?\s.*\baddress="?([^\s"]+)`)

const (
	// startLimit bounds one start-up, however large the database.
	startLimit = 2 * time.Minute
	// stopGrace is how long a SIGTERM'd broker may take to shut down
	// before SIGKILL; a graceful stop writes positions and snapshots.
	stopGrace = 30 * time.Second
)

// findModule walks up from the working directory to the saguin.dev/broker
// module, which `make bench` runs this command from.
func findModule() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module saguin.dev/broker\n")) {
			return dir, nil
		}
		if sub := filepath.Join(dir, "broker"); dir != sub {
			if data, err := os.ReadFile(filepath.Join(sub, "go.mod")); err == nil && bytes.Contains(data, []byte("module saguin.dev/broker\n")) {
				return sub, nil
			}
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no saguin.dev/broker module above the working directory; pass -saguin-src or -saguin-bin")
		}
		dir = up
	}
}

// buildSaguin builds cmd/saguin into dir and returns the binary's path.
func buildSaguin(ctx context.Context, src, dir string) (string, error) {
	if src == "" {
		var err error
		if src, err = findModule(); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(dir, "saguin")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	args := []string{"build", "-o", bin}
	if rev := gitRevision(ctx, src); rev != "" {
		// As the Makefile does, so the table names the code it measured.
		args = append(args, "-ldflags", "-X main.revision="+rev)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/saguin")...)
	cmd.Dir = src
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/saguin in %s: %w\n%s", src, err, bytes.TrimSpace(out))
	}
	return bin, nil
}

// gitRevision names the commit src is at, with "+dirty" when the work tree
// differs from it; "" outside git. (Read-only git commands.)
func gitRevision(ctx context.Context, src string) string {
	out, err := exec.CommandContext(ctx, "git", "-C", src, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	st, err := exec.CommandContext(ctx, "git", "-C", src, "status", "--porcelain", "--untracked-files=normal", ".").Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "+dirty"
	}
	return rev
}

// saguinVersion asks the binary for the build it is: the "build
// <version>+<revision>" line of --version.
func saguinVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "unknown revision"
	}
	for _, line := range strings.Split(string(out), "\n") {
		if b, ok := strings.CutPrefix(line, "build "); ok {
			return strings.TrimSpace(b)
		}
	}
	return strings.TrimSpace(string(out))
}

// saguinConfig is a minimal configuration: one provider of the given type,
// an append channel for the throughput runs (events/#) and one for the
// replay (replay/#), so the replay reads exactly the records published for
// it, and two latest channels: state (state/#), whose state and point
// reads are measured, and fanout (fanout/#), kept apart so a fan-out
// subscriber is sent no state. Retention is off: nothing may leave a
// channel while it is accounted for. log_level info, because the listening
// line is logged at info.
func saguinConfig(storage, dataDir string) (string, error) {
	return saguinConfigWith(storage, dataDir, "")
}

// saguinConfigWith is saguinConfig with broker.limits entries (YAML lines
// indented under limits:, joined by a newline and four spaces), or none.
func saguinConfigWith(storage, dataDir, limits string) (string, error) {
	var provider string
	switch storage {
	case "memory":
		provider = "type: memory\n        snapshot_dir: none"
	case "sqlite":
		provider = fmt.Sprintf("type: sqlite\n        file_path: %q", filepath.Join(dataDir, "saguin.db"))
	default:
		return "", fmt.Errorf("unknown storage %q", storage)
	}
	if limits != "" {
		limits = "\n  limits:\n    " + limits
	}
	return fmt.Sprintf(`# written by saguin-bench
broker:
  id: bench
  log_level: info%s
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        %s
channels:
  events:
    type: append
    filter: "events/#"
  replay:
    type: append
    filter: "replay/#"
  state:
    type: latest
    filter: "state/#"
  fanout:
    type: latest
    filter: "fanout/#"
  jobs:
    type: queue
    filter: "jobs/#"
`, limits, provider), nil
}

// writeConfig writes the configuration for storage into dir and returns its
// path.
func writeConfig(storage, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	body, err := saguinConfig(storage, dir)
	if err != nil {
		return "", err
	}
	return writeConfigBody(dir, body)
}

// writeConfigBody writes a configuration into dir and returns its path.
func writeConfigBody(dir, body string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "saguin.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// saguinProc is the broker running as a child process.
type saguinProc struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
	out    *loadgen.TailBuffer
	// ready is the time from starting the process to reading its
	// listening line: the start-up time.
	ready time.Duration
}

// startSaguin runs bin on cfg and waits for the listening line.
func startSaguin(ctx context.Context, bin, cfg string) (*saguinProc, error) {
	p := &saguinProc{exited: make(chan struct{}), out: loadgen.NewTailBuffer(64 << 10)}
	p.cmd = exec.Command(bin, "--config", cfg)
	p.cmd.Stderr = p.out
	// Should this process die without unwinding, the kernel ends the
	// broker too rather than leaving it holding a port and a lock.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	addrc := make(chan string, 1)
	go func() {
		// Keep reading to the end: a broker whose stdout pipe fills blocks
		// on its next log line.
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(p.out, line+"\n")
			if !sent {
				if m := listeningLine.FindStringSubmatch(line); m != nil {
					addrc <- m[1]
					sent = true
				}
			}
		}
		_, _ = io.Copy(p.out, stdout)
	}()
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	select {
	case p.addr = <-addrc:
		p.ready = time.Since(start)
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("saguin exited (%s) before listening:\n%s", p.cmd.ProcessState, p.out)
	case <-time.After(startLimit):
		p.kill()
		return nil, fmt.Errorf("saguin not listening %s after start:\n%s", startLimit, p.out)
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
}

// term stops the broker gracefully and reports a shutdown that failed or
// needed SIGKILL.
func (p *saguinProc) term() error {
	begin := time.Now()
	loadgen.StopProcess(p.cmd, p.exited, stopGrace)
	if time.Since(begin) >= stopGrace {
		return fmt.Errorf("saguin did not stop within %s of SIGTERM (killed):\n%s", stopGrace, p.out)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("saguin exited %d after SIGTERM:\n%s", code, p.out)
	}
	return nil
}

func (p *saguinProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// alive reports an early exit: a broker that died mid-run explains every
// error that follows, so its output is what the report shows.
func (p *saguinProc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("saguin exited (%s):\n%s", p.cmd.ProcessState, p.out)
	default:
		return nil
	}
}
