package linearizability

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
)

// Whole-history checks for queues. These are safety properties over the whole
// run rather than linearizability questions: porcupine can always place an
// effect nobody observed after the end of the history, so "every acknowledged
// job is eventually offered" can never fail inside it.

type jobKey struct{ channel, id string }

// CheckQueueResolution checks that every job acknowledged to its publisher
// (PUBACK success, outside any power cut's loss window) was offered or
// dead-lettered, and ended resolved: dead-lettered, or its last delivery acked
// by the connection that received it.
//
// The history must end with a drain — workers that ack everything until no
// delivery has come for longer than the visibility timeout plus one offer
// tick. Only then does "the last delivery was acked" mean "the ack applied":
// an ack that arrived too late is followed by a redelivery within the drain.
// A job that was returned, timed out or lost its worker and then never came
// back is the failure this finds (invariant 16 "refusal on the way out": a job
// that belongs to nobody — never processed, never returned, never
// dead-lettered).
func CheckQueueResolution(ops []Op) ([]Violation, error) {
	evs, err := prepare(ops, "queue.")
	if err != nil {
		return nil, err
	}
	type jobInfo struct {
		published *event
		lastDel   *event
		dead      bool
		acks      []*event
	}
	jobs := map[jobKey]*jobInfo{}
	var order []jobKey
	get := func(k jobKey) *jobInfo {
		j, ok := jobs[k]
		if !ok {
			j = &jobInfo{}
			jobs[k] = j
			order = append(order, k)
		}
		return j
	}
	for _, e := range evs {
		if isCrash(e.Op.Op) {
			continue
		}
		k := jobKey{e.Channel, jobID(e.Op)}
		switch e.Op.Op {
		case OpQueuePublish:
			if !e.pending && e.lossCut == 0 && Succeeded(e.Output.Reason) {
				get(k).published = e
			}
		case OpQueueDeliver:
			if e.Input != nil && e.Input.Dup {
				continue // a resend of a delivery already counted
			}
			j := get(k)
			if j.lastDel == nil || e.Return >= j.lastDel.Return {
				j.lastDel = e
			}
		case OpQueueDeadLetter:
			get(k).dead = true
		case OpQueueAnswer:
			// An ack whose PUBACK never came (the broker stopped, the link
			// was cut) may have applied: if it did not, the drain offers
			// the job again and that later delivery is the last one. So a
			// pending ack of the last delivery resolves it; one the broker
			// refused does not.
			if e.Input.Result == ResultAck && (e.pending || Succeeded(e.Output.Reason)) {
				get(k).acks = append(get(k).acks, e)
			}
		}
	}
	var vs []Violation
	for _, k := range order {
		j := jobs[k]
		if j.published == nil || j.dead {
			continue
		}
		if j.lastDel == nil {
			vs = append(vs, Violation{Check: "queue-offered", Channel: k.channel, Lines: []int{j.published.Line},
				Msg: fmt.Sprintf("job %s was acknowledged to its publisher and never offered or dead-lettered", k.id)})
			continue
		}
		d := j.lastDel
		resolved := false
		for _, a := range j.acks {
			if a.Client == d.Client && bytes.Equal(a.Input.Delivery, d.Output.Delivery) && a.Call >= d.Call {
				resolved = true
				break
			}
		}
		if !resolved {
			vs = append(vs, Violation{Check: "queue-resolved", Channel: k.channel, Lines: []int{j.published.Line, d.Line},
				Msg: fmt.Sprintf("job %s: its last delivery (attempt %d, client %d) was never acked and it was not dead-lettered",
					k.id, d.Output.Attempt, d.Client)})
		}
	}
	return vs, nil
}

// CheckQueueOffsets checks offsets across jobs, which per-job partitions
// cannot see: two jobs never share an offset (invariant 9), and a job whose
// publish was acknowledged before another's began has the lower offset
// (offsets are monotonic within a channel). Jobs a power cut may have lost are
// left out: their offsets may legitimately be issued again (invariant 14).
func CheckQueueOffsets(ops []Op) ([]Violation, error) {
	evs, err := prepare(ops, "queue.")
	if err != nil {
		return nil, err
	}
	type jobOff struct {
		offset int64
		line   int
	}
	offsets := map[jobKey]jobOff{}
	pubs := map[jobKey]*event{}
	lost := map[jobKey]bool{}
	for _, e := range evs {
		if e.Op.Op == OpQueuePublish {
			k := jobKey{e.Channel, e.Input.ID}
			if e.lossCut != 0 {
				lost[k] = true
			} else if !e.pending && Succeeded(e.Output.Reason) {
				pubs[k] = e
			}
		}
	}
	var vs []Violation
	owner := map[string]map[int64]jobKey{} // channel -> offset -> job
	for _, e := range evs {
		if e.Op.Op != OpQueueDeliver {
			continue
		}
		k := jobKey{e.Channel, e.Output.ID}
		if lost[k] {
			continue
		}
		off := e.Output.Offset
		if _, ok := offsets[k]; !ok {
			offsets[k] = jobOff{off, e.Line}
		}
		if owner[k.channel] == nil {
			owner[k.channel] = map[int64]jobKey{}
		}
		if other, ok := owner[k.channel][off]; ok && other != k {
			vs = append(vs, Violation{Check: "queue-offset-unique", Channel: k.channel, Lines: []int{offsets[other].line, e.Line},
				Msg: fmt.Sprintf("offset %d delivered as job %s and as job %s", off, other.id, k.id)})
			continue
		}
		owner[k.channel][off] = k
	}
	// Monotonic: sweep publishes by call time, holding the highest offset of
	// publishes already acknowledged before that call.
	type pub struct {
		k    jobKey
		e    *event
		off  int64
		line int
	}
	byChannel := map[string][]pub{}
	for k, e := range pubs {
		if o, ok := offsets[k]; ok {
			byChannel[k.channel] = append(byChannel[k.channel], pub{k, e, o.offset, o.line})
		}
	}
	channels := make([]string, 0, len(byChannel))
	for c := range byChannel {
		channels = append(channels, c)
	}
	slices.Sort(channels)
	for _, c := range channels {
		ps := byChannel[c]
		byCall := slices.Clone(ps)
		slices.SortFunc(byCall, func(a, b pub) int { return cmp.Or(cmp.Compare(a.e.Call, b.e.Call), cmp.Compare(a.k.id, b.k.id)) })
		byRet := slices.Clone(ps)
		slices.SortFunc(byRet, func(a, b pub) int { return cmp.Or(cmp.Compare(a.e.Return, b.e.Return), cmp.Compare(a.k.id, b.k.id)) })
		i := 0
		var best *pub
		for _, b := range byCall {
			for i < len(byRet) && byRet[i].e.Return < b.e.Call {
				if best == nil || byRet[i].off > best.off {
					best = &byRet[i]
				}
				i++
			}
			if best != nil && b.off <= best.off {
				vs = append(vs, Violation{Check: "queue-offset-order", Channel: c, Lines: []int{best.e.Line, b.e.Line},
					Msg: fmt.Sprintf("job %s (offset %d) was published after job %s (offset %d) was acknowledged",
						b.k.id, b.off, best.k.id, best.off)})
			}
		}
	}
	return vs, nil
}
