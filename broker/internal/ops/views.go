package ops

import (
	"net/http"
	"time"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/passwd"
)

// MaxRows is how many rows a /v1 list returns at most (docs/operations.md "The routes":
// every list worst-first, capped at 100, beside how many exist).
const MaxRows = 100

// Source is what the listener asks of the broker: the one interface it
// consumes, each method answering one route from what the broker already
// holds. A method copies what it needs under the broker's locks and
// returns plain values; the listener formats them with no lock held
// (docs/operations.md "Metrics": a scrape holding the lock would make /health flap).
type Source interface {
	// MetricsHandler serves /metrics (the Prometheus text exposition).
	MetricsHandler() http.Handler
	// PublishPathOpen reports whether the broker's publish path can be
	// entered within the given time: /health's probe.
	PublishPathOpen(within time.Duration) bool
	// Operators is the operator password file at path as the broker holds
	// it now (read at start, and again by each SIGUSR1 that loaded every
	// file); nil when it holds none under that path.
	Operators(path string) *passwd.Table
	// ExplainACL is acl.Explain against the ACL in force; clientID nil
	// when none was asked about.
	ExplainACL(user string, clientID *string) acl.Explanation
	Users(max int) Users
	Sessions(max int) Sessions
	Consumers(max int) Consumers
	// Queue is the queue channel named channel; false when no queue has
	// that name, an error when its store cannot be read.
	Queue(channel string, max int) (Queue, bool, error)
	Refused(max int) Refused
	PositionLost(max int) PositionLost
}

// Time is a moment as every /v1 body writes it: UTC, RFC 3339 with
// milliseconds.
type Time time.Time

// MarshalJSON writes t as "2006-01-02T15:04:05.000Z".
func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Time(t).UTC().Format("2006-01-02T15:04:05.000Z07:00") + `"`), nil
}

// UnmarshalJSON reads what MarshalJSON writes (a client of the routes,
// the tests among them).
func (t *Time) UnmarshalJSON(b []byte) error {
	var v time.Time
	if err := v.UnmarshalJSON(b); err != nil {
		return err
	}
	*t = Time(v)
	return nil
}

// TimeOf is t as a body writes it, nil for the zero time (never).
func TimeOf(t time.Time) *Time {
	if t.IsZero() {
		return nil
	}
	v := Time(t)
	return &v
}

// Users is /v1/operations/users: who may connect, per MQTT door.
type Users struct {
	// Users are the names of every MQTT door's password file, each once,
	// sorted; Total counts them all.
	Users            []string        `json:"users"`
	Total            int             `json:"total"`
	Returned         int             `json:"returned"`
	AnonymousAllowed bool            `json:"anonymous_allowed"`
	Listeners        map[string]Door `json:"listeners"`
}

// Door is one MQTT door in /v1/operations/users.
type Door struct {
	Users            []string `json:"users"`
	Total            int      `json:"total"`
	Returned         int      `json:"returned"`
	AnonymousAllowed bool     `json:"anonymous_allowed"`
	// Certificate is "required", "accepted" or "none" (a unix door: none,
	// unless a proxy in front of it vouches for certificates).
	Certificate string `json:"certificate"`
}

// Sessions is /v1/operations/sessions.
type Sessions struct {
	Sessions  []Session `json:"sessions"`
	Total     int       `json:"total"`
	Connected int       `json:"connected"`
	Offline   int       `json:"offline"`
	Returned  int       `json:"returned"`
}

// Session is one session: connected, or held with no connection. What
// only a connection knows (user, listener, remote, keepalive, clean
// start) is null for a held one.
type Session struct {
	ClientID  string  `json:"client_id"`
	Connected bool    `json:"connected"`
	User      *string `json:"user"`
	Protocol  string  `json:"protocol"` // "3.1.1" or "5"
	Listener  *string `json:"listener"`
	Remote    *string `json:"remote"`
	Keepalive *int    `json:"keepalive"` // seconds
	// ExpiresAfter is how long, in seconds, the session outlives its
	// connection (0: it ends with it).
	ExpiresAfter  int64   `json:"expires_after"`
	CleanStart    *bool   `json:"clean_start"`
	Subscriptions int     `json:"subscriptions"`
	LastSeen      *Time   `json:"last_seen,omitempty"` // a held session: when its connection ended
	Partitions    []Slice `json:"partitions,omitempty"`
}

// Slice is one filter's declared partitions (saguin-filter).
type Slice struct {
	Filter  string   `json:"filter"`
	Count   uint32   `json:"count"`
	Indices []uint32 `json:"indices"`
}

// Consumers is /v1/operations/consumers: every append channel's readers,
// the channels whose worst reader is furthest behind first.
type Consumers struct {
	Channels []ConsumerChannel `json:"channels"`
	Total    int               `json:"total"`
	Returned int               `json:"returned"`
}

// ConsumerChannel is one append channel's readers, furthest behind first.
type ConsumerChannel struct {
	Channel    string     `json:"channel"`
	NextOffset uint64     `json:"next_offset"`
	Consumers  int        `json:"consumers"`
	Returned   int        `json:"returned"`
	Positions  []Position `json:"positions"`
}

// Position is one reader's place on a channel.
type Position struct {
	Reader   string `json:"reader"` // mqtt:<client-id> or bridge:<rule>
	Offset   uint64 `json:"offset"`
	Behind   uint64 `json:"behind"`
	LastSeen *Time  `json:"last_seen"`
}

// Queue is /v1/operations/queues/<channel>: the unresolved jobs, metadata
// only, never a payload.
type Queue struct {
	Channel    string        `json:"channel"`
	Unresolved int           `json:"unresolved"`
	Returned   int           `json:"returned"`
	Records    []QueueRecord `json:"records"`
}

// QueueRecord is one unresolved job.
type QueueRecord struct {
	Offset   uint64 `json:"offset"`
	Topic    string `json:"topic"`
	Attempts uint32 `json:"attempts"`
	// State is "waiting", "delivering" (handed out, PUBACK not yet back)
	// or "leased"; Holder and LeaseUntil are written only when leased.
	State      string  `json:"state"`
	Holder     *string `json:"holder,omitempty"`
	LeaseUntil *Time   `json:"lease_until,omitempty"`
	// FirstSeen is when the broker stored the job; LastSeen when it last
	// handed it to a worker (null: never).
	FirstSeen *Time `json:"first_seen"`
	LastSeen  *Time `json:"last_seen"`
}

// Refused is /v1/operations/refused.
type Refused struct {
	Clients []RefusedClient `json:"clients"`
	RecordCounts
}

// RecordCounts are the counts of a body read from one of the broker's
// bounded records: the rows returned, the rows the broker holds
// (Tracked), and what it could not keep a row for (Beyond: refusals, or
// passings).
type RecordCounts struct {
	Returned int    `json:"returned"`
	Tracked  int    `json:"tracked"`
	Beyond   uint64 `json:"beyond"`
}

// RefusedClient is one client's refusals ("" client_id: before a CONNECT
// was read).
type RefusedClient struct {
	ClientID string `json:"client_id"`
	User     string `json:"user"`
	Reason   string `json:"reason"` // the latest refusal's
	Count    uint64 `json:"count"`
	LastSeen *Time  `json:"last_seen"`
}

// PositionLost is /v1/operations/position-lost.
type PositionLost struct {
	Readers []LostReader `json:"readers"`
	RecordCounts
}

// LostReader is one reader on one channel whose stored position the
// retention floor passed, every passing aggregated.
type LostReader struct {
	Reader  string `json:"reader"`
	Channel string `json:"channel"`
	// Kind is "consumer" (overtaken while connected), "session" (found
	// passed at its return or its SUBSCRIBE) or "bridge".
	Kind string `json:"kind"`
	// Reported is false when any passing aggregated here went untold.
	Reported      bool   `json:"reported"`
	Count         uint64 `json:"count"`
	RecordsMissed uint64 `json:"records_missed"`
	LastPosition  uint64 `json:"last_position"`
	LastFloor     uint64 `json:"last_floor"`
	LastSeen      *Time  `json:"last_seen"`
}
