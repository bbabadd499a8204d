package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// The Will workload (rfcs/wills.md; invariants 14, 18). Will
// clients live one episode each under a client id of its own
// (will-<n>-<k>): CONNECT with Clean Start 1, a Session Expiry longer than
// the Will Delay, and a Will whose topic is wills/<client id> and whose
// payload is the client id — so a Will read names the episode that armed
// it. Each episode ends one way, drawn from the seed:
//
//   - DISCONNECT 0x00, answered by the broker's close: the Will is
//     withdrawn and stored so before the close (invariant 18), so it must
//     never be published;
//   - DISCONNECT 0x04, or the socket reset (a crashing device), or the
//     link cut at the proxy: the Will must be published, not before its
//     delay, and at least once by the end of the campaign — across a kill
//     or a power cut too, once the broker had time to write its due moment
//     (rfcs/wills.md), unless a loss window may
//     have taken that write back (invariant 14);
//   - reset, then the same id back with Clean Start 0 well within the
//     delay, then DISCONNECT 0x00: the resume cancelled the waiting Will
//     and the DISCONNECT withdrew the new one, so nothing is published.
//
// A watcher reads the wills channel: an append channel rather than a
// broadcast topic, so a Will published while the watcher is away (a cut,
// a restart) is stored and read when its durable session resumes, and one
// published twice (allowed across a crash) is two records the watcher
// sees. An episode the broker ended (a kill, a SIGTERM, a stop) may or may
// not announce its client, and is judged only against early publication.

const (
	// willClients is how many Will clients run episodes side by side.
	willClients = 2
	// willMaxDelay bounds the Will Delay Interval, in seconds: short, so
	// the campaign's end can wait them out.
	willMaxDelay = 3
	// willSettle is how long the broker must have run, after a Will's
	// connection ended, before a stop for its due moment to count as
	// written (docs/channels.md: "written down when the wait begins"); a stop
	// sooner excuses a Will not published.
	willSettle = 2 * time.Second
)

// Episode endings (a NoteWillEpisode's Detail).
const (
	willEndClean     = "disconnect-0x00"  // answered by the broker's close
	willEndCleanLost = "disconnect-0x00?" // sent, the close not seen as the broker's
	willEndKeep      = "disconnect-0x04"  // answered by the broker's close
	willEndKeepLost  = "disconnect-0x04?"
	willEndReset     = "reset"   // the client reset its socket
	willEndCut       = "cut"     // the proxy cut the link
	willEndBroker    = "broker"  // the broker ended it (a stop, a kill) or the harness cannot tell
	willEndResumed   = "resumed" // reset, resumed within the delay, then 0x00 answered
	willEndResumedX  = "resumed?"
	willEndNever     = "never" // never accepted
)

// willTracker lets the campaign's end wait for the Wills that are due.
type willTracker struct {
	mu   sync.Mutex
	due  map[string]int64 // client id -> earliest moment its Will may be published
	seen map[string]bool
}

func newWillTracker() *willTracker {
	return &willTracker{due: map[string]int64{}, seen: map[string]bool{}}
}

func (w *willTracker) expect(id string, at int64) {
	w.mu.Lock()
	w.due[id] = at
	w.mu.Unlock()
}

func (w *willTracker) saw(id string) {
	w.mu.Lock()
	w.seen[id] = true
	w.mu.Unlock()
}

// outstanding reports how many expected Wills are unseen, and the latest
// moment one of them falls due.
func (w *willTracker) outstanding() (int, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, last := 0, int64(0)
	for id, at := range w.due {
		if !w.seen[id] {
			n++
			last = max(last, at)
		}
	}
	return n, last
}

// willClient runs episodes until stop closes.
type willClient struct {
	env   *env
	name  string
	rng   *lockedRand
	stop  <-chan struct{}
	track *willTracker
	n     int
}

func (w *willClient) run(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case <-w.stop:
			return
		default:
		}
		w.n++
		w.episode(ctx, fmt.Sprintf("%s-%d", w.name, w.n))
		if !sleepCtx(ctx, w.rng.between(50*time.Millisecond, 200*time.Millisecond)) {
			return
		}
	}
}

func (w *willClient) episode(ctx context.Context, id string) {
	e := w.env
	delay := uint32(w.rng.intN(willMaxDelay + 1))
	kind := w.rng.intN(10)
	if kind >= 8 && delay < 2 {
		delay = 2 // a resume needs room inside the delay
	}
	o := dialOpts{clientID: id, cleanStart: true, sessionExpiry: delay + 5,
		will: &paho.WillMessage{Topic: topicWills + id, QoS: 1, Payload: []byte(id)}, willDelay: delay}
	ep := Note{Kind: NoteWillEpisode, ClientID: id, Delay: (time.Duration(delay) * time.Second).Nanoseconds(), Sent: e.now()}
	c, err := e.dial(ctx, o)
	if err != nil {
		// Never accepted: the broker may still have armed it (a CONNACK
		// lost to a cut), so it is told, and judged for nothing but time.
		ep.Detail, ep.End = willEndNever, e.now()
		e.note(ep)
		return
	}
	ep.T = e.now()
	hold := time.NewTimer(w.rng.between(200*time.Millisecond, time.Second))
	select {
	case <-c.dead:
	case <-hold.C:
	case <-ctx.Done():
	}
	hold.Stop()
	if c.isDead() || ctx.Err() != nil {
		if !c.isDead() {
			c.abort()
		}
		w.lost(c, &ep)
		return
	}
	switch {
	case kind < 3:
		sent, ok := c.disconnectAnswered(0x00)
		ep.End, ep.Closed, ep.Detail = sent, sent, willEndClean
		if !ok {
			ep.Detail = willEndCleanLost
		}
	case kind < 5:
		sent, ok := c.disconnectAnswered(0x04)
		ep.End, ep.Detail = sent, willEndKeep
		if ok {
			w.track.expect(id, sent+ep.Delay)
		} else {
			ep.Detail = willEndKeepLost
		}
	case kind < 8:
		ep.End, ep.Detail = e.now(), willEndReset
		stops := e.stops.Load()
		c.abort()
		if stops%2 == 0 && e.stops.Load() == stops {
			w.track.expect(id, ep.End+ep.Delay)
		}
	default:
		w.resume(ctx, c, o, &ep)
	}
	e.note(ep)
}

// lost notes an episode whose connection ended without the client ending
// it: the proxy's cut, or the broker.
func (w *willClient) lost(c *mconn, ep *Note) {
	<-c.dead // dropAt is set before dead closes
	ep.End = c.dropAt
	// The proxy remembers cuts by the client's address, and a port is
	// reused: a cut older than this connection is another's.
	if t, ok := w.env.proxy.CutTime(c.local); ok && t >= ep.Sent && c.closedAt.Load() == 0 {
		ep.End, ep.Detail = t, willEndCut
		w.track.expect(ep.ClientID, t+ep.Delay)
	} else {
		ep.Detail = willEndBroker
	}
	w.env.note(*ep)
}

// resume resets the connection, comes back with Clean Start 0 well inside
// the delay (its CONNECT re-arms the same Will), and then withdraws it with
// DISCONNECT 0x00.
func (w *willClient) resume(ctx context.Context, c *mconn, o dialOpts, ep *Note) {
	e := w.env
	ep.End = e.now()
	c.abort()
	sleepCtx(ctx, w.rng.between(50*time.Millisecond, 300*time.Millisecond))
	o.cleanStart = false
	nc, err := e.dial(ctx, o)
	if err != nil {
		ep.Detail = willEndReset // it never came back: judged as a reset
		return
	}
	ep.Resumed = e.now()
	if ep.Resumed-ep.End >= ep.Delay/2 {
		// Too late to be sure the Will was still waiting: nothing is
		// asked of it, and the new connection withdraws its own.
		ep.Detail = willEndResumedX
		nc.disconnectAnswered(0x00)
		return
	}
	sleepCtx(ctx, w.rng.between(50*time.Millisecond, 300*time.Millisecond))
	sent, ok := nc.disconnectAnswered(0x00)
	ep.Closed, ep.Detail = sent, willEndResumed
	if !ok {
		ep.Detail = willEndResumedX
	}
}

// willWatcher is a durable consumer of the wills channel; every Will it is
// sent is noted (NoteWillSeen).
type willWatcher struct {
	env     *env
	name    string
	track   *willTracker
	started bool
}

func (w *willWatcher) run(ctx context.Context) {
	w.env.keepConnected(ctx, func() dialOpts {
		clean := !w.started
		w.started = true
		return dialOpts{clientID: w.name, cleanStart: clean, sessionExpiry: 3600, receiveMax: 64, onPublish: w.onPublish}
	}, func(ctx context.Context, c *mconn) {
		if !c.sessionPresent() {
			code, err := c.subscribe(ctx, filterWills, 1)
			if err != nil {
				c.abort()
				return
			}
			if code >= 0x80 {
				w.env.protocolFinding(0, "subscribe-refused", chanWills, fmt.Sprintf("%s: SUBSCRIBE %s refused 0x%02x", w.name, filterWills, code))
				c.abort()
				return
			}
		}
		waitDead(ctx, c)
	})
}

func (w *willWatcher) onPublish(c *mconn, p *paho.Publish) {
	if !strings.HasPrefix(p.Topic, topicWills) {
		return
	}
	t := w.env.now()
	id := strings.TrimPrefix(p.Topic, topicWills)
	off, _ := userInt(p, "saguin-offset")
	w.env.note(Note{Kind: NoteWillSeen, T: t, Conn: c.id, ClientID: id, Value: off, Detail: string(p.Payload)})
	w.track.saw(id)
}
