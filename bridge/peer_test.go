package bridge

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// mosquittoPath is where Debian's package puts the broker (.ci/run
// installs it); it is the peer these tests link to.
const mosquittoPath = "/usr/sbin/mosquitto"

// peerBroker is a real mosquitto the link dials, on a port of its own that
// survives a restart.
type peerBroker struct {
	t    *testing.T
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

// count is how many times mosquitto's log says line.
func (p *peerBroker) count(line string) int { return strings.Count(p.out.String(), line) }

// startPeer starts mosquitto on a free port; extra is appended to its
// configuration.
func startPeer(t *testing.T, extra string) *peerBroker {
	t.Helper()
	if _, err := exec.LookPath(mosquittoPath); err != nil {
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
	body := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\n%s\n", port, extra)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &peerBroker{t: t, port: port, conf: conf}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *peerBroker) start() {
	p.t.Helper()
	p.out = &syncBuffer{}
	p.cmd = exec.Command(mosquittoPath, "-c", p.conf, "-v")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr(), time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("mosquitto did not listen on %s: %v", p.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *peerBroker) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_, _ = p.cmd.Process.Wait()
	p.cmd = nil
}

// restart stops mosquitto and starts it again on the same port: without
// persistence it has forgotten every session.
func (p *peerBroker) restart() {
	p.stop()
	p.start()
}

func (p *peerBroker) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *peerBroker) url() *url.URL { return &url.URL{Scheme: "tcp", Host: p.addr()} }

// publisher is a stock MQTT 5 client publishing at the peer.
type publisher struct {
	t   *testing.T
	cli *paho.Client
}

func newPublisher(t *testing.T, p *peerBroker, id string) *publisher {
	t.Helper()
	conn, err := net.DialTimeout("tcp", p.addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{Conn: conn, ClientID: id})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Disconnect(&paho.Disconnect{}) })
	return &publisher{t: t, cli: cli}
}

func (pb *publisher) publish(topic, payload string, qos byte) {
	pb.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pb.cli.Publish(ctx, &paho.Publish{Topic: topic, Payload: []byte(payload), QoS: qos}); err != nil {
		pb.t.Fatalf("publishing %s at the peer: %v", topic, err)
	}
}

// memLocal is the broker side of the tests: it keeps what it stored, in
// order, and can be told to hold records back (Retry) or refuse some for
// good (Never).
type memLocal struct {
	mu      sync.Mutex
	stored  []Record
	calls   int
	holding bool
	never   map[string]string // topic → cause
	changed chan struct{}
}

func newMemLocal() *memLocal {
	return &memLocal{never: map[string]string{}, changed: make(chan struct{}, 1)}
}

func (m *memLocal) Store(_ context.Context, rec Record) (Outcome, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	defer func() {
		select {
		case m.changed <- struct{}{}:
		default:
		}
	}()
	if cause, ok := m.never[rec.Topic]; ok {
		return Never, cause
	}
	if m.holding {
		return Retry, ""
	}
	m.stored = append(m.stored, rec)
	return Stored, ""
}

func (m *memLocal) hold(on bool) {
	m.mu.Lock()
	m.holding = on
	m.mu.Unlock()
}

func (m *memLocal) topics() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.stored))
	for i, r := range m.stored {
		out[i] = r.Topic + " " + string(r.Payload)
	}
	return out
}

// waitFor polls cond until it holds or 20s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
