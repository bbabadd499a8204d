package main

// The processes the sessions scenarios measure. A broker's memory is read
// from /proc/<pid>/status, so every broker there runs as a process of its
// own: Sagüin and mosquitto as their binaries, and mochi - a library - in
// a child copy of this command (childEnv), whose only work is serving it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"saguin.dev/broker/internal/loadgen"
)

// childEnv, set to childMochi, makes this command serve a bare mochi and
// nothing else (see serveMochiChild).
const (
	childEnv   = "SAGUIN_BENCH_CHILD"
	childMochi = "mochi"
)

// mochiChildLine is the child's announcement of its address on stdout.
const mochiChildLine = "mochi listening "

// serveMochiChild runs a bare mochi (loadgen.StartMochi) until SIGTERM or
// SIGINT, after writing its address to stdout; it returns the exit code.
func serveMochiChild(stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m, err := loadgen.StartMochi()
	if err != nil {
		fmt.Fprintln(stderr, "mochi child:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s%s\n", mochiChildLine, m.Addr())
	<-ctx.Done()
	if err := m.Close(10 * time.Second); err != nil {
		fmt.Fprintln(stderr, "mochi child:", err)
		return 1
	}
	return 0
}

// brokerProc is a broker process the sessions scenarios measure.
type brokerProc struct {
	name   string
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *loadgen.TailBuffer
}

func (p *brokerProc) pid() int { return p.cmd.Process.Pid }

// alive reports an early exit, with the process's last output.
func (p *brokerProc) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited (%s):\n%s", p.name, p.cmd.ProcessState, p.out)
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and reports a broker that
// needed the SIGKILL or exited other than 0: a failed shutdown after a
// scenario is a finding too.
func (p *brokerProc) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s had exited (%s):\n%s", p.name, p.cmd.ProcessState, p.out)
	default:
	}
	begin := time.Now()
	loadgen.StopProcess(p.cmd, p.exited, grace)
	if time.Since(begin) >= grace {
		return fmt.Errorf("%s did not stop within %s of SIGTERM (killed):\n%s", p.name, grace, p.out)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("%s exited %d after SIGTERM:\n%s", p.name, code, p.out)
	}
	return nil
}

// startMochiChild starts this command's executable as a mochi server.
func startMochiChild(ctx context.Context) (*brokerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("mochi child: %w", err)
	}
	p := &brokerProc{name: "mochi", exited: make(chan struct{}), out: loadgen.NewTailBuffer(16 << 10)}
	p.cmd = exec.Command(self)
	p.cmd.Env = append(os.Environ(), childEnv+"="+childMochi)
	p.cmd.Stderr = p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("mochi child: start %s: %w", self, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), mochiChildLine); ok {
				select {
				case addrc <- a:
				default:
				}
			}
		}
	}()
	select {
	case p.addr = <-addrc:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("mochi child exited (%s) before listening:\n%s", p.cmd.ProcessState, p.out)
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	_ = p.stop(time.Second)
	return nil, fmt.Errorf("mochi child not listening: %w\n%s", context.Cause(ctx), p.out)
}

// startMosquittoProc runs mosquitto on a free port with the same minimal
// configuration as loadgen.StartMosquitto (a listener, allow_anonymous,
// every other setting at its default: sessions kept in memory, at most
// 1,000 queued messages each), started here because the scenarios need its
// pid.
func startMosquittoProc(ctx context.Context, bin, dir string) (*brokerProc, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("mosquitto: %w (Debian package mosquitto)", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	// A free port can be taken by another process before mosquitto binds
	// it; a few tries make that race harmless.
	for range 3 {
		port, err := loadgen.FreePort()
		if err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "mosquitto.conf")
		body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\n", port)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			return nil, fmt.Errorf("mosquitto: write config: %w", err)
		}
		p := &brokerProc{name: "mosquitto", addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			exited: make(chan struct{}), out: loadgen.NewTailBuffer(16 << 10)}
		p.cmd = exec.Command(bin, "-c", conf)
		p.cmd.Stdout = p.out
		p.cmd.Stderr = p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			return nil, fmt.Errorf("mosquitto: start: %w", err)
		}
		go func() {
			_ = p.cmd.Wait()
			close(p.exited)
		}()
		if lastErr = waitDialable(ctx, p); lastErr == nil {
			return p, nil
		}
		_ = p.stop(time.Second)
	}
	return nil, lastErr
}

// mosquittoVersionOf asks the binary for its version: mosquitto -h prints
// its usage, version first, and exits non-zero.
func mosquittoVersionOf(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, "-h").CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	if strings.HasPrefix(first, "mosquitto version") {
		return strings.TrimSpace(first)
	}
	return "mosquitto (version unknown)"
}

// waitDialable dials p until it answers, exits, or 10s pass.
func waitDialable(ctx context.Context, p *brokerProc) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after 10s: %w\n%s", p.name, p.addr, err, p.out)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before listening:\n%s", p.name, p.out)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// saguinBroker wraps a started Sagüin as a brokerProc.
func saguinBroker(name string, s *saguinProc) *brokerProc {
	return &brokerProc{name: name, addr: s.addr, cmd: s.cmd, exited: s.exited, out: s.out}
}

// readRSS is a process's resident set size in KiB (VmRSS in
// /proc/<pid>/status, which the kernel gives in kB meaning KiB).
func readRSS(pid int) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("read memory of pid %d: %w", pid, err)
	}
	return parseVmRSS(data)
}

func parseVmRSS(status []byte) (int64, error) {
	for line := range strings.SplitSeq(string(status), "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS line %q: want a count of kB", line)
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, errors.New("no VmRSS line (a kernel thread, or a process that has exited)")
}

// raiseFileLimit sets this process's soft RLIMIT_NOFILE to at least need,
// raising the hard limit too when it is lower and this process may (root).
// Calling Setrlimit also makes children inherit the raised limit (Go
// otherwise restores the original soft limit in every child), so
// mosquitto, holding one descriptor per client, gets it as well.
func raiseFileLimit(need uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	want := lim
	want.Cur = max(lim.Cur, need)
	if want.Max < want.Cur {
		want.Max = want.Cur
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		// Not root: take what the hard limit allows.
		want = lim
		want.Cur = max(lim.Cur, min(need, lim.Max))
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err2 != nil {
			return lim.Cur, fmt.Errorf("setrlimit: %w", err2)
		}
		if want.Cur < need {
			return want.Cur, fmt.Errorf("open files limited to %d (hard limit; raising it: %v), %d wanted", want.Cur, err, need)
		}
	}
	return want.Cur, nil
}
