package main

// The step 4 figures (issue 5, "Benchmarks"): a latest channel's current
// state sent to a new subscriber, one latest update fanned out to many
// subscribers, and point reads on $saguin/kv/get from one client and from
// many (rfcs/latest-channel.md). The reference brokers have no latest
// channel; retained messages are MQTT's nearest thing - a current value per
// topic, sent to a new subscriber - so their columns are a retained state
// of as many topics, and one publish fanned out (not retained: see
// loadgen.FanOutConfig.QoS). Point reads have no counterpart there and are
// reported for Sagüin alone.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"saguin.dev/broker/internal/loadgen"
)

// Flag defaults and bounds of the latest scenarios (invariant 13: each
// topic, subscriber and client costs memory here and in the broker).
const (
	defaultStateTopics  = 10_000
	defaultFanOutSubs   = 1_000
	defaultFanOutRounds = 20
	quickFanOutRounds   = 5
	// A fan-out subscriber is a connection: two file descriptors when the
	// broker runs in this process (mochi).
	maxFanOutSubs = loadgen.MaxFanOut
)

// latestFlags registers the latest scenarios' flags.
func latestFlags(fs *flag.FlagSet, o *options, readClients *string) {
	fs.IntVar(&o.stateTopics, "state-topics", defaultStateTopics, "topics in the latest channel (retained topics on the reference brokers) whose state a new subscriber is sent; also the keys point reads read")
	fs.IntVar(&o.fanOutSubs, "fanout-subscribers", defaultFanOutSubs, "subscribers one latest update (a publish on the reference brokers) is fanned out to")
	fs.IntVar(&o.fanOutRounds, "fanout-rounds", defaultFanOutRounds, "fan-out publishes timed, one at a time, after one warm-up round")
	fs.StringVar(readClients, "point-read-clients", "1,32", "comma-separated point-read client counts, each client keeping one read in flight for -duration")
}

// checkLatest applies -quick and validates the latest flags.
func checkLatest(o *options, set map[string]bool, readClients string) error {
	if o.quick && !set["fanout-rounds"] {
		o.fanOutRounds = quickFanOutRounds
	}
	var err error
	if o.readClients, err = parseCounts(readClients); err != nil {
		return fmt.Errorf("-point-read-clients: %w", err)
	}
	switch {
	case o.stateTopics < 1 || o.stateTopics > loadgen.MaxTopics:
		return fmt.Errorf("-state-topics %d: want 1..%d", o.stateTopics, loadgen.MaxTopics)
	case o.fanOutSubs < 1 || o.fanOutSubs > maxFanOutSubs:
		return fmt.Errorf("-fanout-subscribers %d: want 1..%d", o.fanOutSubs, maxFanOutSubs)
	case o.fanOutRounds < 1 || o.fanOutRounds > 1000:
		return fmt.Errorf("-fanout-rounds %d: want 1..1000", o.fanOutRounds)
	}
	return nil
}

// stateCell is the time a new subscriber took to receive a whole state.
type stateCell struct {
	elapsed time.Duration
	ok      bool
	err     string
}

// fanCell is one fan-out's figures.
type fanCell struct {
	complete time.Duration // median over rounds: publish to the last subscriber's delivery
	p50, p99 time.Duration // per-subscriber latency over every round
	ok       bool
	err      string
	note     string
}

// latestResults are keyed by column: "saguin memory", "saguin sqlite",
// "mochi", "mosquitto".
type latestResults struct {
	// state[q] is read by a subscriber at QoS q. Every broker is measured
	// at both, so each row sets like beside like: neither reference broker
	// at its defaults sends a 10,000-value state at QoS 1 whole (mosquitto
	// drops past max_queued_messages, mochi trickles past its window).
	state  [2]map[string]stateCell
	fanout map[string]fanCell
	reads  map[string]map[int]cell // storage -> clients -> reads/s
}

func newLatestResults() *latestResults {
	return &latestResults{
		state:  [2]map[string]stateCell{{}, {}},
		fanout: map[string]fanCell{},
		reads:  map[string]map[int]cell{},
	}
}

// stateLimit bounds one state read: generous for any broker that sends
// values at 10,000 a second or better, and short enough that one that
// trickles them (mochi at QoS 1) does not hold the run for minutes.
func (b *bench) stateLimit() time.Duration {
	return b.o.ackTimeout + time.Duration(b.o.stateTopics)*100*time.Microsecond
}

func (b *bench) topicSet(prefix string) loadgen.TopicSet {
	return loadgen.TopicSet{Prefix: prefix, Count: b.o.stateTopics, PayloadSize: b.o.payload}
}

// fill publishes the state; retain for the reference brokers.
func (b *bench) fill(ctx context.Context, addr, prefix, ids string, retain bool) (loadgen.FillResult, error) {
	res, err := loadgen.FillTopics(ctx, loadgen.FillConfig{
		Addr: addr, Topics: b.topicSet(prefix), Publishers: min(fillPublishers, b.o.stateTopics), Window: fillWindow,
		Retain: retain, ClientIDPrefix: ids, AckTimeout: b.o.ackTimeout, Limit: fillLimit,
	})
	if err == nil {
		b.progress("state: %s topics published in %s (%s values/s)", commas(float64(b.o.stateTopics)), res.Elapsed.Round(time.Millisecond), commas(res.Rate()))
	}
	return res, err
}

func (b *bench) readState(ctx context.Context, addr, id string, ts loadgen.TopicSet, qos byte, labels bool) (stateCell, error) {
	res, err := loadgen.ReadState(ctx, loadgen.StateConfig{
		Addr: addr, ClientID: id, Topics: ts, QoS: qos, ReceiveMaximum: uint16(b.o.receiveMax),
		PacketTimeout: b.o.ackTimeout, Labels: labels, IdleTimeout: b.o.ackTimeout, Quiet: quiet, Limit: b.stateLimit(),
	})
	if err != nil {
		return stateCell{err: err.Error()}, err
	}
	b.progress("state, QoS %d subscriber: all %s values after %s (%s values/s)", qos, commas(float64(res.Values)), res.Elapsed.Round(100*time.Microsecond), commas(res.Rate()))
	return stateCell{elapsed: res.Elapsed, ok: true}, nil
}

func (b *bench) fanOut(ctx context.Context, addr, prefix, ids string, qos byte, labels bool) (fanCell, error) {
	res, err := loadgen.FanOut(ctx, loadgen.FanOutConfig{
		Addr: addr, TopicPrefix: prefix, Subscribers: b.o.fanOutSubs, Rounds: b.o.fanOutRounds, WarmUp: true,
		QoS: qos, Labels: labels, PayloadSize: b.o.payload, ClientIDPrefix: ids,
		AckTimeout: b.o.ackTimeout, Quiet: quiet,
	})
	if err != nil {
		return fanCell{err: err.Error()}, err
	}
	c := fanCell{complete: res.MedianComplete(), p50: res.Percentile(50), p99: res.Percentile(99), ok: true}
	b.progress("fan-out to %s QoS %d subscribers (connected in %s), %d rounds: all received after %s ms (median; max %s ms), per subscriber p50 %s ms, p99 %s ms",
		commas(float64(res.Subscribers)), qos, res.Connect.Round(time.Millisecond), len(res.Complete), msec(c.complete),
		msec(slices.Max(res.Complete)), msec(c.p50), msec(c.p99))
	return c, nil
}

// runSaguinLatest runs the latest scenarios on a running broker, whose
// configuration has the latest channels state (state/#) and fanout
// (fanout/#).
func (b *bench) runSaguinLatest(ctx context.Context, p *saguinProc, storage string) {
	col := "saguin " + storage
	lr := b.results.latest
	fail := func(what string, err error) {
		if dead := p.alive(); dead != nil {
			err = fmt.Errorf("%w; %w", err, dead)
		}
		b.results.saguinError(fmt.Sprintf("latest %s: %s", storage, what), err)
		b.progress("%s: FAILED: %v", what, err)
	}
	fill, err := b.fill(ctx, p.addr, "state/"+storage, "fill-state-"+storage, false)
	if err != nil {
		lr.state[1][col] = stateCell{err: err.Error()}
		lr.state[0][col] = stateCell{err: err.Error()}
		fail("publishing the state", err)
		return
	}
	for _, qos := range []byte{1, 0} {
		sc, err := b.readState(ctx, p.addr, fmt.Sprintf("bench-state-%s-q%d", storage, qos), fill.Topics, qos, true)
		lr.state[qos][col] = sc
		if err != nil {
			fail(fmt.Sprintf("state to a new QoS %d subscriber", qos), err)
		}
	}
	lr.reads[storage] = map[int]cell{}
	for _, clients := range b.o.readClients {
		if ctx.Err() != nil {
			return
		}
		res, err := loadgen.PointReads(ctx, loadgen.PointReadConfig{
			Addr: p.addr, Keys: fill.Topics, Clients: clients, Duration: b.o.duration,
			ClientIDPrefix: fmt.Sprintf("kv-%s-c%d", storage, clients), AckTimeout: b.o.ackTimeout, Quiet: quiet,
		})
		if err != nil {
			lr.reads[storage][clients] = cell{err: err.Error()}
			fail(fmt.Sprintf("point reads, %s", readers(clients)), err)
			continue
		}
		lr.reads[storage][clients] = cell{rate: res.Rate(), ok: true}
		b.progress("point reads, %s: %s reads/s (%s reads in %s, every answer the key's value, matched by Correlation Data)",
			readers(clients), commas(res.Rate()), commas(float64(res.Reads)), res.Elapsed.Round(time.Millisecond))
	}
	if ctx.Err() != nil {
		return
	}
	fc, err := b.fanOut(ctx, p.addr, "fanout/"+storage, "fan-"+storage, 1, true)
	lr.fanout[col] = fc
	if err != nil {
		fail("fan-out", err)
	}
}

func readers(n int) string {
	if n == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", n)
}

// runMosquittoLatest measures retained state and fan-out on a mosquitto of
// its own (an empty retained store).
func (b *bench) runMosquittoLatest(ctx context.Context) {
	fmt.Fprintf(b.out, "mosquitto (%s), retained state and fan-out\n", b.o.mosquitto)
	lr := b.results.latest
	dir := filepath.Join(b.dir, "mosquitto-latest")
	err := os.MkdirAll(dir, 0o755)
	var m *loadgen.Mosquitto
	if err == nil {
		m, err = loadgen.StartMosquitto(ctx, b.o.mosquitto, dir)
	}
	if err != nil {
		b.results.refError("mosquitto (retained)", err)
		lr.state[1]["mosquitto"] = stateCell{err: err.Error()}
		lr.state[0]["mosquitto"] = stateCell{err: err.Error()}
		lr.fanout["mosquitto"] = fanCell{err: err.Error()}
		return
	}
	defer m.Stop(5 * time.Second)
	b.mosqVer = m.Version
	dropped := func(err error, drops int64) error {
		if m.Drops() > drops {
			return fmt.Errorf("%w (mosquitto logged %q: its own drop, past its default max_queued_messages)", err, "Outgoing messages are being dropped")
		}
		return err
	}
	fill, err := b.fill(ctx, m.Addr(), "state", "mq-fill-state", true)
	if err != nil {
		b.results.refError("mosquitto, retained state: publishing", err)
		lr.state[1]["mosquitto"] = stateCell{err: err.Error()}
		lr.state[0]["mosquitto"] = stateCell{err: err.Error()}
	} else {
		for _, qos := range []byte{1, 0} {
			drops := m.Drops()
			c, err := b.readState(ctx, m.Addr(), fmt.Sprintf("mq-state-q%d", qos), fill.Topics, qos, false)
			if err != nil {
				err = dropped(err, drops)
				b.peerFailed(fmt.Sprintf("mosquitto, retained state, QoS %d subscriber", qos), err)
			}
			lr.state[qos]["mosquitto"] = c
		}
	}
	if ctx.Err() != nil {
		return
	}
	lr.fanout["mosquitto"] = b.peerFanOut(ctx, "mosquitto", func(qos byte) (fanCell, error) {
		drops := m.Drops()
		c, err := b.fanOut(ctx, m.Addr(), fmt.Sprintf("fan-q%d", qos), fmt.Sprintf("mq-fan-q%d", qos), qos, false)
		return c, dropped(err, drops)
	}, true)
}

// runMochiLatest measures a bare mochi, a fresh server for every attempt:
// a failed QoS 1 delivery can leave it wedged.
func (b *bench) runMochiLatest(ctx context.Context) {
	fmt.Fprintf(b.out, "mochi-mqtt v%s (in-process), retained state and fan-out\n", loadgen.MochiVersion)
	lr := b.results.latest
	withMochi := func(f func(addr string) error) error {
		m, err := loadgen.StartMochi()
		if err != nil {
			return err
		}
		err = f(m.Addr())
		if cerr := m.Close(5 * time.Second); cerr != nil && err == nil {
			err = cerr
		}
		return err
	}
	for _, qos := range []byte{1, 0} {
		if qos == 1 && !b.o.mochiQoS1 || ctx.Err() != nil {
			continue
		}
		var c stateCell
		err := withMochi(func(addr string) error {
			fill, err := b.fill(ctx, addr, "state", fmt.Sprintf("mochi-fill-q%d", qos), true)
			if err != nil {
				return fmt.Errorf("publishing: %w", err)
			}
			c, err = b.readState(ctx, addr, fmt.Sprintf("mochi-state-q%d", qos), fill.Topics, qos, false)
			return err
		})
		if err != nil {
			c = stateCell{err: err.Error()}
			b.peerFailed(fmt.Sprintf("mochi, retained state, QoS %d subscriber", qos), err)
		}
		lr.state[qos]["mochi"] = c
	}
	if ctx.Err() != nil {
		return
	}
	lr.fanout["mochi"] = b.peerFanOut(ctx, "mochi", func(qos byte) (fanCell, error) {
		var c fanCell
		err := withMochi(func(addr string) error {
			var err error
			c, err = b.fanOut(ctx, addr, "fan", fmt.Sprintf("mochi-fan-q%d", qos), qos, false)
			return err
		})
		if err != nil {
			c = fanCell{err: err.Error()}
		}
		return c, err
	}, b.o.mochiQoS1)
}

// peerFailed records a reference broker's failed measurement.
func (b *bench) peerFailed(what string, err error) {
	b.progress("%s: FAILED: %v", what, err)
	b.results.refError(what, err)
}

// peerFanOut measures a reference broker's fan-out to QoS 1 subscribers
// (when tryQoS1) and, failing that, to QoS 0 ones, footnoted.
func (b *bench) peerFanOut(ctx context.Context, broker string, run func(qos byte) (fanCell, error), tryQoS1 bool) fanCell {
	if tryQoS1 {
		c, err := run(1)
		if err == nil {
			return c
		}
		b.progress("fan-out, QoS 1 subscribers: FAILED: %v", err)
		b.results.refError(broker+", fan-out, QoS 1 subscribers", err)
		if ctx.Err() != nil {
			return c
		}
	}
	c, err := run(0)
	if err != nil {
		b.progress("fan-out, QoS 0 subscribers: FAILED: %v", err)
		b.results.refError(broker+", fan-out, QoS 0 subscribers", err)
		return c
	}
	c.note = broker + " fan-out to QoS 0 subscribers"
	if tryQoS1 {
		c.note += ": at QoS 1 it failed (see reference broker failures)"
	}
	return c
}

// reportLatest prints the latest table: one row per figure and Sagüin
// storage, the reference brokers' retained figures beside each, and the
// ratio Sagüin / reference (for times, below 1 means Sagüin took less).
func (b *bench) reportLatest() {
	w := b.out
	lr := b.results.latest
	fmt.Fprintln(w)
	fmt.Fprintf(w, "latest channels (Sagüin) beside retained messages (mochi, mosquitto): %s topics of %d bytes; fan-out to %s subscribers,\n",
		commas(float64(b.o.stateTopics)), b.o.payload, commas(float64(b.o.fanOutSubs)))
	fmt.Fprintf(w, "median of %d rounds after a warm-up, latency percentiles over every subscriber and round; every value, answer and delivery\n", b.o.fanOutRounds)
	fmt.Fprintln(w, "accounted for exactly once. Times in ms. Ratios are saguin/reference: for a time, below 1 means Sagüin took less.")
	var notes []string
	mark := func(text string, ok bool, note string) string {
		if !ok || note == "" {
			return text
		}
		i := slices.Index(notes, note)
		if i < 0 {
			notes = append(notes, note)
			i = len(notes) - 1
		}
		return text + " " + strings.Repeat("+", i+1)
	}
	stateFig := func(qos byte) func(col string) (string, float64, bool) {
		return func(col string) (string, float64, bool) {
			c, present := lr.state[qos][col]
			switch {
			case !present:
				return "-", 0, false
			case !c.ok:
				return "FAILED", 0, false
			}
			return msec(c.elapsed), c.elapsed.Seconds(), true
		}
	}
	fanFig := func(col string, pick func(fanCell) time.Duration) (string, float64, bool) {
		c, present := lr.fanout[col]
		switch {
		case !present:
			return "-", 0, false
		case !c.ok:
			return "FAILED", 0, false
		}
		return mark(msec(pick(c)), true, c.note), pick(c).Seconds(), true
	}
	ratioOf := func(a float64, aok bool, r float64, rok bool) string {
		if !aok || !rok || r <= 0 {
			return "-"
		}
		return strconv.FormatFloat(a/r, 'f', 2, 64)
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tstorage\tsaguin\tmochi\tmosquitto\tsaguin/mochi\tsaguin/mosquitto\t")
	row := func(name string, fig func(col string) (string, float64, bool)) {
		mo, mov, mook := fig("mochi")
		mq, mqv, mqok := fig("mosquitto")
		if !b.o.has("saguin") {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t%s\t-\t-\t\n", name, mo, mq)
			return
		}
		for _, st := range b.o.storages {
			s, sv, sok := fig("saguin " + st)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, st, s, mo, mq, ratioOf(sv, sok, mov, mook), ratioOf(sv, sok, mqv, mqok))
		}
	}
	for _, qos := range []byte{1, 0} {
		row(fmt.Sprintf("state of %s topics to a new QoS %d subscriber", commas(float64(b.o.stateTopics)), qos), stateFig(qos))
	}
	row(fmt.Sprintf("fan-out to %s, all received", commas(float64(b.o.fanOutSubs))), func(col string) (string, float64, bool) {
		return fanFig(col, func(c fanCell) time.Duration { return c.complete })
	})
	row("fan-out, per-subscriber p50", func(col string) (string, float64, bool) {
		return fanFig(col, func(c fanCell) time.Duration { return c.p50 })
	})
	row("fan-out, per-subscriber p99", func(col string) (string, float64, bool) {
		return fanFig(col, func(c fanCell) time.Duration { return c.p99 })
	})
	if b.o.has("saguin") {
		for _, clients := range b.o.readClients {
			for _, st := range b.o.storages {
				c, present := lr.reads[st][clients]
				fmt.Fprintf(tw, "point reads/s, %s\t%s\t%s\tn/a\tn/a\t-\t-\t\n", readers(clients), st, figure(c, present))
			}
		}
	}
	_ = tw.Flush()
	for i, n := range notes {
		fmt.Fprintf(w, "%s %s\n", strings.Repeat("+", i+1), n)
	}
	if b.o.has("saguin") {
		fmt.Fprintf(w, "point reads: QoS 1 PUBLISH to %s, each client one read in flight for %s, every answer the key's value\n", loadgen.PointReadTopic, b.o.duration)
		fmt.Fprintln(w, "with the read's Correlation Data and every PUBACK 0x00; the reference brokers have no point read.")
	}
}

// msec renders a duration in milliseconds with two decimals.
func msec(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}
