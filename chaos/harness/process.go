package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuildBroker builds the saguin binary from the broker module at brokerDir
// into dir and returns its path, with the given build tags (FaultBuildTag
// for a negative control's deliberately broken broker: ControlBuildTags).
// The harness runs the broker only as this binary (design.md: the chaos
// harness never imports broker internals).
func BuildBroker(ctx context.Context, brokerDir, dir string, tags ...string) (string, error) {
	if brokerDir == "" {
		d, err := defaultBrokerDir()
		if err != nil {
			return "", err
		}
		brokerDir = d
	}
	bin := filepath.Join(dir, "saguin")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/saguin")...)
	cmd.Dir = brokerDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s ./cmd/saguin in %s: %w\n%s", strings.Join(args, " "), brokerDir, err, out)
	}
	return bin, nil
}

// defaultBrokerDir finds the broker module next to this one in the
// repository (chaos/harness/../../broker).
func defaultBrokerDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the broker module: no caller information; pass Options.BrokerDir")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "broker")
	if _, err := os.Stat(filepath.Join(dir, "cmd", "saguin")); err != nil {
		return "", fmt.Errorf("broker module not found at %s (pass Options.BrokerDir): %w", dir, err)
	}
	return filepath.Clean(dir), nil
}

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

var (
	listeningLine = regexp.MustCompile(`msg=listening .*address=(\S+)`)
	// faultsLine is what a fault-injection build prints when it breaks
	// itself (broker/cmd/saguin).
	faultsLine = regexp.MustCompile(`^saguin: fault injection active: (\S+)`)
)

// faultsEnv is the variable a fault-injection build of saguin reads
// (broker/internal/faults).
const faultsEnv = "SAGUIN_FAULTS"

// brokerProc is one run of the saguin binary. Its output goes to the log
// file shared by every run of the campaign.
type brokerProc struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, valid after exited
	output chan struct{} // closed once all its output is in the log
	tail   *tailBuffer
	// faults is what a fault-injection build said it broke ("": nothing);
	// valid once startBroker returned it.
	faults string
}

// startBroker runs bin on cfgPath, appending its output to log, and waits
// until it listens. faults is what a fault-injection build is told to break
// ("" for an honest run: the variable is then removed from the broker's
// environment, whatever the harness's own holds). A process that exits or
// stays silent is killed and reported with the end of its output.
func startBroker(ctx context.Context, bin, cfgPath, faults string, log io.Writer, timeout time.Duration) (*brokerProc, error) {
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, faultsEnv+"=") })
	if faults != "" {
		cmd.Env = append(cmd.Env, faultsEnv+"="+faults)
	}
	// Its own process group, so a signal reaches exactly it; and the kernel
	// kills it if the harness dies, so no broker outlives a campaign.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	p := &brokerProc{cmd: cmd, exited: make(chan struct{}), output: make(chan struct{}), tail: newTailBuffer(64 << 10)}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	addrc := make(chan string, 1)
	go func() {
		defer close(p.output)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(log, line+"\n")
			p.tail.WriteLine(line)
			if m := faultsLine.FindStringSubmatch(line); m != nil && !sent {
				p.faults = m[1] // before the address is sent: read after it
			}
			if m := listeningLine.FindStringSubmatch(line); m != nil && !sent {
				addrc <- m[1]
				sent = true
			}
		}
		// A line over the scanner's bound ends the scan: keep draining so
		// the broker never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.err = cmd.Wait()
		_ = pw.Close()
		close(p.exited)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case p.addr = <-addrc:
		return p, nil
	case <-p.exited:
		<-p.output
		return nil, fmt.Errorf("saguin exited before listening (%v):\n%s", p.err, p.tail.String())
	case <-timer.C:
		p.kill()
		return nil, fmt.Errorf("saguin did not listen within %s:\n%s", timeout, p.tail.String())
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
}

func (p *brokerProc) signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return fmt.Errorf("signal %v: process already exited", sig)
	default:
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// kill sends SIGKILL (after SIGCONT is moot: SIGKILL ends a stopped process
// too) and waits for the exit.
func (p *brokerProc) kill() {
	_ = p.signal(syscall.SIGKILL)
	p.wait()
}

// wait waits for the exit and for the last of the output to be logged.
func (p *brokerProc) wait() {
	<-p.exited
	<-p.output
}

// term sends SIGTERM and waits up to timeout for the graceful shutdown. It
// reports the exit status; a shutdown that hangs is killed and reported.
func (p *brokerProc) term(timeout time.Duration) error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		p.wait()
	case <-timer.C:
		// SIGQUIT first: the Go runtime writes every goroutine's stack to
		// the log, which shows where the shutdown is stuck.
		_ = p.signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
		}
		p.kill()
		return fmt.Errorf("saguin did not stop within %s of SIGTERM (SIGQUIT: goroutine stacks in the broker log; killed)", timeout)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("saguin exited %d after SIGTERM:\n%s", code, p.tail.String())
	}
	return nil
}

// alive reports whether the process has not exited.
func (p *brokerProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// tailBuffer keeps the last bytes of a process's output for error reports:
// bounded, whatever the process prints (invariant 13).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []string
	n   int
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (t *tailBuffer) WriteLine(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(line) > t.max {
		line = line[:t.max]
	}
	t.buf = append(t.buf, line)
	t.n += len(line) + 1
	for t.n > t.max && len(t.buf) > 1 {
		t.n -= len(t.buf[0]) + 1
		t.buf = t.buf[1:]
	}
}

func (t *tailBuffer) String() string { return t.last(15) }

// last is the last n lines.
func (t *tailBuffer) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := t.buf
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
