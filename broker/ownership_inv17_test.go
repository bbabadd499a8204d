package broker_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// varint is MQTT's Variable Byte Integer.
func varint(n int) []byte {
	var out []byte
	for {
		b := byte(n % 128)
		n /= 128
		if n > 0 {
			b |= 128
		}
		out = append(out, b)
		if n == 0 {
			return out
		}
	}
}

func mqttString(s []byte) []byte {
	return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...)
}

// rawConnect builds an MQTT 5 CONNECT byte by byte, so a test can send one
// no encoder would write: connect flags, CONNECT properties and Will
// properties as given; a Will topic and payload when flags set the Will.
func rawConnect(id string, flags byte, props, willProps []byte, willTopic string, willPayload []byte) []byte {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 5, flags, 0, 60}
	body = append(body, varint(len(props))...)
	body = append(body, props...)
	body = append(body, mqttString([]byte(id))...)
	if flags&0x04 != 0 {
		body = append(body, varint(len(willProps))...)
		body = append(body, willProps...)
		body = append(body, mqttString([]byte(willTopic))...)
		body = append(body, mqttString(willPayload)...)
	}
	return append(append([]byte{0x10}, varint(len(body))...), body...)
}

// overrunConnect is a CONNECT whose property length runs past the end of
// the packet.
func overrunConnect(id string) []byte {
	body := []byte{0, 4, 'M', 'Q', 'T', 'T', 5, 0x02, 0, 60, 100}
	body = append(body, expiryProp(600)...)
	body = append(body, mqttString([]byte(id))...)
	return append(append([]byte{0x10}, varint(len(body))...), body...)
}

// expiryProp is a Session Expiry Interval property of s seconds.
func expiryProp(s uint32) []byte {
	return []byte{0x11, byte(s >> 24), byte(s >> 16), byte(s >> 8), byte(s)}
}

// sendRawConnect writes b (closing the socket after it when cut) and
// returns what the broker answered: a CONNACK, or nothing (closed).
func sendRawConnect(t *testing.T, addr string, b []byte, cut bool) (packets.Packet, bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	if cut {
		return packets.Packet{}, false
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	pk, err := brokertest.ReadPacket(bufio.NewReader(conn), 5)
	if err != nil {
		return packets.Packet{}, false
	}
	return pk, true
}

// Invariant 17 (acceptance): a second connection failing halfway through
// CONNECT for a live client id leaves the first connection's session
// intact. For each way a CONNECT can fail — refused for its Will, too
// large, malformed in a property or a flag, or its socket gone before the
// CONNECT is whole — the first connection is not told anything, goes on
// being served its channel's records and broadcast, and its stored
// position is exactly what it acknowledged: after a clean DISCONNECT and a
// resume it is served the next record, nothing again.
func TestInvariant17_FailedSecondConnectLeavesTheFirstSessionIntact(t *testing.T) {
	b := brokertest.Start(t, configWith(t, sqliteProvider))
	pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	owner, _ := brokertest.DialRaw(t, b.Address(), "dev", true, 600)
	for i, f := range []string{"events/#", "bc/#"} {
		if sa := owner.Subscribe(uint16(i+1), f, 1); sa.ReasonCodes[0] != 1 {
			t.Fatalf("suback %s %v", f, sa.ReasonCodes)
		}
	}

	big := bytes.Repeat([]byte("x"), 110<<10) // past the default max_connect_size (100KiB)
	valid := rawConnect("dev", 0x02, expiryProp(600), nil, "", nil)
	cases := []struct {
		name  string
		bytes []byte
		cut   bool
		want  byte // the CONNACK reason; 0: closed, or any refusal
	}{
		{"Will on a wildcard topic", rawConnect("dev", 0x04|0x08, expiryProp(600), nil, "status/+", []byte("gone")), false, 0x90},
		{"Will in the reserved space", rawConnect("dev", 0x04|0x08, expiryProp(600), nil, "$saguin/queue/jobs", []byte("gone")), false, 0x90},
		{"Will topic past max_topic_levels", rawConnect("dev", 0x04, expiryProp(600), nil, deepTopic(), []byte("gone")), false, 0x90},
		{"CONNECT past max_connect_size", rawConnect("dev", 0x04, expiryProp(600), nil, "status/dev", big), false, 0},
		{"property not allowed on CONNECT", rawConnect("dev", 0x00, append(expiryProp(600), 0x01, 0x01), nil, "", nil), false, 0},
		{"properties longer than the packet", overrunConnect("dev"), false, 0},
		{"Will QoS 3", rawConnect("dev", 0x04|0x18, expiryProp(600), nil, "status/dev", []byte("gone")), false, 0},
		{"Will Retain without a Will", rawConnect("dev", 0x20, expiryProp(600), nil, "", nil), false, 0},
		{"socket gone halfway through CONNECT", valid[:len(valid)/2], true, 0},
	}
	offset := 0
	for i, tc := range cases {
		ack, answered := sendRawConnect(t, b.Address(), tc.bytes, tc.cut)
		switch {
		case tc.want != 0 && (!answered || ack.ReasonCode != tc.want):
			t.Fatalf("%s: answered %v CONNACK 0x%02x, want 0x%02x", tc.name, answered, ack.ReasonCode, tc.want)
		case answered && (ack.FixedHeader.Type != packets.Connack || ack.ReasonCode < 0x80):
			t.Fatalf("%s: accepted (%v 0x%02x)", tc.name, ack.FixedHeader.Type, ack.ReasonCode)
		}
		// The owner is served on: the channel's next record and a
		// broadcast, and the first thing it reads is not a DISCONNECT.
		offset++
		publishN(t, pub, "events/a", offset, 1)
		if _, err := pub.Publish(&paho.Publish{Topic: "bc/x", QoS: 1, Payload: []byte(fmt.Sprintf("bc %d", i))}); err != nil {
			t.Fatal(err)
		}
		gotRecord, gotBroadcast := false, false
		for !gotRecord || !gotBroadcast {
			pk := owner.Read()
			if pk.FixedHeader.Type != packets.Publish {
				t.Fatalf("after %s the owner was sent %v (reason 0x%02x)", tc.name, pk.FixedHeader.Type, pk.ReasonCode)
			}
			switch pk.TopicName {
			case "events/a":
				if off := userProp(pk, "saguin-offset"); off != strconv.Itoa(offset) {
					t.Fatalf("after %s the owner was served offset %s, want %d", tc.name, off, offset)
				}
				gotRecord = true
			case "bc/x":
				if string(pk.Payload) != fmt.Sprintf("bc %d", i) {
					t.Fatalf("after %s the owner got broadcast %q", tc.name, pk.Payload)
				}
				gotBroadcast = true
			}
			owner.Puback(pk.PacketID)
		}
	}

	// Its stored position is what it acknowledged, its subscriptions are
	// whole: resumed, it is served the next record and nothing before.
	owner.Disconnect()
	back, ack := brokertest.DialRaw(t, b.Address(), "dev", false, 600)
	if !ack.SessionPresent {
		t.Fatal("the owner's session did not survive the failed CONNECTs")
	}
	publishN(t, pub, "events/a", offset+1, 1)
	if pk := nextPublish(t, back); userProp(pk, "saguin-offset") != strconv.Itoa(offset+1) {
		t.Fatalf("resumed at offset %s, want %d", userProp(pk, "saguin-offset"), offset+1)
	}
}
