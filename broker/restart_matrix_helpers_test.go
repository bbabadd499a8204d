package broker_test

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// matrixConfig is the restart matrix's broker: one append channel, one
// queue, and broadcast everywhere else (news/#, alerts/# are claimed by no
// channel), every channel and the sessions on the one provider given — so
// what a restart keeps is exactly what that provider keeps (rfcs/sessions-ownership.md).
func matrixConfig(provider string) string {
	return appendConfigWith(provider, `  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    retry:
      max_attempts: 5
`)
}

// mxWait bounds every read of something the broker sends promptly — all of
// the matrix's deliveries: no clock stands between the event and the packet
// (the Will's delay aside, which is shorter). It is shorter than the queue's
// 30 s visibility timeout, which one cell relies on.
const mxWait = 10 * time.Second

// matrixStop is one way the broker stops before it is started again on the
// same data.
type matrixStop struct {
	name     string
	provider string
	stop     func(p *brokertest.Process)
	// keeps: the stop keeps what was stored before it. A memory provider
	// killed keeps only its last snapshot — none was written since the
	// start — so it is in the Session Present matrix only, where what it
	// must not claim is the point (invariants 14, 18).
	keeps bool
}

// matrixStops: memory keeps what it has only through the snapshot a
// graceful stop writes (invariant 14), so it is stopped with SIGTERM only;
// sqlite keeps committed state across a crash too, so it is also killed.
var matrixStops = []matrixStop{
	{"memory-snapshot-SIGTERM", memoryProvider, func(p *brokertest.Process) { p.Term() }, true},
	{"sqlite-SIGTERM", sqliteProvider, func(p *brokertest.Process) { p.Term() }, true},
	{"sqlite-SIGKILL", sqliteProvider, func(p *brokertest.Process) { p.Kill() }, true},
}

// memoryKill is the crash a memory provider does not survive (invariant
// 14): nothing since its last snapshot comes back.
var memoryKill = matrixStop{"memory-snapshot-SIGKILL", memoryProvider, func(p *brokertest.Process) { p.Kill() }, false}

// startMatrixBroker writes the configuration for provider into a fresh
// directory and runs the saguin binary on it.
func startMatrixBroker(t *testing.T, provider string) *brokertest.Process {
	t.Helper()
	dir := t.TempDir()
	if strings.Contains(provider, "snapshots") {
		if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return brokertest.StartProcess(t, brokertest.Config(t, dir, matrixConfig(provider)))
}

// mxConn is one MQTT 5 connection driven packet by packet, with every
// acknowledgement — PUBACK, PUBREL — sent only when the test says: the
// matrix needs a QoS 2 exchange stopped between PUBREC and PUBREL, and
// deliveries left unacknowledged across a restart, which a client library
// would complete on its own.
type mxConn struct {
	t       testing.TB
	id      string
	conn    net.Conn
	r       *bufio.Reader
	version byte // 5, or 4 for MQTT 3.1.1
}

// mxConnect is what a CONNECT carries in the matrix.
type mxConnect struct {
	clean          bool
	expiry         uint32 // Session Expiry Interval, seconds
	receiveMaximum uint16
	will           *packets.Packet // Connect.Will* and WillProperties, if any
	// user and password are sent when user is set (password may be empty).
	user, password string
	// v311 connects as MQTT 3.1.1 (protocol level 4).
	v311 bool
	// from is the loopback address to connect from ("" any): failed
	// authentications are counted per address (authpenalty.go).
	from string
}

// dialMx connects id and returns the connection and its CONNACK; a CONNACK
// refusing the connection fails the test.
func dialMx(t testing.TB, addr, id string, o mxConnect) (*mxConn, packets.Packet) {
	t.Helper()
	c, ack := connectMx(t, addr, id, o)
	if ack.ReasonCode != 0 {
		t.Fatalf("%s: CONNACK refused 0x%02x %q", id, ack.ReasonCode, ack.Properties.ReasonString)
	}
	return c, ack
}

// connectMx connects id and returns the connection and its CONNACK, a
// refusing one included.
func connectMx(t testing.TB, addr, id string, o mxConnect) (*mxConn, packets.Packet) {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if o.from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(o.from)}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	c := &mxConn{t: t, id: id, conn: nc, r: bufio.NewReader(nc), version: 5}
	t.Cleanup(func() { _ = nc.Close() })
	pk := packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id,
			Clean: o.clean, Keepalive: 60},
		Properties: packets.Properties{SessionExpiryInterval: o.expiry, SessionExpiryIntervalFlag: o.expiry > 0,
			ReceiveMaximum: o.receiveMaximum},
	}
	if o.v311 {
		c.version = 4
		pk.ProtocolVersion = 4
		pk.Properties = packets.Properties{}
	}
	if o.user != "" {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(o.user)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(o.password)
	}
	if o.will != nil {
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = o.will.Connect.WillTopic
		pk.Connect.WillPayload = o.will.Connect.WillPayload
		pk.Connect.WillQos = o.will.Connect.WillQos
		pk.Connect.WillRetain = o.will.Connect.WillRetain
		pk.Connect.WillProperties = o.will.Connect.WillProperties
	}
	c.write(pk, (*packets.Packet).ConnectEncode)
	ack := c.read(mxWait)
	if ack.FixedHeader.Type != packets.Connack {
		t.Fatalf("%s: first packet from the broker is type %d, not CONNACK", id, ack.FixedHeader.Type)
	}
	return c, ack
}

func (c *mxConn) write(pk packets.Packet, enc func(*packets.Packet, *bytes.Buffer) error) {
	c.t.Helper()
	// Without it the substrate's encoder silently leaves out a PUBLISH's
	// (and a Will's) Response Topic and Correlation Data: a queue answer
	// would arrive with no Delivery ID.
	pk.Mods.AllowResponseInfo = true
	if c.version != 0 {
		pk.ProtocolVersion = c.version // every packet in the connection's protocol
	}
	var buf bytes.Buffer
	if err := enc(&pk, &buf); err != nil {
		c.t.Fatalf("%s: encoding packet type %d: %v", c.id, pk.FixedHeader.Type, err)
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatalf("%s: write: %v", c.id, err)
	}
}

// read returns the next packet, failing the test if none comes within d.
func (c *mxConn) read(d time.Duration) packets.Packet {
	c.t.Helper()
	pk, err := c.readWithin(d)
	if err != nil {
		c.t.Fatalf("%s: read: %v", c.id, err)
	}
	return pk
}

// readWithin returns the next packet, or the error: a timeout when nothing
// came within d, io.EOF when the broker closed the connection.
func (c *mxConn) readWithin(d time.Duration) (packets.Packet, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	return brokertest.ReadPacket(c.r, c.version)
}

// expect reads the next packet and fails unless it has type typ.
func (c *mxConn) expect(typ byte, what string) packets.Packet {
	c.t.Helper()
	pk, err := c.readWithin(mxWait)
	if err != nil {
		c.t.Fatalf("%s: waiting for %s: %v", c.id, what, err)
	}
	if pk.FixedHeader.Type != typ {
		c.t.Fatalf("%s: %s: got packet type %d (reason 0x%02x), want type %d", c.id, what, pk.FixedHeader.Type, pk.ReasonCode, typ)
	}
	return pk
}

// nextPublish reads until a PUBLISH arrives; anything else is a failure.
func (c *mxConn) nextPublish(what string) packets.Packet {
	c.t.Helper()
	return c.expect(packets.Publish, what)
}

// quiet asserts that the broker sends nothing within d.
func (c *mxConn) quiet(d time.Duration, what string) {
	c.t.Helper()
	pk, err := c.readWithin(d)
	if err == nil {
		c.t.Fatalf("%s: %s: unexpected packet type %d topic %q payload %q", c.id, what, pk.FixedHeader.Type, pk.TopicName, pk.Payload)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("%s: %s: connection ended: %v", c.id, what, err)
	}
}

func (c *mxConn) subscribe(id uint16, filter string, qos byte) {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5,
		PacketID: id, Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}, (*packets.Packet).SubscribeEncode)
	sa := c.expect(packets.Suback, "SUBACK for "+filter)
	if sa.PacketID != id || len(sa.ReasonCodes) != 1 || sa.ReasonCodes[0] != qos {
		c.t.Fatalf("%s: SUBSCRIBE %s QoS %d answered %v", c.id, filter, qos, sa.ReasonCodes)
	}
}

// publish sends one PUBLISH. Properties may carry Correlation Data.
func (c *mxConn) publish(id uint16, qos byte, topic string, payload []byte, props packets.Properties) {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, ProtocolVersion: 5,
		PacketID: id, TopicName: topic, Payload: payload, Properties: props}, (*packets.Packet).PublishEncode)
}

// publishToSelf publishes at QoS 1 to a topic the connection itself
// subscribes to at QoS 1, and returns the PUBLISH it is sent back. MQTT
// orders neither before the other — the PUBACK and the delivery leave on
// two paths — so both are read in whichever order they come (a test that
// expected the PUBACK first failed under qemu's slower scheduling).
func (c *mxConn) publishToSelf(id uint16, topic, payload string) packets.Packet {
	c.t.Helper()
	c.publish(id, 1, topic, []byte(payload), packets.Properties{})
	var back *packets.Packet
	acked := false
	for !acked || back == nil {
		pk, err := c.readWithin(mxWait)
		if err != nil {
			c.t.Fatalf("%s: publish %q to itself: acknowledged %v, sent back %v: %v", c.id, payload, acked, back != nil, err)
		}
		switch {
		case pk.FixedHeader.Type == packets.Puback && !acked:
			if pk.PacketID != id || pk.ReasonCode != 0 {
				c.t.Fatalf("%s: publish %q: PUBACK id %d reason 0x%02x", c.id, payload, pk.PacketID, pk.ReasonCode)
			}
			acked = true
		case pk.FixedHeader.Type == packets.Publish && back == nil:
			back = &pk
		default:
			c.t.Fatalf("%s: publish %q to itself: unexpected packet type %d", c.id, payload, pk.FixedHeader.Type)
		}
	}
	return *back
}

// publish1 publishes at QoS 1 and requires PUBACK success.
func (c *mxConn) publish1(id uint16, topic, payload string, props packets.Properties) {
	c.t.Helper()
	c.publish(id, 1, topic, []byte(payload), props)
	ack := c.expect(packets.Puback, "PUBACK for "+payload)
	if ack.PacketID != id || ack.ReasonCode != 0 {
		c.t.Fatalf("%s: publish %q: PUBACK id %d reason 0x%02x", c.id, payload, ack.PacketID, ack.ReasonCode)
	}
}

func (c *mxConn) puback(id uint16) {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: id},
		(*packets.Packet).PubackEncode)
}

// pubrel releases a QoS 2 exchange; its fixed header carries the reserved
// flags 0010 (MQTT-3.6.1-1), which is what Qos 1 encodes to.
func (c *mxConn) pubrel(id uint16) {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pubrel, Qos: 1}, ProtocolVersion: 5, PacketID: id},
		(*packets.Packet).PubrelEncode)
}

// disconnect sends DISCONNECT 0x00 and waits for the broker's close, which
// it sends only after storing what the DISCONNECT changes (invariant 18).
func (c *mxConn) disconnect() {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5},
		(*packets.Packet).DisconnectEncode)
	for {
		if _, err := c.readWithin(mxWait); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatalf("%s: the broker did not close the connection after DISCONNECT", c.id)
			}
			return
		}
	}
}

// disconnectEnding sends DISCONNECT 0x00 with Session Expiry Interval 0,
// which ends the session (MQTT 5 §3.14.2.2.2), and waits for the close.
func (c *mxConn) disconnectEnding() {
	c.t.Helper()
	c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5,
		Properties: packets.Properties{SessionExpiryIntervalFlag: true}}, (*packets.Packet).DisconnectEncode)
	for {
		if _, err := c.readWithin(mxWait); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatalf("%s: the broker did not close the connection after DISCONNECT", c.id)
			}
			return
		}
	}
}

// drop closes the socket with no DISCONNECT: to the broker the client died.
func (c *mxConn) drop() { _ = c.conn.Close() }

func prop(pk packets.Packet, key string) string {
	for _, u := range pk.Properties.User {
		if u.Key == key {
			return u.Val
		}
	}
	return ""
}

// replayEvents reads the append channel "events" from its floor with a
// fresh, non-durable reader and returns every record's payload per topic,
// reading until the broker has sent nothing for settle. The reader is a
// witness only: it stores no position.
func replayEvents(t *testing.T, addr, id string, settle time.Duration) []packets.Packet {
	t.Helper()
	r, _ := dialMx(t, addr, id, mxConnect{clean: true})
	r.subscribe(1, "events/#", 1)
	var got []packets.Packet
	for {
		pk, err := r.readWithin(settle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return got
			}
			t.Fatalf("%s: reading the events channel: %v", id, err)
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		got = append(got, pk)
		if pk.FixedHeader.Qos > 0 {
			r.puback(pk.PacketID)
		}
	}
}

// waitForLog polls the process's output until a line contains every one of
// parts, failing after wait. It is how the test learns that the broker has
// noticed something the protocol does not acknowledge (a dropped socket).
func waitForLog(t *testing.T, p *brokertest.Process, what string, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(mxWait)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(p.Output(), "\n") {
			all := true
			for _, s := range parts {
				if !strings.Contains(line, s) {
					all = false
					break
				}
			}
			if all {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: no log line containing %q within %s", what, parts, mxWait)
}

// countLog counts the process's output lines containing s.
func countLog(p *brokertest.Process, s string) int {
	return strings.Count(p.Output(), s)
}

func atoi(t *testing.T, what, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not a number", what, s)
	}
	return n
}
