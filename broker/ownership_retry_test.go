package broker_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// ownershipWire is one MQTT 5 connection driven packet by packet, for packets
// RawClient has no method for (a DISCONNECT carrying properties).
type ownershipWire struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialOwnershipWire(t *testing.T, addr string, connect packets.Packet) (*ownershipWire, packets.Packet) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w := &ownershipWire{t: t, conn: conn, r: bufio.NewReader(conn)}
	connect.FixedHeader.Type = packets.Connect
	connect.ProtocolVersion = 5
	connect.Connect.ProtocolName = []byte("MQTT")
	connect.Connect.Keepalive = 60
	w.write(connect, (*packets.Packet).ConnectEncode)
	return w, w.read()
}

func (w *ownershipWire) write(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
	w.t.Helper()
	var buf bytes.Buffer
	if err := enc(&pk, &buf); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.conn.Write(buf.Bytes()); err != nil {
		w.t.Fatal(err)
	}
}

func (w *ownershipWire) read() packets.Packet {
	w.t.Helper()
	_ = w.conn.SetReadDeadline(time.Now().Add(wait))
	pk, err := brokertest.ReadPacket(w.r, 5)
	if err != nil {
		w.t.Fatalf("read: %v", err)
	}
	return pk
}

// disconnect sends DISCONNECT 0x00 with a new Session Expiry Interval and
// waits for the close that answers it.
func (w *ownershipWire) disconnect(expiry uint32) {
	w.t.Helper()
	w.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5,
		Properties: packets.Properties{SessionExpiryInterval: expiry, SessionExpiryIntervalFlag: true}},
		(*packets.Packet).DisconnectEncode)
	_ = w.conn.SetReadDeadline(time.Now().Add(wait))
	for {
		if _, err := brokertest.ReadPacket(w.r, 5); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				w.t.Fatal("the broker did not close the connection after DISCONNECT")
			}
			if !errors.Is(err, io.EOF) {
				w.t.Logf("after DISCONNECT: %v", err)
			}
			return
		}
	}
}

// tickUntilLogged advances the clock a second at a time until the broker
// logs s (fails after wait).
func tickUntilLogged(t *testing.T, b *brokertest.Broker, clk *clock.Fake, s string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !b.Log.Contains(s) {
		if time.Now().After(deadline) {
			t.Fatalf("never logged %q", s)
		}
		clk.Advance(time.Second)
		time.Sleep(10 * time.Millisecond)
	}
}

// Invariant 18, second exception: a clean DISCONNECT whose writes the
// session store refuses is answered with the close all the same; what it
// asked (its Will withdrawn, a shorter expiry) is kept in memory, the log
// names the client, and the record is written again every second until it
// lands — proved by a restart that finds the shorter expiry passed.
func TestInvariant18_RefusedDisconnectWritesAreKeptAndRetried(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	fault := broker.InjectSessionStoreFault(b.Broker)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)

	dev, ack := dialOwnershipWire(t, b.Address(), willConnect("dev", "status/dev", 0, 600))
	if ack.ReasonCode != 0 {
		t.Fatalf("CONNACK 0x%02x", ack.ReasonCode)
	}
	fault.Set(true)
	dev.disconnect(5) // closed although nothing could be stored
	if !b.Log.Contains("the session store refused a session write") || !b.Log.Contains("client=dev at=DISCONNECT") {
		t.Fatalf("the refused DISCONNECT write is not logged naming the client:\n%s", b.Log.Tail(20))
	}
	// Kept in memory: the withdrawn Will is not published.
	watch.Quiet(200 * time.Millisecond)

	tickUntilLogged(t, b, clk, "the session store still refuses a session write")
	if b.Log.Contains("session write landed") {
		t.Fatal("a write landed while the store refused it")
	}
	fault.Set(false)
	tickUntilLogged(t, b, clk, "session write landed after the store refused it")

	// The stored record now holds the DISCONNECT's 5 s expiry: after a
	// restart 10 s later, the session is gone (with the 600 s it had
	// before, it would be resumed) and its Will, withdrawn, is never
	// published.
	clk.Advance(10 * time.Second)
	b.Restart()
	watch = brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)
	if _, ack := brokertest.DialConnect(t, b.Address(), v5Connect("dev", false, 600)); ack.SessionPresent {
		t.Fatal("the session resumed: the DISCONNECT's expiry never reached the store")
	}
	watch.Quiet(200 * time.Millisecond)
}

// Invariant 18: a CONNACK tells a client its session is kept only once the
// store holds it. With the session store refusing writes, a CONNECT for a
// session that outlives its connection is refused 0x83 (3.1.1: 0x03) and
// closed; one whose session ends with its connection stores nothing and is
// accepted; once the store takes writes again the same CONNECT is accepted.
// The refused CONNECT's Will is never armed.
func TestInvariant18_ConnackRefusedWhenTheSessionIsNotStored(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	fault := broker.InjectSessionStoreFault(b.Broker)
	watch := brokertest.Connect(t, b.Address(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)
	fault.Set(true)

	c, ack := brokertest.DialConnect(t, b.Address(), willConnect("dev", "status/dev", 0, 600))
	if ack.ReasonCode != 0x83 || ack.SessionPresent {
		t.Fatalf("CONNECT with the session store refusing: CONNACK 0x%02x (Session Present %v), want 0x83",
			ack.ReasonCode, ack.SessionPresent)
	}
	if pk, err := c.ReadWithin(wait); err == nil {
		t.Fatalf("a refused connection was sent %v", pk.FixedHeader.Type)
	}
	// The refused CONNECT armed no Will: its close publishes nothing.
	watch.Quiet(200 * time.Millisecond)
	if _, ack := brokertest.DialConnect(t, b.Address(), v311Connect("old", false)); ack.ReasonCode != 0x03 {
		t.Fatalf("3.1.1 CONNECT with the session store refusing: CONNACK 0x%02x, want 0x03", ack.ReasonCode)
	}
	if _, ack := brokertest.DialConnect(t, b.Address(), v5Connect("brief", true, 0)); ack.ReasonCode != 0 {
		t.Fatalf("a session ending with its connection stores nothing, yet CONNACK 0x%02x", ack.ReasonCode)
	}

	fault.Set(false)
	if _, ack := brokertest.DialConnect(t, b.Address(), v5Connect("dev", true, 600)); ack.ReasonCode != 0 {
		t.Fatalf("CONNECT with the store back: CONNACK 0x%02x", ack.ReasonCode)
	}
}

// The session store without room (docs/security.md "Every refusal, and its code"): a CONNECT with a
// Will is refused 0x97 (3.1.1: 0x05); one without is accepted with Session
// Expiry 0 — a session that ends with its connection, which needs no record
// — and a later CONNECT finds nothing to resume.
func TestInvariant18_SessionStoreWithoutRoom(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, configWith(t, sqliteProvider), brokertest.WithClock(clk))
	fault := broker.InjectSessionStoreFault(b.Broker)
	fault.SetFull(true)
	fault.Set(true)

	if _, ack := brokertest.DialConnect(t, b.Address(), willConnect("dev", "status/dev", 0, 600)); ack.ReasonCode != 0x97 {
		t.Fatalf("CONNECT with a Will and no room: CONNACK 0x%02x, want 0x97", ack.ReasonCode)
	}
	v3 := willConnect("old", "status/old", 0, 0)
	v3.ProtocolVersion, v3.Properties, v3.Connect.WillProperties, v3.Connect.Clean = 4, packets.Properties{}, packets.Properties{}, false
	if _, ack := brokertest.DialConnect(t, b.Address(), v3); ack.ReasonCode != 0x05 {
		t.Fatalf("3.1.1 CONNECT with a Will and no room: CONNACK 0x%02x, want 0x05", ack.ReasonCode)
	}

	c, ack := brokertest.DialConnect(t, b.Address(), v5Connect("plain", true, 600))
	if ack.ReasonCode != 0 || !ack.Properties.SessionExpiryIntervalFlag || ack.Properties.SessionExpiryInterval != 0 {
		t.Fatalf("CONNECT without a Will and no room: CONNACK 0x%02x Session Expiry %v/%d, want 0x00 with Session Expiry 0",
			ack.ReasonCode, ack.Properties.SessionExpiryIntervalFlag, ack.Properties.SessionExpiryInterval)
	}
	c.Disconnect()
	fault.Set(false)
	if _, ack := brokertest.DialConnect(t, b.Address(), v5Connect("plain", false, 600)); ack.SessionPresent {
		t.Fatal("a session accepted with Session Expiry 0 outlived its connection")
	}
}
