package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The reference brokers a Sagüin measurement is set beside.

// MochiVersion is the version of the mochi-mqtt module linked in.
const MochiVersion = mqtt.Version

// Mochi is a bare mochi-mqtt server running in this process: default
// options, an allow-all auth hook, one TCP listener on a free loopback port.
type Mochi struct {
	server *mqtt.Server
	addr   string
	id     string // the listener's
}

// StartMochi starts a bare mochi server. Its logger is the one option set:
// mochi's default logs every connection at info to stdout, which would land
// in the middle of the benchmark's table.
func StartMochi() (*Mochi, error) {
	s := mqtt.New(&mqtt.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		return nil, fmt.Errorf("mochi: allow hook: %w", err)
	}
	const id = "bench"
	l := listeners.NewTCP(listeners.Config{ID: id, Address: "127.0.0.1:0"})
	if err := s.AddListener(l); err != nil {
		return nil, fmt.Errorf("mochi: listener: %w", err)
	}
	if err := s.Serve(); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("mochi: serve: %w", err)
	}
	return &Mochi{server: s, addr: l.Address(), id: id}, nil
}

// Addr is the listener's host:port.
func (m *Mochi) Addr() string { return m.addr }

// Close stops the server, waiting at most timeout: a mochi whose locks are
// deadlocked never finishes closing, and the benchmark must still end. Such
// a server is abandoned (its goroutines are blocked, not spinning) and the
// error says so.
func (m *Mochi) Close(timeout time.Duration) error {
	done := make(chan struct{})
	go func() {
		// mochi's own closer lists a listener's clients taking the clients'
		// read lock twice (Clients.GetByListener calls Len under RLock), so
		// a client detaching at that moment queues a writer between the two
		// and the close hangs for ever. The listener is ended first with a
		// closer that takes the lock once; a listener runs its closer only
		// once, so Server.Close no longer calls mochi's.
		m.server.Listeners.Close(m.id, m.disconnectAll)
		_ = m.server.Close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("mochi did not close within %s (its goroutines are deadlocked)", timeout)
	}
}

func (m *Mochi) disconnectAll(string) {
	for _, cl := range m.server.Clients.GetAll() {
		if !cl.Closed() {
			_ = m.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
		}
	}
}

// Mosquitto is a mosquitto process on a free loopback port, with a
// generated minimal configuration: the listener and allow_anonymous, every
// other setting at its default.
type Mosquitto struct {
	cmd     *exec.Cmd
	addr    string
	exited  chan struct{}
	out     *TailBuffer
	drops   *lineCounter
	Version string // e.g. "mosquitto version 2.0.11"
}

// mosquittoDropLine is what mosquitto logs when it starts discarding a
// client's outgoing messages (once per episode).
const mosquittoDropLine = "Outgoing messages are being dropped"

// Drops is how many times mosquitto has logged that it is dropping a
// client's outgoing messages: a loss the load generator reports is then
// mosquitto's own decision, not a message the load generator missed.
func (m *Mosquitto) Drops() int64 { return m.drops.count() }

// StartMosquitto runs the mosquitto binary at path with its configuration
// in dir. The child gets SIGKILL if this process dies without stopping it.
func StartMosquitto(ctx context.Context, path, dir string) (*Mosquitto, error) {
	return StartMosquittoWith(ctx, path, dir, "")
}

// StartMosquittoWith is StartMosquitto with extra configuration lines after
// the listener's (a bridge's connection block, for one).
func StartMosquittoWith(ctx context.Context, path, dir, extra string) (*Mosquitto, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("mosquitto: %w (Debian package mosquitto)", err)
	}
	version := mosquittoVersion(ctx, path)
	var lastErr error
	// A free port is found by binding and releasing it, so another process
	// can take it in between; a few tries make that race harmless.
	for range 3 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		m, err := startMosquittoOn(ctx, path, dir, port, extra)
		if err == nil {
			m.Version = version
			return m, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startMosquittoOn(ctx context.Context, path, dir string, port int, extra string) (*Mosquitto, error) {
	conf := filepath.Join(dir, "mosquitto.conf")
	body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\n%s\n", port, extra)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, fmt.Errorf("mosquitto: write config: %w", err)
	}
	m := &Mosquitto{
		addr:   fmt.Sprintf("127.0.0.1:%d", port),
		exited: make(chan struct{}),
		out:    NewTailBuffer(64 << 10),
		drops:  &lineCounter{substr: mosquittoDropLine},
	}
	m.cmd = exec.Command(path, "-c", conf)
	// One writer, so exec copies both streams on one goroutine and the
	// counter sees whole lines in order.
	w := io.MultiWriter(m.out, m.drops)
	m.cmd.Stdout = w
	m.cmd.Stderr = w
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("mosquitto: start: %w", err)
	}
	go func() {
		_ = m.cmd.Wait()
		close(m.exited)
	}()
	if err := waitListening(ctx, m.addr, m.exited, 10*time.Second); err != nil {
		m.Stop(time.Second)
		return nil, fmt.Errorf("mosquitto on port %d: %w\n%s", port, err, m.out)
	}
	return m, nil
}

// Addr is the listener's host:port.
func (m *Mosquitto) Addr() string { return m.addr }

// Stop sends SIGTERM and, after grace, SIGKILL; it returns once the process
// has exited.
func (m *Mosquitto) Stop(grace time.Duration) {
	StopProcess(m.cmd, m.exited, grace)
}

func mosquittoVersion(ctx context.Context, path string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// mosquitto -h prints its usage, version first, and exits non-zero.
	out, _ := exec.CommandContext(ctx, path, "-h").CombinedOutput()
	first, _, _ := strings.Cut(string(out), "\n")
	if strings.HasPrefix(first, "mosquitto version") {
		return strings.TrimSpace(first)
	}
	return "mosquitto (version unknown)"
}

// StopProcess sends SIGTERM to a started command and, if it has not exited
// (exited closed) within grace, SIGKILL; it waits for the exit either way.
func StopProcess(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	<-exited
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitListening dials addr until it answers, the process exits, or limit.
func waitListening(ctx context.Context, addr string, exited <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %s: %w", limit, err)
		}
		select {
		case <-exited:
			return errors.New("exited before listening")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TailBuffer keeps the last max bytes written to it: a child's output is
// kept for error messages without growing with a long run (invariant 13).
type TailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
	cut bool
}

// NewTailBuffer keeps at most max bytes.
func NewTailBuffer(max int) *TailBuffer { return &TailBuffer{max: max} }

func (t *TailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		p = p[len(p)-t.max:]
		t.buf = t.buf[:0]
		t.cut = true
	} else if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *TailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return "[...]\n" + string(bytes.Clone(t.buf))
	}
	return string(t.buf)
}

// lineCounter counts the lines written to it that contain substr. A line
// longer than maxLine is cut there (invariant 13).
type lineCounter struct {
	substr string
	mu     sync.Mutex
	line   []byte
	n      int64
}

const maxLine = 4 << 10

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range p {
		if b == '\n' {
			if bytes.Contains(c.line, []byte(c.substr)) {
				c.n++
			}
			c.line = c.line[:0]
			continue
		}
		if len(c.line) < maxLine {
			c.line = append(c.line, b)
		}
	}
	return len(p), nil
}

func (c *lineCounter) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
