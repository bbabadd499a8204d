package logging

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// RefusalInterval is how often one client's refusals of one kind may be
// logged: its first is logged when it happens; the rest, until the
// interval has passed, are counted, and the next line says how many were
// not logged (a later refusal's line, or RefusalLog.Flush's summary).
const RefusalInterval = 10 * time.Second

const (
	// refusalClients bounds the (client, kind) pairs tracked (invariant 13:
	// client ids are client input): a newcomer evicts an entry with
	// nothing pending, else any entry, whose pending count then goes to
	// the next summary as "from clients no longer tracked".
	refusalClients = 1024
	// refusalLines bounds the lines refusals write per interval across all
	// clients: a flood from many client ids is not a line each.
	refusalLines = 100
	// refusalKeyMax: a client is tracked by at most this many bytes of its
	// id, so a tracked entry is small whatever id the client sent.
	refusalKeyMax = 128
)

// Refusal is one refusal the broker gave a client, to be counted and, unless
// the client's refusals of that kind are being held back, logged.
type Refusal struct {
	// Level is the line's level: warn for refusals (docs/operations.md "Logs"),
	// debug for publish-rate refusals (docs/channels.md "What a publish is answered").
	Level slog.Level
	// Client is the client's identifier (or, before CONNECT, its remote
	// address).
	Client string
	// Kind names what was refused. It is a constant of the calling code,
	// never client input: it keys the counters, which are never evicted.
	Kind string
	// Code is the reason code answered (0: none).
	Code byte
	// Count is how many refusals this stands for (0 means 1: a SUBACK may
	// refuse several filters at once).
	Count uint64
	// Others are further refusals the same line stands for, counted under
	// their own codes: a SUBACK refusing filters with different codes is
	// one line, each filter counted under the code it was answered.
	Others []CodeCount
	// Msg and Args are the line: a message and slog key-value pairs.
	Msg  string
	Args []any

	// What the operations listener's record of refused clients keeps
	// (docs/operations.md "The routes", through RefusalLog.Observe). ClientID is the client
	// identifier the connection's CONNECT gave ("" before one was read:
	// Client is then a remote host); User the user name the client gave or
	// was known by ("" none, or not known); Ends says the refusal ended
	// the connection (a CONNECT refused, a packet answered with a
	// DISCONNECT or a close).
	ClientID string
	User     string
	Ends     bool
}

// CodeCount is a number of refusals answered with one reason code.
type CodeCount struct {
	Code  byte
	Count uint64
}

// RefusalCount is how many refusals of one kind and code were given since
// start: what the refusal metrics (saguin_publish_refused_total and the
// like) read.
type RefusalCount struct {
	Kind  string
	Code  byte
	Count uint64
}

// RefusalLog logs refusals rate-limited per client and kind, and counts all
// of them. Its Flush runs every RefusalInterval (the owner's loop).
type RefusalLog struct {
	log        *slog.Logger
	now        func() time.Time
	interval   time.Duration
	maxEntries int
	maxLines   int

	mu      sync.Mutex
	entries map[string]*refusalEntry // invariant 13: at most maxEntries
	counts  map[countKey]uint64      // bounded: constant kinds × 256 codes
	// window is when the current interval of the line budget began;
	// lines is what it has spent.
	window time.Time
	lines  int
	// evicted counts refusals not logged whose entry was evicted before
	// its summary; evictedClients how many entries those were.
	evicted        uint64
	evictedClients int

	// observe, when set, is told every refusal (Observe).
	observe func(Refusal)
}

type countKey struct {
	kind string
	code byte
}

type refusalEntry struct {
	client, kind string
	level        slog.Level
	last         time.Time // when this entry last wrote a line
	suppressed   uint64    // refusals since then not logged
}

// NewRefusalLog logs to log, reading the time from now (the broker's
// clock, so tests move it instead of sleeping).
func NewRefusalLog(log *slog.Logger, now func() time.Time) *RefusalLog {
	return &RefusalLog{log: log, now: now, interval: RefusalInterval,
		maxEntries: refusalClients, maxLines: refusalLines,
		entries: make(map[string]*refusalEntry), counts: make(map[countKey]uint64)}
}

// Observe has f told every refusal, logged or not, on the refusing
// goroutine and with no lock of the log's held: f must take no lock its
// callers might hold. It is set once, before the log is used.
func (r *RefusalLog) Observe(f func(Refusal)) { r.observe = f }

// Refused counts f and logs it, unless the same client's refusals of the
// same kind already wrote a line less than an interval ago, or the lines
// of this interval are spent: then it is counted for the next line.
func (r *RefusalLog) Refused(f Refusal) {
	if r.observe != nil {
		r.observe(f)
	}
	n := f.Count
	if n == 0 {
		n = 1
	}
	now := r.now()
	key := Cut(f.Client, refusalKeyMax) + "\x00" + f.Kind
	r.mu.Lock()
	r.counts[countKey{f.Kind, f.Code}] += n
	for _, o := range f.Others {
		r.counts[countKey{f.Kind, o.Code}] += o.Count
		n += o.Count // what a summary says was not logged
	}
	r.roll(now)
	e, ok := r.entries[key]
	var held uint64
	write := false
	switch {
	case !ok:
		r.makeRoom()
		e = &refusalEntry{client: f.Client, kind: f.Kind, level: f.Level}
		r.entries[key] = e
		if r.lines < r.maxLines {
			write = true
		} else {
			// Over budget: reported by the next Flush.
			e.suppressed, e.last = n, now.Add(-r.interval)
		}
	case now.Sub(e.last) >= r.interval && r.lines < r.maxLines:
		write, held = true, e.suppressed
	default:
		e.suppressed += n
	}
	if write {
		e.level, e.last, e.suppressed = f.Level, now, 0
		r.lines++
	}
	r.mu.Unlock()
	if !write {
		return
	}
	args := make([]any, 0, len(f.Args)+6)
	args = append(args, "client", f.Client)
	if f.Code != 0 {
		args = append(args, "code", codeString(f.Code))
	}
	args = append(args, f.Args...)
	if held > 0 {
		args = append(args, "suppressed", held)
	}
	r.log.Log(context.Background(), f.Level, f.Msg, args...)
}

// Flush writes, for each client and kind whose last line is an interval
// old and that had refusals since, one line saying how many were not
// logged; it forgets the pairs that had none. With all, it writes every
// pending count whatever its age (at shutdown). The owner calls it every
// RefusalInterval.
func (r *RefusalLog) Flush(all bool) {
	type summary struct {
		level        slog.Level
		client, kind string
		n            uint64
		since        time.Time
	}
	now := r.now()
	var out []summary
	var evicted uint64
	var evictedClients int
	r.mu.Lock()
	r.roll(now)
	for k, e := range r.entries {
		due := all || now.Sub(e.last) >= r.interval
		if e.suppressed == 0 {
			if due {
				delete(r.entries, k) // idle: its next refusal is a first again
			}
			continue
		}
		if !due || (!all && r.lines >= r.maxLines) {
			continue
		}
		out = append(out, summary{e.level, e.client, e.kind, e.suppressed, e.last})
		r.lines++
		e.suppressed, e.last = 0, now
	}
	if r.evicted > 0 && (all || r.lines < r.maxLines) {
		evicted, evictedClients = r.evicted, r.evictedClients
		r.evicted, r.evictedClients = 0, 0
		r.lines++
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].client != out[j].client {
			return out[i].client < out[j].client
		}
		return out[i].kind < out[j].kind
	})
	for _, s := range out {
		r.log.Log(context.Background(), s.level, "refusals not logged", "client", s.client, "kind", s.kind,
			"suppressed", s.n, "since", s.since)
	}
	if evicted > 0 {
		r.log.Warn("refusals not logged, from clients no longer tracked", "clients", evictedClients,
			"suppressed", evicted)
	}
}

// Counts is every count, sorted by kind and code.
func (r *RefusalLog) Counts() []RefusalCount {
	r.mu.Lock()
	out := make([]RefusalCount, 0, len(r.counts))
	for k, n := range r.counts {
		out = append(out, RefusalCount{Kind: k.kind, Code: k.code, Count: n})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Code < out[j].Code
	})
	return out
}

// roll starts a new line budget once an interval has passed. Caller holds
// r.mu.
func (r *RefusalLog) roll(now time.Time) {
	if now.Sub(r.window) >= r.interval || now.Before(r.window) {
		r.window, r.lines = now, 0
	}
}

// makeRoom evicts one entry when the map is full (invariant 13): one with
// nothing pending if there is one, else any, its pending count kept for
// the next summary. Caller holds r.mu.
func (r *RefusalLog) makeRoom() {
	if len(r.entries) < r.maxEntries {
		return
	}
	var victim string
	for k, e := range r.entries {
		victim = k
		if e.suppressed == 0 {
			break
		}
	}
	if e := r.entries[victim]; e.suppressed > 0 {
		r.evicted += e.suppressed
		r.evictedClients++
	}
	delete(r.entries, victim)
}

func codeString(c byte) string { return fmt.Sprintf("0x%02X", c) }
