package broker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
)

// seamConfig: an append channel (events/#), broadcast everywhere else, on a
// memory provider, with room enough in limits.session_queue_bytes for a
// thousand unacknowledged broadcast deliveries.
const seamConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    session_queue_bytes: 16MiB
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
channels:
  events:
    type: append
    filter: "events/#"
`

func startSeamBroker(t *testing.T) *brokertest.Broker {
	t.Helper()
	return brokertest.Start(t, brokertest.Config(t, t.TempDir(), seamConfig))
}

// The client and the server number their exchanges independently (MQTT 5
// §2.2.1): a packet identifier the broker gave a delivery says nothing about
// the client's own PUBLISH under the same number. The substrate kept both
// directions in one table, so a client PUBLISH whose id was an outbound
// delivery's deleted that delivery's entry: a broadcast delivery the
// session was owed was then never resent after a reconnect (MQTT-4.4.0-1).
func TestSubstrateTable_InboundPublishKeepsTheOutboundDelivery(t *testing.T) {
	b := startSeamBroker(t)
	sub, _ := dialMx(t, b.Address(), "tbl-sub", mxConnect{clean: true, expiry: 3600, receiveMaximum: 10})
	sub.subscribe(1, "news/#", 1)
	pub, _ := dialMx(t, b.Address(), "tbl-pub", mxConnect{clean: true})
	pub.publish1(1, "news/a", "owed", packets.Properties{})
	d := sub.nextPublish("the broadcast delivery")
	// Unacknowledged; the client's own QoS 1 PUBLISH takes the same number.
	sub.publish1(d.PacketID, "elsewhere/x", "mine", packets.Properties{})
	sub.drop()

	again, ack := dialMx(t, b.Address(), "tbl-sub", mxConnect{expiry: 3600, receiveMaximum: 10})
	if !ack.SessionPresent {
		t.Fatal("the session did not carry over: CONNACK Session Present 0")
	}
	pk := again.nextPublish("the unacknowledged delivery, sent again")
	if string(pk.Payload) != "owed" || pk.PacketID != d.PacketID || !pk.FixedHeader.Dup {
		t.Fatalf("after the reconnect: %q id %d DUP %v; want %q sent again as id %d with DUP",
			pk.Payload, pk.PacketID, pk.FixedHeader.Dup, "owed", d.PacketID)
	}
}

// The same collision on a channel delivery emptied the slot the client's
// Receive Maximum counts: with a window of one, a second record was written
// while the first was unacknowledged (MQTT-3.3.4-9).
func TestSubstrateTable_InboundPublishDoesNotOpenTheWindow(t *testing.T) {
	b := startSeamBroker(t)
	pub, _ := dialMx(t, b.Address(), "win-pub", mxConnect{clean: true})
	pub.publish1(1, "events/a", "r1", packets.Properties{})
	pub.publish1(2, "events/a", "r2", packets.Properties{})
	sub, _ := dialMx(t, b.Address(), "win-sub", mxConnect{clean: true, receiveMaximum: 1})
	sub.subscribe(1, "events/#", 1)
	first := sub.nextPublish("the first record")
	if string(first.Payload) != "r1" {
		t.Fatalf("first delivery %q, want r1", first.Payload)
	}
	sub.publish1(first.PacketID, "elsewhere/x", "mine", packets.Properties{})
	sub.quiet(500*time.Millisecond, "Receive Maximum 1 with r1 unacknowledged")
	sub.puback(first.PacketID)
	if pk := sub.nextPublish("the second record, once r1 is acknowledged"); string(pk.Payload) != "r2" {
		t.Fatalf("second delivery %q, want r2", pk.Payload)
	}
}

// A SUBSCRIBE or UNSUBSCRIBE whose packet identifier is an outbound
// delivery's is answered as any other: the identifier is the client's own,
// not in use (MQTT 5 §2.2.1). The substrate answered every filter 0x91
// Packet Identifier in use — and still ran the unsubscribe hook, so the
// broker let go of the filter while the substrate kept it.
func TestSubstrateTable_SubscribeAndUnsubscribeKeepTheirOwnPacketIDs(t *testing.T) {
	b := startSeamBroker(t)
	sub, _ := dialMx(t, b.Address(), "sub-ids", mxConnect{clean: true, receiveMaximum: 10})
	sub.subscribe(1, "news/#", 1)
	pub, _ := dialMx(t, b.Address(), "sub-pub", mxConnect{clean: true})
	pub.publish1(1, "news/a", "held", packets.Properties{})
	d := sub.nextPublish("the broadcast delivery")

	sub.subscribe(d.PacketID, "more/#", 1) // fails unless SUBACK grants QoS 1 under the same id
	sub.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe, Qos: 1}, ProtocolVersion: 5,
		PacketID: d.PacketID, Filters: packets.Subscriptions{{Filter: "more/#"}}}, (*packets.Packet).UnsubscribeEncode)
	ua := sub.expect(packets.Unsuback, "UNSUBACK")
	if ua.PacketID != d.PacketID || len(ua.ReasonCodes) != 1 || ua.ReasonCodes[0] != 0 {
		t.Fatalf("UNSUBSCRIBE under id %d answered id %d codes %v; want 0x00", d.PacketID, ua.PacketID, ua.ReasonCodes)
	}
}

// The substrate counted the broker's own QoS 2 deliveries against the
// client's inbound allowance: each PUBREC the client sent for one took a
// slot of the Receive Maximum the broker gave it, and only the
// PUBCOMP gave it back. A client holding that many outbound exchanges at
// PUBREL — which is the client's right, up to its own Receive Maximum — had
// its next PUBLISH refused, DISCONNECT 0x93 Receive Maximum exceeded, with
// no publish of its own in flight.
func TestSubstrateTable_OutboundQoS2SpendsNoneOfTheClientsReceiveQuota(t *testing.T) {
	n := broker.ReceiveMaximum // what the broker's CONNACK gives
	b := startSeamBroker(t)
	sub, ack := dialMx(t, b.Address(), "q2-sub", mxConnect{clean: true, receiveMaximum: 4096})
	if int(ack.Properties.ReceiveMaximum) != n {
		t.Fatalf("CONNACK Receive Maximum %d; want %d", ack.Properties.ReceiveMaximum, n)
	}
	sub.subscribe(1, "news/#", 2)
	pub, _ := dialMx(t, b.Address(), "q2-pub", mxConnect{clean: true})
	for i := 0; i < n; i++ {
		id := uint16(i%60000 + 1)
		pub.publish(id, 2, "news/a", []byte(fmt.Sprintf("m%d", i)), packets.Properties{})
		pub.expect(packets.Pubrec, "PUBREC")
		pub.pubrel(id)
		pub.expect(packets.Pubcomp, "PUBCOMP")
		d := sub.nextPublish("a QoS 2 delivery")
		sub.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, ProtocolVersion: 5, PacketID: d.PacketID},
			(*packets.Packet).PubrecEncode)
		if rel := sub.expect(packets.Pubrel, "PUBREL"); rel.PacketID != d.PacketID || rel.ReasonCode != 0 {
			t.Fatalf("PUBREC for %d answered PUBREL %d 0x%02x", d.PacketID, rel.PacketID, rel.ReasonCode)
		}
	}
	// Every delivery now waits for its PUBCOMP; the client has nothing of
	// its own in flight.
	sub.publish1(1, "elsewhere/x", "mine", packets.Properties{})
}

// Invariant 18 for an outbound QoS 2 exchange: the PUBREL that answers a
// PUBREC tells the client its copy is the one (it may deliver it and forget
// the packet identifier at the PUBCOMP, MQTT 5 §4.3.3). So after a crash a
// durable session is sent that PUBREL again, never the message: a client
// that had completed the exchange would take a second PUBLISH under the
// same identifier as a new message, and deliver it twice (rfcs/broadcast-log.md: QoS 2: its PUBREL, never a 2nd message). The window recording the
// PUBREC is stored before the PUBREL is written; the substrate wrote the
// PUBREL at once and the window caught up within ack_commit_interval, so a
// crash in between resent the message.
func TestInvariant18_PubrelOwedComesBackAfterACrash(t *testing.T) {
	cfg := strings.Replace(matrixConfig(sqliteProvider), "broker:\n  id: test\n",
		"broker:\n  id: test\n  session:\n    ack_commit_interval: 1s\n", 1)
	if !strings.Contains(cfg, "ack_commit_interval") {
		t.Fatal("configuration template changed: no place for broker.session")
	}
	p := brokertest.StartProcess(t, brokertest.Config(t, t.TempDir(), cfg))
	sub, _ := dialMx(t, p.Address(), "rel-sub", mxConnect{clean: true, expiry: 3600})
	sub.subscribe(1, "news/#", 2)
	pub, _ := dialMx(t, p.Address(), "rel-pub", mxConnect{clean: true})
	pub.publish(1, 2, "news/a", []byte("once"), packets.Properties{})
	pub.expect(packets.Pubrec, "PUBREC")
	pub.pubrel(1)
	pub.expect(packets.Pubcomp, "PUBCOMP")
	d := sub.nextPublish("the QoS 2 delivery")
	if d.FixedHeader.Qos != 2 {
		t.Fatalf("delivered at QoS %d, want 2", d.FixedHeader.Qos)
	}
	sub.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, ProtocolVersion: 5, PacketID: d.PacketID},
		(*packets.Packet).PubrecEncode)
	sub.expect(packets.Pubrel, "PUBREL")
	p.Kill()

	p.Restart()
	again, ack := dialMx(t, p.Address(), "rel-sub", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the durable session did not come back: CONNACK Session Present 0")
	}
	pk := again.read(mxWait)
	if pk.FixedHeader.Type != packets.Pubrel || pk.PacketID != d.PacketID {
		t.Fatalf("after the crash: packet type %d id %d payload %q; want the PUBREL owed for %d, never the message again",
			pk.FixedHeader.Type, pk.PacketID, pk.Payload, d.PacketID)
	}
	again.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, ProtocolVersion: 5, PacketID: d.PacketID},
		(*packets.Packet).PubcompEncode)
	again.quiet(300*time.Millisecond, "the exchange is complete")
}
