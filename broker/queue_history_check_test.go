package broker_test

// The checker of the queue model test (queue_property_test.go): from what
// the workers were told and when — every time a bound, see there — it
// decides whether any correct broker could have produced the history.

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// stamp orders what the harness knows about time: fake time first, then the
// harness's event number, for things that happened at one fake moment in a
// known real order (a delivery seen before an answer was sent). ev 0 is the
// earliest moment of a fake time: the broker acts on a deadline there.
type stamp struct {
	at time.Duration // fake time since the rig started
	ev int
}

func never() stamp                  { return stamp{at: math.MaxInt64, ev: math.MaxInt} }
func (a stamp) before(b stamp) bool { return a.at < b.at || a.at == b.at && a.ev < b.ev }
func (a stamp) plus(d time.Duration) stamp {
	if a == never() {
		return a
	}
	return stamp{at: a.at + d}
}
func (a stamp) String() string {
	if a == never() {
		return "never"
	}
	return fmt.Sprintf("%v#%d", a.at, a.ev)
}
func maxStamp(a, b stamp) stamp {
	if a.before(b) {
		return b
	}
	return a
}
func minStamp(a, b stamp) stamp {
	if b.before(a) {
		return b
	}
	return a
}

// queueHistory is everything the harness did and saw: the checker's input.
type queueHistory struct {
	visibility  time.Duration
	maxAttempts int
	published   map[string]stamp // payload (unique per publish) → when it was published
	conns       []qhConn
	deliveries  []qhDelivery
	dead        []qhDead
}

type qhConn struct {
	worker string
	manual bool  // the PUBACK goes only when the harness says (paho manual acknowledgement)
	start  stamp // subscribed to $saguin/queue/jobs
	end    stamp // closed by the harness or by a restart; never() while open
	lost   bool  // ended with nobody asking: when, the harness cannot know
}

type qhAnswer struct {
	verdict   string
	at        stamp
	confirmed bool // its PUBACK came back: the broker processed it
}

type qhDelivery struct {
	conn, seq int // seq: position among its connection's deliveries
	offset    uint64
	attempt   int
	payload   string
	seen      stamp     // in the worker's hands by then: an upper bound on the handover
	answer    *qhAnswer // the holder's own answer, on the connection the job came on
	puback    stamp     // manual connections: when the PUBACK was let go; never() if not
}

type qhDead struct {
	payload, reason string
	offset          uint64 // saguin-dlq-offset: where it was in the queue
	attempts        int
	record          string // its own offset in the dead-letter channel
}

// queueAnalysis holds, for each delivery, a lower bound on when it was handed
// over (lo) and the known "handed over before" order (hb). Both are derived
// from facts every correct broker obeys, so a contradiction is a broker bug.
type queueAnalysis struct {
	h  *queueHistory
	lo []stamp
	hb [][]bool
}

// exclusive: two deliveries that can never overlap in a correct broker — one
// job (invariant 4) or one connection (a worker holds one job at a time).
func (a *queueAnalysis) exclusive(i, j int) bool {
	di, dj := a.h.deliveries[i], a.h.deliveries[j]
	return di.offset == dj.offset || di.conn == dj.conn
}

// expiryLB is the earliest a visibility timeout can end delivery i: the
// deadline starts at the PUBACK (invariant 7), which follows the handover; a
// manual worker that never let its PUBACK go has no deadline at all.
func (a *queueAnalysis) expiryLB(i int) stamp {
	d := a.h.deliveries[i]
	if !a.h.conns[d.conn].manual {
		return a.lo[i].plus(a.h.visibility)
	}
	if d.puback == never() {
		return never()
	}
	return maxStamp(a.lo[i], d.puback).plus(a.h.visibility)
}

// endLB is the earliest delivery i can have ended: by its timeout, by its
// holder's answer, or by its connection ending (docs/channels.md "`queue`").
func (a *queueAnalysis) endLB(i int) stamp {
	d := a.h.deliveries[i]
	c := a.h.conns[d.conn]
	e := a.expiryLB(i)
	if d.answer != nil {
		e = minStamp(e, d.answer.at)
	}
	if c.lost {
		e = a.lo[i]
	}
	return maxStamp(a.lo[i], minStamp(e, c.end))
}

// surelyCounted: delivery i, which ended before j was handed over, spent an
// attempt. An answer counts it; so does a timeout (only a leased job times
// out, and the lease starts at the PUBACK that counted it). Only the end of
// its connection could have returned it unspent, and that came after j.
func (a *queueAnalysis) surelyCounted(i, j int) bool {
	di := a.h.deliveries[i]
	c := a.h.conns[di.conn]
	return di.answer != nil && di.answer.confirmed || !c.lost && a.h.deliveries[j].seen.before(c.end)
}

// ackClass sorts the holder's own ack of delivery i. sure: sent while the
// lease was certainly live — the broker applies an answer before its PUBACK,
// at the moment it was sent. void: a later delivery of the job was seen
// before the ack was sent, so i was no longer current.
func (a *queueAnalysis) ackClass(i int) (sure, void bool) {
	d := a.h.deliveries[i]
	if d.answer == nil || d.answer.verdict != "ack" {
		return false, false
	}
	for j, dj := range a.h.deliveries {
		if dj.offset == d.offset && a.hb[i][j] && dj.seen.before(d.answer.at) {
			return false, true
		}
	}
	c := a.h.conns[d.conn]
	return d.answer.confirmed && !c.lost && d.answer.at.before(c.end) && d.answer.at.before(a.expiryLB(i)), false
}

func (a *queueAnalysis) describe(i int) string {
	d := a.h.deliveries[i]
	c := a.h.conns[d.conn]
	s := fmt.Sprintf("[%s conn %d got %s offset %d attempt %d, handed over in [%s, %s]", c.worker, d.conn, d.payload,
		d.offset, d.attempt, a.lo[i], d.seen)
	if d.answer != nil {
		s += fmt.Sprintf(", answered %s at %s (confirmed %v)", d.answer.verdict, d.answer.at, d.answer.confirmed)
	}
	if c.end != never() {
		s += fmt.Sprintf(", connection ended %s", c.end)
	}
	return s + "]"
}

func closeOrder(m [][]bool) {
	for k := range m {
		for i := range m {
			if !m[i][k] {
				continue
			}
			for j := range m {
				if m[k][j] {
					m[i][j] = true
				}
			}
		}
	}
}

// check returns every violation the history proves. final: the run is over
// and every buffer drained, so "not seen" now means "never delivered".
func (h *queueHistory) check(final bool) []string {
	a, bad := h.analyse()
	if final && bad == nil {
		bad = a.finalChecks()
	}
	return bad
}

func (h *queueHistory) analyse() (*queueAnalysis, []string) {
	var bad []string
	report := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	d := h.deliveries
	n := len(d)
	a := &queueAnalysis{h: h, lo: make([]stamp, n)}
	base := make([]stamp, n)
	for i := range d {
		base[i] = maxStamp(h.published[d[i].payload], h.conns[d[i].conn].start)
		if d[i].attempt < 1 || d[i].attempt > h.maxAttempts {
			report("attempts: %s was delivered as attempt %d, outside 1..%d (a spent job is dead-lettered, never offered)",
				d[i].payload, d[i].attempt, h.maxAttempts)
		}
	}
	copy(a.lo, base)
	// Known whatever the clock says: one connection carries its deliveries
	// in handover order, and a connection that ended before another began
	// was handed everything it got first.
	static := make([][]bool, n)
	for i := range d {
		static[i] = make([]bool, n)
		for j := range d {
			ci, cj := h.conns[d[i].conn], h.conns[d[j].conn]
			static[i][j] = i != j && (d[i].conn == d[j].conn && d[i].seq < d[j].seq || ci.end.before(cj.start))
		}
	}
	closeOrder(static)
	for i := range d {
		for j := range d {
			if static[i][j] && d[i].offset == d[j].offset && d[j].attempt < d[i].attempt {
				report("invariant 15: offset %d went back from attempt %d to %d: %s then %s", d[i].offset,
					d[i].attempt, d[j].attempt, a.describe(i), a.describe(j))
			}
		}
	}
	if bad != nil {
		return a, bad
	}
	var overlap [][2]int
	for round := 0; ; round++ {
		overlap = overlap[:0]
		hb := make([][]bool, n)
		for i := range d {
			hb[i] = append([]bool(nil), static[i]...)
		}
		for i := range d {
			for j := range d {
				// Attempts never fall, so a lower one was handed over first;
				// a delivery seen before another could be handed over came
				// first; and of two that cannot overlap, if one cannot have
				// ended before the other was seen, the other came first.
				if d[i].offset == d[j].offset && d[i].attempt < d[j].attempt || i != j && d[i].seen.before(a.lo[j]) {
					hb[i][j] = true
				}
				if i < j && a.exclusive(i, j) {
					iFirst, jFirst := !d[j].seen.before(a.endLB(i)), !d[i].seen.before(a.endLB(j))
					if !iFirst && !jFirst {
						// Reported once the bounds settle: they only tighten,
						// so the pair stays impossible.
						overlap = append(overlap, [2]int{i, j})
						continue
					}
					hb[i][j] = hb[i][j] || !jFirst
					hb[j][i] = hb[j][i] || !iFirst
				}
			}
		}
		closeOrder(hb)
		a.hb = hb
		for i := range d {
			if hb[i][i] {
				report("invariant 4: no order of the deliveries of offset %d has one holder at a time; %s is on a cycle",
					d[i].offset, a.describe(i))
				return a, bad
			}
		}
		changed := false
		for j := range d {
			lo := base[j]
			for i := range d {
				if hb[i][j] {
					if a.exclusive(i, j) {
						lo = maxStamp(lo, a.endLB(i)) // i ended before j began
					} else {
						lo = maxStamp(lo, a.lo[i])
					}
				}
			}
			if a.lo[j].before(lo) {
				a.lo[j], changed = lo, true
			}
		}
		early := false // seen before it could be handed over: reported below
		for j := range d {
			early = early || d[j].seen.before(a.lo[j])
		}
		if !changed || early || round > n*n+n {
			break
		}
	}
	for _, p := range overlap {
		report("invariant 4: two live deliveries at once: %s and %s", a.describe(p[0]), a.describe(p[1]))
	}
	for j := range d {
		if d[j].seen.before(a.lo[j]) {
			why := ""
			for i := range d {
				if a.hb[i][j] && a.exclusive(i, j) && a.endLB(i) == a.lo[j] {
					why = " while " + a.describe(i) + " cannot have ended before " + a.lo[j].String()
					if a.lo[j] == never() {
						why = " while " + a.describe(i) + " still held it (no PUBACK, so no deadline; no answer; connected)"
					}
				}
			}
			report("invariant 4: %s was seen before it could have been handed over%s", a.describe(j), why)
		}
	}
	for i := range d {
		for j := range d {
			if a.hb[i][j] && d[i].offset == d[j].offset && a.surelyCounted(i, j) && d[j].attempt <= d[i].attempt {
				report("attempts: %s spent its attempt, yet %s came after with attempt %d", a.describe(i), a.describe(j), d[j].attempt)
			}
		}
	}
	for i := range d {
		if sure, _ := a.ackClass(i); sure {
			for j := range d {
				if j != i && d[j].offset == d[i].offset && (a.hb[i][j] || d[i].seen.before(a.endLB(j))) {
					report("invariant 3: %s acked while its lease was live, yet the job went out again: %s",
						a.describe(i), a.describe(j))
				}
			}
		}
	}
	return a, bad
}

// finalChecks need every delivery in: a counted delivery was always seen
// (paho hands a job to the application before it sends the PUBACK).
func (a *queueAnalysis) finalChecks() []string {
	var bad []string
	report := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	h, d := a.h, a.h.deliveries
	attempts := map[uint64]map[int]bool{}
	for j := range d {
		if attempts[d[j].offset] == nil {
			attempts[d[j].offset] = map[int]bool{}
		}
		attempts[d[j].offset][d[j].attempt] = true
		// Upper bound: the attempt counts the deliveries before it that were
		// acknowledged or answered (invariants 6, 7: nothing else counts).
		could := 0
		for i := range d {
			c := h.conns[d[i].conn]
			if i != j && d[i].offset == d[j].offset && !a.hb[j][i] && (!c.manual || d[i].puback != never() || d[i].answer != nil) {
				could++
			}
		}
		if d[j].attempt-1 > could {
			report("attempts: %s says attempt %d, but at most %d earlier deliveries were acknowledged or answered",
				a.describe(j), d[j].attempt, could)
		}
	}
	for off, set := range attempts {
		for k := 1; k <= len(set); k++ {
			if !set[k] {
				report("attempts: offset %d was delivered with attempts %v: attempt %d was skipped", off, keys(set), k)
				break
			}
		}
	}
	for i := range d {
		if d[i].answer == nil || !d[i].answer.confirmed {
			continue
		}
		after, next := false, false
		for j := range d {
			if j != i && d[j].offset == d[i].offset {
				after = after || a.hb[i][j]
				next = next || !a.hb[j][i] && d[j].attempt == d[i].attempt+1
			}
		}
		if after && !next {
			report("attempts: %s was answered (counted once), but no later delivery has attempt %d", a.describe(i), d[i].attempt+1)
		}
	}
	// Nothing is lost, nothing is finished twice.
	dead := map[string]map[string]qhDead{}
	for _, x := range h.dead {
		if _, ok := h.published[x.payload]; !ok {
			report("dead letter %q: nobody published it", x.payload)
			continue
		}
		if dead[x.payload] == nil {
			dead[x.payload] = map[string]qhDead{}
		}
		dead[x.payload][x.record] = x
		if x.reason != "attempts_exhausted" || x.attempts != h.maxAttempts {
			report("dead letter %s: reason %q after %d attempts, want attempts_exhausted after %d", x.payload, x.reason,
				x.attempts, h.maxAttempts)
		}
		top := 0
		for j := range d {
			if d[j].payload == x.payload {
				top = max(top, d[j].attempt)
				if d[j].offset != x.offset {
					report("dead letter %s names offset %d; it was delivered as offset %d", x.payload, x.offset, d[j].offset)
				}
			}
		}
		if top != h.maxAttempts {
			report("dead letter %s: its last delivery seen was attempt %d of %d", x.payload, top, h.maxAttempts)
		}
	}
	for _, p := range sortedKeys(h.published) {
		sure, maybe := a.acks(p)
		switch l := len(dead[p]); {
		case l > 1:
			report("%s was dead-lettered %d times", p, l)
		case l == 1 && sure > 0:
			report("%s was acked by its holder and also dead-lettered", p)
		case sure > 1:
			report("%s was acked %d times by holders with live leases", p, sure)
		case l+sure+maybe == 0:
			report("%s was lost: published, never acked, never dead-lettered", p)
		}
	}
	return bad
}

// acks counts the holders' acks of a job that were surely applied, and
// those that may have been (neither surely applied nor surely superseded).
func (a *queueAnalysis) acks(payload string) (sure, maybe int) {
	for i, d := range a.h.deliveries {
		if d.payload == payload {
			s, void := a.ackClass(i)
			switch {
			case s:
				sure++
			case !void && d.answer != nil && d.answer.verdict == "ack":
				maybe++
			}
		}
	}
	return sure, maybe
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func keys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
