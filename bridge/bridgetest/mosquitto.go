package bridgetest

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MosquittoPath is where Debian's package puts the broker (.ci/run
// installs it); it is the peer these tests link to.
const MosquittoPath = "/usr/sbin/mosquitto"

// Mosquitto is Debian's mosquitto as a bridge's peer, on a port of its own
// that survives a restart, its log kept for tests to read.
type Mosquitto struct {
	t    testing.TB
	port int
	conf string
	cmd  *exec.Cmd
	out  *syncBuffer
}

// syncBuffer is mosquitto's log, written by its process and read by tests.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Count is how many times mosquitto's log (-v) says line.
func (p *Mosquitto) Count(line string) int { return strings.Count(p.out.String(), line) }

// StartMosquitto starts mosquitto on a free loopback port, stopped with the
// test; extra is appended to its configuration after the listener line, so
// listener options (cafile, require_certificate, …) apply to it.
func StartMosquitto(t testing.TB, extra string) *Mosquitto {
	t.Helper()
	if _, err := exec.LookPath(MosquittoPath); err != nil {
		t.Fatalf("these tests need mosquitto as the peer (apt-get install mosquitto; .ci/run installs it): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	user := ""
	if os.Geteuid() == 0 {
		// Run as root (as CI is), mosquitto drops to its own user before it
		// reads a listener's key, and cannot read the test's temporary
		// files: this peer keeps root's rights instead.
		user = "user root\n"
	}
	body := fmt.Sprintf("%slistener %d 127.0.0.1\nallow_anonymous true\n%s\n", user, port, extra)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Mosquitto{t: t, port: port, conf: conf}
	p.start()
	t.Cleanup(p.Stop)
	return p
}

func (p *Mosquitto) start() {
	p.t.Helper()
	p.out = &syncBuffer{}
	p.cmd = exec.Command(MosquittoPath, "-c", p.conf, "-v")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A test binary killed (a timeout) takes its peer with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("mosquitto did not listen on %s: %v", p.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills mosquitto.
func (p *Mosquitto) Stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_, _ = p.cmd.Process.Wait()
	p.cmd = nil
}

// RestartGracefully stops mosquitto with SIGTERM, so with persistence it
// saves its sessions, and starts it again on the same port.
func (p *Mosquitto) RestartGracefully() {
	p.t.Helper()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		_, _ = p.cmd.Process.Wait()
		p.cmd = nil
	}
	p.start()
}

// Restart stops mosquitto and starts it again on the same port: without
// persistence it has forgotten every session.
func (p *Mosquitto) Restart() {
	p.Stop()
	p.start()
}

// Addr is its host:port.
func (p *Mosquitto) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// URL is it as a tcp:// peer.
func (p *Mosquitto) URL() *url.URL { return &url.URL{Scheme: "tcp", Host: p.Addr()} }

// Log is what mosquitto printed so far.
func (p *Mosquitto) Log() string { return p.out.String() }
