package storage

// Pending is a write that has been given its place and not yet answered:
// what Submitter.Submit returns. Done is closed once Result holds the
// answer, which is the one the waiting call (Append, Enqueue or Put) would
// have returned, and never before the record is as durable as that call
// promises (invariant 18: nothing is acknowledged before it is stored).
type Pending interface {
	// Done is closed when the answer is known.
	Done() <-chan struct{}
	// Result is the record as stored, or why it was not. Read it only
	// after Done is closed.
	Result() (Record, error)
}

// Submitter is a store whose writes can be given their place now and
// answered later: Submit is Append on an AppendLog, Enqueue on a
// QueueStore, Put on a ValueStore, without the wait. Every provider's
// append logs, queues and value stores implement it.
//
// Order: writes one goroutine submits one after another (Submit, or the
// waiting calls, which are a Submit and a wait) are stored in that order —
// within a channel their offsets rise in submission order — and answered
// in that order, across the provider's channels too. A publisher whose
// records go to storage while its connection goes on reading relies on
// it: its records are stored in the order it sent them (MQTT 5 §4.6), and
// its acknowledgements can leave in that order as each is answered.
// Other writes (trims, positions, queue relief, holds) are not ordered
// with submitted ones.
//
// A write submitted to a provider that closes before storing it is
// answered ErrClosed; every Pending is answered, so a waiter never hangs.
type Submitter interface {
	Submit(rec Record) Pending
}

// Submit gives rec its place in s when s is a Submitter; otherwise it
// writes rec now with write (s's own waiting call) and returns the answer
// already given. Stores that wrap a provider's (tests' fault injectors)
// keep working unchanged, one write at a time.
func Submit(s any, rec Record, write func(Record) (Record, error)) Pending {
	if sub, ok := s.(Submitter); ok {
		return sub.Submit(rec)
	}
	out, err := write(rec)
	return Answered(out, err)
}

// Answered is a Pending whose answer is already known.
func Answered(rec Record, err error) Pending {
	return &answered{rec: rec, err: err}
}

type answered struct {
	rec Record
	err error
}

// closedChan is closed once, shared by every answered Pending.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (a *answered) Done() <-chan struct{}   { return closedChan }
func (a *answered) Result() (Record, error) { return a.rec, a.err }
