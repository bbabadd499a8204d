package broker_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
	"saguin.dev/broker/passwd"
)

// authConfig: a password file and an ACL on one tcp door, over an append,
// a latest and a queue channel.
const authConfig = `
broker:
  id: test
  log_level: debug
  mqtt:
    password_file: "{{.Dir}}/passwd"
    acl_file: "{{.Dir}}/acl.yaml"
    listen:
      tcp:
        address: "127.0.0.1:0"
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
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
`

// authACL: devices write only under their own name, readers read, workers
// consume, and two users are denied features.
const authACL = `
roles:
  device:
    - channel: events
      filter: "events/%u/#"
      allow: [write]
    - channel: state
      filter: "state/%u/#"
      allow: [write, read]
    - topic: "devices/%u/#"
      allow: [write, read]
  reader:
    - channel: events
      allow: [read, seek]
    - channel: state
      allow: [read, delete]
    - topic: "#"
      allow: [read]
  producer:
    - channel: jobs
      allow: [write]
  worker:
    - channel: jobs
      allow: [consume]
  plain:
    - broker: features
      deny: [persistent, will, share, retained, qos2]
  no-exactly-once:
    - broker: features
      deny: [retained, qos2]
  hangman:
    - broker: sessions
      allow: [disconnect]
users:
  "sensor-*":
    roles: [device]
    client_ids: "%u"
  alice: [reader, producer, hangman]
  limited:
    roles: [device]
    limits: {publish_rate: 2}
  "worker-*": [worker]
  bob: [device, plain]
  carol: [device, no-exactly-once]
`

// authPasswords are the users of authPasswordFile, each with password
// "pw-" + name.
var authPasswords = []string{"sensor-1", "sensor-2", "alice", "worker-1", "worker-2", "bob", "carol", "limited"}

func writePasswordFile(t *testing.T, path string, users ...string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	f := passwd.NewFile(path, passwd.MQTT)
	for _, u := range users {
		h, err := passwd.NewHash([]byte("pw-" + u))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Set(u, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
}

func startAuthBroker(t *testing.T, opts ...brokertest.Option) (*brokertest.Broker, string) {
	t.Helper()
	dir := t.TempDir()
	writePasswordFile(t, filepath.Join(dir, "passwd"), authPasswords...)
	if err := os.WriteFile(filepath.Join(dir, "acl.yaml"), []byte(authACL), 0o600); err != nil {
		t.Fatal(err)
	}
	return brokertest.Start(t, brokertest.Config(t, dir, authConfig), opts...), dir
}

// as connects user (password "pw-"+user) with client id id.
func as(user string, o mxConnect) mxConnect {
	o.user, o.password = user, "pw-"+user
	return o
}

// expectConnackCode connects and requires the CONNACK to refuse with code.
func expectConnackCode(t *testing.T, addr, id string, o mxConnect, code byte, what string) {
	t.Helper()
	_, ack := connectMx(t, addr, id, o)
	if ack.ReasonCode != code {
		t.Errorf("%s: CONNACK 0x%02x %q, want 0x%02x", what, ack.ReasonCode, ack.Properties.ReasonString, code)
	}
}

// docs/security.md "Every refusal, and its code": every authentication refusal is 0x86 on MQTT 5 and 0x04
// on 3.1.1 — a wrong password, an unknown user, no credentials on a door
// that admits named users only, a name with a control character, a client
// id the user's client_ids do not admit. A right password is admitted.
func TestInvariant10_AuthenticationRefusalsOnBothProtocols(t *testing.T) {
	b, _ := startAuthBroker(t)
	addr := b.Address()
	cases := []struct {
		what, id string
		o        mxConnect
	}{
		{"wrong password", "sensor-1", mxConnect{clean: true, user: "sensor-1", password: "nope"}},
		{"unknown user", "mallory", mxConnect{clean: true, user: "mallory", password: "pw-mallory"}},
		{"no credentials", "anon", mxConnect{clean: true}},
		{"control character in the name", "ctl", mxConnect{clean: true, user: "sensor-\x01", password: "x"}},
		{"client id outside client_ids", "not-sensor-1", as("sensor-1", mxConnect{clean: true})},
	}
	for i, tc := range cases {
		// Each from its own loopback address: failures from one address
		// are spaced out (authpenalty.go), which is not what this checks.
		o := tc.o
		o.from = fmt.Sprintf("127.0.1.%d", 2*i+1)
		expectConnackCode(t, addr, tc.id, o, 0x86, tc.what+" (MQTT 5)")
		o.v311, o.from = true, fmt.Sprintf("127.0.1.%d", 2*i+2)
		expectConnackCode(t, addr, tc.id, o, 0x04, tc.what+" (3.1.1)")
	}
	if n := b.AuthPenaltyAddresses(); n != 2*len(cases) {
		t.Errorf("%d addresses counted for their failures, want %d: every refusal passes the penalty", n, 2*len(cases))
	}
	c, ack := connectMx(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true}))
	if ack.ReasonCode != 0 {
		t.Fatalf("the right password: CONNACK 0x%02x", ack.ReasonCode)
	}
	c.disconnect()
	if !b.Log.Contains("CONNECT refused: authentication") || b.Log.Contains("pw-sensor-1") || b.Log.Contains("nope") {
		t.Errorf("the refusals are logged, never with the credential:\n%s", b.Log.Tail(20))
	}
}

// docs/configuration.md "The ACL file"; docs/channels.md "What a publish is answered": a publish the ACL does not grant is refused 0x87
// (3.1.1: the connection is closed), and nothing of it is kept; one it
// grants is stored. A latest delete needs delete, not write.
func TestInvariant10_PublishNeedsAGrant(t *testing.T) {
	b, _ := startAuthBroker(t)
	addr := b.Address()
	s1, _ := dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true}))
	s1.publish1(1, "events/sensor-1/temp", "21", packets.Properties{})
	s1.publish1(2, "devices/sensor-1/hello", "hi", packets.Properties{})
	for i, topic := range []string{"events/sensor-2/temp", "devices/sensor-2/x", "jobs/resize", "news/x"} {
		s1.publish(uint16(10+i), 1, topic, []byte("x"), packets.Properties{})
		if ack := s1.expect(packets.Puback, "PUBACK for "+topic); ack.ReasonCode != 0x87 {
			t.Errorf("publish to %s: PUBACK 0x%02x, want 0x87", topic, ack.ReasonCode)
		}
	}
	// The delete of a latest value: sensor-1 has write there, not delete.
	s1.publish1(20, "state/sensor-1/door", "open", packets.Properties{})
	s1.publish(21, 1, "state/sensor-1/door", nil, packets.Properties{})
	if ack := s1.expect(packets.Puback, "PUBACK for the delete"); ack.ReasonCode != 0x87 {
		t.Errorf("a zero-length publish to a latest topic with write but not delete: PUBACK 0x%02x, want 0x87", ack.ReasonCode)
	}
	alice, _ := dialMx(t, addr, "alice", as("alice", mxConnect{clean: true}))
	alice.subscribe(1, "events/#", 1)
	if pk := alice.nextPublish("the one granted record"); string(pk.Payload) != "21" {
		t.Errorf("alice reads %q; the refused publish was kept", pk.Payload)
	}
	alice.quiet(300*time.Millisecond, "only the granted record is in the channel")

	// 3.1.1 has no reason codes: a refused QoS 1 publish closes the
	// connection rather than acknowledge it.
	s2, _ := dialMx(t, addr, "sensor-2", as("sensor-2", mxConnect{clean: true, v311: true}))
	s2.publish(1, 1, "events/sensor-1/x", []byte("x"), packets.Properties{})
	if pk, err := s2.readWithin(mxWait); err == nil {
		t.Errorf("3.1.1 refused publish: the broker sent packet type %d, want the connection closed", pk.FixedHeader.Type)
	}
}

// docs/configuration.md "The ACL file"; docs/security.md "Every refusal, and its code": a SUBSCRIBE filter the ACL does not cover is
// refused 0x87 (3.1.1: 0x80) with the connection kept; the queue form
// needs consume.
func TestInvariant10_SubscribeNeedsAGrant(t *testing.T) {
	b, _ := startAuthBroker(t)
	addr := b.Address()
	s1, _ := dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true}))
	s1.subscribe(1, "devices/sensor-1/#", 1)
	s1.subscribe(2, "state/sensor-1/#", 1)
	for i, f := range []string{"events/#", "devices/#", "state/#", "$saguin/queue/jobs"} {
		s1.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
			PacketID: uint16(10 + i), Filters: packets.Subscriptions{{Filter: f, Qos: 1}}}, (*packets.Packet).SubscribeEncode)
		sa := s1.expect(packets.Suback, "SUBACK for "+f)
		if len(sa.ReasonCodes) != 1 || sa.ReasonCodes[0] != 0x87 {
			t.Errorf("SUBSCRIBE %s: %v, want [0x87]", f, sa.ReasonCodes)
		}
	}
	// The connection outlives refused filters.
	if pk := s1.publishToSelf(30, "devices/sensor-1/ping", "still here"); string(pk.Payload) != "still here" {
		t.Errorf("got %q", pk.Payload)
	}
	w, _ := dialMx(t, addr, "worker-1", as("worker-1", mxConnect{clean: true}))
	w.subscribe(1, "$saguin/queue/jobs", 1)

	s2, _ := dialMx(t, addr, "sensor-2", as("sensor-2", mxConnect{clean: true, v311: true}))
	s2.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
		PacketID: 1, Filters: packets.Subscriptions{{Filter: "events/#", Qos: 1}}}, (*packets.Packet).SubscribeEncode)
	if sa := s2.expect(packets.Suback, "3.1.1 SUBACK"); len(sa.ReasonCodes) != 1 || sa.ReasonCodes[0] != 0x80 {
		t.Errorf("3.1.1 refused filter: %v, want [0x80]", sa.ReasonCodes)
	}
}

// docs/security.md "A feature the ACL denies": what broker: features denies, on the CONNACK and on the
// packets that ask for it anyway.
func TestInvariant10_FeatureDenials(t *testing.T) {
	b, _ := startAuthBroker(t)
	addr := b.Address()
	will := func(topic string, qos byte, retain bool) *packets.Packet {
		return &packets.Packet{Connect: packets.ConnectParams{WillTopic: topic, WillPayload: []byte("gone"), WillQos: qos, WillRetain: retain}}
	}

	t.Run("the CONNACK says what is denied", func(t *testing.T) {
		c, ack := dialMx(t, addr, "bob", as("bob", mxConnect{expiry: 3600}))
		p := ack.Properties
		if !p.MaximumQosFlag || p.MaximumQos != 1 {
			t.Errorf("Maximum QoS %d (flag %v), want 1", p.MaximumQos, p.MaximumQosFlag)
		}
		if !p.SharedSubAvailableFlag || p.SharedSubAvailable != 0 {
			t.Errorf("Shared Subscription Available %d (flag %v), want 0", p.SharedSubAvailable, p.SharedSubAvailableFlag)
		}
		if !p.SessionExpiryIntervalFlag || p.SessionExpiryInterval != 0 {
			t.Errorf("Session Expiry %d (flag %v), want 0: persistent is denied", p.SessionExpiryInterval, p.SessionExpiryIntervalFlag)
		}
		// A QoS 2 subscription is granted as 1.
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
			PacketID: 1, Filters: packets.Subscriptions{{Filter: "devices/bob/#", Qos: 2}}}, (*packets.Packet).SubscribeEncode)
		if sa := c.expect(packets.Suback, "SUBACK"); len(sa.ReasonCodes) != 1 || sa.ReasonCodes[0] != 1 {
			t.Errorf("QoS 2 subscription: %v, want granted [1]", sa.ReasonCodes)
		}
		// The session ended with the connection: a resume finds nothing.
		c.disconnect()
		_, again := dialMx(t, addr, "bob", as("bob", mxConnect{expiry: 3600}))
		if again.SessionPresent {
			t.Error("Session Present 1 for a client denied persistent")
		}
	})

	t.Run("Wills", func(t *testing.T) {
		expectConnackCode(t, addr, "bob", as("bob", mxConnect{clean: true, will: will("devices/bob/will", 0, false)}), 0x87, "a Will from a client denied will")
		expectConnackCode(t, addr, "carol", as("carol", mxConnect{clean: true, will: will("devices/carol/will", 2, false)}), 0x9B, "a QoS 2 Will denied qos2")
		expectConnackCode(t, addr, "carol", as("carol", mxConnect{clean: true, will: will("devices/carol/will", 1, true)}), 0x9A, "a retained broadcast Will denied retained")
		expectConnackCode(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true, will: will("devices/sensor-2/will", 1, false)}), 0x87, "a Will to a topic the client may not write")
		for _, o := range []mxConnect{
			as("bob", mxConnect{clean: true, v311: true, will: will("devices/bob/will", 0, false)}),
			as("carol", mxConnect{clean: true, v311: true, will: will("devices/carol/will", 2, false)}),
			as("carol", mxConnect{clean: true, v311: true, will: will("devices/carol/will", 1, true)}),
		} {
			expectConnackCode(t, addr, o.user, o, 0x05, "3.1.1 Will refusal")
		}
		// A retained Will on a channel topic is not a broadcast retain.
		c, _ := dialMx(t, addr, "carol", as("carol", mxConnect{clean: true, will: will("state/carol/online", 1, true)}))
		c.disconnect()
	})

	t.Run("publishes and subscriptions that ask anyway", func(t *testing.T) {
		c, _ := dialMx(t, addr, "carol", as("carol", mxConnect{clean: true}))
		c.publish(1, 2, "devices/carol/x", []byte("x"), packets.Properties{})
		if d := c.expect(packets.Disconnect, "DISCONNECT for a QoS 2 publish"); d.ReasonCode != 0x9B {
			t.Errorf("QoS 2 publish from a client denied qos2: DISCONNECT 0x%02x, want 0x9B", d.ReasonCode)
		}
		c, _ = dialMx(t, addr, "carol", as("carol", mxConnect{clean: true}))
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 0, Retain: true},
			TopicName: "devices/carol/x", Payload: []byte("x")}, (*packets.Packet).PublishEncode)
		if d := c.expect(packets.Disconnect, "DISCONNECT for a retained publish"); d.ReasonCode != 0x9A {
			t.Errorf("retained broadcast publish from a client denied retained: DISCONNECT 0x%02x, want 0x9A", d.ReasonCode)
		}
		// A retained publish to a channel topic is not refused.
		c, _ = dialMx(t, addr, "carol", as("carol", mxConnect{clean: true}))
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
			PacketID: 1, TopicName: "state/carol/x", Payload: []byte("x")}, (*packets.Packet).PublishEncode)
		if ack := c.expect(packets.Puback, "PUBACK for a retained channel publish"); ack.ReasonCode != 0 {
			t.Errorf("retained publish to a latest channel: PUBACK 0x%02x", ack.ReasonCode)
		}
		c, _ = dialMx(t, addr, "bob", as("bob", mxConnect{clean: true}))
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1},
			PacketID: 1, Filters: packets.Subscriptions{{Filter: "$share/g/devices/bob/#", Qos: 1}}}, (*packets.Packet).SubscribeEncode)
		if d := c.expect(packets.Disconnect, "DISCONNECT for a shared subscription"); d.ReasonCode != 0x9E {
			t.Errorf("$share from a client denied share: DISCONNECT 0x%02x, want 0x9E", d.ReasonCode)
		}
		// 3.1.1: a QoS 2 publish closes the connection.
		c, _ = dialMx(t, addr, "carol", as("carol", mxConnect{clean: true, v311: true}))
		c.publish(1, 2, "devices/carol/x", []byte("x"), packets.Properties{})
		if pk, err := c.readWithin(mxWait); err == nil {
			t.Errorf("3.1.1 QoS 2 publish denied qos2: the broker sent packet type %d, want the connection closed", pk.FixedHeader.Type)
		}
	})
}

// readingAlice connects alice with a durable session reading the events
// channel and sensor-1 writing to it, and has alice read and acknowledge
// sensor-1's first record, r1 at offset 1.
func readingAlice(t *testing.T, addr string) (alice, s1 *mxConn) {
	t.Helper()
	alice, _ = dialMx(t, addr, "alice", as("alice", mxConnect{expiry: 3600}))
	alice.subscribe(1, "events/#", 1)
	s1, _ = dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true}))
	s1.publish1(1, "events/sensor-1/t", "r1", packets.Properties{})
	pk := alice.nextPublish("r1 while alice may read")
	if string(pk.Payload) != "r1" {
		t.Fatalf("alice read %q, want r1", pk.Payload)
	}
	alice.puback(pk.PacketID)
	return alice, s1
}

// rewriteACL replaces the ACL file and re-reads it as SIGUSR1 does.
func rewriteACL(t *testing.T, b *brokertest.Broker, dir, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "acl.yaml"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.ReloadAuthority(); err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// Invariant 16 on a live durable consumer (issue 14 acceptance): a read
// grant withdrawn by a reload stops the next delivery — the consumer gets
// nothing more, without resubscribing, and its stored position does not
// move; the grant restored, it resumes with nothing skipped.
func TestInvariant16_ReloadStallsALiveDurableConsumerAndResumesIt(t *testing.T) {
	b, dir := startAuthBroker(t)
	addr := b.Address()
	alice, s1 := readingAlice(t, addr)

	withdrawn := strings.Replace(authACL, "    - channel: events\n      allow: [read, seek]\n", "", 1)
	rewriteACL(t, b, dir, withdrawn)
	if !b.Log.Contains("SIGUSR1: authorization is on") {
		t.Errorf("the reload did not say what it now holds:\n%s", b.Log.Tail(10))
	}
	for i, p := range []string{"r2", "r3", "r4"} {
		s1.publish1(uint16(2+i), "events/sensor-1/t", p, packets.Properties{})
	}
	alice.quiet(500*time.Millisecond, "nothing is delivered once read is withdrawn")
	pos, ok := b.StoredPosition("events", "alice")
	if !ok {
		t.Fatal("no stored position for alice")
	}

	rewriteACL(t, b, dir, authACL)
	for _, want := range []string{"r2", "r3", "r4"} {
		pk := alice.nextPublish(want + " once read is granted again")
		if string(pk.Payload) != want {
			t.Fatalf("delivered %q, want %q: nothing is skipped", pk.Payload, want)
		}
		if want == "r2" && prop(pk, "saguin-offset") != fmt.Sprint(pos) {
			t.Errorf("r2 is offset %s; the stored position while refused was %d: it moved", prop(pk, "saguin-offset"), pos)
		}
		alice.puback(pk.PacketID)
	}
}

// Invariant 16 on a queue: a worker whose consume grant a reload withdrew
// is offered nothing; the job goes to another worker with its attempt
// unspent.
func TestInvariant16_ReloadMovesQueueWorkToAnotherWorkerUnspent(t *testing.T) {
	b, dir := startAuthBroker(t)
	addr := b.Address()
	w1, _ := dialMx(t, addr, "worker-1", as("worker-1", mxConnect{clean: true}))
	w1.subscribe(1, "$saguin/queue/jobs", 1)
	withdrawn := strings.Replace(authACL, `  "worker-*": [worker]`, "  worker-1: [producer]\n  \"worker-*\": [worker]", 1)
	rewriteACL(t, b, dir, withdrawn)
	alice, _ := dialMx(t, addr, "alice", as("alice", mxConnect{clean: true}))
	alice.publish1(1, "jobs/resize", "j1", packets.Properties{})
	w1.quiet(500*time.Millisecond, "the worker whose consume was withdrawn is offered nothing")
	w2, _ := dialMx(t, addr, "worker-2", as("worker-2", mxConnect{clean: true}))
	w2.subscribe(1, "$saguin/queue/jobs", 1)
	pk := w2.nextPublish("the job, handed to the worker that may take it")
	if string(pk.Payload) != "j1" || prop(pk, "saguin-attempt") != "1" {
		t.Fatalf("worker-2 got %q at attempt %s; want j1 at attempt 1 (unspent)", pk.Payload, prop(pk, "saguin-attempt"))
	}
}

// docs/operations.md "Signals" (3): a password file re-read adds users at once; a
// broken file changes nothing, is logged at error naming its file and
// line, and the broker keeps serving those it knew.
func TestPasswordReloadIsAllOrNothing(t *testing.T) {
	b, dir := startAuthBroker(t)
	addr := b.Address()
	pw := filepath.Join(dir, "passwd")
	expectConnackCode(t, addr, "sensor-3", as("sensor-3", mxConnect{clean: true}), 0x86, "before it is added")
	writePasswordFile(t, pw, append(authPasswords, "sensor-3")...)
	if err := b.ReloadAuthority(); err != nil {
		t.Fatal(err)
	}
	c, _ := dialMx(t, addr, "sensor-3", as("sensor-3", mxConnect{clean: true}))
	c.disconnect()

	old, _ := os.ReadFile(pw)
	broken := append(bytes.Clone(old), []byte("sensor-9:$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA\n")...)
	if err := os.WriteFile(pw, broken, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.ReloadAuthority(); err == nil {
		t.Fatal("a file with an argon2id line loaded")
	}
	if !b.Log.Contains("nothing changed") || !b.Log.Contains(pw+":") {
		t.Errorf("the failed re-read is not logged naming the file and line:\n%s", b.Log.Tail(10))
	}
	c, _ = dialMx(t, addr, "sensor-3", as("sensor-3", mxConnect{clean: true}))
	c.disconnect()
}

// docs/configuration.md "`broker.limits`"; docs/configuration.md "The ACL file": an ACL entry's limits replace the broker-wide
// publish figures for its users: past publish_rate, PUBACK 0x97 naming the
// entry's limit, the connection kept; the budget refills with time (the
// broker's clock, injected).
func TestACLEntryLimitsBoundItsUsersPublishRate(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b, _ := startAuthBroker(t, brokertest.WithClock(fake))
	c, _ := dialMx(t, b.Address(), "limited", as("limited", mxConnect{clean: true}))
	c.publish1(1, "devices/limited/x", "1", packets.Properties{})
	c.publish1(2, "devices/limited/x", "2", packets.Properties{})
	c.publish(3, 1, "devices/limited/x", []byte("3"), packets.Properties{RequestProblemInfo: 1})
	ack := c.expect(packets.Puback, "PUBACK past the entry's rate")
	if ack.ReasonCode != 0x97 {
		t.Fatalf("third publish in one instant at publish_rate 2: PUBACK 0x%02x, want 0x97", ack.ReasonCode)
	}
	fake.Advance(time.Second)
	c.publish1(4, "devices/limited/x", "4", packets.Properties{})
	// A user whose entry has no limits: broker.limits (none here).
	s1, _ := dialMx(t, b.Address(), "sensor-1", as("sensor-1", mxConnect{clean: true}))
	for i := 1; i <= 5; i++ {
		s1.publish1(uint16(i), "devices/sensor-1/x", fmt.Sprint(i), packets.Properties{})
	}
}

// rfcs/wills.md: the ACL is asked again when a Will fires, as the
// identity that armed it: a grant withdrawn by a reload after the CONNECT
// keeps the Will from being published.
func TestWillRefusedWhenItsGrantWasWithdrawnBeforeItFired(t *testing.T) {
	b, dir := startAuthBroker(t)
	addr := b.Address()
	alice, _ := dialMx(t, addr, "alice", as("alice", mxConnect{clean: true}))
	alice.subscribe(1, "devices/#", 1)
	will := &packets.Packet{Connect: packets.ConnectParams{WillTopic: "devices/sensor-1/will", WillPayload: []byte("gone"), WillQos: 1}}
	s1, _ := dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{clean: true, will: will}))
	withdrawn := strings.Replace(authACL, "    - topic: \"devices/%u/#\"\n      allow: [write, read]\n", "", 1)
	if withdrawn == authACL {
		t.Fatal("the test's ACL edit matched nothing")
	}
	rewriteACL(t, b, dir, withdrawn)
	s1.drop() // an unclean end: the Will falls due
	alice.quiet(500*time.Millisecond, "a Will its client may no longer publish")
	if !b.Log.Contains("Will not published: its client may no longer publish there") {
		t.Errorf("the refused Will is not logged:\n%s", b.Log.Tail(10))
	}
}

// docs/channels.md "The `$saguin/` topics"; docs/channels.md "What a publish is answered": $saguin/sessions/disconnect hangs up the client
// its payload names — DISCONNECT 0x98, its session kept — answering
// hung-up or no-such-client on the requester's Response Topic before the
// PUBACK; without the disconnect verb 0x87, without a Response Topic, an
// empty payload or naming oneself 0x83; a 3.1.1 requester is closed.
func TestHangUpIsAnACLGatedPublish(t *testing.T) {
	b, _ := startAuthBroker(t)
	addr := b.Address()
	victim, _ := dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{expiry: 3600}))
	victim.subscribe(1, "devices/sensor-1/#", 1)
	alice, _ := dialMx(t, addr, "alice", as("alice", mxConnect{clean: true}))
	ask := func(c *mxConn, id uint16, target string, props packets.Properties) packets.Packet {
		t.Helper()
		c.publish(id, 1, "$saguin/sessions/disconnect", []byte(target), props)
		return c.read(mxWait)
	}
	corr := []byte("q1")
	first := ask(alice, 1, "sensor-1", packets.Properties{ResponseTopic: "answers/alice", CorrelationData: corr})
	if first.FixedHeader.Type != packets.Publish || string(first.Payload) != "hung-up" || !bytes.Equal(first.Properties.CorrelationData, corr) || first.TopicName != "answers/alice" {
		t.Fatalf("answer: type %d topic %q payload %q correlation %q; want hung-up on answers/alice with q1", first.FixedHeader.Type, first.TopicName, first.Payload, first.Properties.CorrelationData)
	}
	if ack := alice.expect(packets.Puback, "PUBACK of the hang-up"); ack.ReasonCode != 0 {
		t.Fatalf("hang-up PUBACK 0x%02x", ack.ReasonCode)
	}
	if d := victim.expect(packets.Disconnect, "the victim's DISCONNECT"); d.ReasonCode != 0x98 {
		t.Fatalf("the victim got DISCONNECT 0x%02x, want 0x98", d.ReasonCode)
	}
	if _, ack := dialMx(t, addr, "sensor-1", as("sensor-1", mxConnect{expiry: 3600})); !ack.SessionPresent {
		t.Error("the hung-up client's session was not kept")
	}
	if a := ask(alice, 2, "nobody-here", packets.Properties{ResponseTopic: "answers/alice"}); string(a.Payload) != "no-such-client" {
		t.Errorf("hang-up of an absent client answered %q, want no-such-client", a.Payload)
	}
	alice.expect(packets.Puback, "PUBACK")
	for i, tc := range []struct {
		target string
		props  packets.Properties
		code   byte
	}{
		{"sensor-1", packets.Properties{}, 0x83},                            // no Response Topic
		{"", packets.Properties{ResponseTopic: "answers/alice"}, 0x83},      // names nobody
		{"alice", packets.Properties{ResponseTopic: "answers/alice"}, 0x83}, // names itself
	} {
		if ack := ask(alice, uint16(10+i), tc.target, tc.props); ack.FixedHeader.Type != packets.Puback || ack.ReasonCode != tc.code {
			t.Errorf("case %d: type %d reason 0x%02x, want PUBACK 0x%02x", i, ack.FixedHeader.Type, ack.ReasonCode, tc.code)
		}
	}
	s2, _ := dialMx(t, addr, "sensor-2", as("sensor-2", mxConnect{clean: true}))
	if ack := ask(s2, 1, "alice", packets.Properties{ResponseTopic: "devices/sensor-2/a"}); ack.FixedHeader.Type != packets.Puback || ack.ReasonCode != 0x87 {
		t.Errorf("hang-up without the disconnect verb: type %d reason 0x%02x, want PUBACK 0x87", ack.FixedHeader.Type, ack.ReasonCode)
	}
	old, _ := dialMx(t, addr, "alice", as("alice", mxConnect{clean: true, v311: true}))
	old.publish(1, 1, "$saguin/sessions/disconnect", []byte("sensor-2"), packets.Properties{})
	if pk, err := old.readWithin(mxWait); err == nil {
		t.Errorf("3.1.1 hang-up: the broker sent packet type %d, want the connection closed", pk.FixedHeader.Type)
	}
}
