package broker_test

import (
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// wordSizeConfig is one append channel bounded by retention_bytes (so it
// has a floor above 1), one latest channel and one queue, with the
// sessions and the retained store on the same provider: everything a
// provider keeps, in one data directory.
func wordSizeConfig(provider string) string {
	return appendConfigWith(provider, `    retention_bytes: 1000
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    retry:
      max_attempts: 5
`)
}

// docs/operations.md "32-bit devices": 32-bit and 64-bit builds both run, and a
// database written at one word size reads at the other. A broker of one word size stores a workload on a
// sqlite database and on a memory provider's snapshot files and stops
// gracefully; a broker of the other word size is started on the same data
// directory and must serve exactly what the first one would have: the same
// records at the same offsets with the same properties, ids and
// timestamps, the same floor, the same latest values, the durable
// consumer's position, the queue's attempt counts, a QoS 2 exchange held
// between PUBREC and PUBREL, the retained message — and go on numbering
// where the first left off (invariant 9). Both directions, both providers.
func TestDataDirectoryServedByTheOtherWordSize(t *testing.T) {
	wide, narrows := brokertest.HostWordSizes(t)
	bins := map[string]string{wide: brokertest.BinaryFor(t, wide)}
	classes := map[string]elf.Class{wide: elf.ELFCLASS64}
	for _, narrow := range narrows {
		bins[narrow] = brokertest.BinaryFor(t, narrow)
		classes[narrow] = elf.ELFCLASS32
	}
	// A binary that is not the width its name says would make this test
	// prove nothing: read the ELF header.
	for arch, want := range classes {
		f, err := elf.Open(bins[arch])
		if err != nil {
			t.Fatalf("the %s build: %v", arch, err)
		}
		if f.Class != want {
			t.Fatalf("the %s build is %v, want %v", arch, f.Class, want)
		}
		_ = f.Close()
	}
	providers := []struct{ name, conf string }{{"sqlite", sqliteProvider}, {"memory-snapshot", memoryProvider}}
	var moves [][2]string
	for _, narrow := range narrows {
		moves = append(moves, [2]string{wide, narrow}, [2]string{narrow, wide})
	}
	for _, pr := range providers {
		for _, dir := range moves {
			t.Run(pr.name+"/"+dir[0]+"-to-"+dir[1], func(t *testing.T) {
				t.Parallel()
				data := t.TempDir()
				if err := os.MkdirAll(filepath.Join(data, "snapshots"), 0o700); err != nil {
					t.Fatal(err)
				}
				cfg := brokertest.Config(t, data, wordSizeConfig(pr.conf))
				writer := brokertest.StartBinary(t, bins[dir[0]], cfg)
				before := writeWordSizeWorkload(t, writer)
				writer.Term()

				reader := brokertest.StartBinary(t, bins[dir[1]], cfg)
				readWordSizeWorkload(t, reader, before)
			})
		}
	}
}

// wordSizeView is what the writer served just before it stopped, read by
// witnesses that store nothing.
type wordSizeView struct {
	events []string          // the events channel from its floor, one line a record
	state  map[string]string // the latest channel's values, one line a topic
	job2ID string            // the saguin-id of the job left unanswered
}

const (
	// Twenty records of 1100-byte payloads, each alone above the channel's
	// retention_bytes of 1000, then five small ones that fit together: the
	// size sweep removes every large one and no small one, whatever the
	// exact per-record overhead, so the floor settles at exactly 21.
	bigRecords   = 20
	smallRecords = 5
	wantFloor    = bigRecords + 1
)

func writeWordSizeWorkload(t *testing.T, p *brokertest.Process) wordSizeView {
	t.Helper()
	pub, _ := dialMx(t, p.Address(), "ws-pub", mxConnect{clean: true})
	id := uint16(1)
	next := func() uint16 { id++; return id }
	for i := 1; i <= bigRecords; i++ {
		pub.publish1(next(), "events/big", fmt.Sprintf("big-%02d-%s", i, strings.Repeat("x", 1100)), packets.Properties{})
	}
	for i := bigRecords + 1; i <= bigRecords+smallRecords; i++ {
		pub.publish1(next(), "events/small", fmt.Sprintf("small-%02d", i), packets.Properties{
			ContentType: "text/plain", ResponseTopic: "replies/ws", CorrelationData: []byte{0, 1, 0xfe, byte(i)},
			PayloadFormat: 1, PayloadFormatFlag: true,
			User: []packets.UserProperty{{Key: "seq", Val: strconv.Itoa(i)}, {Key: "dup", Val: "a"}, {Key: "dup", Val: "b"}},
		})
	}
	// The floor is the size sweep's (every second): wait for it to settle.
	var events []string
	deadline := time.Now().Add(mxWait)
	for poll := 0; ; poll++ {
		events = recordLines(replayEvents(t, p.Address(), fmt.Sprintf("ws-floor-%d", poll), 200*time.Millisecond))
		if len(events) == smallRecords && strings.HasPrefix(events[0], fmt.Sprintf("offset=%d ", wantFloor)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the size sweep did not settle the floor at %d within %s; the channel holds:\n%s",
				wantFloor, mxWait, strings.Join(events, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A durable consumer acknowledges 21 and 22 and leaves 23..25 sent and
	// unacknowledged: its stored position is 23.
	c1, _ := dialMx(t, p.Address(), "ws-c1", mxConnect{clean: true, expiry: 3600, receiveMaximum: 10})
	c1.subscribe(1, "events/#", 1)
	for off := wantFloor; off < wantFloor+smallRecords; off++ {
		pk := c1.nextPublish("the durable consumer's first read")
		if got := prop(pk, "saguin-offset"); got != strconv.Itoa(off) {
			t.Fatalf("the durable consumer was sent offset %s where %d was due", got, off)
		}
		if off < wantFloor+2 {
			c1.puback(pk.PacketID)
		}
	}
	c1.disconnect()

	// Latest: a replaced value, a kept one, one set and deleted (offsets 1..5).
	for _, kv := range [][2]string{{"state/a", "a1"}, {"state/b", "b1"}, {"state/a", "a2"}, {"state/c", "c1"}, {"state/c", ""}} {
		pub.publish1(next(), kv[0], kv[1], packets.Properties{})
	}

	// The retained store: one broadcast retained message.
	pub.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, ProtocolVersion: 5,
		PacketID: next(), TopicName: "news/kept", Payload: []byte("retained across word sizes")}, (*packets.Packet).PublishEncode)
	if ack := pub.expect(packets.Puback, "PUBACK for the retained message"); ack.ReasonCode != 0 {
		t.Fatalf("retained publish: PUBACK 0x%02x", ack.ReasonCode)
	}

	// The queue: job-1 answered (resolved), job-2 transport-acknowledged
	// and unanswered (its attempt spent), job-3 never acknowledged.
	pub.publish1(next(), "jobs/a", "job-1", packets.Properties{})
	w1, _ := dialMx(t, p.Address(), "ws-w1", mxConnect{clean: true, receiveMaximum: 1})
	w1.subscribe(1, "$saguin/queue/jobs", 1)
	job1 := w1.nextPublish("job-1")
	if string(job1.Payload) != "job-1" || prop(job1, "saguin-attempt") != "1" {
		t.Fatalf("first offer %q attempt %s", job1.Payload, prop(job1, "saguin-attempt"))
	}
	w1.puback(job1.PacketID)
	w1.publish(1, 1, job1.Properties.ResponseTopic, []byte("ack"), packets.Properties{CorrelationData: job1.Properties.CorrelationData})
	if ack := w1.expect(packets.Puback, "PUBACK for job-1's answer"); ack.ReasonCode != 0 {
		t.Fatalf("job-1's answer: PUBACK 0x%02x", ack.ReasonCode)
	}
	pub.publish1(next(), "jobs/a", "job-2", packets.Properties{})
	job2 := w1.nextPublish("job-2")
	if string(job2.Payload) != "job-2" || prop(job2, "saguin-id") == "" {
		t.Fatalf("second offer %q, saguin-id %q", job2.Payload, prop(job2, "saguin-id"))
	}
	w1.puback(job2.PacketID)
	// The SUBACK is written after the PUBACK before it was read: the spent
	// attempt is stored before the stop.
	w1.subscribe(2, "news/ws-w1-sync", 1)
	pub.publish1(next(), "jobs/a", "job-3", packets.Properties{})

	// A QoS 2 exchange stopped between PUBREC and PUBREL.
	q2, _ := dialMx(t, p.Address(), "ws-q2", mxConnect{clean: true, expiry: 3600})
	q2.publish(7, 2, "events/q2", []byte("exactly-once"), packets.Properties{})
	if rec := q2.expect(packets.Pubrec, "PUBREC"); rec.PacketID != 7 || rec.ReasonCode >= 0x80 {
		t.Fatalf("PUBREC id %d reason 0x%02x", rec.PacketID, rec.ReasonCode)
	}

	return wordSizeView{
		events: recordLines(witness(t, p.Address(), "ws-witness-events", "events/#", smallRecords)),
		state:  stateLines(witness(t, p.Address(), "ws-witness-state", "state/#", 2)),
		job2ID: prop(job2, "saguin-id"),
	}
}

func readWordSizeWorkload(t *testing.T, p *brokertest.Process, before wordSizeView) {
	t.Helper()
	// Records, offsets, floor, properties, ids and timestamps: the same.
	if got := recordLines(witness(t, p.Address(), "ws-witness-events", "events/#", len(before.events))); !slices.Equal(got, before.events) {
		t.Fatalf("the events channel reads differently on the other word size:\nbefore:\n%s\nafter:\n%s",
			strings.Join(before.events, "\n"), strings.Join(got, "\n"))
	}
	if got := stateLines(witness(t, p.Address(), "ws-witness-state", "state/#", len(before.state))); !maps.Equal(got, before.state) {
		t.Fatalf("the latest channel reads differently on the other word size:\nbefore: %v\nafter:  %v", before.state, got)
	}

	// The durable consumer resumes at its stored position, 23.
	c1, ack := dialMx(t, p.Address(), "ws-c1", mxConnect{expiry: 3600, receiveMaximum: 10})
	if !ack.SessionPresent {
		t.Fatal("the durable consumer's session did not come back: CONNACK Session Present 0")
	}
	for off := wantFloor + 2; off < wantFloor+smallRecords; off++ {
		pk := c1.nextPublish("the resumed consumer")
		if got := prop(pk, "saguin-offset"); got != strconv.Itoa(off) {
			t.Fatalf("the consumer whose stored position is %d was sent offset %s where %d was due", wantFloor+2, got, off)
		}
		c1.puback(pk.PacketID)
	}

	// The held QoS 2 publish is released into the next offset, 26.
	q2, ack := dialMx(t, p.Address(), "ws-q2", mxConnect{expiry: 3600})
	if !ack.SessionPresent {
		t.Fatal("the QoS 2 publisher's session did not come back: CONNACK Session Present 0")
	}
	q2.pubrel(7)
	if comp := q2.expect(packets.Pubcomp, "PUBCOMP"); comp.PacketID != 7 || comp.ReasonCode != 0 {
		t.Fatalf("PUBREL of the held exchange: PUBCOMP id %d reason 0x%02x, want 0x00", comp.PacketID, comp.ReasonCode)
	}
	held := c1.nextPublish("the released QoS 2 record")
	if string(held.Payload) != "exactly-once" || prop(held, "saguin-offset") != strconv.Itoa(wantFloor+smallRecords) {
		t.Fatalf("after the release the consumer was sent %q at offset %s, want exactly-once at %d",
			held.Payload, prop(held, "saguin-offset"), wantFloor+smallRecords)
	}
	c1.puback(held.PacketID)
	c1.quiet(300*time.Millisecond, "nothing else is owed")

	// Numbering goes on where the writer stopped (invariant 9): the events
	// channel at 27, the latest channel at 6 (its tombstone took 5).
	pub, _ := dialMx(t, p.Address(), "ws-pub", mxConnect{clean: true})
	pub.publish1(1, "events/after", "after", packets.Properties{})
	if pk := c1.nextPublish("a record published on the other word size"); prop(pk, "saguin-offset") != strconv.Itoa(wantFloor+smallRecords+1) {
		t.Fatalf("the first record published after the move has offset %s, want %d", prop(pk, "saguin-offset"), wantFloor+smallRecords+1)
	}
	pub.publish1(2, "state/b", "b2", packets.Properties{})
	if got := stateLines(witness(t, p.Address(), "ws-witness-state-2", "state/#", 2))["state/b"]; !strings.HasPrefix(got, "offset=6 ") {
		t.Fatalf("the first latest value set after the move: %s, want offset 6", got)
	}

	// The queue: job-1 stays resolved; job-2 comes back as attempt 2 under
	// the same message id, then (a worker holds one job of a queue at a
	// time, in offset order) job-3 as attempt 1.
	w2, _ := dialMx(t, p.Address(), "ws-w2", mxConnect{clean: true})
	w2.subscribe(1, "$saguin/queue/jobs", 1)
	// The next offer may overtake the PUBACK of the answer that frees the
	// worker for it: offers read while waiting for a PUBACK are kept.
	var early []packets.Packet
	for i, want := range []struct{ payload, attempt, id string }{{"job-2", "2", before.job2ID}, {"job-3", "1", ""}} {
		var pk packets.Packet
		if len(early) > 0 {
			pk, early = early[0], early[1:]
		} else {
			pk = w2.nextPublish(want.payload + " after the move")
		}
		if string(pk.Payload) != want.payload || prop(pk, "saguin-attempt") != want.attempt ||
			(want.id != "" && prop(pk, "saguin-id") != want.id) {
			t.Fatalf("after the move the worker was offered %q attempt %s id %s; want %s attempt %s (id %s)",
				pk.Payload, prop(pk, "saguin-attempt"), prop(pk, "saguin-id"), want.payload, want.attempt, want.id)
		}
		w2.puback(pk.PacketID)
		w2.publish(uint16(i+1), 1, pk.Properties.ResponseTopic, []byte("ack"), packets.Properties{CorrelationData: pk.Properties.CorrelationData})
		for {
			got := w2.read(mxWait)
			if got.FixedHeader.Type == packets.Publish {
				early = append(early, got)
				continue
			}
			if got.FixedHeader.Type != packets.Puback || got.PacketID != uint16(i+1) || got.ReasonCode != 0 {
				t.Fatalf("the answer to %s: packet type %d id %d reason 0x%02x, want PUBACK %d 0x00",
					want.payload, got.FixedHeader.Type, got.PacketID, got.ReasonCode, i+1)
			}
			break
		}
	}
	if len(early) > 0 {
		t.Fatalf("offered %q after job-3: job-1 was resolved before the move", early[0].Payload)
	}
	w2.quiet(300*time.Millisecond, "job-1 was resolved before the move, job-2 and job-3 since")

	// The retained message.
	r, _ := dialMx(t, p.Address(), "ws-retained", mxConnect{clean: true})
	r.subscribe(1, "news/#", 1)
	if pk := r.nextPublish("the retained message"); pk.TopicName != "news/kept" || string(pk.Payload) != "retained across word sizes" || !pk.FixedHeader.Retain {
		t.Fatalf("retained after the move: %s %q retain %v", pk.TopicName, pk.Payload, pk.FixedHeader.Retain)
	}
	p.Term()
}

// recordLines is each delivered record as one comparable line: offset,
// topic, payload and every property the record carries from storage.
func recordLines(pks []packets.Packet) []string {
	out := make([]string, 0, len(pks))
	for _, pk := range pks {
		out = append(out, recordLine(pk))
	}
	return out
}

func recordLine(pk packets.Packet) string {
	pr := pk.Properties
	payload := string(pk.Payload)
	if len(payload) > 40 {
		payload = fmt.Sprintf("%s…(%d bytes)", payload[:40], len(payload))
	}
	return fmt.Sprintf("offset=%s topic=%s payload=%q content-type=%q response-topic=%q correlation=%x format=%d/%v user=%v",
		prop(pk, "saguin-offset"), pk.TopicName, payload, pr.ContentType, pr.ResponseTopic, pr.CorrelationData,
		pr.PayloadFormat, pr.PayloadFormatFlag, pr.User)
}

// stateLines is each latest value as one comparable line, keyed by topic.
func stateLines(pks []packets.Packet) map[string]string {
	out := map[string]string{}
	for _, pk := range pks {
		out[pk.TopicName] = recordLine(pk)
	}
	return out
}

// witness subscribes a fresh connection that stores nothing to filter,
// reads the n publishes it is owed, and fails if a further one follows.
func witness(t *testing.T, addr, id, filter string, n int) []packets.Packet {
	t.Helper()
	c, _ := dialMx(t, addr, id, mxConnect{clean: true})
	c.subscribe(1, filter, 1)
	out := make([]packets.Packet, 0, n)
	for range n {
		pk := c.nextPublish(fmt.Sprintf("%s: %d publishes", filter, n))
		out = append(out, pk)
		if pk.FixedHeader.Qos > 0 {
			c.puback(pk.PacketID)
		}
	}
	c.quiet(300*time.Millisecond, fmt.Sprintf("%s holds %d, no more", filter, n))
	c.drop()
	return out
}
