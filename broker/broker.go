package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/bridge"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/clock"
	doorpkg "saguin.dev/broker/internal/door"
	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/metrics"
	"saguin.dev/broker/internal/msgid"
	"saguin.dev/broker/internal/wire"
	"saguin.dev/broker/partition"
	"saguin.dev/broker/topic"
	"saguin.dev/storage"
	"saguin.dev/storage/memory"
	"saguin.dev/storage/sqlite"
)

// Options are what New needs besides the configuration.
type Options struct {
	// Clock is the broker's time; nil means the wall clock.
	Clock clock.Clock
	// Logger receives the broker's log; nil means logging.New on stdout at
	// broker.log_level. Whatever handler it has, every value reaching it
	// is bounded (logging.Bounded) and the substrate's lines are mapped
	// (logging.Substrate).
	Logger *slog.Logger
	// Build is the build revision written into snapshot headers.
	Build string
	// Version is what saguin_build_info{version} shows: the version and
	// revision of the build; "" shows Build.
	Version string
	// SQLiteFaults are handed to every sqlite provider: set only by a
	// fault-injection build for the chaos negative controls
	// (broker/internal/faults); nil in production.
	SQLiteFaults *sqlite.Faults
	// PanicTopic, set only by a fault-injection build (broker/internal/
	// faults: panic-on-packet), makes the handling of a PUBLISH to this
	// topic, or a SUBSCRIBE or UNSUBSCRIBE naming it, panic on its
	// connection's goroutine: the proof that such a panic ends that
	// connection and nothing else. Empty in production.
	PanicTopic string
	// ProxyHeaderWithin, set only by tests, replaces the fixed 5 s a unix
	// door with proxy_protocol gives a connection to send its PROXY header.
	ProxyHeaderWithin time.Duration
}

// Broker is one running Sagüin.
type Broker struct {
	cfg *config.Config
	// bridges are the links to peer brokers (bridges.go), started last.
	bridges []*bridge.Link
	clock   clock.Clock
	log     *slog.Logger
	build   string
	// version is saguin_build_info's (Options.Version), and started when
	// New ran: what saguin_uptime_seconds counts from, on the broker's
	// clock. metrics serves the catalogue (metrics.go).
	version string
	started time.Time
	metrics *metrics.Exporter
	// refusals rate-limits the log lines of refusals given to clients and
	// counts every one (refusals.go).
	refusals *logging.RefusalLog

	sqliteFaults *sqlite.Faults // Options.SQLiteFaults
	panicTopic   string         // Options.PanicTopic
	pauses       pausePoints    // held by tests only (retained_order.go)
	// answerLinger, when set (tests only), replaces the const answerLinger
	// (inbound.go) for the answering goroutines started after it is set.
	answerLinger atomic.Int64

	mqtt      *mqtt.Server
	providers map[string]storage.Provider
	channels  map[string]*channel
	queues    []*channel
	engines   map[string]*queueEngine // by queue name
	resolver  *topic.Resolver
	routing   routing            // what the configuration decides of topics and filters (route.go)
	retained  storage.ValueStore // broadcast retained values (broker.retained)
	// sessionStore holds durable sessions (broker.session.storage).
	sessionStore storage.ValueStore
	// closing is set when Close begins: connections the broker's own stop
	// cuts do not publish or arm their Wills (wills.go).
	closing   atomic.Bool
	ids       msgid.Generator
	listeners []net.Listener
	// doors are the MQTT doors being served: Close waits for their
	// goroutines (listener.go).
	doors []*door
	// layers are the TLS, WebSocket and PROXY layers of each door that has
	// any, by the door's id (doors.go).
	layers      map[string]*doorpkg.Layers
	proxyWithin time.Duration // Options.ProxyHeaderWithin
	// pidFile is the pid file this broker wrote ("" = none yet).
	pidFile string
	// operations is the operations listener (ops.go); refusedClients and
	// positionsLost are the records two of its routes read
	// (refused_record.go, position_record.go).
	operations     operations
	refusedClients *refusedRecord
	positionsLost  *lostRecord

	claims idClaims // per client id: CONNECT takeover vs teardown (invariant 17)
	// spaces tracks the partition counts subscribers declare per filter, to
	// warn when two disagree (rfcs/partition.md).
	spaces partition.Spaces

	mu       sync.Mutex
	sessions map[string]*session // invariant 13: one per held client id, bounded by connections and expiry

	fan fanout // broadcast delivery: shared groups' turns, drop counts (fanout.go)
	// events counts what the metric catalogue reads that moves once per
	// connection, session, Will or refusal (metrics_counters.go).
	events eventCounts
	// retainedOrder orders retained broadcast publishes with the
	// subscriptions they meet (retained_order.go).
	retainedOrder sync.RWMutex

	qos2 qos2State // held QoS 2 publishes to channels (qos2.go)
	// inbound maps each connection (*mqtt.Client) with publishes taken in
	// and not yet answered to its pipeline (inbound.go); an entry goes when
	// the connection ends. Invariant 13: one per connection.
	inbound sync.Map
	// bcastHolds keeps held QoS 2 broadcast publishes: the hold store of
	// sessionProvider, where the broadcast log lives (qos2_broadcast.go).
	bcastHolds      storage.HoldStore
	sessionProvider string

	gate *gate // connection slots and publish budgets (admission.go, ratelimit.go)

	// auth is who may connect and what they may do: the password files and
	// the ACL, swapped whole by a reload (auth.go). penalties slows repeated
	// authentication failures from one address (authpenalty.go).
	auth      atomic.Pointer[authority]
	authGen   atomic.Uint64
	penalties *authPenalties

	// afterTeardown, set only by tests (ownership_export_test.go), runs at
	// the end of OnDisconnect: where the substrate's own cleanup of the
	// connection follows.
	afterTeardown atomic.Pointer[func(cl *mqtt.Client)]
	// permitTest, set only by tests (deliveries_export_test.go), stands in
	// for the permission every delivery asks (deliveries.go permit).
	permitTest atomic.Pointer[func(clientID, route, topic string) bool]

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // pumps and background loops
	closed sync.Once
}

// New opens every provider and channel the configuration names and prepares
// the MQTT server. Nothing listens until Start.
func New(cfg *config.Config, opts Options) (_ *Broker, err error) {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Logger == nil {
		opts.Logger = logging.New(os.Stdout, logLevel(cfg.Broker.LogLevel))
	} else {
		// A client's mistake is at most one bounded line whatever handler
		// the caller chose (docs/operations.md "Logs").
		opts.Logger = slog.New(logging.Bounded(opts.Logger.Handler()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Broker{
		cfg: cfg, clock: opts.Clock, log: opts.Logger.With("broker", cfg.Broker.ID), build: opts.Build,
		providers: make(map[string]storage.Provider),
		channels:  make(map[string]*channel),
		sessions:  make(map[string]*session),
		engines:   make(map[string]*queueEngine),
		ctx:       ctx, cancel: cancel, sqliteFaults: opts.SQLiteFaults, panicTopic: opts.PanicTopic,
		proxyWithin: opts.ProxyHeaderWithin,
	}
	b.version, b.started = opts.Version, b.clock.Now()
	if b.version == "" {
		b.version = opts.Build
	}
	b.refusals = logging.NewRefusalLog(b.log, b.clock.Now)
	b.refusedClients = newRefusedRecord(refusedTracked, cfg.Broker.Limits.MaxTopicLength)
	b.positionsLost = newLostRecord(lostTracked, cfg.Broker.Limits.MaxTopicLength)
	b.refusals.Observe(b.noteRefusal)
	b.penalties = newAuthPenalties()
	defer func() {
		if err != nil {
			b.closeProviders()
			cancel()
		}
	}()
	// What the loader warns of (an inert provider, a door identifying
	// nobody beside an acl_file) is said at start as --check-config says it.
	for _, w := range cfg.Warnings {
		b.log.Warn("configuration warning", w.Attrs()...)
	}
	// Every door's certificates are read before anything opens (doors.go),
	// the operations doors' with them; and the configuration document the
	// operations listener serves is rendered (ops.go).
	if b.layers, err = b.doorLayers(); err != nil {
		return nil, err
	}
	if err := b.newOperations(); err != nil {
		return nil, err
	}
	// Before any storage opens: the files naming who may connect are read
	// and checked whole (docs/operations.md "A start"), as --check-config reads them.
	auth, err := loadAuthority(cfg, b.authGen.Add(1))
	if err != nil {
		return nil, err
	}
	b.auth.Store(auth)
	b.logAuthority(auth, "")
	b.logStorageDeclared() // startup.go
	if err := b.openChannels(); err != nil {
		return nil, err
	}
	if err := b.openRetained(); err != nil {
		return nil, err
	}
	if err := b.settleRetained(); err != nil { // retained_migrate.go
		return nil, err
	}
	if err := b.openSessions(); err != nil {
		return nil, err
	}
	b.logPromises() // startup.go
	b.mqtt = b.newServer()
	if err := b.newMetrics(); err != nil {
		return nil, err
	}
	return b, nil
}

func logLevel(s string) slog.Level { return logging.LevelOf(s) }

// openChannels opens the providers channels use (a provider no channel
// names stays closed: docs/configuration.md "`broker.storage`") and each channel's store.
func (b *Broker) openChannels() error {
	for _, cc := range b.cfg.Channels {
		p, err := b.provider(cc.Storage)
		if err != nil {
			return err
		}
		ch := newChannel(cc)
		switch cc.Type {
		case "append":
			if cc.DeadLetterOf != "" {
				// The dead-letter log is opened with its queue, in the same
				// provider, so the move is one transaction (invariant 5).
				break
			}
			if ch.log, err = p.Append(cc.Name); err != nil {
				return fmt.Errorf("channel %s: %w", cc.Name, err)
			}
			ch.log.SetMaxBytes(cc.MaxBytes)
		case "queue":
			if ch.queue, err = p.Queue(cc.Name, cc.DeadLetter); err != nil {
				return fmt.Errorf("channel %s: %w", cc.Name, err)
			}
			ch.queue.SetMaxBytes(cc.MaxBytes)
			b.queues = append(b.queues, ch)
			// invariant 15: a queue starts with nothing out; every job it
			// holds is available now, with the attempts it had.
			b.engines[cc.Name] = newQueueEngine(b, ch)
		case "latest":
			if ch.values, err = p.Values(cc.Name); err != nil {
				return fmt.Errorf("channel %s: %w", cc.Name, err)
			}
		}
		b.channels[cc.Name] = ch
	}
	for _, q := range b.queues {
		if dlq := b.channels[q.cfg.DeadLetter]; dlq != nil {
			dlq.log = q.queue.DeadLetters()
		}
	}
	// The configuration built the resolver when it checked the filters:
	// one resolver, the one --check-config and --route judged.
	if b.resolver = b.cfg.Resolver(); b.resolver == nil {
		return errors.New("the configuration has no topic resolver: it was not made by config.Load")
	}
	b.routing = newRouting(b.cfg)
	b.countStrayLatestValues() // latest.go: docs/configuration.md "`channels`", a filter edited
	return nil
}

// provider opens a configured provider on first use.
func (b *Broker) provider(name string) (storage.Provider, error) {
	if p, ok := b.providers[name]; ok {
		return p, nil
	}
	pc, ok := b.cfg.Providers[name]
	if !ok {
		return nil, fmt.Errorf("storage provider %q is not configured", name)
	}
	reserve := b.cfg.Broker.Limits.Reserve()
	var p storage.Provider
	var err error
	switch pc.Type {
	case "memory":
		p, err = memory.Open(memory.Options{Name: name, SnapshotDir: pc.SnapshotDir, MaxBytes: pc.MaxBytes,
			Reserve: reserve, Writer: b.build, Now: b.clock.Now, Logger: b.log})
	case "sqlite":
		if err := makeDataDir(filepath.Dir(pc.FilePath)); err != nil {
			return nil, fmt.Errorf("storage provider %s: creating the directory of %s: %w", name, pc.FilePath, err)
		}
		p, err = sqlite.Open(sqlite.Options{Name: name, FilePath: pc.FilePath, MaxBytes: pc.MaxBytes,
			Reserve: reserve, FlushInterval: pc.FlushInterval, PublishCommitInterval: pc.PublishCommitInterval,
			PublishCommitNone: pc.PublishCommitNone, PublishCommitMaxRecords: pc.PublishCommitMaxRecords,
			ReadConnections: pc.ReadConnections, Now: b.clock.Now, Writer: b.build, Faults: b.sqliteFaults,
			Logger: b.log})
	default:
		err = fmt.Errorf("unknown type %q", pc.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("storage provider %s: %w", name, err)
	}
	if pc.Type == "memory" {
		// invariant 14: say exactly what memory storage keeps.
		if pc.SnapshotDir == "" {
			b.log.Warn("memory provider keeps nothing across a restart (snapshot_dir: none)", "provider", name)
		} else {
			b.log.Info("memory provider survives a graceful shutdown only, through its snapshot; a crash or power cut loses everything since the last snapshot",
				"provider", name, "snapshot_dir", pc.SnapshotDir)
		}
	}
	b.providers[name] = p
	return p, nil
}

// newServer configures the substrate. Each setting closes one of its known
// gaps (mochi-notes); rfcs/0006-substrate.md says why each is what it is.
func (b *Broker) newServer() *mqtt.Server {
	lim := b.cfg.Broker.Limits
	caps := mqtt.NewDefaultServerCapabilities()
	// Our channels own expiry; the substrate's 24h sweep would silently
	// delete owed messages (invariant 2).
	caps.MaximumMessageExpiryInterval = 0
	caps.MaximumSessionExpiryInterval = uint32(lim.MaxSessionExpiry / time.Second)
	caps.MaximumPacketSize = uint32(lim.MaxMessageSize)
	// What every MQTT 5 CONNACK advertises, and what a connection's
	// pipelined publishes are bounded by (inbound.go).
	caps.ReceiveMaximum = receiveMaximum
	// invariant 13: inbound alias table bounded (docs/configuration.md "`broker.limits`": fixed at 16).
	caps.TopicAliasMaximum = wire.TopicAliasMaximum
	// The substrate's outbound queue carries nothing of Sagüin's: broadcast
	// goes through each session's outbox, bounded by
	// limits.session_queue_bytes (fanout.go). The queue (which dropped QoS 1
	// when full) is kept small rather than at its 64 KiB default.
	caps.MaximumClientWritesPending = 16
	caps.Compatibilities.NoInheritedPropertiesOnAck = true
	caps.Compatibilities.PassiveClientDisconnect = true
	if b.cfg.Broker.MinProtocolVersion == 5 {
		caps.MinimumProtocolVersion = 5
	} else {
		caps.MinimumProtocolVersion = 4 // MQTT 3.1 is never admitted
	}
	// The substrate logs through an adapter: its internals at debug, its
	// refusals rate-limited, never a packet dumped (logging.Substrate).
	s := mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		Logger:                   logging.Substrate(b.log, b.refusals),
		ClientNetWriteBufferSize: 4096,
		ClientNetReadBufferSize:  4096,
		SysTopicResendInterval:   3600,
	})
	_ = s.AddHook(&hook{b: b}, nil)
	return s
}

// Start opens the listeners and the background loops: retention sweeps (run
// once now, so a broker that was down while records aged does not wait a
// tick) and the position flusher.
func (b *Broker) Start() error {
	b.sweepAge()
	b.sweepSize()
	// Sessions come back before anything listens: a CONNECT must find its
	// session (Session Present 1) or know it is gone.
	if err := b.restoreSessions(); err != nil {
		return err
	}
	b.startQoS2() // holds of sessions that came back; the rest dropped (qos2.go)
	if err := b.makeBridges(); err != nil {
		return err
	}
	var doors []*door
	var statements []string // each door as the listening line names it
	for i, l := range b.cfg.Broker.Listeners {
		ln, err := openListener(l) // listen.go
		if err != nil {
			b.closeListeners()
			return fmt.Errorf("listener %s: %w", l.Name, err)
		}
		b.listeners = append(b.listeners, ln)
		// broker.limits at the door (admission.go), then the door's layers.
		wrapped := b.admitListener(ln, &b.cfg.Broker.Listeners[i], b.layers[l.ID])
		// Our door, not the substrate's listener: a panic handling one
		// connection ends that connection only (listener.go).
		d := b.newDoor(l.Name, wrapped)
		if err := b.mqtt.AddListener(d); err != nil {
			b.closeListeners()
			return fmt.Errorf("listener %s: %w", l.Name, err)
		}
		doors = append(doors, d)
		b.logListening(l, ln.Addr().String(), b.layers[l.ID]) // doors.go
		statements = append(statements, doorStatement(l, ln.Addr().String(), b.layers[l.ID]))
	}
	// docs/configuration.md "`broker.operations`": the operations doors bind with the MQTT doors, and
	// serve at once (ops.go).
	if err := b.startOperations(); err != nil {
		b.stopOperations()
		b.closeListeners()
		return err
	}
	// docs/operations.md "The pid file": the pid file says the broker can be reached, so
	// it is written once every door is bound (the signal handlers are
	// installed by the caller before New), before serving.
	if err := b.writePIDFile(); err != nil {
		b.stopOperations()
		b.closeListeners()
		return err
	}
	// The substrate starts each door's accept loop: counted before, so
	// Close never waits for one that was never started.
	for _, d := range doors {
		d.serving.Add(1)
	}
	if err := b.mqtt.Serve(); err != nil {
		for _, d := range doors {
			d.serving.Done()
		}
		return err
	}
	b.doors = doors
	b.background(b.flushLoop)
	b.background(b.sweepLoop)
	b.background(b.willLoop)
	b.background(b.refusalLoop)
	for _, q := range b.engines {
		b.background(q.run)
	}
	// Last: a bridge brings records in only once channels, sessions and
	// the queues' engines are up (docs/bridge.md "The link").
	b.runBridges()
	b.logServing(statements) // startup.go
	return nil
}

func (b *Broker) background(f func(ctx context.Context)) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f(b.ctx)
	}()
}

// Addr is the address of the first listener (tests bind port 0).
func (b *Broker) Addr() net.Addr {
	if len(b.listeners) == 0 {
		return nil
	}
	return b.listeners[0].Addr()
}

func (b *Broker) closeListeners() {
	for _, l := range b.listeners {
		_ = l.Close()
	}
}

// Close shuts the broker down gracefully: stop accepting, stop every pump,
// store every position, then close the providers (the memory provider
// writes its snapshot there: invariant 14).
func (b *Broker) Close() error {
	var err error
	b.closed.Do(func() {
		b.closing.Store(true)
		// The operations listener first: nothing answers /health for a
		// broker that is stopping (ops.go).
		b.stopOperations()
		if b.mqtt != nil {
			// The substrate's Close only writes DISCONNECT 0x8B (with passive
			// disconnect it leaves the socket to the client) and then waits
			// for every connection to end: a client that never answers would
			// hold the shutdown for its keepalive. Sagüin closes them.
			//
			// Each substrate listener is ended first with Sagüin's own closer:
			// the substrate's closer lists clients with a read lock taken
			// twice (Clients.GetByListener calls Len under RLock), so a
			// client detaching at that moment queues a writer between the
			// two and the shutdown hangs for ever. A listener runs its closer
			// only once, so Server.Close below no longer calls that one.
			for _, l := range b.cfg.Broker.Listeners {
				b.mqtt.Listeners.Close(l.Name, b.stopListenerClients)
			}
			b.stopListenerClients("")
			_ = b.mqtt.Close()
			// Every connection's goroutine and every accept loop has
			// returned (the substrate's Close waited for the connections'
			// handling, not for what follows it).
			for _, d := range b.doors {
				d.serving.Wait()
			}
		}
		b.claims.stopTimeouts()
		b.cancel()
		for _, s := range b.heldSessions() {
			s.stopPumps()
		}
		b.wg.Wait()
		b.refusals.Flush(true) // what the rate limit held back is still told
		b.flushPositions(true)
		err = b.closeProviders()
		// Every door is closed (their socket files removed with them), so
		// the pid file no longer names a broker one can reach.
		b.closeListeners()
		b.removePIDFile()
	})
	return err
}

// stopListenerClients disconnects and stops every client (of every
// listener: the name is ignored), taking the substrate's client-map lock
// once. The DISCONNECTs are written side by side, and once they are written
// or cutGrace has passed every connection is closed: a DISCONNECT waiting
// behind a write blocked on a client that stopped reading (a deaf
// subscriber's sender) is cut by the close rather than holding the stop for
// its write_timeout — or for good with write_timeout none and no keep-alive
// (invariant 16) — one such client after another.
func (b *Broker) stopListenerClients(string) {
	var clients []*mqtt.Client
	for _, cl := range b.mqtt.Clients.GetAll() {
		if !cl.Closed() {
			clients = append(clients, cl)
		}
	}
	if len(clients) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = b.mqtt.DisconnectClient(cl, packets.ErrServerShuttingDown)
			cl.Stop(packets.ErrServerShuttingDown)
		}()
	}
	written := make(chan struct{})
	go func() {
		wg.Wait()
		close(written)
	}()
	grace := time.NewTimer(cutGrace)
	defer grace.Stop()
	select {
	case <-written:
		return
	case <-grace.C:
	}
	for _, cl := range clients {
		cutConnection(cl, packets.ErrServerShuttingDown)
	}
	<-written
}

func (b *Broker) closeProviders() error {
	names := make([]string, 0, len(b.providers))
	for n := range b.providers {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, n := range names {
		if err := b.providers[n].Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing storage provider %s: %w", n, err))
		}
	}
	b.providers = map[string]storage.Provider{}
	return errors.Join(errs...)
}
