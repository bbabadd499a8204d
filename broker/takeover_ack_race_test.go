package broker

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/config"
)

// The chaos run 06-memory-seed4005 (takeover-replay, invariant 17): tk-2's
// connection 5118 was reset and 5123 resumed the session within a
// millisecond. 5123 was served offsets 2742..2852 and acknowledged every
// one, yet the connection that took it over next was served 2742 again: the
// broker never credited the PUBACK of 2742. The end of 5118 had passed its
// owner check (the session was still 5118's) and, not holding the id's
// claim, went on — while 5123's CONNECT claimed the session and its pump
// took a packet id for 2742 — to stopPumps, which replaced the session's
// packet-id table: 5123's PUBACK for 2742 found no entry and was ignored,
// and the consumer's position stayed at 2742.
//
// Deterministic: the test holds the consumer's lock, at which the old
// connection's end waits inside stopPumps once past its owner check; a
// CONNECT that can claim the id at that point runs its takeover to the end
// before the old connection's end goes on.
func TestInvariant17_OldConnectionEndKeepsTheNewOwnersAcks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "saguin.yaml")
	if err := os.WriteFile(path, []byte(bcastInternalConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.restoreSession("tk", storedSession{Format: sessionFormat, Protocol: 5, Expiry: 3600,
		Subscriptions: []storedSubscribe{{Filter: "events/#", QoS: 1}}}, time.Hour, time.Hour)
	s := b.sessionOf("tk")
	if s == nil || s.consumers["events"] == nil {
		t.Fatal("restored session has no consumer of events")
	}
	c := s.consumers["events"]
	oldConn := b.mqtt.NewClient(nil, "tcp", "tk", false)
	newConn := b.mqtt.NewClient(nil, "tcp", "tk", false)
	oldConn.Properties.ProtocolVersion, newConn.Properties.ProtocolVersion = 5, 5
	s.mu.Lock()
	s.cl, s.lastSeen = oldConn, time.Time{}
	s.mu.Unlock()

	const pid, off = 7, 5
	c.mu.Lock()
	// What the new connection's pump will have out: offset 5 under packet
	// id 7 (the pump is not run: its stop is what the old end waits on).
	c.inflight = map[uint64]struct{}{off: {}}
	c.next = off + 1
	era := c.era

	ended := make(chan struct{})
	go func() {
		defer close(ended)
		b.connectionEnded(oldConn, false)
	}()
	// The old connection's end has passed its owner check once it let go
	// of the session; it then waits for c.mu in stopPumps.
	for s.owner() != nil {
		runtime.Gosched()
	}
	b.claims.mu.Lock()
	idc := b.claims.m["tk"]
	claimed := idc != nil && idc.holder != nil
	b.claims.mu.Unlock()

	tookOver := make(chan struct{})
	go func() {
		defer close(tookOver)
		// The takeover's part (claimSession, OnSessionEstablished and the
		// pump's delivery), under the id's claim as a CONNECT holds it.
		b.claims.acquire("tk", newConn)
		defer b.claims.release("tk", newConn)
		s.mu.Lock()
		s.cl, s.lastSeen = newConn, time.Time{}
		s.mu.Unlock()
		s.deliv.mu.Lock()
		s.deliv.cl = newConn
		s.deliv.table[pid] = &exchange{target: consumerAck{c, era, off}, route: routeAppend, qos: 1}
		s.deliv.mu.Unlock()
	}()
	if !claimed {
		// Nothing keeps the CONNECT out: it completes while the old end
		// is still under way.
		<-tookOver
	}
	c.mu.Unlock()
	<-ended
	<-tookOver

	if s.owner() != newConn {
		t.Fatal("the new connection does not own the session")
	}
	s.deliv.mu.Lock()
	_, held := s.deliv.table[pid]
	s.deliv.mu.Unlock()
	if !held {
		t.Fatalf("the new owner's delivery under packet id %d (offset %d) left the session's deliveries: the old connection's end dropped it", pid, off)
	}
	s.deliv.ack(b, s, newConn, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pid})
	c.mu.Lock()
	pos := c.positionLocked()
	c.mu.Unlock()
	if pos != off+1 {
		t.Fatalf("position %d after the PUBACK of offset %d; want %d (the next takeover is served %d again)", pos, off, off+1, pos)
	}
}
