package broker_test

// A model-based test of the queue engine (docs/channels.md "`queue`"): rapid draws a
// sequence of publishes, clock moves, answers, disconnects, reconnects and
// restarts; a real broker on a fake clock serves three stock paho workers
// over real sockets; the harness records what each worker received and when,
// and a checker decides whether any correct broker could have produced it.
//
// The harness cannot know when the broker handed a job over: a delivery is
// seen only when a worker's buffer is drained, and a slow machine can hold it
// on the wire across any number of harness steps. So every time below is a
// bound, and the checker only reports what no ordering within the bounds can
// explain (soundness: a correct broker on a slow machine is never accused).

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"pgregory.net/rapid"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
)

// queueModel drives one broker and records its history.
type queueModel struct {
	t        *testing.T // brokertest needs a testing.TB; rapid.T is not one
	rt       *rapid.T
	clk      *clock.Fake
	epoch    time.Time
	b        *brokertest.Broker
	manual   bool
	ev       int
	h        queueHistory
	conns    []*qmConn
	holders  map[string]*qmConn // worker → its open connection
	workers  []string
	producer *brokertest.Client
	ops      *brokertest.Client // the dead-letter reader (final phase)
	topics   map[string]string  // payload → topic
	offsets  map[uint64]string  // offset → payload
	corrs    map[string]bool
	records  map[string]bool // dead-letter records seen
	problems []string
	log      []string
}

type qmConn struct {
	c       *brokertest.Client
	idx     int
	open    bool
	seq     int
	pending []int // own deliveries not yet answered
	pubs    map[int]*paho.Publish
}

func newQueueModel(t *testing.T, rt *rapid.T, manual bool) *queueModel {
	epoch := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(epoch)
	m := &queueModel{t: t, rt: rt, clk: clk, epoch: epoch, manual: manual,
		b:       brokertest.Start(t, brokertest.Config(t, t.TempDir(), queueConfig), brokertest.WithClock(clk)),
		h:       queueHistory{visibility: 30 * time.Second, maxAttempts: 3, published: map[string]stamp{}},
		holders: map[string]*qmConn{}, workers: []string{"w1", "w2", "w3"},
		topics: map[string]string{}, offsets: map[uint64]string{}, corrs: map[string]bool{}, records: map[string]bool{}}
	// Each case ends its broker and clients itself: the test's own cleanups
	// would keep every case's broker open until the whole test ends.
	rt.Cleanup(func() {
		for _, qc := range m.conns {
			if qc.open {
				qc.c.Close()
			}
		}
		stop := watchdog("the broker's graceful stop")
		_ = m.b.Close()
		stop()
	})
	for _, w := range m.workers {
		m.connect(w, manual)
	}
	return m
}

func (m *queueModel) now() stamp { return stamp{at: m.clk.Now().Sub(m.epoch), ev: m.ev} }
func (m *queueModel) logf(format string, args ...any) {
	m.log = append(m.log, m.now().String()+" "+fmt.Sprintf(format, args...))
}

func (m *queueModel) connect(name string, manual bool) *qmConn {
	m.ev++
	// A fresh client id for every connection: reconnecting under the same id
	// right after a clean DISCONNECT can lose the new connection to the old
	// one's teardown (TestInvariant17_LateTeardownLeavesTheReconnectedClientAlone),
	// which is not what this test is about.
	id := fmt.Sprintf("%s.%d", name, len(m.conns))
	c := brokertest.Connect(m.t, m.b.Address(), id, brokertest.ClientOptions{CleanStart: true, ManualAck: manual, Buffer: 1024})
	if sa := c.Subscribe("$saguin/queue/jobs", 1); sa.Reasons[0] != 1 {
		m.rt.Fatalf("queue subscription granted 0x%02x", sa.Reasons[0])
	}
	qc := &qmConn{c: c, idx: len(m.conns), open: true, pubs: map[int]*paho.Publish{}}
	m.conns = append(m.conns, qc)
	m.h.conns = append(m.h.conns, qhConn{worker: name, manual: manual, start: m.now(), end: never()})
	m.holders[name] = qc
	m.logf("%s connected as conn %d (manual PUBACK %v)", name, qc.idx, manual)
	return qc
}

func (m *queueModel) disconnect(name string) {
	qc := m.holders[name]
	if qc == nil {
		return
	}
	m.ev++
	qc.open, qc.pending = false, nil
	m.h.conns[qc.idx].end = m.now()
	delete(m.holders, name)
	qc.c.Close() // returns once the broker closed the connection
	m.logf("%s closed conn %d", name, qc.idx)
}

func (m *queueModel) publish() {
	m.ev++
	if m.producer == nil {
		m.producer = brokertest.Connect(m.t, m.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true, Buffer: 16})
	}
	n := len(m.h.published) + 1
	payload, topic := fmt.Sprintf("job-%d", n), fmt.Sprintf("jobs/kind/%d", n)
	m.topics[payload] = topic
	m.h.published[payload] = m.now()
	resp, err := m.producer.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
	if err != nil || resp.ReasonCode != 0 {
		m.rt.Fatalf("publish %s: %v %+v", payload, err, resp)
	}
	m.logf("published %s", payload)
}

func (m *queueModel) advance(d time.Duration) {
	m.ev++
	m.clk.Advance(d)
	m.logf("clock +%v", d)
}

// answer sends the verdict for delivery i from connection qc, echoing its
// Correlation Data on its Response Topic (docs/channels.md). own: qc is where it came.
func (m *queueModel) answer(qc *qmConn, i int, verdict string) {
	m.ev++
	job := m.conns[m.h.deliveries[i].conn].pubs[i]
	own := m.h.deliveries[i].conn == qc.idx
	resp, err := qc.c.Publish(&paho.Publish{Topic: job.Properties.ResponseTopic, QoS: 1, Payload: []byte(verdict),
		Properties: &paho.PublishProperties{CorrelationData: job.Properties.CorrelationData}})
	if own {
		m.h.deliveries[i].answer = &qhAnswer{verdict: verdict, at: m.now(), confirmed: err == nil && resp.ReasonCode == 0}
		for k, p := range qc.pending {
			if p == i {
				qc.pending = append(qc.pending[:k], qc.pending[k+1:]...)
				break
			}
		}
		if m.h.conns[qc.idx].manual {
			m.puback(qc, i) // a paho worker acknowledges the packet after answering it
		}
	}
	m.logf("%s answered %s for %s (delivery %d, own %v): err %v", m.h.conns[qc.idx].worker, verdict,
		m.h.deliveries[i].payload, i, own, err)
}

func (m *queueModel) puback(qc *qmConn, i int) {
	if m.h.deliveries[i].puback != never() {
		return
	}
	if err := qc.c.Ack(qc.pubs[i]); err != nil {
		m.rt.Fatalf("ack: %v", err)
	}
	m.h.deliveries[i].puback = m.now()
	m.logf("%s let the PUBACK for delivery %d go", m.h.conns[qc.idx].worker, i)
}

// restart stops the broker gracefully and starts it on the same data: every
// connection ends, and the workers that were connected come back on the new
// port (invariant 15: nothing they held is theirs any more).
func (m *queueModel) restart() {
	m.ev++
	m.logf("restart")
	end := m.now()
	var back []string
	for _, w := range m.workers {
		if qc := m.holders[w]; qc != nil {
			back = append(back, w)
			qc.open, qc.pending = false, nil
			m.h.conns[qc.idx].end = end
			delete(m.holders, w)
		}
	}
	stop := watchdog("the broker's graceful restart")
	m.b.Restart()
	stop()
	for _, qc := range m.conns {
		select {
		case <-qc.c.Done():
		case <-time.After(10 * time.Second):
			m.rt.Fatalf("conn %d did not see the broker go", qc.idx)
		}
	}
	m.producer = nil
	m.settle()
	for _, w := range back {
		m.connect(w, m.manual)
	}
}

func (m *queueModel) observe(qc *qmConn, p *paho.Publish) {
	u := p.Properties.User
	off, err1 := strconv.ParseUint(u.Get("saguin-offset"), 10, 64)
	att, err2 := strconv.Atoi(u.Get("saguin-attempt"))
	payload, corr := string(p.Payload), string(p.Properties.CorrelationData)
	problem := func(format string, args ...any) {
		m.problems = append(m.problems, fmt.Sprintf("conn %d: ", qc.idx)+fmt.Sprintf(format, args...))
	}
	switch {
	case err1 != nil || err2 != nil:
		problem("delivery of %q lacks saguin-offset/saguin-attempt: %v", payload, u)
		return
	case m.topics[payload] == "":
		problem("delivered %q, which nobody published", payload)
		return
	case p.Topic != m.topics[payload]:
		problem("%s delivered on %s, published on %s", payload, p.Topic, m.topics[payload])
	case p.Properties.ResponseTopic != "$saguin/queue/jobs/response" || len(corr) == 0 || len(corr) > 32:
		problem("%s: response topic %q, correlation data %d bytes", payload, p.Properties.ResponseTopic, len(corr))
	case m.corrs[corr]:
		problem("%s: a Delivery ID was used twice (it is unique to the attempt)", payload)
	}
	if prev, ok := m.offsets[off]; ok && prev != payload {
		problem("offset %d carried %s and %s", off, prev, payload)
	}
	m.offsets[off] = payload
	m.corrs[corr] = true
	i := len(m.h.deliveries)
	m.h.deliveries = append(m.h.deliveries, qhDelivery{conn: qc.idx, seq: qc.seq, offset: off, attempt: att,
		payload: payload, seen: m.now(), puback: never()})
	qc.seq++
	qc.pubs[i] = p
	if qc.open {
		qc.pending = append(qc.pending, i)
	}
	m.logf("%s got %s offset %d attempt %d (delivery %d, conn %d)", m.h.conns[qc.idx].worker, payload, off, att, i, qc.idx)
}

func (m *queueModel) drain() int {
	got := 0
	for _, qc := range m.conns {
		for more := true; more; {
			select {
			case p := <-qc.c.Msgs:
				m.observe(qc, p)
				got++
			default:
				more = false
			}
		}
		if !qc.open {
			continue
		}
		select {
		case <-qc.c.Done(): // the broker dropped it: a bug of its own, but judged only by its effects
			qc.open, qc.pending = false, nil
			m.h.conns[qc.idx].end, m.h.conns[qc.idx].lost = m.now(), true
			delete(m.holders, m.h.conns[qc.idx].worker)
			m.logf("conn %d LOST", qc.idx)
		default:
		}
	}
	if m.producer != nil {
		select {
		case p := <-m.producer.Msgs:
			m.problems = append(m.problems, fmt.Sprintf("the producer, subscribed to nothing, received %q", p.Payload))
		default:
		}
	}
	if m.ops != nil {
		for more := true; more; {
			select {
			case p := <-m.ops.Msgs:
				m.deadLetter(p)
				got++
			default:
				more = false
			}
		}
	}
	return got
}

func (m *queueModel) deadLetter(p *paho.Publish) {
	u := p.Properties.User
	rec := u.Get("saguin-offset")
	if m.records[rec] {
		return // the reader's own redelivery of one record is not a second dead letter
	}
	m.records[rec] = true
	off, _ := strconv.ParseUint(u.Get("saguin-dlq-offset"), 10, 64)
	att, _ := strconv.Atoi(u.Get("saguin-dlq-attempts"))
	payload := string(p.Payload)
	if want := strings.Replace(m.topics[payload], "jobs/", "jobs/__dlq/", 1); p.Topic != want {
		m.problems = append(m.problems, fmt.Sprintf("dead letter %s on %s, want %s", payload, p.Topic, want))
	}
	m.h.dead = append(m.h.dead, qhDead{payload: payload, reason: u.Get("saguin-dlq-reason"), offset: off, attempts: att, record: rec})
	m.logf("dead letter %s (offset %d, %d attempts, %s)", payload, off, att, u.Get("saguin-dlq-reason"))
}

// settle drains every worker until nothing has arrived for 25ms (bounded).
// Nothing depends on it catching everything: a late delivery is recorded
// later, with a later bound.
func (m *queueModel) settle() {
	m.ev++
	quiet, stop := time.Now(), time.Now().Add(500*time.Millisecond)
	for time.Now().Before(stop) && time.Since(quiet) < 25*time.Millisecond {
		if m.drain() > 0 {
			quiet = time.Now()
		}
		time.Sleep(3 * time.Millisecond)
	}
}

func (m *queueModel) verify(final bool) {
	bad := append(append([]string(nil), m.problems...), m.h.check(final)...)
	if len(bad) == 0 {
		return
	}
	tail := m.log
	if len(tail) > 200 {
		tail = tail[len(tail)-200:]
	}
	m.rt.Fatalf("%s\n\nwhat the harness did and saw (fake time#event):\n%s", strings.Join(bad, "\n"), strings.Join(tail, "\n"))
}

// finish: every worker leaves, a fresh worker acks whatever it is given, and
// a fresh subscriber reads the dead-letter channel from its floor — until
// every published job is accounted for (bounded in real time).
func (m *queueModel) finish() {
	for _, w := range m.workers {
		m.disconnect(w)
	}
	m.settle()
	m.ops = brokertest.Connect(m.t, m.b.Address(), "ops", brokertest.ClientOptions{CleanStart: true, Buffer: 1024})
	m.ops.Subscribe("jobs/__dlq/#", 1)
	fin := m.connect("fin", false)
	ackAll := func() {
		for len(fin.pending) > 0 {
			m.answer(fin, fin.pending[0], "ack")
		}
	}
	stop := time.Now().Add(20 * time.Second)
	for quiet := 0; quiet < 5 && time.Now().Before(stop); {
		seen := len(m.h.deliveries) + len(m.h.dead)
		m.advance(200 * time.Millisecond)
		m.settle()
		ackAll()
		if len(m.h.deliveries)+len(m.h.dead) == seen && m.settledAll() {
			quiet++
		} else {
			quiet = 0
		}
		m.verify(false)
	}
	// Anything still out would come back now; nothing should.
	m.advance(31 * time.Second)
	m.settle()
	ackAll()
	m.advance(200 * time.Millisecond)
	m.settle()
	// Closed, fin's buffer is complete: everything counted was seen.
	m.disconnect("fin")
	m.settle()
}

// settledAll: every job has a dead letter or an ack its holder sent while it
// may still have been current. A job whose every ack was surely superseded is
// still in the queue and must reach the final worker, however long that takes.
func (m *queueModel) settledAll() bool {
	a, bad := m.h.analyse()
	if bad != nil {
		return false // verify reports it next
	}
	dead := map[string]bool{}
	for _, x := range m.h.dead {
		dead[x.payload] = true
	}
	for p := range m.h.published {
		if sure, maybe := a.acks(p); sure+maybe == 0 && !dead[p] {
			return false
		}
	}
	return true
}

// run is one rapid case: 20-40 drawn actions, each followed by a settle and
// the checker, then the final accounting.
func (m *queueModel) run() {
	kinds := []string{"tick", "tick", "tick", "publish", "publish", "publish", "advance", "advance",
		"answer", "answer", "answer", "stale answer", "close", "reconnect", "reconnect", "restart"}
	if m.manual {
		kinds = append(kinds, "puback", "puback")
	}
	steps := rapid.IntRange(20, 40).Draw(m.rt, "steps")
	for s := 0; s < steps; s++ {
		// Every action draws the same values whatever state the broker is
		// in, reduced to what is there: a replay during shrinking then
		// reads the same draws even when the broker's timing differs.
		kind := rapid.SampledFrom(kinds).Draw(m.rt, "action")
		switch kind {
		case "tick":
			m.advance(200 * time.Millisecond) // the offer loop runs on this tick
		case "publish":
			m.publish()
		case "advance":
			m.advance(rapid.SampledFrom([]time.Duration{time.Second, 10 * time.Second, 31 * time.Second}).Draw(m.rt, "by"))
		case "answer", "puback", "stale answer":
			qc := m.holders[rapid.SampledFrom(m.workers).Draw(m.rt, "worker")]
			which := rapid.IntRange(0, 7).Draw(m.rt, "which")
			verdict := rapid.SampledFrom([]string{"ack", "return"}).Draw(m.rt, "verdict")
			if qc == nil {
				break
			}
			// answer: any job the worker was given and has not answered; an
			// older one is a late answer whose lease may have passed
			// (invariant 3). stale answer: a delivery not its own, or one
			// that came on a connection that has ended — rules 1-3 make it
			// change nothing.
			choices := qc.pending
			if kind == "stale answer" {
				choices = nil
				for i, d := range m.h.deliveries {
					if d.conn != qc.idx {
						choices = append(choices, i)
					}
				}
			}
			if len(choices) == 0 {
				break
			}
			i := choices[which%len(choices)]
			if kind == "puback" {
				m.ev++
				m.puback(qc, i)
			} else {
				m.answer(qc, i, verdict)
			}
		case "close":
			m.disconnect(rapid.SampledFrom(m.workers).Draw(m.rt, "worker"))
		case "reconnect":
			w := rapid.SampledFrom(m.workers).Draw(m.rt, "worker")
			m.disconnect(w)
			m.connect(w, m.manual)
		case "restart":
			m.restart()
		}
		m.settle()
		m.verify(false)
	}
	m.finish()
	m.verify(true)
	m.summary()
}

// summary says what a case exercised, so a run that only ever ticked an
// idle broker is visible as such.
func (m *queueModel) summary() {
	redelivered, answered, restarts := 0, 0, 0
	for _, d := range m.h.deliveries {
		if d.attempt > 1 {
			redelivered++
		}
		if d.answer != nil {
			answered++
		}
	}
	for _, l := range m.log {
		if strings.HasSuffix(l, " restart") {
			restarts++
		}
	}
	m.t.Logf("case: %d jobs, %d deliveries (%d past attempt 1), %d answered, %d dead-lettered, %d connections, %d restarts",
		len(m.h.published), len(m.h.deliveries), redelivered, answered, len(m.h.dead), len(m.h.conns), restarts)
}

// watchdog turns a hang into a report: a graceful stop waits for every
// connection the broker knows of, so one that never returns is a broker bug,
// and the test binary's ten-minute timeout would bury which step hung.
func watchdog(what string) (stop func()) {
	t := time.AfterFunc(time.Minute, func() {
		debug.SetTraceback("all")
		panic(what + " did not finish within a minute")
	})
	return func() { t.Stop() }
}

// boundRapidChecks: every case starts a broker and runs for about a second,
// so the default of 100 cases would take minutes. It also keeps rapid from
// writing fail files into the package: a broker's timing differs on replay,
// so the seed it prints is as good a reproduction. Whatever the run asked
// for itself (-rapid.checks, -rapid.nofailfile, RAPID_*) is kept. The flags
// are rapid's own; the test is not parallel, so nothing else reads them
// meanwhile, and they are restored.
func boundRapidChecks(t *testing.T, n int) {
	for name, v := range map[string]string{"checks": strconv.Itoa(n), "nofailfile": "true"} {
		f := flag.Lookup("rapid." + name)
		if f == nil || os.Getenv("RAPID_"+strings.ToUpper(name)) != "" || f.Value.String() != f.DefValue {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Value.Set(f.DefValue) })
	}
}

// Invariant 4 (with 3, 6, 7 and 15 along the way): under any interleaving of
// publishes, clock moves, acks, returns, late and foreign answers,
// disconnects, reconnects and restarts, no job is held by two live
// deliveries, attempts count exactly what was acknowledged or answered, an
// ack on a live lease is final, and every job ends acked or dead-lettered,
// once.
func TestInvariant04_NoJobIsEverHeldByTwoLiveDeliveries(t *testing.T) {
	boundRapidChecks(t, 6)
	rapid.Check(t, func(rt *rapid.T) { newQueueModel(t, rt, false).run() })
}

// The same machine with workers that hold back their PUBACK until told
// (invariant 7): such a job has no deadline, is never taken back while held,
// and returns unspent when its connection ends without one.
func TestQueueStateMachineDeferredPuback(t *testing.T) {
	boundRapidChecks(t, 5)
	rapid.Check(t, func(rt *rapid.T) { newQueueModel(t, rt, true).run() })
}

// The negative control: the checker above must be able to fail. Each
// history is written by hand; the correct ones must pass, each broken one
// must be reported for the reason it is broken.
func TestQueueHistoryCheckerCatchesViolations(t *testing.T) {
	at := func(sec float64, ev int) stamp { return stamp{at: time.Duration(sec * float64(time.Second)), ev: ev} }
	history := func(dels ...qhDelivery) *queueHistory {
		for i := range dels {
			dels[i].payload, dels[i].seq = "job-1", i
			if dels[i].puback == (stamp{}) {
				dels[i].puback = never()
			}
		}
		return &queueHistory{visibility: 30 * time.Second, maxAttempts: 3,
			published: map[string]stamp{"job-1": at(0, 3)},
			conns: []qhConn{{worker: "w1", start: at(0, 1), end: never()},
				{worker: "w2", start: at(0, 2), end: never()}},
			deliveries: dels}
	}
	ans := func(verdict string, a stamp) *qhAnswer { return &qhAnswer{verdict: verdict, at: a, confirmed: true} }
	restart := history(
		qhDelivery{conn: 0, offset: 1, attempt: 2, seen: at(0.2, 5)},
		qhDelivery{conn: 1, offset: 1, attempt: 1, seen: at(0.4, 9)})
	restart.conns[0].end, restart.conns[1].start = at(0.3, 6), at(0.3, 8) // w1 gone, then w2 arrives
	early := history(qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5), answer: ans("return", at(1, 7))})
	early.dead = []qhDead{{payload: "job-1", reason: "attempts_exhausted", offset: 1, attempts: 1, record: "1"}}
	cases := []struct {
		name  string
		h     *queueHistory
		final bool
		want  string // "" = no violation
	}{
		{"timeout, return, ack is correct", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5)},
			qhDelivery{conn: 1, offset: 1, attempt: 2, seen: at(31, 9), answer: ans("return", at(31, 10))},
			qhDelivery{conn: 0, offset: 1, attempt: 3, seen: at(31.2, 12), answer: ans("ack", at(31.2, 13))}), true, ""},
		{"(a) redelivered while the first lease was live", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5)},
			qhDelivery{conn: 1, offset: 1, attempt: 2, seen: at(10, 9)}), false, "invariant 4"},
		{"(a) two holders of attempt 1", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5)},
			qhDelivery{conn: 1, offset: 1, attempt: 1, seen: at(0.4, 7)}), false, "two live deliveries"},
		{"(c) delivered again after an ack on a live lease", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5), answer: ans("ack", at(1, 7))},
			qhDelivery{conn: 1, offset: 1, attempt: 2, seen: at(40, 12)}), false, "invariant 3"},
		{"(b) a return not counted", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5), answer: ans("return", at(1, 7))},
			qhDelivery{conn: 1, offset: 1, attempt: 1, seen: at(1.2, 9)}), false, "spent its attempt"},
		{"(b) attempts forgotten across a restart", restart, false, "went back from attempt 2 to 1"},
		{"(d) a lost job", history(
			qhDelivery{conn: 0, offset: 1, attempt: 1, seen: at(0.2, 5), answer: ans("return", at(1, 7))}), true, "was lost"},
		{"(d) dead-lettered after one attempt", early, true, "want attempts_exhausted after 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.h.check(tc.final)
			t.Logf("reported: %q", got)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Fatalf("a correct history was reported:\n%s", strings.Join(got, "\n"))
			case tc.want != "" && !strings.Contains(strings.Join(got, "\n"), tc.want):
				t.Fatalf("want a report containing %q, got %q", tc.want, got)
			}
		})
	}
}

// Invariant 15 ("attempt counts do survive, so a record that has exhausted
// its attempts is still dead-lettered rather than starting over") across a
// crash: the third attempt is counted at its PUBACK, and the broker is
// killed while that lease is live. On restart the job is AVAILABLE with its
// attempts spent, so it must be dead-lettered, never offered as attempt 4.
func TestInvariant15_SpentJobIsDeadLetteredAfterACrash(t *testing.T) {
	proc := brokertest.StartProcess(t, brokertest.Config(t, t.TempDir(), queueConfig))
	pub := brokertest.Connect(t, proc.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	if resp, err := pub.Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("doomed")}); err != nil || resp.ReasonCode != 0 {
		t.Fatalf("publish: %v %+v", err, resp)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		w, _ := brokertest.DialRaw(t, proc.Address(), "w", true, 0)
		w.Subscribe(1, "$saguin/queue/jobs", 1)
		job := w.Read()
		for job.FixedHeader.Type != packets.Publish {
			job = w.Read()
		}
		if got := userProp(job, "saguin-attempt"); got != strconv.Itoa(attempt) {
			t.Fatalf("delivery %d says attempt %s", attempt, got)
		}
		w.Puback(job.PacketID) // counts the attempt (invariant 6: resolves nothing)
		if attempt < 3 {
			w.Disconnect() // returned, its attempt spent
			continue
		}
		// A SUBACK is written after every packet before it was read: the
		// PUBACK, and the count it stored, are in.
		w.Subscribe(2, "events/#", 1)
	}
	proc.Kill()
	proc.Restart()

	w := brokertest.Connect(t, proc.Address(), "w2", brokertest.ClientOptions{CleanStart: true})
	w.Subscribe("$saguin/queue/jobs", 1)
	ops := brokertest.Connect(t, proc.Address(), "ops", brokertest.ClientOptions{CleanStart: true})
	ops.Subscribe("jobs/__dlq/#", 1)
	select {
	case p := <-w.Msgs:
		t.Fatalf("after the crash the spent job was offered again as attempt %s (want it dead-lettered after 3)",
			p.Properties.User.Get("saguin-attempt"))
	case d := <-ops.Msgs:
		if u := d.Properties.User; string(d.Payload) != "doomed" || u.Get("saguin-dlq-attempts") != "3" {
			t.Fatalf("dead letter %q after %s attempts", d.Payload, u.Get("saguin-dlq-attempts"))
		}
	case <-time.After(wait):
		t.Fatal("the spent job was neither dead-lettered nor offered")
	}
}

// Invariant 17: only the connection that owns a client id changes what the
// broker keeps for it. A client disconnects cleanly and at once reconnects
// under the same id. The substrate's teardown of the old connection checks
// whether it was taken over, then unsubscribes it and deletes its id from the
// client table (mochi attachClient); Sagüin's OnDisconnect runs just before
// that. A new connection that registers between the check and the delete is
// deleted in its place: it is still connected, but gets no broadcast, and a
// graceful stop — which disconnects the clients in that table and waits for
// every connection — then never returns. The old connection's 300
// subscriptions only widen the window (the unsubscribe runs inside it).
func TestInvariant17_LateTeardownLeavesTheReconnectedClientAlone(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	subs := make([]paho.SubscribeOptions, 300)
	for k := range subs {
		subs[k] = paho.SubscribeOptions{Topic: fmt.Sprintf("plain/f%d", k), QoS: 0}
	}
	for i := 0; i < 50; i++ {
		old := brokertest.Connect(t, r.b.Address(), "device", brokertest.ClientOptions{CleanStart: true, Buffer: 16})
		if sa, err := old.SubscribeWith(&paho.Subscribe{Subscriptions: subs}); err != nil || len(sa.Reasons) != len(subs) {
			t.Fatalf("subscribe: %v", err)
		}
		old.Close()
		c := brokertest.Connect(t, r.b.Address(), "device", brokertest.ClientOptions{CleanStart: true, Buffer: 16})
		c.Subscribe("plain/x", 1)
		if resp, err := pub.Publish(&paho.Publish{Topic: "plain/x", QoS: 1, Payload: []byte("hello")}); err != nil || resp.ReasonCode != 0 {
			t.Fatalf("publish: %v %+v", err, resp)
		}
		select {
		case <-c.Msgs:
		case <-time.After(wait):
			// Closing it ends the orphaned connection, so the broker's own
			// cleanup is not left waiting for it.
			c.Close()
			t.Fatalf("reconnect %d: the new connection of client id \"device\" receives nothing its subscription matches: "+
				"the old connection's teardown unregistered it", i+1)
		}
		c.Close()
	}
}
