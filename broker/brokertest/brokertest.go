// Package brokertest starts real Sagüin brokers for tests: in-process, or as
// the built saguin binary in a child process (so a test can SIGKILL it).
// Either way the broker listens on a free loopback port (configurations say
// address 127.0.0.1:0) and keeps its data in the test's temporary directory.
package brokertest

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"text/template"

	"saguin.dev/broker"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/clock"
)

// Config renders a configuration template into dir/saguin.yaml and returns
// its path. The template sees .Dir, the directory for data files.
func Config(t testing.TB, dir, tmpl string) string {
	t.Helper()
	tp, err := template.New("config").Parse(tmpl)
	if err != nil {
		t.Fatalf("configuration template: %v", err)
	}
	var buf bytes.Buffer
	if err := tp.Execute(&buf, struct{ Dir string }{dir}); err != nil {
		t.Fatalf("configuration template: %v", err)
	}
	path := filepath.Join(dir, "saguin.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Broker is an in-process broker.
type Broker struct {
	*broker.Broker
	t       testing.TB
	cfgPath string
	Clock   clock.Clock
	Log     *LogBuffer
}

// Option adjusts how a broker is started.
type Option func(*broker.Options)

// WithClock injects the broker's clock.
func WithClock(c clock.Clock) Option { return func(o *broker.Options) { o.Clock = c } }

// Start runs an in-process broker on the configuration at cfgPath, closed
// when the test ends.
func Start(t testing.TB, cfgPath string, opts ...Option) *Broker {
	t.Helper()
	b := &Broker{t: t, cfgPath: cfgPath, Log: &LogBuffer{}}
	o := broker.Options{Build: "test", Logger: slog.New(slog.NewTextHandler(b.Log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range opts {
		f(&o)
	}
	b.Clock = o.Clock
	b.start(o)
	t.Cleanup(func() {
		_ = b.Close()
		if t.Failed() {
			t.Logf("broker log:\n%s", b.Log.Tail(60))
		}
	})
	return b
}

func (b *Broker) start(o broker.Options) {
	b.t.Helper()
	cfg, err := config.Load(b.cfgPath)
	if err != nil {
		b.t.Fatalf("configuration: %v", err)
	}
	br, err := broker.New(cfg, o)
	if err != nil {
		b.t.Fatalf("broker.New: %v", err)
	}
	if err := br.Start(); err != nil {
		b.t.Fatalf("broker.Start: %v", err)
	}
	b.Broker = br
}

// Address is host:port of the MQTT listener.
func (b *Broker) Address() string { return b.Addr().String() }

// URL is the listener as an mqtt:// URL.
func (b *Broker) URL() string { return "mqtt://" + b.Address() }

// Restart closes the broker gracefully and starts it again on the same
// configuration and data; the new listener has a new port.
func (b *Broker) Restart() {
	b.t.Helper()
	if err := b.Close(); err != nil {
		b.t.Fatalf("close: %v", err)
	}
	o := broker.Options{Build: "test", Clock: b.Clock,
		Logger: slog.New(slog.NewTextHandler(b.Log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	b.start(o)
}

// LogBuffer collects a broker's log lines for assertions.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Contains reports whether any logged line contains s.
func (l *LogBuffer) Contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

// Tail is the last n lines logged.
func (l *LogBuffer) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
