package harness

import (
	"cmp"
	"fmt"
	"slices"

	L "saguin.dev/linearizability"
)

// The takeover workload's checks (takeover.go). A gap after a takeover, a
// resume served past what was acknowledged, and a session told new served
// its old position are resume-skip, resume-new-session and the events
// channel's append model, which read the takeover clients' connections like
// the readers'. Here: what only a takeover or a refused CONNECT can break.

// nemesisBetween reports a nemesis note (a link cut counted only when cuts
// is true) with from <= T <= to.
func (r *run) nemesisBetween(from, to int64, cuts bool) bool {
	for _, n := range r.notes {
		if n.Kind == NoteNemesis && n.T >= from && n.T <= to && (cuts || n.Detail != NemesisCut) {
			return true
		}
	}
	return false
}

// crashBetween reports a stop and start of the broker overlapping [from, to].
func (r *run) crashBetween(from, to int64) bool {
	for _, c := range r.crashes {
		if c.call <= to && c.ret >= from {
			return true
		}
	}
	return false
}

// checkTakeovers:
//
//   - takeover-replay (invariant 17): the connection that took a session
//     over is first served an offset of events below what the broker had
//     certainly been acknowledged by the old one — everything through
//     Received-takeoverReceiveMax, by the Receive Maximum — with no stop of
//     the broker in between: the taken-over connection's acknowledgements
//     were dropped, or the session handed over stale. Anything above may
//     come again (an unacknowledged delivery, resent).
//   - takeover-reason (invariant 17, MQTT-3.1.4-3): the old connection was
//     sent a DISCONNECT whose reason is not 0x8E, Session taken over, with
//     no stop of the broker to explain it.
//   - takeover-old-open (invariant 17): the old connection still open an
//     operation timeout after the new one's CONNACK, the broker running:
//     two connections own one id.
//   - taken-over-unasked (invariant 17): a connection sent DISCONNECT 0x8E
//     when no CONNECT for its id was accepted — what a refused CONNECT that
//     still took the id over looks like.
func (r *run) checkTakeovers() []Finding {
	connack := map[int]Note{}
	ends := map[int][]Note{}
	var takeovers []Note
	takenOver := map[int]Note{}
	for _, n := range r.notes {
		switch n.Kind {
		case NoteConnack:
			connack[n.Conn] = n
		case NoteConnEnd:
			ends[n.Conn] = append(ends[n.Conn], n)
		case NoteTakeover:
			takeovers = append(takeovers, n)
			takenOver[n.Peer] = n
		}
	}
	first := map[int]L.Op{}
	for _, o := range r.ops {
		if o.Op != L.OpAppendRead || o.Channel != chanEvents || o.Output == nil {
			continue
		}
		if f, ok := first[o.Client]; !ok || o.Return < f.Return {
			first[o.Client] = o
		}
	}
	var replay, reason, open, unasked capped
	for _, tk := range takeovers {
		if tk.Conn == 0 {
			continue // no CONNACK: nothing to judge but the 0x8E it excuses
		}
		old, ok := connack[tk.Peer]
		if f, has := first[tk.Conn]; has && ok && tk.Received > 0 {
			floor := tk.Received - takeoverReceiveMax + 1
			if f.Output.Offset < floor && !r.crashBetween(old.T, f.Return) {
				replay.add(Finding{Check: "takeover-replay", Invariant: 17, Channel: chanEvents, Lines: lines(f.Line),
					Msg: fmt.Sprintf("%s: connection %d took the session over from connection %d, which had received through offset %d (so, with Receive Maximum %d, the broker had its acknowledgements through %d), and was first served offset %d",
						tk.ClientID, tk.Conn, tk.Peer, tk.Received, takeoverReceiveMax, floor-1, f.Output.Offset)})
			}
		}
		for _, e := range ends[tk.Peer] {
			excused := r.nemesisBetween(tk.Sent, e.T, false)
			switch {
			case e.Value == -2 && !r.nemesisBetween(tk.Sent, e.T, true):
				open.add(Finding{Check: "takeover-old-open", Invariant: 17,
					Msg: fmt.Sprintf("%s: connection %d was still open after connection %d took its id over (CONNACK at %d, still open at %d)", tk.ClientID, tk.Peer, tk.Conn, tk.T, e.T)})
			case e.Value >= 0 && e.Value != 0x8E && !excused:
				reason.add(Finding{Check: "takeover-reason", Invariant: 17,
					Msg: fmt.Sprintf("%s: connection %d, taken over by connection %d, was sent DISCONNECT 0x%02x, not 0x8E (Session taken over)", tk.ClientID, tk.Peer, tk.Conn, e.Value)})
			}
		}
	}
	for conn, es := range ends {
		if _, ok := takenOver[conn]; ok {
			continue
		}
		for _, e := range es {
			if e.Value == 0x8E {
				unasked.add(Finding{Check: "taken-over-unasked", Invariant: 17,
					Msg: fmt.Sprintf("%s: connection %d was sent DISCONNECT 0x8E (Session taken over) though no CONNECT for its id was accepted: %s",
						e.ClientID, conn, r.refusalsFor(e.ClientID, connack[conn].T, e.T))})
			}
		}
	}
	return slices.Concat(replay.done(), reason.done(), open.done(), unasked.done())
}

// refusalsFor says which refused CONNECTs for id fell in [from, to].
func (r *run) refusalsFor(id string, from, to int64) string {
	n := 0
	for _, x := range r.notes {
		if x.Kind == NoteRefused && x.ClientID == id && x.T >= from && x.Sent <= to {
			n++
		}
	}
	if n == 0 {
		return "no refused CONNECT either"
	}
	return fmt.Sprintf("%d CONNECT(s) for it refused meanwhile took it over after all", n)
}

// checkSessionPresent (invariants 18 and 17): a takeover client's durable
// session (Session Expiry 3600), once a CONNACK told it exists, is stored
// (invariant 18: nothing is told before it is stored), so every later
// CONNECT with Clean Start 0 is answered Session Present 1 — across kills
// and SIGTERMs, a refused CONNECT (invariant 17: it changes nothing) and a
// takeover — unless a power cut's loss window (or a memory provider's kill)
// may have taken back the write that created it. Session Present 0 there is
// a session ended underneath its owner or a CONNACK that does not tell the
// truth.
func (r *run) checkSessionPresent() []Finding {
	byClient := map[string][]Note{}
	var clients []string
	for _, n := range r.notes {
		if n.Kind != NoteConnack || (n.Detail != "clean" && n.Detail != "resume" && n.Detail != "takeover") {
			continue
		}
		if _, ok := byClient[n.ClientID]; !ok {
			clients = append(clients, n.ClientID)
		}
		byClient[n.ClientID] = append(byClient[n.ClientID], n)
	}
	var c capped
	for _, id := range clients {
		ns := byClient[id]
		slices.SortStableFunc(ns, func(a, b Note) int { return cmp.Compare(a.T, b.T) })
		created := int64(-1) // when the CONNACK that made the session came; -1: none
		for _, n := range ns {
			switch {
			case n.Detail == "clean":
				created = n.T
			case n.SessionPresent:
			case created >= 0 && !r.mayBeLost(created, n.T):
				c.add(Finding{Check: "session-present", Invariant: 18,
					Msg: fmt.Sprintf("%s: connection %d (Clean Start 0, %s) was told Session Present 0, though its durable session was stored when a CONNACK at %d said it existed and no loss window reaches that write; %s",
						id, n.Conn, n.Detail, created, r.refusalsFor(id, created, n.T))})
				created = n.T
			default:
				created = n.T // a new session now exists
			}
		}
	}
	return c.done()
}

// takeoverFigures counts takeovers, refused CONNECTs and the old
// connections seen sent DISCONNECT 0x8E.
func (r *run) takeoverFigures() (takeovers, refused, got8E int) {
	old := map[int]bool{}
	for _, n := range r.notes {
		switch n.Kind {
		case NoteTakeover:
			if n.Conn == 0 {
				continue
			}
			takeovers++
			old[n.Peer] = true
		case NoteRefused:
			refused++
		}
	}
	for _, n := range r.notes {
		if n.Kind == NoteConnEnd && n.Value == 0x8E && old[n.Conn] {
			got8E++
		}
	}
	return takeovers, refused, got8E
}
