package broker

import "sync/atomic"

// writerCounts are the broker's counts of what its connection writers did
// (WriterStats).
type writerCounts struct {
	writes       atomic.Int64 // Writes handed to a connection
	socketWrites atomic.Int64 // system calls that wrote them
	bytes        atomic.Int64 // bytes written to sockets
}

// WriterStats is what the connection writers did since the broker started:
// how many Writes were handed in, and in how many system calls they left.
type WriterStats struct {
	Writes       int64 // Writes handed to a client connection (a packet, or a pump's batch)
	SocketWrites int64 // socket writes that carried them
	Bytes        int64 // bytes those socket writes carried
}

// WriterStats reports the connection writers' counts.
func (b *Broker) WriterStats() WriterStats {
	if b.gate == nil {
		return WriterStats{}
	}
	w := &b.gate.writes
	return WriterStats{Writes: w.writes.Load(), SocketWrites: w.socketWrites.Load(), Bytes: w.bytes.Load()}
}
