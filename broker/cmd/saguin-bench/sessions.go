package main

// The sessions scenarios (-scenarios sessions): what durable MQTT 5
// sessions cost and how they come back.
//
//   - Memory: N sessions (Session Expiry 1h, one QoS 1 subscription each on
//     a topic of its own) are created with at most -create-concurrency
//     connected at a time and left idle; then all N reconnect (the storm)
//     and stay connected; then all disconnect. The broker's resident set
//     (VmRSS) is read at start, with the N sessions idle, with all N
//     connected, and after they left. Memory only grows along that order,
//     so the idle figure is not hidden by a Go heap that keeps what a
//     connection freed (RSS after the disconnect is shown, not divided).
//   - Reconnect storm: the N idle sessions reconnect at once (Clean Start
//     0), -dialers dialling at a time; the figure is the time until the last
//     CONNACK, and every CONNACK must say Session Present 1.
//   - Offline backlog: M sessions subscribe at QoS 1 to one topic (all the
//     same topic: broadcast to many away sessions is what is measured) and
//     disconnect; one publisher sends K QoS 1 messages to it (time to store:
//     its last PUBACK); then all M reconnect and the figure is the time
//     until each has received its K, exactly, in order, nothing twice
//     except a DUP-flagged redelivery.
//
// Sagüin (memory and sqlite), mosquitto and mochi run the memory and storm
// scenarios; the backlog runs on Sagüin and mosquitto: mochi v2.7.9
// resends an away session's messages sorted by a timestamp in whole
// seconds, so it reorders any backlog published within a second (and its
// QoS 1 delivery deadlocks under load: see main.go). Every broker is a process
// of its own, started fresh for each scenario group.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Flag defaults and bounds of the sessions scenarios (invariant 13: each
// session is a connection, a goroutine and a file descriptor here).
const (
	defaultSessions        = 10_000
	quickSessions          = 2_000
	defaultBacklogSessions = 1_000
	quickBacklogSessions   = 200
	defaultBacklogMessages = 100
	maxSessionsFlag        = 100_000
	maxBacklogDeliveries   = 10_000_000 // sessions x messages
	// fdHeadroom is what this process keeps open besides its clients.
	fdHeadroom = 1024
)

// sessionFlags registers the sessions scenarios' flags.
func sessionFlags(fs *flag.FlagSet, o *options) {
	fs.IntVar(&o.sessions, "sessions", defaultSessions, "durable sessions whose memory is measured and which reconnect in the storm (-quick: 2,000)")
	fs.IntVar(&o.backlogSessions, "backlog-sessions", defaultBacklogSessions, "away sessions a backlog is stored for (-quick: 200)")
	fs.IntVar(&o.backlogMessages, "backlog-messages", defaultBacklogMessages, "QoS 1 messages in the backlog, to a topic every away session matches")
	// 64, not more: mosquitto 2.0 listens with a backlog of 100, and a SYN
	// it drops costs the client a one-second retransmission, which would
	// then be what the storm measured.
	fs.IntVar(&o.dialers, "dialers", 64, "connections dialled at a time in a reconnect (storm and backlog)")
	fs.IntVar(&o.createConcurrency, "create-concurrency", 64, "sessions being created (connect, subscribe, disconnect) at a time")
	fs.DurationVar(&o.sessionsTimeout, "sessions-timeout", 5*time.Minute, "bound on each sessions scenario on each broker")
	fs.DurationVar(&o.rssSettle, "rss-settle", 2*time.Second, "wait before each memory reading (and before the backlog is published)")
	fs.StringVar(&o.connectRate, "saguin-connect-rate", "none", "Sagüin's limits.max_connect_rate in the sessions scenarios (none, or connections per second); the reference brokers have none")
}

// checkSessions applies -quick and validates the sessions flags.
func checkSessions(o *options, set map[string]bool) error {
	if o.quick && !set["sessions"] {
		o.sessions = quickSessions
	}
	if o.quick && !set["backlog-sessions"] {
		o.backlogSessions = quickBacklogSessions
	}
	if o.connectRate != "none" {
		if n, err := strconv.Atoi(o.connectRate); err != nil || n < 1 {
			return fmt.Errorf("-saguin-connect-rate %q: want none or connections per second, 1 or more", o.connectRate)
		}
	}
	switch {
	case o.sessions < 1 || o.sessions > maxSessionsFlag:
		return fmt.Errorf("-sessions %d: want 1..%d", o.sessions, maxSessionsFlag)
	case o.backlogSessions < 1 || o.backlogSessions > maxSessionsFlag:
		return fmt.Errorf("-backlog-sessions %d: want 1..%d", o.backlogSessions, maxSessionsFlag)
	case o.backlogMessages < 1 || o.backlogMessages > 65535:
		// Every message of the backlog is in flight on the publisher's one
		// connection at most once: packet ids 1..K are never reused.
		return fmt.Errorf("-backlog-messages %d: want 1..65535", o.backlogMessages)
	case int64(o.backlogSessions)*int64(o.backlogMessages) > maxBacklogDeliveries:
		return fmt.Errorf("-backlog-sessions x -backlog-messages = %d: want at most %d deliveries", int64(o.backlogSessions)*int64(o.backlogMessages), maxBacklogDeliveries)
	case o.dialers < 1 || o.dialers > maxPublishers:
		return fmt.Errorf("-dialers %d: want 1..%d", o.dialers, maxPublishers)
	case o.createConcurrency < 1 || o.createConcurrency > maxPublishers:
		return fmt.Errorf("-create-concurrency %d: want 1..%d", o.createConcurrency, maxPublishers)
	case o.sessionsTimeout <= 0:
		return fmt.Errorf("-sessions-timeout %s: want above 0", o.sessionsTimeout)
	case o.rssSettle < 0 || o.rssSettle > time.Minute:
		return fmt.Errorf("-rss-settle %s: want 0..1m", o.rssSettle)
	}
	return nil
}

// memCell is one broker's memory and storm figures.
type memCell struct {
	sessions                     int
	base, idle, connected, after int64 // VmRSS, KiB
	create, storm                time.Duration
	memOK, stormOK               bool
	err                          string
}

func (c *memCell) perIdle() float64 { return float64(c.idle-c.base) / float64(c.sessions) }
func (c *memCell) perConnected() float64 {
	return float64(c.connected-c.base) / float64(c.sessions)
}

// backlogCell is one broker's offline backlog figures.
type backlogCell struct {
	store, deliver time.Duration
	dups           int64 // DUP-flagged redeliveries of messages already received
	ok             bool
	err            string
}

// sessionResults are keyed by column: "saguin memory", "saguin sqlite",
// "mochi", "mosquitto".
type sessionResults struct {
	mem     map[string]*memCell
	backlog map[string]*backlogCell
}

func newSessionResults() *sessionResults {
	return &sessionResults{mem: map[string]*memCell{}, backlog: map[string]*backlogCell{}}
}

// raiseSessionLimit raises the open-file limit for the largest scenario:
// this process holds one descriptor per client, and so does a broker,
// which inherits the limit.
func (b *bench) raiseSessionLimit() {
	need := uint64(max(b.o.sessions, b.o.backlogSessions, maxStorm(b.o.storms)) + fdHeadroom)
	got, err := raiseFileLimit(need)
	if err != nil {
		b.progress("open files: %v (scenarios past it will fail)", err)
		return
	}
	b.progress("open files: limit %d (wanted %d)", got, need)
}

// runSessionsOn runs the memory and storm scenarios and then, on a fresh
// process from start, the backlog. col names the table's column.
func (b *bench) runSessionsOn(ctx context.Context, col string, start func(ctx context.Context, scenario string) (*brokerProc, error), backlog, saguin bool) {
	fail := func(what string, p *brokerProc, err error) string {
		if p != nil {
			if dead := p.alive(); dead != nil {
				err = fmt.Errorf("%w; %w", err, dead)
			}
		}
		b.progress("%s: FAILED: %v", what, err)
		if saguin {
			b.results.saguinError(col+", "+what, err)
		} else {
			b.results.refError(col+", "+what, err)
		}
		return err.Error()
	}
	sr := b.results.sessions
	if ctx.Err() == nil {
		mc := &memCell{sessions: b.o.sessions}
		sr.mem[col] = mc
		p, err := start(ctx, "memory")
		if err != nil {
			mc.err = fail("memory: start", nil, err)
		} else {
			b.memoryAndStorm(ctx, p, mc, fail)
			if err := p.stop(stopGrace); err != nil {
				fail("memory: shutdown", nil, err)
			}
		}
	}
	if !backlog || ctx.Err() != nil {
		return
	}
	bc := &backlogCell{}
	sr.backlog[col] = bc
	p, err := start(ctx, "backlog")
	if err != nil {
		bc.err = fail("backlog: start", nil, err)
		return
	}
	if err := b.backlog(ctx, p, bc); err != nil {
		bc.err = fail("offline backlog", p, err)
	}
	if err := p.stop(stopGrace); err != nil {
		fail("backlog: shutdown", nil, err)
	}
}

// memoryAndStorm creates the sessions, reads memory at each stage, and
// times the reconnect storm.
func (b *bench) memoryAndStorm(ctx context.Context, p *brokerProc, mc *memCell, fail func(string, *brokerProc, error) string) {
	ctx, cancel := context.WithTimeout(ctx, b.o.sessionsTimeout)
	defer cancel()
	n := b.o.sessions
	tag := runTag()
	id := func(i int) string { return fmt.Sprintf("s-%s-%d", tag, i) }
	rss := func(stage string, into *int64) bool {
		if !b.sleep(ctx, b.o.rssSettle) {
			mc.err = fail("memory: "+stage, p, context.Cause(ctx))
			return false
		}
		v, err := readRSS(p.pid())
		if err != nil {
			mc.err = fail("memory: "+stage, p, err)
			return false
		}
		*into = v
		return true
	}
	if !rss("at start", &mc.base) {
		return
	}
	begin := time.Now()
	err := forEach(ctx, n, b.o.createConcurrency, func(ctx context.Context, i int) error {
		c, _, err := dialSession(ctx, p.addr, sessDial{id: id(i), clean: true, expiry: sessionExpiry, timeout: b.o.ackTimeout})
		if err != nil {
			return err
		}
		defer c.disconnect()
		return c.subscribe(fmt.Sprintf("sess/%s/%d", tag, i), b.o.ackTimeout)
	})
	if err != nil {
		mc.err = fail("creating the sessions", p, err)
		return
	}
	mc.create = time.Since(begin)
	b.progress("%s sessions created in %s (%s a second, at most %d connected at once)", commas(float64(n)), mc.create.Round(time.Millisecond), commas(float64(n)/mc.create.Seconds()), b.o.createConcurrency)
	if !rss("sessions idle", &mc.idle) {
		return
	}

	conns := make([]*sessConn, n)
	defer func() {
		_ = forEach(context.WithoutCancel(ctx), n, b.o.dialers, func(_ context.Context, i int) error {
			if conns[i] != nil {
				conns[i].close()
			}
			return nil
		})
	}()
	var absent atomic.Int64
	begin = time.Now()
	err = forEach(ctx, n, b.o.dialers, func(ctx context.Context, i int) error {
		c, ca, err := dialSession(ctx, p.addr, sessDial{id: id(i), clean: false, expiry: sessionExpiry, timeout: b.o.ackTimeout})
		if err != nil {
			return err
		}
		conns[i] = c
		if !ca.present {
			absent.Add(1)
		}
		return nil
	})
	storm := time.Since(begin)
	switch {
	case err != nil:
		mc.err = fail("reconnect storm", p, err)
		return
	case absent.Load() > 0:
		mc.err = fail("reconnect storm", p, fmt.Errorf("%d of %d reconnections were answered Session Present 0: their sessions were lost", absent.Load(), n))
	default:
		mc.storm, mc.stormOK = storm, true
		b.progress("reconnect storm: all %s sessions back (Session Present 1) in %s, %d dialling at a time", commas(float64(n)), storm.Round(time.Millisecond), b.o.dialers)
	}
	if !rss("all connected", &mc.connected) {
		return
	}
	_ = forEach(context.WithoutCancel(ctx), n, b.o.dialers, func(_ context.Context, i int) error {
		conns[i].disconnect()
		conns[i] = nil
		return nil
	})
	if !rss("after disconnecting", &mc.after) {
		return
	}
	mc.memOK = true
	b.progress("RSS: %s MiB at start, %s MiB with %s sessions idle (%.1f KiB each), %s MiB with all connected (%.1f KiB each), %s MiB after they left",
		mib(mc.base), mib(mc.idle), commas(float64(n)), mc.perIdle(), mib(mc.connected), mc.perConnected(), mib(mc.after))
}

// forEach runs f(i) for i in 0..n-1 on at most workers goroutines; the
// first error stops handing out more and is returned (with a count of any
// others).
func forEach(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs errFirst
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					errs.add(err)
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errs.err(); err != nil {
		return err
	}
	return context.Cause(ctx)
}

// errFirst keeps the first error of many goroutines and counts the rest.
type errFirst struct {
	mu    sync.Mutex
	first error
	n     int
}

func (e *errFirst) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		e.first = err
	}
	e.n++
}

func (e *errFirst) err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.first == nil:
		return nil
	case e.n == 1:
		return e.first
	default:
		return fmt.Errorf("%w (and %d more errors)", e.first, e.n-1)
	}
}

// sleep waits d unless ctx ends first.
func (b *bench) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runTag is a random 16-hex-digit name for one scenario's client ids and
// topics.
func runTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	b[0] |= 0x10 // sixteen digits, never a leading zero
	return hex.EncodeToString(b[:])
}

func mib(kib int64) string { return strconv.FormatFloat(float64(kib)/1024, 'f', 1, 64) }

// runSaguinSessions runs the sessions scenarios on Sagüin with one storage
// provider, a fresh broker and data directory for each scenario group.
func (b *bench) runSaguinSessions(ctx context.Context, bin, storage string) {
	fmt.Fprintf(b.out, "saguin, %s storage, sessions\n", storage)
	limits := fmt.Sprintf("max_connections: %d\n    max_connect_rate: %s", max(b.o.sessions, b.o.backlogSessions)+64, b.o.connectRate)
	b.runSessionsOn(ctx, "saguin "+storage, func(ctx context.Context, scenario string) (*brokerProc, error) {
		body, err := saguinConfigWith(storage, filepath.Join(b.dir, "sessions-"+storage+"-"+scenario), limits)
		if err != nil {
			return nil, err
		}
		cfg, err := writeConfigBody(filepath.Join(b.dir, "sessions-"+storage+"-"+scenario), body)
		if err != nil {
			return nil, err
		}
		s, err := startSaguin(ctx, bin, cfg)
		if err != nil {
			return nil, err
		}
		p := saguinBroker("saguin", s)
		b.progress("%s: listening on %s after %s", scenario, p.addr, s.ready.Round(time.Millisecond))
		return p, nil
	}, true, true)
}

func (b *bench) runMosquittoSessions(ctx context.Context) {
	fmt.Fprintf(b.out, "mosquitto (%s), sessions\n", b.o.mosquitto)
	if b.mosqVer == "" {
		b.mosqVer = mosquittoVersionOf(ctx, b.o.mosquitto)
	}
	b.runSessionsOn(ctx, "mosquitto", func(ctx context.Context, scenario string) (*brokerProc, error) {
		return startMosquittoProc(ctx, b.o.mosquitto, filepath.Join(b.dir, "sessions-mosquitto-"+scenario))
	}, true, false)
}

func (b *bench) runMochiSessions(ctx context.Context) {
	fmt.Fprintln(b.out, "mochi-mqtt (a child process, default options, allow-all auth), sessions")
	b.runSessionsOn(ctx, "mochi", func(ctx context.Context, _ string) (*brokerProc, error) {
		return startMochiChild(ctx)
	}, false, false)
}
