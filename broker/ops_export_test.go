package broker

import "net"

// OperationsAddr is the address of the operations door named name (tests
// bind port 0); nil when there is none.
func (b *Broker) OperationsAddr(name string) net.Addr { return b.operations.addrs[name] }

// HoldSessionsLock holds Broker.mu, one of the two locks /health's probe
// takes, until release is called.
func (b *Broker) HoldSessionsLock() (release func()) {
	b.mu.Lock()
	return b.mu.Unlock
}

// HoldRetainedOrder holds Broker.retainedOrder for writing, as a
// SUBSCRIBE's retained pass does, until release is called.
func (b *Broker) HoldRetainedOrder() (release func()) {
	b.retainedOrder.Lock()
	return b.retainedOrder.Unlock
}

// ShrinkOperationsRecords makes the records of refused clients and of lost
// positions hold at most rows rows, for tests of what a full record keeps.
func (b *Broker) ShrinkOperationsRecords(rows int) {
	b.refusedClients.max = rows
	b.positionsLost.max = rows
}
