package brokertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"saguin.dev/storage/storagetest/emulate"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/saguin once per test process and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "saguin-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "saguin")
		_, file, _, _ := runtime.Caller(0)
		moduleRoot := filepath.Dir(filepath.Dir(file))
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/saguin")
		cmd.Dir = moduleRoot
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/saguin: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// Command is exec.Command for the built binary (Binary): the binary of the
// test's GOARCH, which under make test-32 the kernel may not run itself,
// is started the way storagetest/emulate decided (natively or under
// qemu-user).
func Command(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	return CommandFor(t, Binary(t), args...)
}

// CommandFor is Command for the binary at bin (BinaryFor builds one for
// another GOARCH).
func CommandFor(t testing.TB, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd, err := emulate.Command(bin, args...)
	if err != nil {
		t.Fatalf("running %s: %v", bin, err)
	}
	return cmd
}

// CommandContext is Command with the context exec.CommandContext takes.
func CommandContext(ctx context.Context, t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd, err := emulate.CommandContext(ctx, Binary(t), args...)
	if err != nil {
		t.Fatalf("running the saguin binary: %v", err)
	}
	return cmd
}

// Process is the saguin binary running as a child process.
type Process struct {
	t       testing.TB
	bin     string // "" is Binary's build for this test's GOARCH
	cfgPath string
	cmd     *exec.Cmd
	addr    string
	out     *LogBuffer
	exited  chan struct{}
}

var listeningLine = regexp.MustCompile(`msg=listening .*address=(\S+)`)

// StartProcess runs the binary on cfgPath and waits until it listens.
func StartProcess(t testing.TB, cfgPath string) *Process {
	t.Helper()
	return StartBinary(t, "", cfgPath)
}

// StartBinary is StartProcess with the binary at bin (BinaryFor builds one
// for another GOARCH); "" is Binary's.
func StartBinary(t testing.TB, bin, cfgPath string) *Process {
	t.Helper()
	p := &Process{t: t, bin: bin, cfgPath: cfgPath, out: &LogBuffer{}}
	p.start()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("saguin output:\n%s", p.out.Tail(60))
			_ = os.WriteFile(filepath.Join(os.TempDir(), "saguin-failed.log"), []byte(p.out.String()), 0o644)
		}
	})
	return p
}

func (p *Process) start() {
	p.t.Helper()
	bin := p.bin
	if bin == "" {
		bin = Binary(p.t)
	}
	p.cmd = CommandFor(p.t, bin, "--config", p.cfgPath)
	// An io.Pipe rather than StdoutPipe: Wait runs concurrently and would
	// close a StdoutPipe before everything was read.
	stdout, pw := io.Pipe()
	p.cmd.Stdout = pw
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.exited = make(chan struct{})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(p.out, line+"\n")
			if m := listeningLine.FindStringSubmatch(line); m != nil && !sent {
				addrc <- m[1]
				sent = true
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		_ = pw.Close()
		close(p.exited)
	}()
	select {
	case p.addr = <-addrc:
	case <-p.exited:
		p.t.Fatalf("saguin exited before listening:\n%s", p.out)
	case <-time.After(60 * time.Second):
		p.Kill()
		p.t.Fatalf("saguin did not start listening within a minute:\n%s", p.out)
	}
}

// Address is host:port of the MQTT listener.
func (p *Process) Address() string { return p.addr }

// URL is the listener as an mqtt:// URL.
func (p *Process) URL() string { return "mqtt://" + p.addr }

// Output is everything the process printed.
func (p *Process) Output() string { return p.out.String() }

// Kill sends SIGKILL: the crash.
func (p *Process) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Term sends SIGTERM and waits for the graceful shutdown to finish.
func (p *Process) Term() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		p.Kill()
		p.t.Fatalf("saguin did not stop within a minute of SIGTERM:\n%s", p.out)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Fatalf("saguin exited %d after SIGTERM:\n%s", code, p.out)
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// WaitOutput waits until the process has printed s, and reports whether it
// did: false when the process ends first or d passes.
func (p *Process) WaitOutput(s string, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(p.out.String(), s) {
			return true
		}
		select {
		case <-p.exited:
			return strings.Contains(p.out.String(), s)
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
}

// Stop sends sig (unless the process has already ended) and returns the
// exit code once it ends: -1 when a signal ended it.
func (p *Process) Stop(sig os.Signal) int {
	p.t.Helper()
	if !p.Exited() {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		p.Kill()
		p.t.Fatalf("saguin did not stop within a minute of %v:\n%s", sig, p.out)
	}
	return p.cmd.ProcessState.ExitCode()
}

// Restart starts the binary again on the same configuration (new port).
func (p *Process) Restart() {
	p.t.Helper()
	p.start()
}

// Run runs the binary with args to completion and returns its exit code and
// combined output.
func Run(t testing.TB, args ...string) (int, string) {
	t.Helper()
	cmd := Command(t, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		t.Fatal(err)
	}
	return 0, strings.TrimSpace(string(out))
}
