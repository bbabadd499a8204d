package linearizability

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"
)

type jobStatus uint8

const (
	jobAbsent    jobStatus = iota // no publish has taken effect
	jobAvailable                  // stored, held by nobody
	jobLeased                     // offered to one worker connection
	jobAcked                      // an ack applied: resolved for good
	jobDead                       // moved to the dead-letter channel
)

func (s jobStatus) String() string {
	return [...]string{"absent", "available", "leased", "acked", "dead-lettered"}[s]
}

// jobState is one queue record as its clients can know it. It is comparable,
// so porcupine's Equal is ==.
type jobState struct {
	status   jobStatus
	holder   int    // the worker connection holding the lease
	delivery string // the lease's Delivery ID (hex)
	attempt  int    // highest attempt number delivered
	// floor is the lowest attempt the next delivery may carry. It rises past
	// an attempt the broker is known to have counted (answered, or PUBACKed
	// and timed out); softFloor marks a rise a kill -9 may undo, because the
	// count from a worker's PUBACK is nothing the broker promised anybody.
	floor     int
	softFloor bool
	offset    int64
	dlqOffset int64
	seen      string // ",hex,hex," — every Delivery ID handed out
	// The power cut that may undo the publish, the applied ack, or the
	// dead-letter move (0: none).
	pubCut, ackCut, deadCut int
}

// QueueModel is one queue record's life as workers and publishers see it,
// partitioned per channel and job (Message ID). It rejects:
//   - a delivery of a job never published, or whose publish was refused;
//   - a delivery while another delivery's lease is live (invariant 4: exactly
//     one consumer holds a record) — a lease ends only by an answer that
//     applies, a queue.lease_end (disconnect / visibility timeout), or a
//     restart (invariant 15);
//   - a delivery after an ack that applied, or after a dead-letter (an
//     applied ack is final; invariant 3: a superseded Delivery ID resolves
//     nothing, so the only ack that applies is the holder's current one);
//   - a Delivery ID handed out twice (unique to the attempt, docs/channels.md);
//   - an attempt number below one already delivered, or not above one the
//     worker answered;
//   - a job seen at two offsets (invariants 8, 9);
//   - a dead-letter of a job that is held, acked, or already dead-lettered at
//     another dead-letter offset (invariant 5: in one place, never both).
//
// "Eventually offered" is not here: it is CheckQueueResolution.
func QueueModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			return partitionBy(h, queueKey)
		},
		Init:              func() []any { return []any{jobState{}} },
		Step:              queueStep,
		Equal:             func(a, b any) bool { return a.(jobState) == b.(jobState) },
		DescribeOperation: func(in, _ any) string { return describeEvent(in.(*event)) },
		DescribeState:     describeJob,
	}
	return nm.ToModel()
}

func queueKey(e *event) string { return e.Channel + "\x00" + jobID(e.Op) }

// jobID is the Message ID an operation is about.
func jobID(op Op) string {
	switch op.Op {
	case OpQueuePublish, OpQueueAnswer, OpQueueLeaseEnd:
		return op.Input.ID
	case OpQueueDeliver, OpQueueDeadLetter:
		return op.Output.ID
	}
	return ""
}

func queueStep(state, input, _ any) []any {
	s := state.(jobState)
	e := input.(*event)
	op := e.Op
	switch op.Op {
	case OpQueuePublish:
		applied, ok := s, s.status == jobAbsent
		if ok {
			applied.status = jobAvailable
			applied.pubCut = e.lossCut
		}
		switch {
		case e.pending && ok:
			return []any{s, applied}
		case e.pending:
			return []any{s}
		case !Succeeded(op.Output.Reason):
			return []any{s}
		case !ok:
			return nil // a second record under one Message ID
		}
		return []any{applied}

	case OpQueueDeliver:
		d := hex.EncodeToString(op.Output.Delivery)
		seen := strings.Contains(s.seen, ","+d+",")
		if op.Input != nil && op.Input.Dup && seen {
			return []any{s} // MQTT's resend of a packet already seen
		}
		if s.status != jobAvailable || seen {
			return nil
		}
		if s.offset != 0 && s.offset != op.Output.Offset {
			return nil
		}
		if op.Output.Attempt < s.floor {
			return nil
		}
		n := s
		n.status = jobLeased
		n.holder = op.Client
		n.delivery = d
		n.attempt = op.Output.Attempt
		n.floor = op.Output.Attempt // attempts never go down
		n.softFloor = false
		n.offset = op.Output.Offset
		if n.seen == "" {
			n.seen = ","
		}
		n.seen += d + ","
		return []any{n}

	case OpQueueAnswer:
		applied := s
		d := hex.EncodeToString(op.Input.Delivery)
		// docs/channels.md: applies only for the current delivery, from the
		// connection holding it (invariant 3).
		if s.status == jobLeased && s.delivery == d && s.holder == op.Client {
			if op.Input.Result == ResultAck {
				applied.status = jobAcked
				applied.ackCut = e.lossCut
			} else {
				applied.status = jobAvailable
			}
			applied.holder, applied.delivery = 0, ""
			// Answering counts the attempt, and the answer is stored
			// before its PUBACK (invariant 18).
			applied.floor, applied.softFloor = s.attempt+1, false
		}
		switch {
		case e.pending:
			return dedupJobs(s, applied)
		case !Succeeded(op.Output.Reason):
			return []any{s}
		}
		return []any{applied}

	case OpQueueLeaseEnd:
		if s.status == jobLeased && s.delivery == hex.EncodeToString(op.Input.Delivery) {
			n := s
			n.status = jobAvailable
			n.holder, n.delivery = 0, ""
			if op.Input.Cause == CauseTimeout {
				// The timeout starts at the worker's PUBACK (invariant 7),
				// which counted the attempt.
				n.floor, n.softFloor = s.attempt+1, true
			}
			return []any{n}
		}
		return []any{s}

	case OpQueueDeadLetter:
		switch s.status {
		case jobDead:
			if s.dlqOffset == op.Output.Offset {
				return []any{s} // the same dead letter read again
			}
			return nil
		case jobAvailable:
			if op.Output.Attempt > 0 && op.Output.Attempt < s.attempt-1 {
				return nil // fewer attempts than the deliveries showed
			}
			n := s
			n.status = jobDead
			n.dlqOffset = op.Output.Offset
			n.deadCut = e.lossCut
			return []any{n}
		}
		return nil

	case OpBrokerRestart:
		n := endLease(s)
		if n.softFloor {
			n.floor, n.softFloor = n.attempt, false
		}
		return []any{n}

	case OpBrokerPowerCut:
		n := endLease(s)
		// Which attempt counts were synced is invisible to clients, so
		// the attempt check restarts after a power cut.
		n.floor, n.softFloor = 0, false
		out := []any{n}
		if s.pubCut == e.cut && s.status != jobAbsent {
			out = append(out, jobState{seen: s.seen})
		}
		if (s.status == jobAcked && s.ackCut == e.cut) || (s.status == jobDead && s.deadCut == e.cut) {
			r := n
			r.status = jobAvailable
			r.ackCut, r.deadCut, r.dlqOffset = 0, 0, 0
			out = append(out, r)
		}
		return out
	}
	return nil
}

func endLease(s jobState) jobState {
	if s.status == jobLeased {
		s.status = jobAvailable
		s.holder, s.delivery = 0, ""
	}
	return s
}

func dedupJobs(a, b jobState) []any {
	if a == b {
		return []any{a}
	}
	return []any{a, b}
}

func describeJob(state any) string {
	s := state.(jobState)
	switch s.status {
	case jobLeased:
		return fmt.Sprintf("leased to client %d d=%s attempt %d @%d", s.holder, s.delivery, s.attempt, s.offset)
	case jobDead:
		return fmt.Sprintf("dead-lettered (dlq@%d) after attempt %d", s.dlqOffset, s.attempt)
	case jobAbsent:
		return "absent"
	}
	return fmt.Sprintf("%s, attempt %d, next ≥ %d @%d", s.status, s.attempt, s.floor, s.offset)
}
