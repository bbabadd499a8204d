package broker_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/storage/sqlite"
)

// commitGate holds the sqlite provider's publish transactions just before
// COMMIT (sqlite.Faults.BeforePublishCommit) until the test lets each one
// go, so a test can see what the broker answers while a commit is pending.
// released counts the records of the transactions let go: a PUBACK for the
// n-th record of a connection that arrives while released < n came before
// its commit.
type commitGate struct {
	armed    atomic.Bool
	held     chan int   // records of each transaction as it reaches COMMIT
	verdict  chan error // nil lets one held transaction commit; an error fails it
	opened   chan struct{}
	released atomic.Int64
	commits  atomic.Int64
}

func newCommitGate(t *testing.T) *commitGate {
	return &commitGate{held: make(chan int, 1024), verdict: make(chan error), opened: make(chan struct{})}
}

func (g *commitGate) hook(n int) error {
	if !g.armed.Load() {
		return nil
	}
	g.commits.Add(1)
	g.held <- n
	select {
	case err := <-g.verdict:
		return err
	case <-g.opened:
		return nil
	}
}

// option hands the gate to the broker's sqlite providers.
func (g *commitGate) option() brokertest.Option {
	return func(o *broker.Options) { o.SQLiteFaults = &sqlite.Faults{BeforePublishCommit: g.hook} }
}

// next waits for the next transaction to reach COMMIT and returns the
// records it carries, still held.
func (g *commitGate) next(t *testing.T) int {
	t.Helper()
	select {
	case n := <-g.held:
		return n
	case <-time.After(wait):
		t.Fatal("no publish transaction reached COMMIT")
		return 0
	}
}

// let lets the held transaction of n records commit (err nil) or fail.
func (g *commitGate) let(n int, err error) {
	if err == nil {
		g.released.Add(int64(n))
	}
	g.verdict <- err
}

// letAll lets every transaction commit from now on, as it comes.
func (g *commitGate) letAll(t *testing.T) {
	go func() {
		for {
			select {
			case n := <-g.held:
				g.released.Add(int64(n))
				select {
				case g.verdict <- nil:
				case <-g.opened:
					return
				}
			case <-g.opened:
				return
			}
		}
	}()
}

func (g *commitGate) open() {
	select {
	case <-g.opened:
	default:
		close(g.opened)
	}
}

// startGated starts a broker with the append channel events on provider,
// broker.limits lines (indented four spaces) added, and g on its commits.
func startGated(t *testing.T, provider, limits string, g *commitGate) *brokertest.Broker {
	t.Helper()
	tmpl := appendConfigWith(provider, "")
	if limits != "" {
		tmpl = strings.Replace(tmpl, "  storage:\n", "  limits:\n"+limits+"  storage:\n", 1)
	}
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), tmpl), g.option())
	// Registered after the broker's Close, so it runs first: whatever a
	// test leaves held commits once it ends, and the Close (which waits
	// for every record handed over) is not held.
	t.Cleanup(g.open)
	return b
}

func sendQoS1(c *brokertest.RawClient, id uint16, topic, payload string) {
	c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, PacketID: id, TopicName: topic, Payload: []byte(payload)})
}

// readAcks reads n PUBACKs, which must answer packet ids first..first+n-1
// in that order with code 0, and each must come after the commit of its
// record: the id-th record of the connection (check, with the gate).
func readAcks(t *testing.T, c *brokertest.RawClient, first, n int, g *commitGate) {
	t.Helper()
	for id := first; id < first+n; id++ {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			t.Fatalf("waiting for the PUBACK of %d: %v", id, err)
		}
		if pk.FixedHeader.Type != packets.Puback {
			t.Fatalf("waiting for the PUBACK of %d: got packet type %d", id, pk.FixedHeader.Type)
		}
		if int(pk.PacketID) != id || pk.ReasonCode != 0 {
			t.Fatalf("PUBACK %d (0x%02x), want %d (0x00): out of arrival order", pk.PacketID, pk.ReasonCode, id)
		}
		if g != nil && int64(id) > g.released.Load() {
			t.Fatalf("invariant 18: PUBACK %d before its record's commit (%d records committed)", id, g.released.Load())
		}
	}
}

// readBack subscribes a fresh consumer to events/# and checks the channel
// holds payloads want, at offsets 1..len(want).
func readBack(t *testing.T, addr string, want []string) {
	t.Helper()
	c := brokertest.Connect(t, addr, "reader", brokertest.ClientOptions{CleanStart: true})
	c.Subscribe("events/#", 1)
	for i, w := range want {
		p := c.Next(wait)
		if string(p.Payload) != w || p.Properties.User.Get("saguin-offset") != fmt.Sprint(i+1) {
			t.Fatalf("offset %d: %q at %s, want %q", i+1, p.Payload, p.Properties.User.Get("saguin-offset"), w)
		}
	}
	c.Quiet(200 * time.Millisecond)
}

func records(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s %d", prefix, i+1)
	}
	return out
}

// invariants 16, 18: one connection with 64 QoS 1 publishes in flight to an
// append channel on sqlite. While the first commit is held the broker goes
// on reading — the PINGREQ sent behind the 64 is answered, no PUBACK
// before it — and the records it read meanwhile go together in the next
// transaction. Every PUBACK then comes in arrival order, each after its
// record's commit, and the channel holds the 64 in the order sent.
func TestInvariant18_PipelinedPublisherAnsweredInOrderEachAfterItsCommit(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	c, _ := brokertest.DialRaw(t, b.Address(), "deep", true, 0)
	g.armed.Store(true)
	want := records("deep", 64)
	for i, p := range want {
		sendQoS1(c, uint16(i+1), "events/deep", p)
	}
	c.SendPingreq()
	first := g.next(t)
	pk, err := c.ReadWithin(wait)
	if err != nil {
		t.Fatalf("invariant 16: no PINGRESP while the first commit (%d records) is held: the read loop waits on the commit: %v", first, err)
	}
	if pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("packet type %d (id %d) before the PINGRESP, while no record is committed", pk.FixedHeader.Type, pk.PacketID)
	}
	g.let(first, nil)
	g.letAll(t)
	readAcks(t, c, 1, 64, g)
	if n := g.commits.Load(); n > 2 {
		t.Fatalf("the 64 records took %d transactions: the broker took one publish at a time", n)
	}
	readBack(t, b.Address(), want)
}

// The memory provider answers at once: 64 publishes in flight are answered
// in order, and what was answered is in the snapshot a graceful stop
// writes (invariant 14's promise for memory).
func TestPipelinedPublisherOnMemorySurvivesGracefulRestart(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	c, _ := brokertest.DialRaw(t, b.Address(), "deep", true, 0)
	want := records("mem", 64)
	for i, p := range want {
		sendQoS1(c, uint16(i+1), "events/mem", p)
	}
	readAcks(t, c, 1, 64, nil)
	c.Drop()
	b.Restart()
	readBack(t, b.Address(), want)
}

// invariant 16: a PINGREQ sent behind 10 publishes whose commit is held is
// answered before they commit.
func TestInvariant16_PingAnsweredWhileCommitsAreHeld(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	c, _ := brokertest.DialRaw(t, b.Address(), "pinger", true, 0)
	g.armed.Store(true)
	for i := 1; i <= 10; i++ {
		sendQoS1(c, uint16(i), "events/ping", fmt.Sprint("p", i))
	}
	c.SendPingreq()
	first := g.next(t)
	pk, err := c.ReadWithin(wait)
	if err != nil || pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("while the first commit is held: %v, packet type %d; want a PINGRESP", err, pk.FixedHeader.Type)
	}
	g.let(first, nil)
	g.letAll(t)
	readAcks(t, c, 1, 10, g)
}

// MQTT 5 §3.3.4: the CONNACK advertises the Receive Maximum; QoS 1
// publishes owed a PUBACK count against it and QoS 0 ones do not; one
// more than it is DISCONNECT 0x93. What was taken in is still stored.
func TestPipelinedPublishesPastReceiveMaximumDisconnect0x93(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	c, connack := brokertest.DialRaw(t, b.Address(), "greedy", true, 0)
	if got := connack.Properties.ReceiveMaximum; got != broker.ReceiveMaximum {
		t.Fatalf("CONNACK Receive Maximum %d, want %d", got, broker.ReceiveMaximum)
	}
	g.armed.Store(true)
	for i := 1; i <= broker.ReceiveMaximum; i++ {
		sendQoS1(c, uint16(i), "events/rm", fmt.Sprint("r", i))
	}
	// Broadcast QoS 0 (stored nowhere): the 256 records already fill the
	// sqlite writer's queue (publish_commit_max_records) behind the held
	// commit, and one more stored publish would wait for room there — the
	// read loop waiting on storage, which is backpressure, not this test.
	for i := range 3 {
		c.SendPublish(packets.Packet{TopicName: "plain/rm0", Payload: []byte(fmt.Sprint("q0 ", i))})
	}
	c.SendPingreq()
	first := g.next(t)
	if pk, err := c.ReadWithin(wait); err != nil || pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("at exactly the Receive Maximum (QoS 0 not counted): %v, packet type %d code 0x%02x; want a PINGRESP", err, pk.FixedHeader.Type, pk.ReasonCode)
	}
	sendQoS1(c, broker.ReceiveMaximum+1, "events/rm", "one too many")
	pk, err := c.ReadWithin(wait)
	if err != nil || pk.FixedHeader.Type != packets.Disconnect || pk.ReasonCode != 0x93 {
		t.Fatalf("past the Receive Maximum: %v, packet type %d code 0x%02x; want DISCONNECT 0x93", err, pk.FixedHeader.Type, pk.ReasonCode)
	}
	g.let(first, nil)
	g.letAll(t)
	other := brokertest.Connect(t, b.Address(), "other", brokertest.ClientOptions{CleanStart: true})
	if r, err := other.Publish(&paho.Publish{Topic: "events/other", QoS: 1, Payload: []byte("x")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("the broker did not go on for others: %v", err)
	}
}

// invariant 13: the bytes a connection's publishes hold while their store
// is pending are bounded (limits.session_queue_bytes): at the bound the
// broker reads no further — a PINGREQ behind it is not answered — and
// goes on once answers leave. Nothing is refused.
func TestInvariant13_PipelinedPublishBytesBoundedWithBackpressure(t *testing.T) {
	g := newCommitGate(t)
	const bound = 32 << 10
	b := startGated(t, sqliteProvider, fmt.Sprintf("    max_message_size: %d\n    session_queue_bytes: %d\n", bound, bound), g)
	c, _ := brokertest.DialRaw(t, b.Address(), "bp", true, 0)
	g.armed.Store(true)
	payload := strings.Repeat("b", 3000)
	const n = 12
	for i := 1; i <= n; i++ {
		sendQoS1(c, uint16(i), "events/bp", payload)
	}
	c.SendPingreq()
	first := g.next(t)
	// Taken in up to the bound, and no further while the commit is held.
	var entries int
	var bytes int64
	deadline := time.Now().Add(wait)
	for {
		e, _, by, ok := b.InboundUsage("bp")
		if ok && e > 1 && e == entriesAfter(t, b, "bp", 100*time.Millisecond) {
			entries, bytes = e, by
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline never settled (%d entries, %d bytes)", e, by)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if bytes > bound || entries >= n {
		t.Fatalf("while the commit is held: %d publishes taken in holding %d bytes; want fewer than %d, within %d", entries, bytes, n, bound)
	}
	if pk, err := c.ReadWithin(300 * time.Millisecond); err == nil {
		t.Fatalf("packet type %d answered while the pipeline is at its bound: the PINGREQ behind it was read", pk.FixedHeader.Type)
	}
	g.let(first, nil)
	g.letAll(t)
	pings := 0
	for id := 1; id <= n; {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			t.Fatalf("waiting for PUBACK %d: %v", id, err)
		}
		if pk.FixedHeader.Type == packets.Pingresp {
			pings++
			continue
		}
		if pk.FixedHeader.Type != packets.Puback || int(pk.PacketID) != id || pk.ReasonCode != 0 {
			t.Fatalf("packet type %d id %d code 0x%02x, want PUBACK %d", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, id)
		}
		id++
	}
	if pings == 0 {
		if pk, err := c.ReadWithin(wait); err != nil || pk.FixedHeader.Type != packets.Pingresp {
			t.Fatalf("no PINGRESP after the backpressure ended: %v", err)
		}
	}
}

// entriesAfter samples the pipeline again after d, so a test can tell a
// pipeline that stopped growing from one still being filled.
func entriesAfter(t *testing.T, b *brokertest.Broker, id string, d time.Duration) int {
	t.Helper()
	time.Sleep(d)
	e, _, _, _ := b.InboundUsage(id)
	return e
}

// MQTT 5 §4.6: answers leave in the order the PUBLISHes arrived, whatever
// decided them — a record's commit, a refusal decided at once on the read
// loop, a broadcast with nothing to store, a QoS 2 publish's PUBREC — and a
// failed commit answers its records 0x83 in their place.
func TestPipelinedAnswersLeaveInArrivalOrder(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	c, _ := brokertest.DialRaw(t, b.Address(), "mixed", true, 0)
	g.armed.Store(true)
	sendQoS1(c, 1, "events/a", "one")
	sendQoS1(c, 2, "$SYS/x", "refused at once")
	sendQoS1(c, 3, "plain/x", "broadcast")
	c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 2}, PacketID: 4, TopicName: "plain/q2", Payload: []byte("held")})
	sendQoS1(c, 5, "events/a", "two")
	sendQoS1(c, 6, "events/a", "three")
	first := g.next(t)
	g.let(first, nil)
	// The QoS 2 publish waited on the read loop for 1-3 to be answered;
	// 5 and 6 come after it. Their transaction fails.
	n := g.next(t)
	g.let(n, errors.New("injected commit failure"))
	if n < 2 {
		// 5 and 6 went in two transactions: the second fails too.
		g.let(g.next(t), errors.New("injected commit failure"))
	}
	want := []struct {
		typ  byte
		id   uint16
		code byte
	}{{packets.Puback, 1, 0}, {packets.Puback, 2, 0x87}, {packets.Puback, 3, 0}, {packets.Pubrec, 4, 0},
		{packets.Puback, 5, 0x83}, {packets.Puback, 6, 0x83}}
	for _, w := range want {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			t.Fatalf("waiting for the answer to %d: %v", w.id, err)
		}
		if pk.FixedHeader.Type != w.typ || pk.PacketID != w.id || pk.ReasonCode != w.code {
			t.Fatalf("got packet type %d id %d code 0x%02x; want type %d id %d code 0x%02x", pk.FixedHeader.Type, pk.PacketID, pk.ReasonCode, w.typ, w.id, w.code)
		}
	}
	if g.released.Load() != 1 {
		t.Fatalf("%d records committed, want 1", g.released.Load())
	}
}

// invariant 18: the broker closed while a connection's commits are
// pending tells the client nothing of them — the connection ends first,
// no PUBACK comes before the commit — and stores all it was handed before
// Close returns.
func TestInvariant18_CloseWithCommitsPendingTellsNothingBeforeStored(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	c, _ := brokertest.DialRaw(t, b.Address(), "closing", true, 0)
	g.armed.Store(true)
	want := records("closing", 10)
	for i, p := range want {
		sendQoS1(c, uint16(i+1), "events/close", p)
	}
	c.SendPingreq()
	first := g.next(t)
	if pk, err := c.ReadWithin(wait); err != nil || pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("want the PINGRESP first: %v, type %d", err, pk.FixedHeader.Type)
	}
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	for {
		pk, err := c.ReadWithin(wait)
		if err != nil {
			var ne net.Error
			if errors.Is(err, io.EOF) || errors.As(err, &ne) && !ne.Timeout() {
				break // closed by the broker
			}
			t.Fatalf("waiting for the broker to close the connection: %v", err)
		}
		if pk.FixedHeader.Type == packets.Puback {
			t.Fatalf("invariant 18: PUBACK %d while no commit has been let go", pk.PacketID)
		}
	}
	g.let(first, nil)
	g.letAll(t)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	b.Restart()
	readBack(t, b.Address(), want)
}

// A session taken over while its old connection's commits are pending:
// the takeover completes, the old connection is told of its publishes only
// what was stored, in order, until it is closed; the records it handed
// over are stored, and the new connection is served. (A PUBACK the old
// connection never got is a publish its client sends again: at least
// once, as when a connection drops after a commit.)
func TestPipelinedTakeoverWithCommitsPending(t *testing.T) {
	g := newCommitGate(t)
	b := startGated(t, sqliteProvider, "", g)
	a, _ := brokertest.DialRaw(t, b.Address(), "same", true, 0)
	g.armed.Store(true)
	want := records("old", 5)
	for i, p := range want {
		sendQoS1(a, uint16(i+1), "events/take", p)
	}
	a.SendPingreq()
	first := g.next(t)
	if pk, err := a.ReadWithin(wait); err != nil || pk.FixedHeader.Type != packets.Pingresp {
		t.Fatalf("want the PINGRESP first: %v", err)
	}
	newc := make(chan *brokertest.RawClient, 1)
	go func() {
		// The takeover's own writes (the ended session forgotten) wait on
		// the provider's writer, held with the commit: it goes on once
		// the commit is let go below.
		c, _ := brokertest.DialRaw(t, b.Address(), "same", true, 0)
		newc <- c
	}()
	g.let(first, nil)
	g.letAll(t)
	next := uint16(1)
	for {
		pk, err := a.ReadWithin(wait)
		if err != nil {
			break // taken over: closed
		}
		if pk.FixedHeader.Type != packets.Puback {
			continue // the DISCONNECT 0x8E
		}
		if pk.PacketID != next || int64(pk.PacketID) > g.released.Load() {
			t.Fatalf("PUBACK %d to the old connection (want %d; %d records committed)", pk.PacketID, next, g.released.Load())
		}
		next++
	}
	var c *brokertest.RawClient
	select {
	case c = <-newc:
	case <-time.After(wait):
		t.Fatal("the takeover did not complete")
	}
	sendQoS1(c, 1, "events/take", "new 1")
	readAcks(t, c, 1, 1, nil)
	readBack(t, b.Address(), append(want, "new 1"))
}

// The answering goroutine stays for a publisher's next publish (one publish
// in flight paid a goroutine start and a stack's growth per publish), is
// woken by it, and is ended by the connection's end however long it would
// linger: set to an hour here, so only the end can stop it. A second
// connection's goroutine with a short linger ends by itself once idle.
func TestPipelineAnswererLingersForTheNextPublishAndEndsWithItsConnection(t *testing.T) {
	b := brokertest.Start(t, configWith(t, memoryProvider))
	b.SetAnswerLinger(time.Hour)
	c, _ := brokertest.DialRaw(t, b.Address(), "linger", true, 0)
	for id := 1; id <= 3; id++ {
		sendQoS1(c, uint16(id), "events/linger", fmt.Sprint("linger ", id))
		readAcks(t, c, id, 1, nil)
		if running, ok := b.Answering("linger"); !ok || !running {
			t.Fatalf("after PUBACK %d: answering goroutine running=%v (pipeline found %v), want it lingering", id, running, ok)
		}
	}
	c.Drop()
	deadline := time.Now().Add(wait)
	for {
		if _, ok := b.Answering("linger"); !ok && !answererStackPresent() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection ended, but its answering goroutine still lingers")
		}
		time.Sleep(5 * time.Millisecond)
	}
	readBack(t, b.Address(), records("linger", 3))

	b.SetAnswerLinger(time.Millisecond)
	c2, _ := brokertest.DialRaw(t, b.Address(), "brief", true, 0)
	sendQoS1(c2, 1, "events/brief", "brief 1")
	readAcks(t, c2, 1, 1, nil)
	deadline = time.Now().Add(wait)
	for {
		if running, ok := b.Answering("brief"); ok && !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an idle connection's answering goroutine did not end after its linger")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A publish after it ended starts another, and is answered.
	sendQoS1(c2, 2, "events/brief", "brief 2")
	readAcks(t, c2, 2, 1, nil)
}

func answererStackPresent() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*inbound).run")
}
