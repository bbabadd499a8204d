package harness

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// willEarlySlack absorbs the two processes' clocks being read at different
// moments; a broker publishing a Will a second early (a due moment rounded
// down) is still caught.
const willEarlySlack = 100 * time.Millisecond

// willFigures are the Will workload's counts, for the report.
type willFigures struct {
	episodes, seen, required, acrossCrash, forbidden int
}

// checkWills judges every Will episode (wills.go) by what the watcher read:
//
//   - will-early: a Will read before its connection could have ended plus
//     its Will Delay (MQTT 5 §3.1.3.2.2; rfcs/wills.md).
//   - will-withdrawn-published (invariant 18): a Will read although its
//     client's DISCONNECT 0x00 was answered by the broker's close — the
//     withdrawal is stored before that close — unless a power cut's loss
//     window (or a memory provider's kill) reaches back to it.
//   - will-cancelled-published (docs/channels.md): a Will read although its client
//     came back well within the delay (which cancels it) and then withdrew
//     the new one with an answered DISCONNECT 0x00.
//   - will-missing (invariant 14): a Will whose connection ended with
//     DISCONNECT 0x04 answered, a reset socket or a cut link, never read by
//     the end of the campaign — the broker had run willSettle after the end
//     (time to write the due moment) before any stop, and no loss window
//     may have taken that write back. A kill or a SIGTERM after it does not
//     excuse it: a restart does not lose a Will (docs/channels.md), it is at least
//     once across a crash.
func (r *run) checkWills() ([]Finding, willFigures) {
	var fig willFigures
	seen := map[string][]Note{}
	var done *Note
	var nemeses []Note
	for i, n := range r.notes {
		switch n.Kind {
		case NoteWillSeen:
			seen[n.ClientID] = append(seen[n.ClientID], n)
			fig.seen++
		case NoteWillsDone:
			done = &r.notes[i]
		case NoteNemesis:
			nemeses = append(nemeses, n)
		}
	}
	slices.SortStableFunc(nemeses, func(a, b Note) int { return cmp.Compare(a.T, b.T) })
	endReached := done != nil && !r.hasNote(NoteAbort)
	var early, withdrawn, cancelled, missing capped
	for _, ep := range r.notes {
		if ep.Kind != NoteWillEpisode {
			continue
		}
		fig.episodes++
		reads := seen[ep.ClientID]
		from := ep.End
		if ep.Detail == willEndNever || from == 0 {
			from = ep.Sent
		}
		for _, s := range reads {
			if s.T < from+ep.Delay-willEarlySlack.Nanoseconds() {
				early.add(Finding{Check: "will-early", Channel: chanWills,
					Msg: fmt.Sprintf("the Will of %s (delay %s, its connection ended %s at %d) was read at %d, %s before its delay was out",
						ep.ClientID, time.Duration(ep.Delay), ep.Detail, from, s.T, time.Duration(from+ep.Delay-s.T).Round(time.Millisecond))})
				break
			}
		}
		switch ep.Detail {
		case willEndClean:
			if r.mayBeLost(ep.Closed, 1<<62) {
				continue
			}
			fig.forbidden++
			if len(reads) > 0 {
				withdrawn.add(Finding{Check: "will-withdrawn-published", Invariant: 18, Channel: chanWills,
					Msg: fmt.Sprintf("the Will of %s was read at offset %d at %d, though its DISCONNECT 0x00 (sent at %d) was answered by the broker's close, which comes after the withdrawal is stored",
						ep.ClientID, reads[0].Value, reads[0].T, ep.Closed)})
			}
		case willEndResumed:
			if r.mayBeLost(ep.Resumed, 1<<62) || r.mayBeLost(ep.Closed, 1<<62) {
				continue
			}
			fig.forbidden++
			if len(reads) > 0 {
				cancelled.add(Finding{Check: "will-cancelled-published", Channel: chanWills,
					Msg: fmt.Sprintf("the Will of %s (delay %s) was read at offset %d at %d, though its client came back %s after its connection ended (CONNACK at %d), which cancels the waiting Will, and then withdrew it with an answered DISCONNECT 0x00 at %d",
						ep.ClientID, time.Duration(ep.Delay), reads[0].Value, reads[0].T, time.Duration(ep.Resumed-ep.End).Round(time.Millisecond), ep.Resumed, ep.Closed)})
			}
		case willEndKeep, willEndReset, willEndCut:
			if !endReached || ep.End+ep.Delay > done.T || !r.willSettled(ep.End, nemeses) {
				continue
			}
			fig.required++
			if len(reads) > 0 {
				if r.crashBetween(ep.End, reads[0].T) {
					fig.acrossCrash++
				}
				continue
			}
			crossed := ""
			if r.crashBetween(ep.End, done.T) {
				crossed = ", across a restart of the broker that came after it had run " + willSettle.String() + " since"
			}
			missing.add(Finding{Check: "will-missing", Invariant: 14, Channel: chanWills,
				Msg: fmt.Sprintf("the Will of %s (delay %s), whose connection ended %s at %d, was never published (watched until %d)%s",
					ep.ClientID, time.Duration(ep.Delay), ep.Detail, ep.End, done.T, crossed)})
		}
	}
	return slices.Concat(early.done(), withdrawn.done(), cancelled.done(), missing.done()), fig
}

// willSettled reports whether the broker ran for willSettle after a Will's
// connection ended at end (after the SIGCONT, if it was frozen then) with
// no stop beginning meanwhile, and whether no loss window may take back
// what it wrote in that time. Only then is the Will's due moment known to
// be written, and the Will owed whatever came after.
func (r *run) willSettled(end int64, nemeses []Note) bool {
	from := end
	frozen := false
	for _, n := range nemeses {
		if n.T > end {
			break
		}
		switch n.Detail {
		case NemesisStop:
			frozen = true
		case nemesisCont:
			frozen = false
		}
	}
	if frozen {
		// Running again from the SIGCONT that follows.
		from = -1
		for _, n := range nemeses {
			if n.T > end && n.Detail == nemesisCont {
				from = n.T
				break
			}
		}
		if from < 0 {
			return false
		}
	}
	until := from + willSettle.Nanoseconds()
	if r.crashBetween(end, until) {
		return false // a stop already under way when it ended counts too
	}
	for _, n := range nemeses {
		if n.T >= end && n.T <= until && n.Detail != NemesisCut && n.Detail != nemesisCont {
			return false
		}
	}
	for _, c := range r.crashes {
		if c.cut && c.call >= end && c.call-c.loss <= until {
			return false
		}
	}
	return true
}
