package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// retainedRestConfig is a broker whose sessions may be owed at most
// {{.Queue}} (limits.session_queue_bytes).
const retainedRestConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 4KiB
    session_queue_bytes: %s
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: "{{.Dir}}/snap"
channels:
  events:
    type: append
    filter: "events/#"
`

// retainValues starts a broker and stores n retained QoS 1 values under
// fleet/, each payloadBytes long.
func retainValues(t *testing.T, queue string, n, payloadBytes int) *brokertest.Broker {
	t.Helper()
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fmt.Sprintf(retainedRestConfig, queue)))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	for i := range n {
		payload := fmt.Sprintf("%-*s", payloadBytes, fmt.Sprint("value ", i))
		if code := retainPublish(t, pub, fmt.Sprint("fleet/", i), []byte(payload), 0); code != 0 {
			t.Fatalf("retained publish %d: 0x%02x", i, code)
		}
	}
	return b
}

// dialRawReceiveMaximum connects an MQTT 5 client that takes at most rm
// unacknowledged QoS 1/2 PUBLISHes and acknowledges only what the test
// tells it to.
func dialRawReceiveMaximum(t *testing.T, addr, id string, rm uint16) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, r := dialRawMQTT5With(t, addr, id, packets.Properties{ReceiveMaximum: rm})
	var buf bytes.Buffer
	sub := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: "fleet/#", Qos: 1}}}
	if err := sub.SubscribeEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	if got, err := brokertest.ReadPacket(r, 5); err != nil || got.FixedHeader.Type != packets.Suback {
		t.Fatalf("waiting for the SUBACK: got %+v, %v", got.FixedHeader, err)
	}
	return conn, r
}

func readRetainedPublish(t *testing.T, conn net.Conn, r *bufio.Reader) packets.Packet {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	pk, err := brokertest.ReadPacket(r, 5)
	if err != nil || pk.FixedHeader.Type != packets.Publish || !pk.FixedHeader.Retain {
		t.Fatalf("waiting for a retained PUBLISH: %+v, %v", pk.FixedHeader, err)
	}
	return pk
}

func puback(t *testing.T, conn net.Conn, id uint16) {
	t.Helper()
	var buf bytes.Buffer
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: id}
	if err := ack.PubackEncode(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

func quietFor(t *testing.T, conn net.Conn, r *bufio.Reader, d time.Duration) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	if pk, err := brokertest.ReadPacket(r, 5); err == nil {
		t.Fatalf("expected nothing more, got packet type %d (%q)", pk.FixedHeader.Type, pk.Payload)
	}
}

// waitNoRetainedRest fails with msg unless every retained rest's goroutine
// ends within wait.
func waitNoRetainedRest(t *testing.T, msg string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for retainedRestRunning() {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func retainedRestRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*retainedRest).run")
}

// invariant 13 (MQTT-4.9.0-2): a subscriber whose Receive Maximum is 2 is
// sent a new subscription's 10 retained QoS 1 values never more than 2
// unacknowledged at a time, and all 10 of them, each once, in the order of
// the pass, as its PUBACKs free room. Before, the values past the first two
// were not sent.
func TestInvariant13_RetainedPassPastTheReceiveMaximumWaitsForRoom(t *testing.T) {
	const n = 10
	b := retainValues(t, "1MiB", n, 16)
	conn, r := dialRawReceiveMaximum(t, b.Address(), "narrow", 2)
	seen := map[string]bool{}
	for len(seen) < n {
		var unacked []uint16
		for len(unacked) < 2 && len(seen) < n {
			pk := readRetainedPublish(t, conn, r)
			if seen[pk.TopicName] {
				t.Fatalf("%s sent twice (packet id %d), after %d values", pk.TopicName, pk.PacketID, len(seen))
			}
			seen[pk.TopicName] = true
			unacked = append(unacked, pk.PacketID)
		}
		if len(seen) < n {
			// Two unacknowledged: the broker must send nothing more now.
			quietFor(t, conn, r, 100*time.Millisecond)
		}
		for _, id := range unacked {
			puback(t, conn, id)
		}
	}
	for i := range n {
		if !seen[fmt.Sprint("fleet/", i)] {
			t.Fatalf("fleet/%d was never sent; got %v", i, seen)
		}
	}
	quietFor(t, conn, r, 200*time.Millisecond)
	waitNoRetainedRest(t, "every retained value was sent, but the goroutine that waited for room still runs")
}

// A subscriber that never acknowledges holds a waiting rest; its
// connection's end ends the goroutine (session.stopPumps), and nothing is
// sent to a later connection of another client.
func TestRetainedRestEndsWithItsConnection(t *testing.T) {
	b := retainValues(t, "1MiB", 5, 16)
	conn, r := dialRawReceiveMaximum(t, b.Address(), "deaf", 1)
	readRetainedPublish(t, conn, r)
	quietFor(t, conn, r, 100*time.Millisecond)
	if !retainedRestRunning() {
		t.Fatal("no goroutine holds the 4 values waiting for room")
	}
	_ = conn.Close()
	waitNoRetainedRest(t, "the connection ended, but its retained rest still waits")
}

// invariant 13: what waits for room is bounded by limits.session_queue_bytes.
// 10 values of 1 KiB do not fit 4 KiB: the subscriber with Receive Maximum 1
// gets the first, and after its PUBACK nothing more; the subscription stands
// (a later retained publish reaches it live), and a subscriber with room
// gets all ten.
func TestInvariant13_RetainedRestBoundedBySessionQueueBytes(t *testing.T) {
	b := retainValues(t, "4KiB", 10, 1024)
	conn, r := dialRawReceiveMaximum(t, b.Address(), "narrow", 1)
	first := readRetainedPublish(t, conn, r)
	puback(t, conn, first.PacketID)
	quietFor(t, conn, r, 300*time.Millisecond)
	if retainedRestRunning() {
		t.Fatal("a rest over session_queue_bytes was kept")
	}

	pub := brokertest.Connect(t, b.Address(), "pub2", brokertest.ClientOptions{CleanStart: true})
	if code := retainPublish(t, pub, "fleet/live", []byte("live"), 0); code != 0 {
		t.Fatalf("retained publish: 0x%02x", code)
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	live, err := brokertest.ReadPacket(r, 5)
	if err != nil || live.FixedHeader.Type != packets.Publish || string(live.Payload) != "live" {
		t.Fatalf("the subscription does not stand: %+v %q, %v", live.FixedHeader, live.Payload, err)
	}

	wide := brokertest.Connect(t, b.Address(), "wide", brokertest.ClientOptions{CleanStart: true})
	wide.Subscribe("fleet/#", 1)
	got := map[string]bool{}
	for len(got) < 11 {
		p := wide.Next(wait)
		got[p.Topic] = true
	}
}

// A stock client: mosquitto_sub connecting with Receive Maximum 1 is sent
// all 20 retained values of its subscription, one at a time, each once.
func TestMosquittoSubWithReceiveMaximumOneGetsEveryRetainedValue(t *testing.T) {
	if _, err := exec.LookPath("mosquitto_sub"); err != nil {
		t.Fatal("mosquitto_sub is not installed (Debian package mosquitto-clients; .ci/run installs it)")
	}
	const n = 20
	b := retainValues(t, "1MiB", n, 16)
	host, port, _ := strings.Cut(b.Address(), ":")
	out, err := exec.Command("mosquitto_sub", "-h", host, "-p", port, "-V", "5", "-q", "1", "-i", "narrow-mosq",
		"-D", "connect", "receive-maximum", "1", "-t", "fleet/#", "-C", fmt.Sprint(n), "-W", "20", "-F", "%t %r").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		topic, retained, _ := strings.Cut(l, " ")
		if retained != "1" {
			t.Fatalf("%q: not a retained value", l)
		}
		if got[topic] {
			t.Fatalf("%s sent twice:\n%s", topic, out)
		}
		got[topic] = true
	}
	for i := range n {
		if !got[fmt.Sprint("fleet/", i)] {
			t.Fatalf("fleet/%d never came:\n%s", i, out)
		}
	}
}
