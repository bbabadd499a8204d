package broker_test

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

const metricsConfig = `
broker:
  id: metrics-test
  log_level: debug
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    max_message_size: 16KiB
    session_queue_bytes: 64KiB
    max_session_expiry: 1d
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
        max_bytes: 256MiB
channels:
  events:
    type: append
    filter: "events/#"
    retention_period: 1h
  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    job_expires_after: 1h
    retry:
      max_attempts: 3
`

// publish1 publishes at QoS 1 and returns the PUBACK's reason code.
func publish1(t *testing.T, c *brokertest.Client, p *paho.Publish) byte {
	t.Helper()
	if p.QoS == 0 {
		p.QoS = 1
	}
	resp, err := c.Publish(p)
	if err != nil && resp == nil {
		t.Fatalf("publish %s: %v", p.Topic, err)
	}
	return resp.ReasonCode
}

func mustPublish(t *testing.T, c *brokertest.Client, topic, payload string) {
	t.Helper()
	if code := publish1(t, c, &paho.Publish{Topic: topic, Payload: []byte(payload)}); code != 0 {
		t.Fatalf("publish %s answered 0x%02x", topic, code)
	}
}

// TestMetricsCatalogue drives every family of the catalogue on a running
// broker with real clients, scraping MetricsHandler as the operations
// listener serves it: each family must move (or, for a configured figure,
// read what was configured), and the scrape must carry exactly the
// catalogue the specification writes — names, types, label names. A
// graceful restart then moves what only a start moves.
func TestMetricsCatalogue(t *testing.T) {
	failCommits, faults := commitFaults()
	m := newMetricsRig(t, metricsConfig, faults)
	addr := func() string { return m.b.Address() }
	base := m.fresh()

	// The queue first: its cycle moves the clock by minutes. Deliver, ack,
	// return, redeliver on the visibility timeout, dead-letter.
	q := &queueRig{t: t, b: m.b, clk: m.clk}
	queueFullCycle(t, q)
	// worker-1 (the cycle's) is taken over by a session with no
	// subscription: from here the only worker is one that never PUBACKs,
	// so its job stays out (DELIVERING has no deadline, invariant 7).
	brokertest.Connect(t, addr(), "worker-1", brokertest.ClientOptions{CleanStart: true})
	holder := brokertest.Connect(t, addr(), "holder", brokertest.ClientOptions{CleanStart: true, ManualAck: true})
	holder.Subscribe("$saguin/queue/jobs", 1)
	pub := brokertest.Connect(t, addr(), "pub", brokertest.ClientOptions{CleanStart: true})
	mustPublish(t, pub, "jobs/held", "held")
	q.next(holder) // the offer loop runs on the clock's ticks
	// A retained job: the flag dropped; nobody is free to take it, so it
	// waits out job_expires_after below and is dead-lettered expired.
	if code := publish1(t, pub, &paho.Publish{Topic: "jobs/retained", Retain: true, Payload: []byte("r")}); code != 0 {
		t.Fatalf("retained job answered 0x%02x", code)
	}
	f := m.until("the queue cycle", func(f families) bool {
		ok := atLeast(1, "saguin_queue_inflight", "channel=jobs")(f) &&
			atLeast(1, "saguin_queue_retain_ignored_total", "channel=jobs")(f)
		return ok
	})
	// The cycle's four deliveries and the held job's: one acked, one
	// returned, one taken back on its timeout, the last attempt's return
	// dead-lettered; the held job and the retained one wait.
	for name, want := range map[string]float64{"saguin_queue_delivered_total": 5, "saguin_queue_acknowledged_total": 1,
		"saguin_queue_returned_total": 1, "saguin_queue_redelivered_total": 1, "saguin_queue_dead_lettered_total": 1,
		"saguin_queue_depth": 2} {
		if got, _ := f.value(name, "channel=jobs"); got != want {
			t.Errorf("%s = %v after the cycle, want %v", name, got, want)
		}
	}

	// Records, consumers and positions on the append channel.
	// reader's session outlives the two hours retention is given below.
	reader := brokertest.Connect(t, addr(), "reader", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 86400})
	reader.Subscribe("events/#", 1)
	part := brokertest.Connect(t, addr(), "part", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	if sa := declare(t, part, "events/#", "topic_hash(4, 0)"); sa.Reasons[0] != 1 {
		t.Fatalf("partitioned subscription granted 0x%02x", sa.Reasons[0])
	}
	for _, p := range []string{"a", "b", "c"} {
		mustPublish(t, pub, "events/"+p, strings.Repeat(p, 8<<10)) // the database grows
	}
	for range 3 {
		reader.Next(wait)
	}
	reader.Close() // its position is stored as its connection ends
	// QoS 2: one exchange completed by a stock client, one held (PUBREC'd,
	// never released) and abandoned when its session ends.
	if code := publish1(t, pub, &paho.Publish{Topic: "events/q2", QoS: 2, Payload: []byte("q2")}); code != 0 {
		t.Fatalf("QoS 2 publish answered 0x%02x", code)
	}
	q2, _ := brokertest.DialRaw(t, addr(), "q2", true, 0)
	q2.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 2}, TopicName: "events/held", PacketID: 7,
		Payload: []byte("held")})
	if pk := q2.Read(); pk.FixedHeader.Type != packets.Pubrec {
		t.Fatalf("QoS 2 publish answered %v", pk.FixedHeader)
	}
	f = m.until("a held QoS 2 publish and a stored position", func(f families) bool {
		return atLeast(1, "saguin_qos2_held")(f) && atLeast(1, "saguin_channel_consumers", "channel=events")(f) &&
			atLeast(1, "saguin_channel_partitioned_consumers", "channel=events")(f)
	})
	if got, _ := f.value("saguin_published_total", "channel=events"); got != 4 {
		t.Errorf("published to events = %v, want 4 (three at QoS 1, one released QoS 2)", got)
	}
	q2.Drop()
	m.until("the held QoS 2 publish abandoned", func(f families) bool {
		held, _ := f.value("saguin_qos2_held")
		return held == 0 && atLeast(1, "saguin_qos2_abandoned_total")(f)
	})

	// A latest channel and a subscriber behind: values replaced while it
	// holds its window are superseded, never sent.
	mustPublish(t, pub, "state/t1", "v1")
	slow := brokertest.Connect(t, addr(), "slow-state", brokertest.ClientOptions{CleanStart: true, ManualAck: true, ReceiveMaximum: 1})
	slow.Subscribe("state/#", 1)
	first := slow.Next(wait)
	for _, v := range []string{"v2", "v3", "v4"} {
		mustPublish(t, pub, "state/t1", v)
	}
	if err := slow.Ack(first); err != nil {
		t.Fatal(err)
	}
	if got := slow.Next(wait); string(got.Payload) != "v4" {
		t.Fatalf("slow subscriber was sent %q after its window opened, want the current v4", got.Payload)
	}
	m.until("values superseded", atLeast(2, "saguin_latest_superseded_total", "channel=state"))

	// Broadcast: delivered, unmatched, retained.
	news := brokertest.Connect(t, addr(), "news-reader", brokertest.ClientOptions{CleanStart: true})
	news.Subscribe("news/#", 1)
	mustPublish(t, pub, "news/x", "hello")
	news.Next(wait)
	if _, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "nobody/listens", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	mustPublish(t, pub, "status/r", "kept")
	if code := publish1(t, pub, &paho.Publish{Topic: "status/r2", Retain: true, Payload: []byte("kept")}); code != 0 {
		t.Fatalf("retained publish answered 0x%02x", code)
	}
	m.until("broadcast", func(f families) bool {
		return atLeast(1, "saguin_broadcast_unmatched_total")(f) && atLeast(1, "saguin_retained_messages")(f) &&
			atLeast(1, "saguin_deliveries_sent_total")(f)
	})

	// Refusals: a CONNECT, a PUBLISH, two SUBSCRIBE filters, and a store
	// that fails under a publish.
	if _, err := brokertest.Dial(t, addr(), "bad\x01id", brokertest.ClientOptions{CleanStart: true}); err == nil {
		t.Fatal("a client id with a control character was admitted")
	}
	if code := publish1(t, pub, &paho.Publish{Topic: "jobs/__dlq/x", Payload: []byte("x")}); code != 0x87 {
		t.Fatalf("publish to a dead-letter channel answered 0x%02x, want 0x87", code)
	}
	sa, _ := pub.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "jobs/#", QoS: 1}, {Topic: "$SYS/#", QoS: 1}}})
	if sa == nil || sa.Reasons[0] != 0x8F || sa.Reasons[1] != 0x87 {
		t.Fatalf("SUBACK %+v, want 0x8F and 0x87", sa)
	}
	failCommits.Store(true)
	if code := publish1(t, pub, &paho.Publish{Topic: "events/lost", Payload: []byte("x")}); code != 0x83 {
		t.Fatalf("publish with the store failing answered 0x%02x, want 0x83", code)
	}
	failCommits.Store(false)
	m.until("every refusal counted", func(f families) bool {
		return atLeast(1, "saguin_connections_refused_total", "reason=client identifier not valid")(f) &&
			atLeast(1, "saguin_publish_refused_total", "reason=not authorized")(f) &&
			atLeast(1, "saguin_publish_refused_total", "reason=implementation specific error")(f) &&
			atLeast(1, "saguin_subscriptions_refused_total", "reason=topic filter invalid")(f) &&
			atLeast(1, "saguin_subscriptions_refused_total", "reason=not authorized")(f) &&
			atLeast(1, "saguin_storage_errors_total", "provider=main")(f)
	})

	// Connections: a capped session expiry, an MQTT 3.1.1 client.
	brokertest.Connect(t, addr(), "long", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 10 * 86400})
	old, ack := brokertest.DialConnect(t, addr(), packets.Packet{ProtocolVersion: 4,
		Connect: packets.ConnectParams{ClientIdentifier: "old", Clean: true, Keepalive: 60}})
	if ack.ReasonCode != 0 {
		t.Fatalf("3.1.1 CONNACK 0x%02x", ack.ReasonCode)
	}
	defer old.Drop()
	m.until("connections by protocol", func(f families) bool {
		return atLeast(1, "saguin_connections_by_protocol", "protocol=3.1.1")(f) &&
			atLeast(1, "saguin_session_expiry_shortened_total")(f)
	})

	// Wills: published at once, after their delay, at a session's end;
	// waiting meanwhile; cancelled by a resume.
	watch := brokertest.Connect(t, addr(), "watch", brokertest.ClientOptions{CleanStart: true})
	watch.Subscribe("status/#", 1)
	drop := func(id string, delay, expiry uint32) {
		c, ack := brokertest.DialConnect(t, addr(), willConnect(id, "status/"+id, delay, expiry))
		if ack.ReasonCode != 0 {
			t.Fatalf("CONNACK for %s: 0x%02x", id, ack.ReasonCode)
		}
		c.Drop()
	}
	drop("w-resumed", 600, 3600)
	drop("w-ended", 600, 3600)
	m.until("Wills waiting", atLeast(2, "saguin_wills_waiting"))
	drop("w-now", 0, 0)
	drop("w-later", 90, 3600)
	resumed, ack := brokertest.DialConnect(t, addr(), packets.Packet{Connect: packets.ConnectParams{
		ClientIdentifier: "w-resumed", Keepalive: 60},
		Properties: packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true}})
	if ack.ReasonCode != 0 || !ack.SessionPresent {
		t.Fatalf("resume CONNACK 0x%02x, session present %v", ack.ReasonCode, ack.SessionPresent)
	}
	defer resumed.Drop()
	brokertest.Connect(t, addr(), "w-ended", brokertest.ClientOptions{CleanStart: true})
	m.until("every Will cause", func(f families) bool {
		return atLeast(1, "saguin_wills_published_total", "cause=immediate")(f) &&
			atLeast(1, "saguin_wills_published_total", "cause=delayed")(f) &&
			atLeast(1, "saguin_wills_published_total", "cause=session_ended")(f) &&
			atLeast(1, "saguin_wills_cancelled_total")(f)
	})

	// Shared groups: held while the member is away, drained when it is
	// back, dropped when its session ends; a member at QoS 0 away is no
	// member for a QoS 1 message.
	member := func(clean bool) *brokertest.Client {
		return brokertest.Connect(t, addr(), "member", brokertest.ClientOptions{CleanStart: clean, SessionExpiry: 3600})
	}
	mb := member(true)
	mb.Subscribe("$share/g/grp/#", 1)
	mb.Close()
	mustPublish(t, pub, "grp/1", "one")
	m.until("a share held", atLeast(1, "saguin_shares_held_total"))
	mb = member(false)
	mb.Next(wait)
	mb.Close()
	mustPublish(t, pub, "grp/2", "two")
	member(true) // the session ends: the group has no member left
	z := brokertest.Connect(t, addr(), "zero", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	z.Subscribe("$share/z/zz/#", 0)
	z.Close()
	mustPublish(t, pub, "zz/1", "nobody")
	m.until("shares drained and dropped", func(f families) bool {
		return atLeast(1, "saguin_shares_drained_total")(f) &&
			atLeast(1, "saguin_shares_dropped_total", "cause=no_member_left")(f) &&
			atLeast(1, "saguin_session_deliveries_dropped_total", "cause=no_shared_member")(f)
	})

	// A subscriber that acknowledges nothing: half of
	// limits.session_queue_bytes fills on the wire, the other half
	// waiting behind a QoS 1 delivery with no room on the wire — the
	// oldest waiting QoS 1 deliveries given up, and of four QoS 0 ones
	// (a third of the half each) at least one dropped.
	deaf := brokertest.Connect(t, addr(), "deaf", brokertest.ClientOptions{CleanStart: true, ManualAck: true})
	deaf.Subscribe("big/#", 1)
	big := strings.Repeat("x", 10<<10)
	for range 10 {
		mustPublish(t, pub, "big/x", big)
	}
	for range 4 {
		if _, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "big/x", Payload: []byte(big)}); err != nil {
			t.Fatal(err)
		}
	}
	m.until("a full session queue", func(f families) bool {
		return atLeast(1, "saguin_deliveries_refused_total")(f) && atLeast(1, "saguin_deliveries_dropped_total")(f) &&
			atLeast(1, "saguin_session_deliveries_dropped_total", "cause=session_queue_full")(f) &&
			// What stays counted whatever the timing: the two QoS 1
			// deliveries the wire's half holds, never acknowledged (about
			// 13 KiB each as charged). Whether any QoS 1 delivery is still
			// waiting behind them depends on when the QoS 0 ones arrived:
			// on a loaded machine all eight were given up and the QoS 0
			// ones written, leaving 26,378 bytes in two deliveries.
			atLeast(2, "saguin_session_queue_messages")(f) && atLeast(20<<10, "saguin_session_queue_bytes")(f)
	})

	// A delivery that expires while its durable session is away.
	ttl := brokertest.Connect(t, addr(), "ttl", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 3600})
	ttl.Subscribe("ttl/#", 1)
	ttl.Close()
	expiry := uint32(30)
	if code := publish1(t, pub, &paho.Publish{Topic: "ttl/1", Payload: []byte("soon gone"),
		Properties: &paho.PublishProperties{MessageExpiry: &expiry}}); code != 0 {
		t.Fatalf("publish with expiry answered 0x%02x", code)
	}
	m.fresh() // past the message's expiry
	brokertest.Connect(t, addr(), "ttl", brokertest.ClientOptions{SessionExpiry: 3600}).Quiet(200 * time.Millisecond)
	m.until("an expired delivery", atLeast(1, "saguin_deliveries_expired_total"))

	// Retention: two more records, then past retention_period. The floor
	// passes reader's stored position — the alert condition (floor above
	// the lowest stored position) — and its resume finds it passed.
	mustPublish(t, pub, "events/d", "d")
	mustPublish(t, pub, "events/e", "e")
	m.clk.Advance(2 * time.Hour)
	f = m.until("retention past a stored position", func(f families) bool {
		floor, _ := f.value("saguin_channel_floor_offset", "channel=events")
		low, ok := f.value("saguin_channel_consumer_position_min", "channel=events")
		return ok && floor > low && atLeast(1, "saguin_channel_retention_removed_total", "channel=events")(f) &&
			atLeast(1, "saguin_queue_expired_total", "channel=jobs")(f)
	})
	if next, _ := f.value("saguin_channel_next_offset", "channel=events"); next != 7 {
		t.Errorf("events next offset %v, want 7", next)
	}
	back := brokertest.Connect(t, addr(), "reader", brokertest.ClientOptions{SessionExpiry: 86400})
	if back.Connack.SessionPresent {
		t.Fatal("a session whose position retention passed was resumed")
	}
	runtime.GC() // the collector's families move
	m.until("a lost position", atLeast(1, "saguin_channel_position_lost_total", "channel=events"))
	body, f := m.scrape() // the same result, within the interval

	// Every family of the specification, and nothing else; and
	// Prometheus's own linter has nothing to say of it.
	checkCatalogue(t, body, f)
	checkConfigured(t, f)
	promtoolAccepts(t, body)
	constant := map[string]bool{
		// Configured figures and constants: checked for their value.
		"saguin_build_info": true, "saguin_max_session_expiry_seconds": true, "saguin_qos2_max_inflight_per_client": true,
		"saguin_provider_info": true, "saguin_provider_max_bytes": true, "saguin_provider_publish_commit_max_records": true,
		"saguin_channel_info": true, "saguin_go_gogc_percent": true, "saguin_go_memory_limit_bytes": true,
		// Time only the collector's assists take: nothing in a test makes
		// a goroutine assist for certain.
		"saguin_go_gc_assist_cpu_seconds_total": true,
		// Moved and back: checked above while it moved.
		"saguin_qos2_held": true,
		// Counted only at a start: checked after the restart below.
		"saguin_sessions_restored_total": true, "saguin_sessions_dropped_total": true,
	}
	for name := range specFamilies(t) {
		if !constant[name] && !m.moved[name] {
			t.Errorf("%s never moved (first scrape: %v)", name, base[name])
		}
	}

	// A graceful restart: the storage figures are what was stored, and
	// what only a start does moves. A Will falls due and a session
	// expires while the broker is stopped (and the held job ages past
	// job_expires_after: the queue's figures move, so they are not
	// compared).
	drop("w-start", 600, 3600)
	gone := brokertest.Connect(t, addr(), "gone", brokertest.ClientOptions{CleanStart: true, SessionExpiry: 900})
	gone.Subscribe("news/#", 1)
	gone.Close()
	stored := m.until("the Will waiting", atLeast(1, "saguin_wills_waiting"))
	if err := m.b.Broker.Close(); err != nil {
		t.Fatal(err)
	}
	m.clk.Advance(20 * time.Minute)
	m.b.Restart()
	m.last = nil
	after := m.until("what a start moves", func(f families) bool {
		return atLeast(1, "saguin_sessions_restored_total")(f) &&
			atLeast(1, "saguin_sessions_dropped_total", "cause=expired_while_stopped")(f) &&
			atLeast(1, "saguin_wills_published_total", "cause=start")(f)
	})
	for _, g := range []struct {
		name   string
		labels []string
	}{
		{"saguin_channel_next_offset", []string{"channel=events"}},
		{"saguin_channel_floor_offset", []string{"channel=events"}},
		{"saguin_channel_records", []string{"channel=events"}},
		{"saguin_channel_bytes", []string{"channel=events"}},
		{"saguin_channel_records", []string{"channel=state"}},
		{"saguin_retained_messages", nil},
	} {
		before, ok1 := stored.value(g.name, g.labels...)
		now, ok2 := after.value(g.name, g.labels...)
		if !ok1 || !ok2 || before != now {
			t.Errorf("%s%v: %v before the restart, %v after (present %v, %v)", g.name, g.labels, before, now, ok1, ok2)
		}
	}
	if b, _ := after.value("saguin_provider_bytes", "provider=main"); b <= 0 {
		t.Errorf("provider bytes after the restart: %v", b)
	}
}

// checkConfigured: the families that show configuration read what was
// configured, and the runtime's settings what the runtime has.
func checkConfigured(t *testing.T, f families) {
	t.Helper()
	gogc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gogc)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"saguin_build_info", []string{"version=test", "broker_id=metrics-test"}, 1},
		{"saguin_max_session_expiry_seconds", nil, 86400},
		{"saguin_qos2_max_inflight_per_client", nil, 20},
		{"saguin_provider_info", []string{"provider=main", "type=sqlite"}, 1},
		{"saguin_provider_max_bytes", []string{"provider=main"}, 256 << 20},
		{"saguin_provider_publish_commit_max_records", []string{"provider=main"}, 256},
		{"saguin_channel_info", []string{"channel=events", "filter=events/#", "type=append", "provider=main"}, 1},
		{"saguin_channel_info", []string{"channel=jobs__dlq", "type=append"}, 1},
		{"saguin_go_gogc_percent", nil, float64(gogc)},
		{"saguin_go_memory_limit_bytes", nil, float64(debug.SetMemoryLimit(-1))},
	} {
		if got, ok := f.value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	// Series only where the number exists: no offsets on a queue, no
	// records on a queue, no bytes on a latest channel.
	for _, absent := range []struct{ name, channel string }{
		{"saguin_channel_next_offset", "jobs"}, {"saguin_channel_records", "jobs"}, {"saguin_channel_bytes", "state"},
		{"saguin_queue_depth", "events"}, {"saguin_latest_superseded_total", "events"},
	} {
		if _, ok := f.value(absent.name, "channel="+absent.channel); ok {
			t.Errorf("%s has a series for %s, which has no such number", absent.name, absent.channel)
		}
	}
}
