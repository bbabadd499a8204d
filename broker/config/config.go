// Package config reads and validates Sagüin's configuration file (docs/configuration.md
// "Channels and configuration", §1). Load checks the whole file before
// anything starts and reports every finding at once, each naming the key,
// the value and the fix; on success every default is resolved, so the rest
// of the broker reads plain values and never applies a default itself.
//
// The decisions this package takes on the configuration's open points are written in
// rfcs/0002-configuration-decisions.md.
package config

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"saguin.dev/broker/topic"
)

// Config is a validated configuration with every default resolved.
type Config struct {
	// Source is the path Load was given.
	Source string
	Broker Broker
	// Providers by name.
	Providers map[string]Provider
	// Channels sorted by name, derived <queue>__dlq channels included.
	Channels []Channel
	// Bridges in written order (docs/bridge.md).
	Bridges []Bridge
	// Warnings are findings that do not stop a start (docs/operations.md "A start", last
	// item): an inert provider, a door identifying nobody beside an acl_file.
	Warnings []Finding

	resolver *topic.Resolver
	byName   map[string]int
	at       map[string]Finding // where each key read is written
}

// At is a finding about key, placed where the key is written (file, line,
// value as written) with problem as its text. A key the file does not
// write is placed on the main file with no line.
func (c *Config) At(key, problem string) Finding {
	f, ok := c.at[key]
	if !ok {
		f = Finding{File: c.Source, Key: key}
	}
	f.Problem = problem
	return f
}

// Check is a rule a caller adds to the loader's (what a build of the
// broker does not serve, say). It runs in the same pass, on the
// configuration as far as it could be read — even one with findings of its
// own, so that Load reports everything at once — and must therefore read
// only what it finds set, never assume a block is whole.
type Check func(*Config) []Finding

// Resolver returns the topic -> channel resolver for this configuration's
// channels (invariant 12), dead-letter channels included.
func (c *Config) Resolver() *topic.Resolver { return c.resolver }

// Channel returns the named channel.
func (c *Config) Channel(name string) (Channel, bool) {
	i, ok := c.byName[name]
	if !ok {
		return Channel{}, false
	}
	return c.Channels[i], true
}

// Broker is the broker: block.
type Broker struct {
	ID       string
	LogLevel string // debug, info, warn or error
	PIDFile  string // "" = no pid file

	// Listeners are the MQTT doors; when the file names none, one tcp door
	// on ":1883" (docs/configuration.md "`broker.mqtt`") with Default set.
	Listeners []Listener
	// PasswordFile is broker.mqtt.password_file ("" = none); each door's
	// effective file is in its Listener.
	PasswordFile string
	// ACLFile is broker.mqtt.acl_file ("" = every authenticated client may do anything).
	ACLFile string
	// MinProtocolVersion is the lowest MQTT protocol level admitted: 4 (3.1.1) or 5.
	MinProtocolVersion byte

	Limits Limits

	DefaultProvider string
	// DefaultRetentionPeriod: 0 = none (keep everything).
	DefaultRetentionPeriod time.Duration
	// DefaultRetentionBytes: 0 = none.
	DefaultRetentionBytes int64

	Retained Retained
	QoS2     QoS2
	Share    Share
	Session  Session

	// Operations is nil when the file has no broker.operations block (no
	// operations listener at all).
	Operations *Operations
}

// Listener is one door, MQTT or operations.
type Listener struct {
	// ID names the door in logs and errors: "broker.mqtt.listen.tcp" or
	// "broker.mqtt.listen.tcp[fleet]" (operations: "broker.operations.listen...").
	ID   string
	Name string // the kind when the door has no name of its own
	Kind string // "tcp", "ws" or "unix"
	// Address is host:port as net.Listen takes it (tcp, ws).
	Address string
	// Path is the socket path (unix); a leading '@' is an abstract name.
	Path string
	// Mode is the socket file's permission bits (unix; default 0660).
	Mode fs.FileMode
	// ProxyProtocol: read a PROXY protocol v2 header first (unix only).
	ProxyProtocol bool
	TLS           *TLS // nil = plain
	// PasswordFile is the door's effective password file: its own, else the
	// block's ("" = none).
	PasswordFile string
	// AllowAnonymous is resolved: the door's own value, else
	// broker.mqtt.allow_anonymous, else true exactly when there is no
	// password file. Always false on operations doors.
	AllowAnonymous bool
	// SameOrigin and AllowedOrigins are the ws origin checks.
	SameOrigin     bool
	AllowedOrigins []string
	// Default marks the implicit tcp door added when the file names none.
	Default bool

	File string
	Line int
}

// TLS is a door's tls: block.
type TLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string // "" = no client certificates requested
	// RequireCertificate: default true when ClientCAFile is set.
	RequireCertificate bool
	// MinVersion is tls.VersionTLS12 or tls.VersionTLS13.
	MinVersion uint16
}

// Operations is the broker.operations block.
type Operations struct {
	Listeners         []Listener // kinds tcp and unix
	PasswordFile      string
	MinScrapeInterval time.Duration
}

// Limits is broker.limits with defaults resolved.
type Limits struct {
	MaxMessageSize    int64
	MaxTopicLength    int
	MaxTopicLevels    int
	MaxClientIDLength int
	MaxHeaderCount    int
	MaxHeaderBytes    int64
	MaxConnections    int
	MaxSubscriptions  int
	MaxSessionExpiry  time.Duration
	MaxKeepalive      time.Duration // 0 = none
	PublishRate       int           // 0 = no bound
	PublishBytes      int64         // 0 = no bound
	WriteTimeout      time.Duration // 0 = none
	ConnectTimeout    time.Duration
	MaxConnectSize    int64
	MaxConnectRate    int // 0 = none
	SessionQueueBytes int64
}

// Reserve is one largest record with its headers: the room carved out of
// every provider's max_bytes for acks, positions, dead-letter moves and
// QoS 2 releases (docs/configuration.md "`broker.storage`").
func (l Limits) Reserve() int64 { return l.MaxMessageSize + l.MaxHeaderBytes }

// Provider is one broker.storage.providers entry.
type Provider struct {
	Name string
	Type string // "memory" or "sqlite"
	// SnapshotDir (memory): "" = none, nothing survives a restart.
	SnapshotDir string
	// FilePath (sqlite): the database file.
	FilePath string
	// MaxBytes: 0 = unbounded.
	MaxBytes int64
	// FlushInterval (sqlite): WAL fsync cadence.
	FlushInterval time.Duration
	// PublishCommitInterval (sqlite): 0 with PublishCommitNone false means
	// "collect without waiting" (the key absent); PublishCommitNone means
	// one transaction per publish.
	PublishCommitInterval   time.Duration
	PublishCommitNone       bool
	PublishCommitMaxRecords int // 0 unless an interval is set
	ReadConnections         int // sqlite

	File string
	Line int
}

// Channel is one channel with defaults resolved.
type Channel struct {
	Name string
	Type string // "append", "latest" or "queue"
	// FilterAsWritten keeps the braces (the catalogue shows it).
	FilterAsWritten string
	// Filters are the expanded plain filters, in expansion order.
	Filters []string
	Storage string
	// RetentionPeriod: 0 = none (append, latest, dead-letter).
	RetentionPeriod time.Duration
	// RetentionBytes: 0 = none (append, dead-letter).
	RetentionBytes int64
	// MaxBytes: 0 = none (append, queue).
	MaxBytes int64
	// StartTail: a reader with no position begins at the tail (append).
	StartTail bool
	// DeletionRetentionPeriod: how long tombstones stay (latest); 0 = none,
	// kept while the channel exists.
	DeletionRetentionPeriod time.Duration
	// Queue settings.
	VisibilityTimeout time.Duration
	JobExpiresAfter   time.Duration // 0 = work never expires
	MaxAttempts       int
	Backoff           string // "none", "linear" or "exponential"
	BackoffBase       time.Duration
	// DeadLetter is a queue's dead-letter channel name.
	DeadLetter string
	// DeadLetterOf is, on a derived dead-letter channel, its queue's name.
	DeadLetterOf string

	File string
	Line int
}

// Retained is broker.retained.
type Retained struct {
	Storage         string
	RetentionPeriod time.Duration // 0 = none
}

// QoS2 is broker.qos2.
type QoS2 struct {
	MaxInflightPerClient int
	ExpiresAfter         time.Duration
}

// Share is broker.share.
type Share struct {
	ExpiresAfter time.Duration // 0 = none
}

// Session is broker.session.
type Session struct {
	Storage           string
	AckCommitInterval time.Duration
}

// Load reads the configuration file at path (and the files it includes),
// validates all of it, applies checks, and returns the resolved
// configuration, or a *Findings listing every problem found, the checks'
// included, in one order.
func Load(path string, checks ...Check) (*Config, error) {
	return loadFor(path, strconv.IntSize, checks...)
}

// newLoader is a loader for the file at path, judged as a build of the
// given word size would.
func newLoader(path string, wordSize int) *loader {
	return &loader{
		wordSize: wordSize,
		source:   path,
		files:    map[string]int{},
		budget:   maxYAMLNodes,
		includes: map[*yaml.Node]string{},
		usedInc:  map[*yaml.Node]bool{},

		dlqRetention: map[string]dlqRetention{},
		filterAt:     map[string]val{},
	}
}

// loadFor is Load as a build of the given word size would judge the file.
func loadFor(path string, wordSize int, checks ...Check) (*Config, error) {
	l := newLoader(path, wordSize)
	cfg := l.load(path)
	cfg.Source, cfg.at = path, l.at
	for _, check := range checks {
		for _, f := range check(cfg) {
			l.record(f)
		}
	}
	if len(l.findings) > 0 {
		sortFindings(l.findings, l.files)
		if l.dropped > 0 {
			l.findings = append(l.findings, Finding{File: path, Key: "(more)",
				Problem: fmt.Sprintf("%d further findings not shown; fix these first", l.dropped)})
		}
		sortFindings(l.warnings, l.files)
		return nil, &Findings{Source: path, List: l.findings, Warnings: l.warnings}
	}
	sortFindings(l.warnings, l.files)
	cfg.Warnings = l.warnings
	return cfg, nil
}

func (l *loader) load(path string) *Config {
	cfg := &Config{Source: path, Providers: map[string]Provider{}}
	root, ok := l.readYAML(filepath.Clean(path), "(file)", 0, path)
	if !ok {
		return cfg
	}
	file := filepath.Clean(path)
	l.collectIncludes(root, file, l.includes, 0)
	top, ok := l.mapOf(val{n: root, file: file})
	if !ok {
		return cfg
	}

	bv, hasBroker := top.get("broker")
	if !hasBroker {
		l.addKey(file, 1, "broker", "missing; the file needs a broker: block with at least id and storage")
	}
	if v, ok := top.get("limits"); ok {
		l.add(v, "limits live under broker.limits; move this block under broker:")
	}
	bridgesV, hasBridges := top.get("bridges")
	b := l.broker(bv, hasBroker)
	cfg.Broker = b.Broker
	cfg.Providers = b.providers
	if hasBridges {
		cfg.Bridges = l.bridges(bridgesV, b)
	}

	var chv val
	if v, ok := top.get("channels"); ok {
		chv = v
	}
	top.finish("broker", "channels", "bridges")

	if chv.n != nil {
		cfg.Channels = l.channels(chv, b)
	}
	l.checkChannelSet(cfg, b)
	l.warnBridgesToBroadcast(cfg)
	l.finishIncludes()
	l.warnInert(cfg, b)
	l.warnAddressSpace(b)
	sort.Slice(cfg.Channels, func(i, j int) bool { return cfg.Channels[i].Name < cfg.Channels[j].Name })
	cfg.byName = make(map[string]int, len(cfg.Channels))
	for i, c := range cfg.Channels {
		cfg.byName[c.Name] = i
	}
	return cfg
}

// finishIncludes refuses every !include not consumed by a group list.
func (l *loader) finishIncludes() {
	for n, file := range l.includes {
		if !l.usedInc[n] {
			l.record(Finding{File: file, Line: n.Line, Key: "!include", Value: n.Value, HasValue: true,
				Problem: "!include is allowed only as a list entry under channels: or broker.storage.providers"})
		}
	}
}
