package main

// The headline table (-scenarios table, the default with replay and
// startup): Sagüin beside three peers started here on loopback - mosquitto
// from Debian at its defaults, a bare mochi-mqtt (a child process, so its
// memory is its own), and NATS server's MQTT listener, the durable 3.1.1
// peer - every figure measured in this run, on the same client (wire.go):
// MQTT 5 to Sagüin, mosquitto and mochi, 3.1.1 to NATS, which speaks
// nothing else. A figure a peer cannot give is "n/a", never an estimate.
//
// Each broker runs one process for the publish, fan-out and deaf
// scenarios, and a fresh one for each connection storm, so the storm's
// memory is read over a broker that has held nothing before.

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"saguin.dev/broker/internal/loadgen"
)

// Table columns, in order.
var tableCols = []string{"saguin", "mochi", "mosquitto", "nats"}

// tableFlags registers the table's flags.
func tableFlags(fs *flag.FlagSet, o *options, storms *string) {
	fs.StringVar(&o.natsBin, "nats-server", "", "nats-server binary (default: <repo>/bin/nats-server, installed there with go install "+natsModule+" when missing)")
	fs.StringVar(storms, "storms", "2000,10000", "connection storm sizes, in order (-quick: 2000)")
	fs.IntVar(&o.inFlight, "in-flight", 64, "table: QoS 1 and QoS 0 publishers, one publish in flight each")
	fs.IntVar(&o.fanSubs, "fanout", 50, "table: subscribers one publisher fans out to")
	fs.IntVar(&o.deafMessages, "deaf-messages", 30_000, "table: QoS 1 publishes beside a subscriber that stops reading")
	fs.DurationVar(&o.deafWait, "deaf-wait", 10*time.Second, "table: how long after the last publish the deaf subscriber is checked (Sagüin's write_timeout is 5s)")
	fs.IntVar(&o.queueWorkers, "queue-workers", 16, "table: queue workers")
}

// checkTable applies -quick and validates the table's flags.
func checkTable(o *options, set map[string]bool, storms string) error {
	if o.quick && !set["storms"] {
		storms = "2000"
	}
	o.storms = nil
	for f := range strings.SplitSeq(storms, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxSessionsFlag {
			return fmt.Errorf("-storms %q: want sizes from 1 to %d", f, maxSessionsFlag)
		}
		o.storms = append(o.storms, n)
	}
	switch {
	case o.inFlight < 1 || o.inFlight > maxPublishers:
		return fmt.Errorf("-in-flight %d: want 1..%d", o.inFlight, maxPublishers)
	case o.fanSubs < 1 || o.fanSubs > maxPublishers:
		return fmt.Errorf("-fanout %d: want 1..%d", o.fanSubs, maxPublishers)
	case o.deafMessages < 1 || o.deafMessages > 10_000_000:
		return fmt.Errorf("-deaf-messages %d: want 1..10000000", o.deafMessages)
	case o.deafWait < 0 || o.deafWait > 5*time.Minute:
		return fmt.Errorf("-deaf-wait %s: want 0..5m", o.deafWait)
	case o.queueWorkers < 1 || o.queueWorkers > maxPublishers:
		return fmt.Errorf("-queue-workers %d: want 1..%d", o.queueWorkers, maxPublishers)
	}
	return nil
}

// tcell is one figure of the table, or why there is none.
type tcell struct {
	v    float64
	text string // shown instead of v when set (yes/no answers)
	ok   bool
	na   bool   // the broker has no such thing
	err  string // the measurement failed
	note string // footnoted
}

// Table rows.
const (
	rowBroadcast = "QoS 1 publish, broadcast, msgs/s"
	rowAppendMem = "QoS 1 publish, append on memory, msgs/s"
	rowAppendSql = "QoS 1 publish, append on sqlite, msgs/s"
	// The deep-window shape (issue 13): a gateway or bridge, few
	// connections with many publishes in flight each.
	rowBroadcastDeep = "QoS 1 publish, deep windows, broadcast, msgs/s"
	rowAppendSqlDeep = "QoS 1 publish, deep windows, append on sqlite, msgs/s"
	rowQoS0          = "QoS 0 publish, delivered msgs/s"
	rowFanRate       = "fan-out 1 -> N, delivered/s"
	rowFanP50        = "fan-out 1 -> N, end-to-end p50, ms"
	rowFanP99        = "fan-out 1 -> N, end-to-end p99, ms"
	rowQueueMem      = "queue cycle on memory, jobs/s"
	rowQueueSql      = "queue cycle on sqlite, jobs/s"
	rowReplayMem     = "replay on memory, records/s"
	rowReplaySql     = "replay on sqlite, records/s"
	rowStartup       = "start-up over the sqlite records, s"
	rowDeafLive      = "QoS 1 publishes, subscriber keeping up: last PUBACK, s"
	rowDeafAck       = "QoS 1 publishes, subscribers not reading: last PUBACK, s"
	rowDeafGone0     = "QoS 0 subscriber not reading: disconnected?"
	rowDeafGone1     = "QoS 1 subscriber not reading: disconnected?"
	rowStormTime     = "connection storm of %s: all CONNACKs, s"
	rowStormBytes    = "connection storm of %s: RSS per connection, KiB"
)

// lowerBetter says how a row's ratio reads: times and memory.
func lowerBetter(row string) bool {
	return strings.HasSuffix(row, ", s") || strings.HasSuffix(row, ", ms") || strings.HasSuffix(row, ", KiB")
}

type tableResults struct {
	cells map[string]map[string]tcell // row -> column -> cell
	vers  map[string]string           // column -> version
}

func newTableResults() *tableResults {
	return &tableResults{cells: map[string]map[string]tcell{}, vers: map[string]string{}}
}

func (t *tableResults) set(row, col string, c tcell) {
	if t.cells[row] == nil {
		t.cells[row] = map[string]tcell{}
	}
	t.cells[row][col] = c
}

// tableTarget is one broker as the table measures it.
type tableTarget struct {
	col     string
	version byte
	saguin  bool
	start   func(ctx context.Context, scenario string) (*brokerProc, error)
}

// record stores a figure or a failure; a Sagüin failure fails the run.
func (b *bench) record(t tableTarget, row string, c tcell, err error) {
	if err != nil {
		c = tcell{err: err.Error()}
		if t.saguin {
			b.results.saguinError("table, "+row, err)
		} else {
			b.results.refError(t.col+", "+row, err)
		}
		b.progress("%s, %s: FAILED: %v", t.col, row, err)
	} else {
		c.ok = true
	}
	b.results.table.set(row, t.col, c)
}

// runTablePeers measures the reference brokers.
func (b *bench) runTablePeers(ctx context.Context) {
	tr := b.results.table
	if b.o.has("mosquitto") && ctx.Err() == nil {
		tr.vers["mosquitto"] = mosquittoVersionOf(ctx, b.o.mosquitto)
		b.mosqVer = tr.vers["mosquitto"]
		fmt.Fprintf(b.out, "table: %s (%s), MQTT 5\n", tr.vers["mosquitto"], b.o.mosquitto)
		b.runTableOn(ctx, tableTarget{col: "mosquitto", version: mqtt5, start: func(ctx context.Context, scenario string) (*brokerProc, error) {
			return startMosquittoProc(ctx, b.o.mosquitto, filepath.Join(b.dir, "table-mosquitto-"+scenario))
		}})
	}
	if b.o.has("mochi") && ctx.Err() == nil {
		tr.vers["mochi"] = "mochi-mqtt v" + strings.TrimPrefix(loadgen.MochiVersion, "v")
		fmt.Fprintf(b.out, "table: %s (a child process, default options, allow-all auth), MQTT 5\n", tr.vers["mochi"])
		b.runTableOn(ctx, tableTarget{col: "mochi", version: mqtt5, start: func(ctx context.Context, _ string) (*brokerProc, error) {
			return startMochiChild(ctx)
		}})
	}
	if b.o.has("nats") && ctx.Err() == nil {
		bin, err := findNATS(ctx, b.o.natsBin, b.o.saguinSrc)
		if err != nil {
			b.results.refError("nats", err)
			b.progress("nats: FAILED: %v", err)
			return
		}
		tr.vers["nats"] = natsVersion(ctx, bin)
		fmt.Fprintf(b.out, "table: %s (%s), MQTT 3.1.1 (JetStream on %s)\n", tr.vers["nats"], bin, b.dir)
		b.runTableOn(ctx, tableTarget{col: "nats", version: mqtt311, start: func(ctx context.Context, scenario string) (*brokerProc, error) {
			return startNATS(ctx, bin, filepath.Join(b.dir, "table-nats-"+scenario))
		}})
	}
}

// runTableSaguin measures Sagüin: the peers' scenarios on the memory
// provider, then append and the queue cycle on each provider.
func (b *bench) runTableSaguin(ctx context.Context, bin string) {
	b.results.table.vers["saguin"] = b.saguinRev
	start := func(storage string) func(ctx context.Context, scenario string) (*brokerProc, error) {
		return func(ctx context.Context, scenario string) (*brokerProc, error) {
			dir := filepath.Join(b.dir, "table-saguin-"+storage+"-"+scenario)
			limits := fmt.Sprintf("max_connections: %d\n    max_connect_rate: none", maxStorm(b.o.storms)+b.o.fanSubs+b.o.inFlight+64)
			body, err := saguinConfigWith(storage, dir, limits)
			if err != nil {
				return nil, err
			}
			cfg, err := writeConfigBody(dir, body)
			if err != nil {
				return nil, err
			}
			s, err := startSaguin(ctx, bin, cfg)
			if err != nil {
				return nil, err
			}
			return saguinBroker("saguin", s), nil
		}
	}
	fmt.Fprintf(b.out, "table: saguin %s, MQTT 5 (max_connect_rate none: the peers have no such limit)\n", b.saguinRev)
	b.runTableOn(ctx, tableTarget{col: "saguin", version: mqtt5, saguin: true, start: start("memory")})
	for _, storage := range b.o.storages {
		if ctx.Err() != nil {
			return
		}
		t := tableTarget{col: "saguin", version: mqtt5, saguin: true, start: start(storage)}
		p, err := t.start(ctx, "channels")
		if err != nil {
			b.results.saguinError("table, saguin "+storage+": start", err)
			continue
		}
		appendRow, queueRow := rowAppendMem, rowQueueMem
		if storage == "sqlite" {
			appendRow, queueRow = rowAppendSql, rowQueueSql
		}
		tag := runTag()
		rate, err := b.appendRun(ctx, p, storage, shape{b.o.inFlight, 1}, "app-"+tag)
		b.record(t, appendRow, tcell{v: rate}, b.withExit(p, err))
		if storage == "sqlite" && ctx.Err() == nil {
			// The deep-window shape, where a commit that held one record per
			// connection was the limit (issue 13).
			rate, err := b.appendRun(ctx, p, storage, b.tableDeep(), "appd-"+runTag())
			b.record(t, rowAppendSqlDeep, tcell{v: rate}, b.withExit(p, err))
		}
		if ctx.Err() == nil {
			q, err := tqueue(ctx, p.addr, "q-"+tag, 8, 8, b.o.queueWorkers, b.o.duration, b.o.payload, b.o.ackTimeout)
			rate := float64(q.jobs) / q.elapsed.Seconds()
			if err == nil {
				b.progress("saguin, queue on %s: %s jobs published by 8 producers, each offered once and acked by %d workers, %s jobs/s",
					storage, commas(float64(q.jobs)), b.o.queueWorkers, commas(rate))
			}
			b.record(t, queueRow, tcell{v: rate}, b.withExit(p, err))
		}
		if err := p.stop(stopGrace); err != nil {
			b.results.saguinError("table, saguin "+storage+": shutdown", err)
		}
	}
}

// appendRun publishes at QoS 1 into an append channel of p in shape sh,
// reads every acknowledged record back (in order, once each) and returns
// the PUBACK rate.
func (b *bench) appendRun(ctx context.Context, p *brokerProc, storage string, sh shape, id string) (float64, error) {
	res, err := tpublish(ctx, tpubConfig{addr: p.addr, version: mqtt5, ids: id, topic: "events/" + id,
		pubs: sh.pubs, window: sh.window, qos: 1, duration: b.o.duration, payload: b.o.payload, ackTimeout: b.o.ackTimeout})
	if err != nil {
		return res.rate(false), err
	}
	took, err := treadBack(ctx, p.addr, "readback-"+id, "events/"+id+"/#", sh.pubs, res.acked, b.o.ackTimeout)
	if err == nil {
		b.progress("saguin, append on %s, %s: %s msgs/s (%s acknowledged; all read back, in order, once each, at %s records/s)",
			storage, sh, commas(res.rate(false)), commas(float64(res.acked)), commas(float64(res.acked)/took.Seconds()))
	}
	return res.rate(false), err
}

// tableDeep is the table's deep-window shape: the first -deep-windows
// shape, or 8 publishers x 64 in flight.
func (b *bench) tableDeep() shape {
	if len(b.o.deep) > 0 {
		return b.o.deep[0]
	}
	return shape{8, 64}
}

func maxStorm(storms []int) int {
	m := 0
	for _, n := range storms {
		m = max(m, n)
	}
	return m
}

// withExit adds a broker's early exit to an error.
func (b *bench) withExit(p *brokerProc, err error) error {
	if err == nil {
		return nil
	}
	if dead := p.alive(); dead != nil {
		return fmt.Errorf("%w; %w", err, dead)
	}
	return err
}

// tableProc keeps one broker process for a target's scenarios and starts
// a fresh one after a scenario failed: a peer wedged by one scenario (mochi
// v2.7.9's QoS 1 delivery deadlocks) must not fail the next.
type tableProc struct {
	b      *bench
	ctx    context.Context
	t      tableTarget
	p      *brokerProc
	failed bool
}

// get returns a healthy process, starting one when needed.
func (tp *tableProc) get() (*brokerProc, error) {
	if tp.p != nil && !tp.failed && tp.p.alive() == nil {
		return tp.p, nil
	}
	tp.stop()
	p, err := tp.t.start(tp.ctx, "main")
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	tp.p, tp.failed = p, false
	tp.b.progress("%s: listening on %s", tp.t.col, p.addr)
	return p, nil
}

// done notes a scenario's outcome; an error marks the process for
// replacement, with its early exit added.
func (tp *tableProc) done(err error) error {
	if err == nil {
		return nil
	}
	tp.failed = true
	if tp.p != nil {
		return tp.b.withExit(tp.p, err)
	}
	return err
}

func (tp *tableProc) stop() {
	if tp.p == nil {
		return
	}
	grace := stopGrace
	if tp.failed {
		// A broker wedged by the failed scenario is not waited for: its
		// shutdown is not what is measured.
		grace = time.Second
	}
	if err := tp.p.stop(grace); err != nil && !tp.failed {
		tp.b.record(tp.t, tp.t.col+" shutdown", tcell{}, err)
	} else if err != nil {
		tp.b.progress("%s: shutdown after a failed scenario: %s", tp.t.col, oneLine(err.Error(), 200))
	}
	tp.p = nil
}

// qos0Note footnotes a peer's figure measured with QoS 0 subscribers.
func qos0Note(col string) string {
	return col + ": with QoS 1 subscribers the run failed (see reference broker failures); this figure is with QoS 0 subscribers"
}

// runTableOn runs the scenarios every broker has on one target. A peer
// whose QoS 1 delivery fails is measured again with QoS 0 subscribers,
// footnoted, so there is still a figure to set beside Sagüin's; Sagüin
// gets no second try.
func (b *bench) runTableOn(ctx context.Context, t tableTarget) {
	tp := &tableProc{b: b, ctx: ctx, t: t}
	defer tp.stop()
	tag := runTag()
	try := 0
	pub := func(sh shape, qos byte, subQoS0 bool, maxLag int) (tpubResult, error) {
		p, err := tp.get()
		if err != nil {
			return tpubResult{}, err
		}
		try++
		res, err := tpublish(ctx, tpubConfig{addr: p.addr, version: t.version, ids: fmt.Sprintf("q%d-%s-%d", qos, tag, try), topic: fmt.Sprintf("bench/q%d-%s-%d", qos, tag, try),
			pubs: sh.pubs, window: sh.window, qos: qos, duration: b.o.duration, subscribe: true, subQoS0: subQoS0, maxLag: maxLag,
			payload: b.o.payload, ackTimeout: b.o.ackTimeout})
		return res, tp.done(err)
	}
	lag := int(b.o.maxLag)
	broadcast := func(row string, sh shape) {
		res, err := pub(sh, 1, false, lag)
		note := ""
		if err != nil && !t.saguin && ctx.Err() == nil && lag > mosquittoFallbackLag {
			// As the throughput group does: mosquitto 2.0.11 drops a QoS 1
			// subscriber's messages at 64 publishers with it 250 behind, and
			// keeps them all on a short leash.
			b.record(t, fmt.Sprintf("%s (QoS 1 subscriber, max lag %d)", row, lag), tcell{}, err)
			res, err = pub(sh, 1, false, mosquittoFallbackLag)
			note = fmt.Sprintf("%s: with the subscriber up to %d behind its QoS 1 delivery failed (see reference broker failures); this figure holds it to %d",
				t.col, lag, mosquittoFallbackLag)
		}
		if err != nil && !t.saguin && ctx.Err() == nil {
			b.record(t, row+" (QoS 1 subscriber)", tcell{}, err)
			res, err = pub(sh, 1, true, lag)
			note = qos0Note(t.col)
		}
		if err == nil {
			b.progress("%s, QoS 1 broadcast, %s: %s msgs/s (%s delivered once, in order)", t.col, sh, commas(res.rate(true)), commas(float64(res.delivered)))
		}
		b.record(t, row, tcell{v: res.rate(true), note: note}, err)
	}
	broadcast(rowBroadcast, shape{b.o.inFlight, 1})
	if ctx.Err() == nil {
		broadcast(rowBroadcastDeep, b.tableDeep())
	}
	if ctx.Err() == nil {
		res, err := pub(shape{b.o.inFlight, 1}, 0, false, lag)
		if err == nil {
			b.progress("%s, QoS 0, %d publishers: %s msgs/s (all %s delivered once, in order)", t.col, b.o.inFlight, commas(res.rate(true)), commas(float64(res.delivered)))
		}
		b.record(t, rowQoS0, tcell{v: res.rate(true)}, err)
	}
	fan := func(qos byte) (tfanResult, error) {
		p, err := tp.get()
		if err != nil {
			return tfanResult{}, err
		}
		try++
		f, err := tfanout(ctx, tfanConfig{addr: p.addr, version: t.version, ids: fmt.Sprintf("fan-%s-%d", tag, try), topic: fmt.Sprintf("bench/fan-%s-%d", tag, try),
			subscribers: b.o.fanSubs, subQoS: qos, window: 8, maxLag: int(b.o.maxLag), duration: b.o.duration, payload: b.o.payload, ackTimeout: b.o.ackTimeout})
		return f, tp.done(err)
	}
	if ctx.Err() == nil {
		f, err := fan(1)
		note := ""
		if err != nil && !t.saguin && ctx.Err() == nil {
			b.record(t, rowFanRate+" (QoS 1 subscribers)", tcell{}, err)
			f, err = fan(0)
			note = qos0Note(t.col)
		}
		rate := float64(f.delivered) / f.last.Seconds()
		if err == nil {
			b.progress("%s, fan-out to %d: %s publishes, %s deliveries/s, p50 %s ms, p99 %s ms", t.col, b.o.fanSubs, commas(float64(f.sent)), commas(rate), msec(f.p50), msec(f.p99))
		}
		b.record(t, rowFanRate, tcell{v: rate, note: note}, err)
		b.record(t, rowFanP50, tcell{v: f.p50.Seconds() * 1000, note: note}, err)
		b.record(t, rowFanP99, tcell{v: f.p99.Seconds() * 1000, note: note}, err)
	}
	if ctx.Err() == nil {
		b.tableDeaf(ctx, tp)
	}
	tp.stop()
	for _, n := range b.o.storms {
		if ctx.Err() != nil {
			return
		}
		ns := commas(float64(n))
		p, err := t.start(ctx, fmt.Sprintf("storm-%d", n))
		if err != nil {
			b.record(t, fmt.Sprintf(rowStormTime, ns), tcell{}, fmt.Errorf("start: %w", err))
			continue
		}
		r, err := b.tstorm(ctx, p, t.version, n)
		err = b.withExit(p, err)
		if err == nil {
			b.progress("%s, connection storm of %s: all CONNACKs in %s (%d dialling), RSS %s -> %s MiB, %.1f KiB per connection",
				t.col, ns, r.elapsed.Round(time.Millisecond), b.o.dialers, mib(r.base), mib(r.held), r.perConn(n))
		}
		b.record(t, fmt.Sprintf(rowStormTime, ns), tcell{v: r.elapsed.Seconds()}, err)
		b.record(t, fmt.Sprintf(rowStormBytes, ns), tcell{v: r.perConn(n)}, err)
		if err := p.stop(stopGrace); err != nil {
			b.record(t, fmt.Sprintf(rowStormTime, ns)+" (shutdown)", tcell{}, err)
		}
	}
}

// tableDeaf runs the deaf-subscriber scenario on a process of its own
// state: fresh when an earlier scenario failed.
func (b *bench) tableDeaf(ctx context.Context, tp *tableProc) {
	t := tp.t
	p, err := tp.get()
	if err != nil {
		b.record(t, rowDeafLive, tcell{}, err)
		return
	}
	d := b.tdeaf(ctx, p.addr, t.version, t.col, false)
	note := ""
	if d.liveErr != nil && !t.saguin && ctx.Err() == nil {
		// As for broadcast: the peer's QoS 1 delivery failed; the row
		// gets its figure with a QoS 0 subscriber, footnoted.
		b.record(t, rowDeafLive+" (QoS 1 subscriber)", tcell{}, tp.done(d.liveErr))
		if p, err = tp.get(); err != nil {
			b.record(t, rowDeafLive, tcell{}, err)
			return
		}
		d = b.tdeaf(ctx, p.addr, t.version, t.col, true)
		note = qos0Note(t.col)
	}
	b.record(t, rowDeafLive, tcell{v: d.liveAck.Seconds(), note: note}, tp.done(d.liveErr))
	if d.deafErr != nil && !t.saguin {
		// A peer that holds its publisher back behind a deaf subscriber
		// is what this row is for: that is its figure.
		b.results.table.set(rowDeafAck, t.col, tcell{ok: true, text: "stalled", note: t.col + ": " + oneLine(d.deafErr.Error(), 200)})
		tp.failed = true
	} else {
		b.record(t, rowDeafAck, tcell{v: d.deafAck.Seconds()}, tp.done(d.deafErr))
	}
	for qos, row := range []string{rowDeafGone0, rowDeafGone1} {
		answer := "no"
		if d.disconnected[qos] {
			answer = "yes"
		}
		b.results.table.set(row, t.col, tcell{ok: true, text: answer,
			note: fmt.Sprintf("%s, QoS %d: read again %s after the last publish: %s", t.col, qos, b.o.deafWait, d.how[qos])})
	}
}
