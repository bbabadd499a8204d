package broker

import "time"

// publishPathOpen is /health's probe (docs/operations.md "The routes"): can a publish enter
// the broker now? A broadcast publish, the one path every publish may
// take, holds two of the broker's locks: Broker.retainedOrder for reading
// (a retained one, across its store and fan-out; a SUBSCRIBE's retained
// pass holds it for writing) and Broker.mu (the sessions its fan-out
// reaches; also every CONNECT's and every session's end). The probe takes
// both, in the lock order, each with TryLock until within has passed, and
// lets go at once: a broker whose publish path is wedged behind either
// answers 503, one merely busy answers as soon as they are free. It waits
// by polling rather than blocking, so a probe given up on leaves nothing
// behind waiting for the lock — and no waiting writer ahead of the
// publishes (a blocked RLock would queue behind one).
func (b *Broker) publishPathOpen(within time.Duration) bool {
	deadline := time.Now().Add(within)
	if !takeBy(b.retainedOrder.TryRLock, deadline) {
		return false
	}
	defer b.retainedOrder.RUnlock()
	if !takeBy(b.mu.TryLock, deadline) {
		return false
	}
	b.mu.Unlock()
	return true
}

// takeBy tries try until it succeeds or deadline passes, pausing a little
// longer each time (100 µs doubling to 10 ms): a lock held for a moment
// costs the probe a moment.
func takeBy(try func() bool, deadline time.Time) bool {
	pause := 100 * time.Microsecond
	for !try() {
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
	return true
}
