package broker_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
)

// goroutinesConfig: every kind of delivery goroutine — append and latest
// pumps, queue offers, broadcast senders — on a sqlite provider (its writer
// and readers are goroutines too), and a write_timeout long enough that
// only the broker's own stop can cut a write blocked on a deaf client.
const goroutinesConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  operations:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    write_timeout: 5m
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  events:
    type: append
    filter: "events/#"
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
`

// settledGoroutines waits until no more than want goroutines run, and
// returns how many do: goroutines that are ending (the substrate's event
// loop and each connection's write loop, which nothing waits for) are
// given until the deadline, counted each time the scheduler has run.
func settledGoroutines(want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	n := runtime.NumGoroutine()
	for n > want && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(5 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// Item 4 of Step 8: every goroutine the broker starts has an owner and has
// stopped once Close returns. With clients connected, consumers of each
// channel type serving them, queue workers holding jobs, a shared group's
// members, a broadcast subscriber owed messages and a deaf one whose
// sender is blocked in a write, Close leaves no goroutine of the broker's
// running: the count comes back to what it was before New.
func TestCloseStopsEveryGoroutineTheBrokerStarted(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Load(brokertest.Config(t, dir, goroutinesConfig))
	if err != nil {
		t.Fatal(err)
	}
	before := settledGoroutines(0, 0)
	b, err := broker.New(cfg, broker.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = b.Close()
		}
	})
	addr := b.Addr().String()

	pub, _ := dialMx(t, addr, "g-pub", mxConnect{clean: true})
	for i := 1; i <= 3; i++ {
		pub.publish1(uint16(i), "events/a", fmt.Sprintf("e%d", i), packets.Properties{})
		pub.publish1(uint16(10+i), "state/s"+fmt.Sprint(i), "v", packets.Properties{})
		pub.publish1(uint16(20+i), "jobs/x", fmt.Sprintf("j%d", i), packets.Properties{})
	}
	reader, _ := dialMx(t, addr, "g-reader", mxConnect{clean: true, expiry: 3600, receiveMaximum: 1})
	reader.subscribe(1, "events/#", 1)
	reader.nextPublish("an append record, left unacknowledged")
	watcher, _ := dialMx(t, addr, "g-watcher", mxConnect{clean: true, receiveMaximum: 1})
	watcher.subscribe(1, "state/#", 1)
	watcher.nextPublish("a latest value, left unacknowledged")
	for _, id := range []string{"g-w1", "g-w2"} {
		w, _ := dialMx(t, addr, id, mxConnect{clean: true})
		w.subscribe(1, "$saguin/queue/jobs", 1)
		w.nextPublish("a job, held")
	}
	for _, id := range []string{"g-m1", "g-m2"} {
		m, _ := dialMx(t, addr, id, mxConnect{clean: true, expiry: 3600})
		m.subscribe(1, "$share/g/news/#", 1)
	}
	listener, _ := dialMx(t, addr, "g-listener", mxConnect{clean: true, expiry: 3600, receiveMaximum: 2})
	listener.subscribe(1, "news/#", 1)
	deaf := dialDeaf(t, addr, "g-deaf", 0)
	defer deaf.Close()
	payload := bytes.Repeat([]byte("x"), 4096)
	for i := 0; i < 400; i++ {
		// QoS 0 on the wire to the deaf client until its socket's buffers
		// are full and its sender waits in a write; QoS 1 to the others.
		pub.publish(0, 0, "status/x", payload, packets.Properties{})
	}
	for i := 1; i <= 4; i++ {
		pub.publish1(uint16(30+i), "news/a", fmt.Sprintf("n%d", i), packets.Properties{})
	}
	listener.nextPublish("a broadcast delivery, left unacknowledged")
	// The operations listener: a kept-alive connection idle after its
	// answers, and one that has sent half a request.
	opsAddr := b.OperationsAddr("tcp").String()
	keep := &http.Client{Transport: &http.Transport{}}
	defer keep.CloseIdleConnections()
	for _, path := range []string{"/health", "/v1/operations/sessions", "/v1/operations/consumers"} {
		resp, err := keep.Get("http://" + opsAddr + path)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v", path, err, resp)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	half, err := net.Dial("tcp", opsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	if _, err := half.Write([]byte("GET /v1/operations/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n")); err != nil {
		t.Fatal(err)
	}
	during := runtime.NumGoroutine()

	// A Close that waits on a goroutine it does not stop would hang; the
	// test says so with every stack instead of waiting for its timeout.
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("close: %v", err)
		}
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Close did not return within 30s (write_timeout is 5m):\n%s", brokerStacks(string(buf[:runtime.Stack(buf, true)])))
	}
	closed = true
	// Sagüin's own goroutines have returned by now, not merely been told to:
	// none is left running any of its code or its storage's.
	buf := make([]byte, 1<<20)
	if ours := ownStacks(string(buf[:runtime.Stack(buf, true)])); ours != "" {
		t.Fatalf("goroutines of the broker still running when Close returned:\n%s", ours)
	}
	if after := settledGoroutines(before, 10*time.Second); after > before {
		stacks := string(buf[:runtime.Stack(buf, true)])
		t.Fatalf("%d goroutines before New, %d while serving, %d after Close; still running:\n%s",
			before, during, after, brokerStacks(stacks))
	}
}

// brokerStacks keeps the goroutines whose stack passes through the broker
// or its substrate (the test's own are left out).
func brokerStacks(all string) string {
	var out []string
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "saguin.dev/broker.") || strings.Contains(g, "mochi-mqtt") || strings.Contains(g, "saguin.dev/storage") ||
			strings.Contains(g, "saguin.dev/broker/internal/ops.") || strings.Contains(g, "net/http.(*conn).serve") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// ownStacks keeps the goroutines running the broker's or its storage's own
// code, the test's goroutine aside.
func ownStacks(all string) string {
	var out []string
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "saguin.dev/broker_test.") {
			continue
		}
		if strings.Contains(g, "saguin.dev/broker.") || strings.Contains(g, "saguin.dev/storage") ||
			strings.Contains(g, "saguin.dev/broker/internal/ops.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// Invariant 16: a takeover waiting on a write to the connection it replaces
// cuts that write, so it never waits for good. With write_timeout none and
// a client whose keep-alive bounds its writes only after 15 minutes, a
// sender blocked on the old connection of a deaf client held the CONNECT
// taking its session over — on the new connection's own goroutine — until
// the write ended.
func TestInvariant16_TakeoverCutsAWriteBlockedOnTheOldConnection(t *testing.T) {
	cfg := strings.Replace(goroutinesConfig, "write_timeout: 5m", "write_timeout: none", 1)
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), cfg))
	deaf := dialDeaf(t, b.Address(), "tk-deaf", 0)
	defer deaf.Close()
	pub, _ := dialMx(t, b.Address(), "tk-pub", mxConnect{clean: true})
	payload := bytes.Repeat([]byte("x"), 4096)
	// Until the deaf client's sender is blocked in a write: its outbox then
	// fills, and QoS 0 past it is dropped and counted.
	deadline := time.Now().Add(mxWait)
	for b.BroadcastStats().DroppedQoS0 == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the deaf client's sender never stopped draining its outbox")
		}
		pub.publish(0, 0, "status/x", payload, packets.Properties{})
	}
	again, ack := dialMx(t, b.Address(), "tk-deaf", mxConnect{clean: true})
	if ack.ReasonCode != 0 {
		t.Fatalf("the takeover's CONNACK refused 0x%02x", ack.ReasonCode)
	}
	again.subscribe(1, "status/#", 0)
}
