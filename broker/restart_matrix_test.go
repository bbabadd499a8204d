package broker_test

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// The restart matrix (Step 5 acceptance): every kind of session state a
// client can leave behind, across every way the broker stops and starts
// again on the same data. Each cell asserts both halves of invariant 15 —
// what a restart must bring back does, and what it must not (a lease, a
// Delivery ID, a deadline) does not — against docs/channels.md "Sessions and Session Present" and rfcs/sessions-ownership.md.
//
// Each cell runs its own saguin binary in its own directory: the process is
// the unit a restart acts on, and a cell's leftovers must not feed the next.
func TestInvariant15_RestartMatrix(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, p *brokertest.Process, restart func())
	}{
		{"append-consumer", matrixAppendConsumer},
		{"queue-worker", matrixQueueWorker},
		{"broadcast-qos1-away", matrixBroadcastAway},
		{"shared-member-away", matrixSharedAway},
		{"qos2-publisher-mid-flow", matrixQoS2MidFlow},
		{"will-with-delay", matrixWillDelay},
	}
	for _, st := range matrixStops {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					// Cells share nothing but the binary; running them side by
					// side keeps the matrix within seconds of its slowest cell.
					t.Parallel()
					p := startMatrixBroker(t, st.provider)
					tc.run(t, p, func() {
						t.Helper()
						st.stop(p)
						p.Restart()
					})
				})
			}
		})
	}
}

// A durable append consumer resumes at its acknowledged position: Session
// Present 1, its subscription restored (it does not subscribe again), the
// first record it is sent is the lowest it had not acknowledged, and every
// record from there on comes once, in offset order — none below, none
// skipped. The acknowledgements went in before a clean DISCONNECT, whose
// close promises they are stored (invariant 18), so this holds across a
// kill too.
func matrixAppendConsumer(t *testing.T, p *brokertest.Process, restart func()) {
	pub, _ := dialMx(t, p.Address(), "a-pub", mxConnect{clean: true})
	for i := 1; i <= 10; i++ {
		pub.publish1(uint16(i), "events/a", fmt.Sprintf("rec %d", i), packets.Properties{})
	}
	r, _ := dialMx(t, p.Address(), "a-reader", mxConnect{clean: true, expiry: 3600, receiveMaximum: 20})
	r.subscribe(1, "events/#", 1)
	for i := 1; i <= 10; i++ {
		pk := r.nextPublish("replay before the restart")
		if off := prop(pk, "saguin-offset"); off != strconv.Itoa(i) {
			t.Fatalf("before the restart delivery %d has offset %s", i, off)
		}
		if i <= 6 {
			r.puback(pk.PacketID) // 7..10 stay sent and unacknowledged
		}
	}
	r.disconnect()
	for i := 11; i <= 15; i++ {
		pub.publish1(uint16(i), "events/a", fmt.Sprintf("rec %d", i), packets.Properties{})
	}
	pub.disconnect()

	restart()

	r, ack := dialMx(t, p.Address(), "a-reader", mxConnect{expiry: 3600, receiveMaximum: 20})
	if !ack.SessionPresent {
		t.Fatal("the durable consumer's session did not come back: CONNACK Session Present 0")
	}
	for want := 7; want <= 15; want++ {
		pk := r.nextPublish(fmt.Sprintf("resumed delivery of offset %d", want))
		off := prop(pk, "saguin-offset")
		if off != strconv.Itoa(want) {
			t.Fatalf("after the restart the consumer acknowledged through 6 was sent offset %s where %d was due "+
				"(below the position is a resurrected delivery, above it a skip)", off, want)
		}
		if string(pk.Payload) != fmt.Sprintf("rec %d", want) {
			t.Fatalf("offset %d carries %q", want, pk.Payload)
		}
		r.puback(pk.PacketID)
	}
	r.quiet(300*time.Millisecond, "after offset 15 nothing more is owed")
}

// A queue worker's un-answered job comes back as work, not as its lease
// (invariant 15): after the restart another worker is offered it at once —
// not after the 30 s visibility timeout a restored deadline would impose —
// as attempt 2 (attempt counts do survive) under a new Delivery ID; the
// first worker's session comes back without the delivery; and its answer
// carrying the pre-restart Delivery ID resolves nothing (invariant 3): the
// job is still there to be returned, offered again, and acknowledged.
func matrixQueueWorker(t *testing.T, p *brokertest.Process, restart func()) {
	prod, _ := dialMx(t, p.Address(), "q-producer", mxConnect{clean: true})
	prod.publish1(1, "jobs/a", "job-A", packets.Properties{})
	prod.disconnect()

	w1, _ := dialMx(t, p.Address(), "q-w1", mxConnect{clean: true, expiry: 3600})
	w1.subscribe(1, "$saguin/queue/jobs", 1)
	job := w1.nextPublish("the job before the restart")
	if string(job.Payload) != "job-A" || prop(job, "saguin-attempt") != "1" {
		t.Fatalf("before the restart: %q attempt %s", job.Payload, prop(job, "saguin-attempt"))
	}
	oldID := append([]byte(nil), job.Properties.CorrelationData...)
	respTopic := job.Properties.ResponseTopic
	if len(oldID) == 0 || respTopic == "" {
		t.Fatalf("the offer carries no answer path: response topic %q, correlation data %q", respTopic, oldID)
	}
	// The transport acknowledgement starts the lease and spends the
	// attempt (invariants 6, 7); it answers nothing.
	w1.puback(job.PacketID)
	// A SUBACK is written after every packet read before it: the PUBACK,
	// and the attempt count it stored, are in before the stop.
	w1.subscribe(2, "news/q-w1-sync", 1)

	restart()

	w2, _ := dialMx(t, p.Address(), "q-w2", mxConnect{clean: true})
	w2.subscribe(1, "$saguin/queue/jobs", 1)
	// mxWait (10 s) is shorter than the 30 s visibility timeout: a lease that
	// came back would keep the job from w2 for this whole read.
	again := w2.nextPublish("the job offered to another worker after the restart (a restored lease would withhold it)")
	if string(again.Payload) != "job-A" {
		t.Fatalf("after the restart w2 was offered %q", again.Payload)
	}
	if a := prop(again, "saguin-attempt"); a != "2" {
		t.Fatalf("after the restart the job is attempt %s, want 2: the attempt spent before it survives (invariant 15)", a)
	}
	if bytes.Equal(again.Properties.CorrelationData, oldID) {
		t.Fatal("the pre-restart Delivery ID came back on the new offer (invariant 15)")
	}
	w2.puback(again.PacketID)

	// The first worker's session comes back; its delivery does not.
	// The answer must be ignored as superseded, not for any other reason
	// (an answer that lost its Correlation Data on the way is ignored too,
	// and would prove nothing about invariant 3).
	const superseded = "queue answer ignored: unknown or superseded delivery"
	ignoredBefore := countLog(p, superseded)
	w1, ack := dialMx(t, p.Address(), "q-w1", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the durable worker's session did not come back: CONNACK Session Present 0")
	}
	w1.quiet(300*time.Millisecond, "a resumed worker whose job another worker holds is sent nothing (no resurrected delivery)")
	// It answers across the restart with the Delivery ID it was given
	// before: that answer must change nothing (invariants 3, 15).
	w1.publish(1, 1, respTopic, []byte("ack"), packets.Properties{CorrelationData: oldID})
	w1.expect(packets.Puback, "PUBACK for the stale answer")
	deadline := time.Now().Add(mxWait)
	for countLog(p, superseded) <= ignoredBefore {
		if time.Now().After(deadline) {
			t.Fatal("an answer carrying the pre-restart Delivery ID was not logged as ignored (invariant 3)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// w2 leaves without answering: the job returns and goes to the one
	// worker left. Had the stale ack resolved it, nothing would come.
	w2.disconnect()
	third := w1.nextPublish("the job, still unresolved after the stale answer")
	if string(third.Payload) != "job-A" || prop(third, "saguin-attempt") != "3" {
		t.Fatalf("after w2 left: %q attempt %s, want job-A attempt 3", third.Payload, prop(third, "saguin-attempt"))
	}
	if bytes.Equal(third.Properties.CorrelationData, oldID) || bytes.Equal(third.Properties.CorrelationData, again.Properties.CorrelationData) {
		t.Fatal("a redelivery reused a Delivery ID")
	}
	w1.puback(third.PacketID)
	w1.publish(2, 1, respTopic, []byte("ack"), packets.Properties{CorrelationData: third.Properties.CorrelationData})
	w1.expect(packets.Puback, "PUBACK for the current answer")
	w1.quiet(300*time.Millisecond, "the acknowledged job is resolved")
}

// A durable QoS 1 broadcast subscriber away across the restart is owed what
// was published while it was away and what it had been sent and not
// acknowledged (rfcs/sessions-ownership.md: QoS1/2 deliveries owed — restored;
// invariant 15: a session's own messages come back with it). Each comes
// once, in order; the ones sent before carry their original packet ids
// (MQTT-4.4.0-1) and may carry DUP, the ones never sent must not
// (MQTT-3.3.1-1). What it acknowledged before its clean DISCONNECT does not
// come back (invariant 18).
func matrixBroadcastAway(t *testing.T, p *brokertest.Process, restart func()) {
	sub, _ := dialMx(t, p.Address(), "b-sub", mxConnect{clean: true, expiry: 3600, receiveMaximum: 10})
	sub.subscribe(1, "news/#", 1)
	pub, _ := dialMx(t, p.Address(), "b-pub", mxConnect{clean: true})
	for i := 0; i <= 2; i++ {
		pub.publish1(uint16(i+1), "news/x", fmt.Sprintf("b%d", i), packets.Properties{})
	}
	sentIDs := map[string]uint16{}
	for i := 0; i <= 2; i++ {
		pk := sub.nextPublish("live broadcast before the restart")
		if want := fmt.Sprintf("b%d", i); string(pk.Payload) != want {
			t.Fatalf("live delivery %d is %q, want %q", i, pk.Payload, want)
		}
		if i == 0 {
			sub.puback(pk.PacketID)
		} else {
			sentIDs[string(pk.Payload)] = pk.PacketID
		}
	}
	sub.disconnect()
	for i := 3; i <= 5; i++ {
		pub.publish1(uint16(i+1), "news/x", fmt.Sprintf("b%d", i), packets.Properties{})
	}
	pub.disconnect()

	restart()

	sub, ack := dialMx(t, p.Address(), "b-sub", mxConnect{expiry: 3600, receiveMaximum: 10})
	if !ack.SessionPresent {
		t.Fatal("the durable subscriber's session did not come back: CONNACK Session Present 0")
	}
	for i := 1; i <= 5; i++ {
		want := fmt.Sprintf("b%d", i)
		pk := sub.nextPublish("owed broadcast " + want + " after the restart")
		if string(pk.Payload) != want {
			t.Fatalf("after the restart delivery %d is %q, want %q (b0 was acknowledged; b1..b5 are owed once each, in order)",
				i, pk.Payload, want)
		}
		if id, sent := sentIDs[want]; sent {
			if pk.PacketID != id {
				t.Fatalf("%s was sent before the restart as packet id %d and resent as %d (MQTT-4.4.0-1)", want, id, pk.PacketID)
			}
		} else if pk.FixedHeader.Dup {
			t.Fatalf("%s was never sent before, yet carries DUP (MQTT-3.3.1-1)", want)
		}
		sub.puback(pk.PacketID)
	}
	sub.quiet(300*time.Millisecond, "each owed broadcast comes once")
}

// A shared group whose members are all away, each with a session that
// outlives its connection, keeps what was published to it, across the
// restart (rfcs/broadcast-log.md: a shared group's membership is kept). The first member back is
// served the backlog in publish order, once; the second member back is
// owed nothing of it.
func matrixSharedAway(t *testing.T, p *brokertest.Process, restart func()) {
	for _, id := range []string{"s-m1", "s-m2"} {
		m, _ := dialMx(t, p.Address(), id, mxConnect{clean: true, expiry: 3600})
		m.subscribe(1, "$share/g/alerts/#", 1)
		m.disconnect()
	}
	pub, _ := dialMx(t, p.Address(), "s-pub", mxConnect{clean: true})
	for i := 1; i <= 4; i++ {
		pub.publish1(uint16(i), "alerts/x", fmt.Sprintf("s%d", i), packets.Properties{})
	}
	pub.disconnect()

	restart()

	m1, ack := dialMx(t, p.Address(), "s-m1", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the shared member's session did not come back: CONNACK Session Present 0")
	}
	for i := 1; i <= 4; i++ {
		want := fmt.Sprintf("s%d", i)
		pk := m1.nextPublish("the group's backlog " + want + " to the first member back")
		if string(pk.Payload) != want {
			t.Fatalf("the first member back was served %q where %q was due (backlog in publish order, once each)", pk.Payload, want)
		}
		if pk.FixedHeader.Dup {
			t.Fatalf("%s was never sent before, yet carries DUP (MQTT-3.3.1-1)", want)
		}
		m1.puback(pk.PacketID)
	}
	m1.quiet(300*time.Millisecond, "each backlog message is served once")
	m1.disconnect() // its acknowledgements stored before the close
	m2, ack := dialMx(t, p.Address(), "s-m2", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the second shared member's session did not come back: CONNACK Session Present 0")
	}
	m2.quiet(300*time.Millisecond, "the backlog went to one member only")
}

// A QoS 2 publisher stopped between PUBREC and PUBREL (docs/channels.md "Sessions and Session Present"
// "Restart cost"): the session comes back with the provider's hold, so the
// re-sent PUBREL completes (PUBCOMP 0x00) and writes exactly one record —
// none before the PUBREL, none twice. A publisher whose session ended with
// the connection the stop cut is answered Session Present 0; its hold is
// dropped at start, and its message is never written (a late PUBREL is
// answered 0x92, Packet Identifier not found). An exchange released before
// the stop keeps its one record, and a PUBREL re-sent for it is 0x92.
func matrixQoS2MidFlow(t *testing.T, p *brokertest.Process, restart func()) {
	kept, _ := dialMx(t, p.Address(), "q2-kept", mxConnect{clean: true, expiry: 3600})
	kept.publish(7, 2, "events/q2", []byte("exactly-once"), packets.Properties{})
	if rec := kept.expect(packets.Pubrec, "PUBREC for the kept exchange"); rec.PacketID != 7 || rec.ReasonCode >= 0x80 {
		t.Fatalf("PUBREC id %d reason 0x%02x", rec.PacketID, rec.ReasonCode)
	}
	// A second exchange completes before the stop: its record is stored
	// before its PUBCOMP, and its hold is gone with the release.
	done, _ := dialMx(t, p.Address(), "q2-done", mxConnect{clean: true, expiry: 3600})
	done.publish(11, 2, "events/q2", []byte("released-before"), packets.Properties{})
	if rec := done.expect(packets.Pubrec, "PUBREC for the completed exchange"); rec.PacketID != 11 || rec.ReasonCode >= 0x80 {
		t.Fatalf("PUBREC id %d reason 0x%02x", rec.PacketID, rec.ReasonCode)
	}
	done.pubrel(11)
	if comp := done.expect(packets.Pubcomp, "PUBCOMP before the stop"); comp.PacketID != 11 || comp.ReasonCode != 0 {
		t.Fatalf("PUBCOMP id %d reason 0x%02x", comp.PacketID, comp.ReasonCode)
	}
	gone, _ := dialMx(t, p.Address(), "q2-gone", mxConnect{clean: true})
	gone.publish(9, 2, "events/q2", []byte("never-released"), packets.Properties{})
	if rec := gone.expect(packets.Pubrec, "PUBREC for the exchange whose session ends"); rec.PacketID != 9 || rec.ReasonCode >= 0x80 {
		t.Fatalf("PUBREC id %d reason 0x%02x", rec.PacketID, rec.ReasonCode)
	}

	restart()

	// A hold is not a record: before the PUBREL only the completed
	// exchange is readable.
	if got := replayEvents(t, p.Address(), "q2-witness-1", 300*time.Millisecond); len(got) != 1 || string(got[0].Payload) != "released-before" {
		var payloads []string
		for _, pk := range got {
			payloads = append(payloads, string(pk.Payload))
		}
		t.Fatalf("before the re-sent PUBREL the channel holds %q, want only [released-before]: a hold became a record, or a released one was lost", payloads)
	}

	kept, ack := dialMx(t, p.Address(), "q2-kept", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the QoS 2 publisher's session did not come back: CONNACK Session Present 0")
	}
	kept.pubrel(7)
	if comp := kept.expect(packets.Pubcomp, "PUBCOMP for the re-sent PUBREL"); comp.PacketID != 7 || comp.ReasonCode != 0 {
		t.Fatalf("re-sent PUBREL answered PUBCOMP id %d reason 0x%02x, want 0x00: the exchange did not survive the restart",
			comp.PacketID, comp.ReasonCode)
	}

	gone, ack = dialMx(t, p.Address(), "q2-gone", mxConnect{})
	if ack.SessionPresent {
		t.Fatal("a session that ended with the connection the stop cut was answered Session Present 1")
	}
	// MQTT-4.4.0-1 tells a client answered Session Present 0 not to send
	// this; one that does anyway must find nothing to release.
	gone.pubrel(9)
	if comp := gone.expect(packets.Pubcomp, "PUBCOMP for a PUBREL whose session did not come back"); comp.PacketID != 9 || comp.ReasonCode != 0x92 {
		t.Fatalf("PUBREL of a dropped hold answered PUBCOMP id %d reason 0x%02x, want 0x92", comp.PacketID, comp.ReasonCode)
	}

	// Released before the restart, its PUBCOMP (as far as the broker
	// knows) lost: the record stays, the hold is gone, and the re-sent
	// PUBREL is answered 0x92 — not an error in recovery (MQTT 5 §4.3.3).
	done, ack = dialMx(t, p.Address(), "q2-done", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the completed publisher's session did not come back: CONNACK Session Present 0")
	}
	done.pubrel(11)
	if comp := done.expect(packets.Pubcomp, "PUBCOMP for a PUBREL re-sent after its release"); comp.PacketID != 11 || comp.ReasonCode != 0x92 {
		t.Fatalf("PUBREL of an exchange released before the restart answered PUBCOMP id %d reason 0x%02x, want 0x92",
			comp.PacketID, comp.ReasonCode)
	}

	count := map[string]int{}
	for _, pk := range replayEvents(t, p.Address(), "q2-witness-2", 300*time.Millisecond) {
		count[string(pk.Payload)]++
	}
	if count["never-released"] != 0 {
		t.Fatal("the QoS 2 publish whose session did not come back was written to the channel")
	}
	if count["exactly-once"] != 1 || count["released-before"] != 1 {
		t.Fatalf("records per exchange: exactly-once %d, released-before %d; want exactly 1 each",
			count["exactly-once"], count["released-before"])
	}
}

// A Will with a delay, pending when the broker stops, comes back with its
// due moment (rfcs/sessions-ownership.md: Will — kept with due moment) and is
// published after the restart, at that moment and not before, once. It is
// sent to the append channel, so the test reads when it was published from
// the record's saguin-timestamp rather than from its own clock.
func matrixWillDelay(t *testing.T, p *brokertest.Process, restart func()) {
	const delay = 2
	dev, _ := dialMx(t, p.Address(), "w-dev", mxConnect{clean: true, expiry: 3600, will: &packets.Packet{
		Connect: packets.ConnectParams{WillTopic: "events/will/w-dev", WillPayload: []byte("w-dev is gone"), WillQos: 1,
			WillProperties: packets.Properties{WillDelayInterval: delay}},
	}})
	dropped := time.Now()
	dev.drop()
	// The drop is not acknowledged to anyone: the log line says the broker
	// read it, and the session write that records the due moment follows
	// it at once. A stop before that write is a stop that cut a live
	// connection, whose Will is rightly not published.
	waitForLog(t, p, "the broker noticing the dropped connection", "client disconnected", "client=w-dev")
	time.Sleep(500 * time.Millisecond)
	stopped := time.Now()

	restart()

	w, _ := dialMx(t, p.Address(), "w-watch", mxConnect{clean: true})
	w.subscribe(1, "events/#", 1)
	pk := w.nextPublish("the delayed Will after the restart")
	if pk.TopicName != "events/will/w-dev" || string(pk.Payload) != "w-dev is gone" {
		t.Fatalf("first record after the restart: %s %q, want the Will", pk.TopicName, pk.Payload)
	}
	w.puback(pk.PacketID)
	ts := atoi(t, "saguin-timestamp", prop(pk, "saguin-timestamp"))
	if due := dropped.UnixMilli() + delay*1000; ts < due {
		t.Fatalf("the Will was published %d ms before its due moment", due-ts)
	}
	if ts < stopped.UnixMilli() {
		t.Fatalf("the Will was published %d ms before the broker stopped, not after the restart", stopped.UnixMilli()-ts)
	}
	w.quiet(time.Second, "the Will is published once")
}

// Invariant 18 across the restart matrix: a CONNACK's Session Present tells
// the client what the broker keeps for it, so after a restart it must be 1
// exactly where the session really came back — its subscription restored,
// served without a new SUBSCRIBE — and 0 where the session had ended: a
// device told its session is new must not be served the old one. Sessions
// that outlive their connection come back whether they were away or
// connected when the broker stopped; one that ends with its connection,
// and one ended by DISCONNECT with Session Expiry 0 before the stop, do not
// (rfcs/sessions-ownership.md). A memory provider killed keeps
// exactly its last snapshot (invariant 14), written by a graceful restart
// before the kill: the session set up before that restart comes back, and
// every later one is answered Session Present 0 — a broker claiming a
// session it no longer holds would serve a client as resumed what it lost.
func TestInvariant18_RestartMatrixSessionPresent(t *testing.T) {
	type spCase struct {
		id      string
		present bool
		before  func(c *mxConn) // leaves the session as the case needs
		// early: set up before a graceful restart that precedes the stop
		// under test, so a memory provider has it in its last snapshot.
		early bool
	}
	cases := []spCase{
		{"sp-durable-away", true, func(c *mxConn) { c.disconnect() }, false},
		{"sp-durable-connected", true, func(c *mxConn) {}, false},
		{"sp-ends-with-connection", false, func(c *mxConn) {}, false},
		{"sp-ended-by-disconnect", false, func(c *mxConn) { c.disconnectEnding() }, false},
		{"sp-in-last-snapshot", true, func(c *mxConn) { c.disconnect() }, true},
	}
	setUp := func(t *testing.T, p *brokertest.Process, tc spCase) {
		t.Helper()
		o := mxConnect{clean: true, expiry: 3600}
		if tc.id == "sp-ends-with-connection" {
			o.expiry = 0
		}
		c, _ := dialMx(t, p.Address(), tc.id, o)
		c.subscribe(1, "events/"+tc.id, 1)
		tc.before(c)
	}
	for _, st := range append(append([]matrixStop(nil), matrixStops...), memoryKill) {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			p := startMatrixBroker(t, st.provider)
			for _, tc := range cases {
				if tc.early {
					setUp(t, p, tc)
				}
			}
			p.Term()
			p.Restart()
			for _, tc := range cases {
				if !tc.early {
					setUp(t, p, tc)
				}
			}
			st.stop(p)
			p.Restart()

			pub, _ := dialMx(t, p.Address(), "sp-pub", mxConnect{clean: true})
			for _, tc := range cases {
				t.Run(tc.id, func(t *testing.T) {
					c, ack := dialMx(t, p.Address(), tc.id, mxConnect{expiry: 3600})
					present := tc.present && (st.keeps || tc.early)
					if ack.SessionPresent != present {
						t.Fatalf("after the restart CONNACK Session Present is %v, want %v", ack.SessionPresent, present)
					}
					pub.publish1(1, "events/"+tc.id, "after "+tc.id, packets.Properties{})
					if !present {
						c.quiet(300*time.Millisecond, "a session answered Session Present 0 is served nothing of the old one")
						return
					}
					pk := c.nextPublish("a record its restored subscription matches")
					if string(pk.Payload) != "after "+tc.id {
						t.Fatalf("the resumed session was served %q", pk.Payload)
					}
					c.puback(pk.PacketID)
				})
			}
		})
	}
}
