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

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// The connection writer seen from a client (broker/conn_writer.go): what a
// publisher with several QoS 1 publishes in flight is answered, and in how
// many socket writes.

// publishes encodes n QoS 1 PUBLISHes to topic, packet ids 1..n, one after
// another: what a client with n in flight sends in one write.
func publishes(t *testing.T, topic string, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i := 1; i <= n; i++ {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
			TopicName: topic, PacketID: uint16(i), Payload: []byte("m")}
		if err := pk.PublishEncode(&buf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// readPubacks reads n PUBACKs and checks they acknowledge ids 1..n, in
// order, with success.
func readPubacks(t *testing.T, r *bufio.Reader, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		pk, err := brokertest.ReadPacket(r, 5)
		if err != nil {
			t.Fatalf("PUBACK %d: %v", i, err)
		}
		if pk.FixedHeader.Type != packets.Puback || pk.PacketID != uint16(i) || pk.ReasonCode != 0 {
			t.Fatalf("answer %d: type %d id %d code %#x, want PUBACK %d 0x00", i, pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, i)
		}
	}
}

// A publisher that sends 32 QoS 1 publishes together gets the 32 PUBACKs in
// a few socket writes, not one each — broadcast, and append (whose PUBACK
// waits for its record to be stored), in order.
func TestPubacksToAPipelinedPublisherLeaveTogether(t *testing.T) {
	const n = 32
	for _, tc := range []struct{ name, topic string }{{"broadcast", "status/x"}, {"append on memory", "events/x"}} {
		t.Run(tc.name, func(t *testing.T) {
			// The fake clock never moves: no answer is let go for having
			// been held corkLinger, so the count depends on nothing timed.
			b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig),
				brokertest.WithClock(clock.NewFake(time.Unix(1_700_000_000, 0))))
			conn, r := dialRawMQTT5(t, b.Address(), "pipelined")
			before := b.WriterStats()
			if _, err := conn.Write(publishes(t, tc.topic, n)); err != nil {
				t.Fatal(err)
			}
			readPubacks(t, r, n)
			after := b.WriterStats()
			// One read of the socket normally brings all 32; allow that the
			// kernel handed them over in a few.
			got := after.SocketWrites - before.SocketWrites
			t.Logf("%d PUBACKs: %d Writes, %d socket writes, %d held", n, after.Writes-before.Writes, got, after.Corked-before.Corked)
			if got > 4 {
				t.Fatalf("%d PUBACKs left in %d socket writes (Writes %d), want at most 4",
					n, got, after.Writes-before.Writes)
			}
		})
	}
}

// Answers held while the client's next packets were read still reach it
// when the next packet ends the connection: its DISCONNECT, or a packet the
// door refuses.
func TestHeldAnswersLeaveBeforeTheConnectionEnds(t *testing.T) {
	const n = 8
	for _, tc := range []struct {
		name string
		last []byte
	}{
		{"client DISCONNECT", []byte{0xE0, 0}},
		{"refused packet", []byte{0x36, 0}}, // a PUBLISH at QoS 3: malformed
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), fanoutConfig),
				brokertest.WithClock(clock.NewFake(time.Unix(1_700_000_000, 0))))
			conn, r := dialRawMQTT5(t, b.Address(), "ending")
			if _, err := conn.Write(append(publishes(t, "status/x", n), tc.last...)); err != nil {
				t.Fatal(err)
			}
			readPubacks(t, r, n)
			for {
				pk, err := brokertest.ReadPacket(r, 5)
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatal("the connection was not closed")
					}
					return // reset: closed
				}
				if pk.FixedHeader.Type != packets.Disconnect {
					t.Fatalf("after the PUBACKs: packet type %d", pk.FixedHeader.Type)
				}
			}
		})
	}
}
