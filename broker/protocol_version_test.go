package broker_test

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// connectAt sends a CONNECT at the given protocol level and returns the
// CONNACK's reason (3.1.1 return code or MQTT 5 reason code).
func connectAt(t *testing.T, addr string, version byte, id string) byte {
	t.Helper()
	_, ack := brokertest.DialConnect(t, addr, packets.Packet{
		ProtocolVersion: version,
		Connect:         packets.ConnectParams{ClientIdentifier: id, Clean: true, Keepalive: 30},
	})
	if ack.FixedHeader.Type != packets.Connack {
		t.Fatalf("protocol level %d: answered %v, want a CONNACK", version, ack.FixedHeader.Type)
	}
	return ack.ReasonCode
}

// By default one listener admits MQTT 3.1.1 and 5 side by side (docs/configuration.md:
// broker.mqtt.min_protocol_version 4), and MQTT 3.1 (level 3) never.
func TestOneListenerAdmitsBothProtocolVersions(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	if got := connectAt(t, b.Address(), 5, "v5"); got != 0 {
		t.Fatalf("MQTT 5 CONNECT refused: %#x", got)
	}
	if got := connectAt(t, b.Address(), 4, "v311"); got != 0 {
		t.Fatalf("MQTT 3.1.1 CONNECT refused: %#x", got)
	}
	// A stock 3.1.1 client through the same door.
	out, err := exec.Command("mosquitto_pub", "-V", "mqttv311", "-h", "127.0.0.1", "-p", port(t, b.Address()),
		"-q", "1", "-t", "plain/v311", "-m", "x").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub -V mqttv311: %v: %s", err, out)
	}
}

// broker.mqtt.min_protocol_version 5 refuses a 3.1.1 client with the
// answer its own protocol knows (MQTT 3.1.1 §3.2.2.3: return code 0x01,
// unacceptable protocol version), and keeps admitting MQTT 5.
func TestMinProtocolVersionFiveRefusesMQTT311(t *testing.T) {
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", memoryProvider, 1)
	tmpl = strings.Replace(tmpl, "  mqtt:\n", "  mqtt:\n    min_protocol_version: 5\n", 1)
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), tmpl))
	if got := connectAt(t, b.Address(), 4, "old"); got != 0x01 {
		t.Fatalf("3.1.1 CONNECT answered %#x, want return code 0x01", got)
	}
	if got := connectAt(t, b.Address(), 5, "new"); got != 0 {
		t.Fatalf("MQTT 5 CONNECT refused: %#x", got)
	}
	out, err := exec.Command("mosquitto_pub", "-V", "mqttv311", "-h", "127.0.0.1", "-p", port(t, b.Address()),
		"-q", "1", "-t", "plain/v311", "-m", "x").CombinedOutput()
	if err == nil {
		t.Fatalf("mosquitto_pub -V mqttv311 was admitted: %s", out)
	}
	// The refusal is the operator's to see (refusals at warn), rate-limited
	// by the host it came from (the substrate refuses it before a client
	// id is taken): the first line is written, the second refusal counted.
	const line = `level=WARN msg="CONNECT refused: protocol version below broker.mqtt.min_protocol_version" broker=test client="remote 127.0.0.1" code=0x84`
	deadline := time.Now().Add(5 * time.Second)
	for !b.Log.Contains(line) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !b.Log.Contains(line) {
		t.Fatalf("no refusal line for the 3.1.1 client; log:\n%s", b.Log.Tail(20))
	}
}

func port(t *testing.T, addr string) string {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		t.Fatalf("address without a port: %s", addr)
	}
	return addr[i+1:]
}
