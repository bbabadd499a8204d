package broker

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/ops"
)

// The record of refused clients /v1/operations/refused reads (docs/operations.md "The routes"): every connection the broker refused at or before its CONNECT, or
// ended for a refusal, one row per client id. Every such refusal passes
// the broker's refusal log (refusals.go, admission.go, doors.go and the
// substrate's adapter), whose observer (noteRefusal) feeds the record; a
// refusal that leaves the connection up (a PUBACK with a code, a refused
// filter) makes no row. In memory only: a restart clears it.

// refusedTracked bounds the rows held (invariant 13: client ids are client
// input).
const refusedTracked = 1000

// connectNote is who a CONNECT said its client is.
type connectNote struct{ clientID, user string }

// noteConnect keeps what a CONNECT names on its connection as soon as it
// is read, for a refusal given before the CONNECT hook runs (the
// substrate's protocol version check).
func noteConnect(cl *mqtt.Client, pk packets.Packet) {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		cc.connect.Store(&connectNote{clientID: pk.Connect.ClientIdentifier, user: string(pk.Connect.Username)})
	}
}

// connectedAs is who the connection's client is: the substrate's client
// once its CONNECT hook ran, else what its CONNECT said, else nobody yet.
func (c *clientConn) connectedAs() (clientID, user string) {
	if cl := c.client.Load(); cl != nil {
		return cl.ID, userOf(cl)
	}
	if n := c.connect.Load(); n != nil {
		return n.clientID, n.user
	}
	return "", ""
}

// userOf is the name a client is known by: the identity it authenticated
// as (a password file's user, a certificate's or proxy's name), else the
// user name its CONNECT gave.
func userOf(cl *mqtt.Client) string {
	if ca := authOf(cl); ca != nil {
		return ca.user
	}
	return string(cl.Properties.Username)
}

// refusedRecord holds one row per refused client id.
type refusedRecord struct {
	max    int // rows held at most
	maxLen int // bytes kept of each string: limits.max_topic_length

	mu   sync.Mutex
	rows map[string]*refusedRow // at most max (add)
	// once are the rows refused exactly once: the ones a newcomer may
	// displace.
	once map[string]struct{}
	// beyond counts the refusals no row keeps: a newcomer dropped, or a
	// row displaced.
	beyond uint64
}

type refusedRow struct {
	user, reason string
	count        uint64
	last         time.Time
}

func newRefusedRecord(max, maxLen int) *refusedRecord {
	return &refusedRecord{max: max, maxLen: maxLen, rows: make(map[string]*refusedRow), once: make(map[string]struct{})}
}

// add counts one refusal of clientID. A newcomer to a full record
// displaces a client refused exactly once, never one refused again and
// again; when every row is a repeat offender the newcomer is dropped.
// Either way what no row keeps is counted in beyond.
func (r *refusedRecord) add(clientID, user, reason string, at time.Time) {
	clientID, user, reason = cut(clientID, r.maxLen), cut(user, r.maxLen), cut(reason, r.maxLen)
	r.mu.Lock()
	defer r.mu.Unlock()
	if row, ok := r.rows[clientID]; ok {
		row.count++
		row.reason, row.last = reason, at
		if user != "" {
			row.user = user
		}
		delete(r.once, clientID)
		return
	}
	// invariant 13: a full record makes room by displacing a row, or keeps none.
	if len(r.rows) >= r.max {
		victim, found := "", false
		for k := range r.once {
			victim, found = k, true
			break
		}
		if !found {
			r.beyond++
			return
		}
		delete(r.rows, victim)
		delete(r.once, victim)
		r.beyond++
	}
	r.rows[clientID] = &refusedRow{user: user, reason: reason, count: 1, last: at}
	r.once[clientID] = struct{}{}
}

// view is the rows worst first — most refusals, then the latest — at most
// max of them, copied under the lock and sorted outside it.
func (r *refusedRecord) view(max int) ops.Refused {
	r.mu.Lock()
	out := ops.Refused{Clients: make([]ops.RefusedClient, 0, len(r.rows)),
		RecordCounts: ops.RecordCounts{Tracked: len(r.rows), Beyond: r.beyond}}
	for id, row := range r.rows {
		out.Clients = append(out.Clients, ops.RefusedClient{ClientID: id, User: row.user, Reason: row.reason,
			Count: row.count, LastSeen: ops.TimeOf(row.last)})
	}
	r.mu.Unlock()
	slices.SortFunc(out.Clients, func(a, b ops.RefusedClient) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		if c := time.Time(*b.LastSeen).Compare(time.Time(*a.LastSeen)); c != 0 {
			return c
		}
		return strings.Compare(a.ClientID, b.ClientID)
	})
	out.Clients = out.Clients[:min(len(out.Clients), max)]
	out.Returned = len(out.Clients)
	return out
}

// noteRefusal is the refusal log's observer: a refusal that ended its
// connection makes or counts its client's row. A socket closed for
// "server busy" before its CONNECT was read is counted by the metric but
// gets no row (docs/operations.md "The routes"): its client is not known.
func (b *Broker) noteRefusal(f logging.Refusal) {
	if !f.Ends || (f.ClientID == "" && f.Kind == refuseConnect && f.Code == packets.ErrServerBusy.Code) {
		return
	}
	b.refusedClients.add(f.ClientID, f.User, refusalReason(f), b.clock.Now())
}

// refusalReason is a refusal as one row says it: its line's message, the
// reason or error it gave, and its code.
func refusalReason(f logging.Refusal) string {
	s := f.Msg
	if why := argOf(f.Args, "reason", "error"); why != "" {
		s += ": " + why
	}
	if f.Code != 0 {
		s += fmt.Sprintf(" (0x%02X)", f.Code)
	}
	return s
}

// argOf is the first of keys among slog arguments (key-value pairs or
// slog.Attr values), as text.
func argOf(args []any, keys ...string) string {
	for i := 0; i < len(args); i++ {
		var key string
		var val any
		if a, ok := args[i].(slog.Attr); ok {
			key, val = a.Key, a.Value.Any()
		} else if k, ok := args[i].(string); ok && i+1 < len(args) {
			key, val = k, args[i+1]
			i++
		} else {
			continue
		}
		if slices.Contains(keys, key) {
			return fmt.Sprint(val)
		}
	}
	return ""
}

// cut keeps at most n bytes of s, ending on a whole character.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
