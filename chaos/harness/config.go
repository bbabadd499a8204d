package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Channel names and filters of the configuration the harness runs the broker
// on. The harness knows the broker only through this file, its binary and the
// wire (design.md), so everything it checks is named here.
const (
	// chanEvents is an append channel with no retention: its floor stays at 1
	// and every record acknowledged to a publisher must be readable at the end
	// (invariant 14), so it is the one the "acknowledged record missing" check
	// and the linearizability model (which assumes no retention) run on.
	chanEvents = "events"
	// chanTicks is an append channel whose retention empties it between
	// bursts: a restart then finds no surviving row, which is where MAX(offset)+1
	// reissues offsets (invariant 9) and where a recomputed floor goes back
	// (invariant 1).
	chanTicks = "ticks"
	// chanJobs is the queue; its dead letters land in jobs__dlq under
	// jobs/__dlq/# (docs/configuration.md: the derived filter).
	chanJobs = "jobs"
	// chanState is a latest channel (docs/channels.md "`latest`"): a value per topic, a
	// zero-length publish deletes it. Its keys are read by point reads
	// ($saguin/kv/get) and by a durable subscriber, and checked against the
	// latest model (a register with delete per key).
	chanState = "state"

	// chanWills is an append channel (no retention) every Will client's
	// Will goes to, one topic per client (wills/<client id>): stored, a
	// Will published while the watcher is away (a cut, a restart) is still
	// read by it when its durable session resumes, where a broadcast
	// topic's would rest on the session's queue alone (wills.go).
	chanWills   = "wills"
	topicWills  = "wills/"
	filterWills = "wills/#"
	// badWillTopic is a Will topic no broker may accept (a wildcard in a
	// topic name: rfcs/wills.md, 0x90): the
	// takeover workload's CONNECT that must be refused.
	badWillTopic = "wills/+/refused"

	topicEvents  = "events/"
	topicTicks   = "ticks/"
	topicJobs    = "jobs/"
	filterEvents = "events/#"
	filterTicks  = "ticks/#"
	filterDLQ    = "jobs/__dlq/#"
	filterState  = "state/#"
	topicQueue   = "$saguin/queue/" + chanJobs
	topicState   = "state/"
	// topicKVGet is where a point read is asked (docs/channels.md "`latest`").
	topicKVGet = "$saguin/kv/get"
	// replyPrefix + client id is a point reader's Response Topic: a plain
	// topic no channel claims, subscribed before the first read.
	replyPrefix    = "replies/"
	ticksRetention = time.Second
)

// dbFile is the sqlite provider's database, in the data directory.
const dbFile = "saguin.db"

// brokerConfig is what the harness varies in the broker's configuration.
type brokerConfig struct {
	provider          string // "sqlite" | "memory"
	dataDir           string // where the provider keeps its files (the FUSE mount for power cuts)
	visibilityTimeout time.Duration
	maxAttempts       int
	logLevel          string // the broker's log_level (Options.BrokerLogLevel)
}

// seekReplyTopic is where the harness asks seek replies to go: a plain topic
// nobody publishes to, so a reply is never confused with a record.
const seekReplyTopic = "chaos/seek-reply"

// render writes the YAML. Durations are whole milliseconds, which the broker's
// duration syntax accepts.
func (c brokerConfig) render() (string, error) {
	var provider string
	switch c.provider {
	case ProviderSQLite:
		provider = fmt.Sprintf("        type: sqlite\n        file_path: %q\n", filepath.Join(c.dataDir, dbFile))
	case ProviderMemory:
		provider = fmt.Sprintf("        type: memory\n        snapshot_dir: %q\n", filepath.Join(c.dataDir, "snapshots"))
	default:
		return "", fmt.Errorf("unknown provider %q (want %s or %s)", c.provider, ProviderSQLite, ProviderMemory)
	}
	var b strings.Builder
	b.WriteString(`# Written by the chaos harness (saguin.dev/chaos/harness).
broker:
  id: chaos
  log_level: ` + c.logLevel + `
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
`)
	b.WriteString(provider)
	fmt.Fprintf(&b, `channels:
  %s:
    type: append
    filter: %q
  %s:
    type: append
    filter: %q
    retention_period: %dms
  %s:
    type: queue
    filter: "%s#"
    visibility_timeout: %dms
    retry:
      max_attempts: %d
  %s:
    type: latest
    filter: %q
  %s:
    type: append
    filter: %q
`, chanEvents, filterEvents, chanTicks, filterTicks, ticksRetention.Milliseconds(),
		chanJobs, topicJobs, c.visibilityTimeout.Milliseconds(), c.maxAttempts, chanState, filterState,
		chanWills, filterWills)
	return b.String(), nil
}

// prepareDataDir creates what the provider expects to exist.
func (c brokerConfig) prepareDataDir() error {
	if c.provider == ProviderMemory {
		if err := os.MkdirAll(filepath.Join(c.dataDir, "snapshots"), 0o700); err != nil {
			return fmt.Errorf("create snapshot dir: %w", err)
		}
	}
	return nil
}
