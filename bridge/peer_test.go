package bridge

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/bridge/bridgetest"
)

// publisher is a stock MQTT 5 client publishing at the peer.
type publisher struct {
	t   *testing.T
	cli *paho.Client
}

func newPublisher(t *testing.T, p *bridgetest.Mosquitto, id string) *publisher {
	t.Helper()
	conn, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
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
