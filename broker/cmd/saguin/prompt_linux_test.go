package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"saguin.dev/broker/brokertest"
)

// onTerminal is the saguin binary running with a pseudo-terminal as its
// controlling terminal and stdin, stdout and stderr, as an operator's
// shell would start it. The test types on the terminal's other side and
// reads everything the terminal shows — the binary's output and the
// terminal's own echo of what was typed.
type onTerminal struct {
	t       *testing.T
	ptm     *os.File // the side the test types on and reads from
	pts     *os.File // the binary's terminal
	cmd     *exec.Cmd
	exited  chan struct{}
	mu      sync.Mutex
	screen  []byte
	readEnd chan struct{}
}

// openPTY opens a new pseudo-terminal pair (the kernel's /dev/ptmx).
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening a pseudo-terminal: %v", err)
	}
	fd := int(ptm.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("numbering the pseudo-terminal: %v", err)
	}
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the terminal side: %v", err)
	}
	return ptm, pts
}

func startOnTerminal(t *testing.T, args ...string) *onTerminal {
	t.Helper()
	ptm, pts := openPTY(t)
	term := &onTerminal{t: t, ptm: ptm, pts: pts, exited: make(chan struct{}), readEnd: make(chan struct{})}
	term.cmd = brokertest.Command(t, args...)
	term.cmd.Stdin, term.cmd.Stdout, term.cmd.Stderr = pts, pts, pts
	term.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := term.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = term.cmd.Wait()
		close(term.exited)
	}()
	go func() { // ends when the terminal closes (EIO once both sides of pts are closed)
		defer close(term.readEnd)
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			term.mu.Lock()
			term.screen = append(term.screen, buf[:n]...)
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = term.cmd.Process.Kill()
		<-term.exited
		_ = pts.Close()
		_ = ptm.Close()
		<-term.readEnd
	})
	return term
}

// shown is everything the terminal has shown so far.
func (term *onTerminal) shown() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return string(term.screen)
}

// waitShown waits until the terminal shows s.
func (term *onTerminal) waitShown(s string) {
	term.t.Helper()
	deadline := time.Now().Add(wait)
	for !strings.Contains(term.shown(), s) {
		if time.Now().After(deadline) {
			term.t.Fatalf("the terminal never showed %q; it shows:\n%q", s, term.shown())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// answerPrompts types first at the password prompt and second at the
// second one, each when its prompt shows, and returns the exit code.
func (term *onTerminal) answerPrompts(first, second string) int {
	term.t.Helper()
	term.waitShown("Password: ")
	term.typeLine(first + "\r")
	term.waitShown("Reenter password: ")
	term.typeLine(second + "\r")
	return term.exitCode()
}

func (term *onTerminal) typeLine(s string) {
	term.t.Helper()
	if _, err := term.ptm.Write([]byte(s)); err != nil {
		term.t.Fatal(err)
	}
}

// exitCode waits for the binary to end.
func (term *onTerminal) exitCode() int {
	term.t.Helper()
	select {
	case <-term.exited:
	case <-time.After(wait):
		term.t.Fatalf("saguin did not end; the terminal shows:\n%q", term.shown())
	}
	return term.cmd.ProcessState.ExitCode()
}

// echoOn says whether the terminal echoes what is typed.
func (term *onTerminal) echoOn() bool {
	term.t.Helper()
	tio, err := unix.IoctlGetTermios(int(term.pts.Fd()), unix.TCGETS)
	if err != nil {
		term.t.Fatal(err)
	}
	return tio.Lflag&unix.ECHO != 0
}

// docs/configuration.md "Password files and `saguin --passwd`": with no password on the command line and a terminal on
// stdin, add asks twice with echo off: what is typed never shows on the
// terminal, and the stored hash verifies it. Echo is on again afterwards.
func TestPasswdPromptsTwiceWithEchoOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	term := startOnTerminal(t, "--passwd", "add", path, "alice")
	if !term.echoOn() {
		t.Fatal("the test terminal does not echo to begin with: the test would prove nothing")
	}
	if code := term.answerPrompts("typed-secret-1", "typed-secret-1"); code != 0 {
		t.Fatalf("exit %d; the terminal shows:\n%q", code, term.shown())
	}
	term.waitShown("added user alice")
	if strings.Contains(term.shown(), "typed-secret") {
		t.Errorf("the password was echoed on the terminal:\n%q", term.shown())
	}
	if !term.echoOn() {
		t.Error("echo is still off after the prompt")
	}
	checkVerifies(t, path, "alice", "typed-secret-1")
}

// Two different passwords typed: refused, exit 1, nothing written.
func TestPasswdPromptMismatchIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	term := startOnTerminal(t, "--passwd", "add", path, "alice")
	if code := term.answerPrompts("one", "two"); code != 1 {
		t.Fatalf("exit %d, want 1; the terminal shows:\n%q", code, term.shown())
	}
	term.waitShown("do not match; nothing written")
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was written after a mismatch: %v", err)
	}
}

// Ctrl-C at the prompt ends the command with 130 and leaves the terminal
// echoing, not silent for the rest of the operator's session.
func TestPasswdPromptInterruptedRestoresEcho(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	term := startOnTerminal(t, "--passwd", "add", path, "alice")
	term.waitShown("Password: ")
	if term.echoOn() {
		t.Fatal("echo is on while the prompt waits")
	}
	term.typeLine("half-typed\x03")
	if code := term.exitCode(); code != 130 {
		t.Fatalf("exit %d after Ctrl-C, want 130; the terminal shows:\n%q", code, term.shown())
	}
	if !term.echoOn() {
		t.Error("echo is still off after Ctrl-C at the prompt")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was written after Ctrl-C: %v", err)
	}
}
