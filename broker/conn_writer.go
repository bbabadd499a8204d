package broker

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"saguin.dev/broker/internal/wire"
)

// The connection writer (rfcs/connection-writer.md). Every byte to a
// client passes clientConn.Write: the substrate's packets (CONNACK, SUBACK,
// PUBACK, PINGRESP, DISCONNECT, its own PUBLISHes), Sagüin's pumps, the
// broadcast sender, queue offers and the door's refusals. Writes that are
// ready together leave in one system call:
//
//   - A Write that finds no flush running becomes the flusher and writes at
//     once, straight from the caller's bytes: an idle connection adds no
//     latency and no copy.
//   - A Write that arrives while a flush runs copies its bytes into the
//     connection's pending buffer and returns. When the flusher's own write
//     is done it hands what gathered to a background flusher, which writes
//     it in one system call per round until nothing is pending, and ends. A
//     caller's goroutine is never kept writing other writers' bytes (the
//     substrate's read loop must go back to reading).
//   - An answer the read loop writes (PUBACK, PUBREC, PUBREL, PUBCOMP,
//     SUBACK, UNSUBACK, PINGRESP) while the connection has already read the
//     client's next packet is held ("corked") and leaves with the answer to
//     the last packet of that read, or with the next write of any other
//     kind, or before the reader next waits on the socket, or at Close;
//     once the first held answer has waited corkLinger the next answer
//     carries them all out, and never more than corkMax bytes are held. A
//     publisher with several publishes in flight gets its PUBACKs in one
//     write, as a broker reading with an event loop answers a read.
//
// Bytes leave in the order their Writes were accepted, each Write's bytes
// contiguous and appended whole or not at all: every writer hands whole
// packets (the substrate's WritePacket one packet, or its outbuf's whole
// packets; the pumps whole batches), so packets leave whole, and what is
// pending never ends inside one. Writers that must wait for room queue in
// arrival order, so none is passed by a later one; a Write larger than the
// bound waits for the flush to end and writes itself.
//
// invariant 13: the pending buffer is bounded (pendingMax) and exists only
// while non-empty, taken from pools shared by every connection, so an idle
// connection holds none. A Write that finds it full waits for room — never
// grows it — and that wait is bounded by the Write's deadline and cut by
// Close.
//
// invariant 16: every socket write carries limits.write_timeout (the
// keep-alive span under write_timeout none), and a Write — its wait for
// room and its own socket write together — takes no longer than that bound.
// A write that fails or misses its deadline closes the connection, and
// every later Write fails: after a partial write the stream is corrupt, so
// nothing may follow it. The writer never waits on a lock the substrate
// holds (its WritePacket calls Write inside the client lock; other writers
// call it without).
const (
	// pendingMax bounds the bytes one connection holds waiting for its
	// socket: a pump's batch (consumer.go, fanout_send.go: at most 64
	// deliveries or 64 KiB) fits, and a round of the background flusher is
	// never larger than a write of today's pumps, so write_timeout judges a
	// slow client on what it always did. Beside it the kernel holds at most
	// connSendBuffer.
	pendingMax = 64 << 10
	// corkMax bounds the answers held for the read side: about a thousand
	// PUBACKs.
	corkMax = 4 << 10
	// corkLinger bounds how long a held answer waits for the answers
	// after it: once the first has waited this long, the next answer
	// carries them all out.
	corkLinger = time.Millisecond
)

// errWriteTimedOut ends a connection on which a Write found no room within
// its bound: the client took nothing in that time (invariant 16).
var errWriteTimedOut = errors.New("write_timeout: the client did not take the broker's writes in time; disconnected")

// errWriterFailed is what every Write after the failed one is told.
var errWriterFailed = fmt.Errorf("%w: an earlier write to the client failed or missed write_timeout", net.ErrClosed)

// pendingBuf is a pending buffer: the bytes, and when the first of them
// was held for the read side (cork).
type pendingBuf struct {
	b     []byte
	since time.Time
}

// pendingSizes are the pooled sizes of pending buffers, smallest first;
// the last is pendingMax. A connection's buffer starts at the smallest that
// fits and moves up as it fills.
var pendingSizes = [...]int{4 << 10, 16 << 10, pendingMax}

var pendingPools [len(pendingSizes)]sync.Pool

// getPending takes an empty buffer with room for need bytes (callers never
// ask for more than pendingMax: checked before).
func getPending(need int) *pendingBuf {
	for i, size := range pendingSizes {
		if need <= size {
			if p, _ := pendingPools[i].Get().(*pendingBuf); p != nil {
				return p
			}
			return &pendingBuf{b: make([]byte, 0, size)}
		}
	}
	return &pendingBuf{b: make([]byte, 0, need)}
}

func putPending(p *pendingBuf) {
	for i, size := range pendingSizes {
		if cap(p.b) == size {
			p.b, p.since = p.b[:0], time.Time{}
			pendingPools[i].Put(p)
			return
		}
	}
}

// writerCounts are the broker's counts of what its connection writers did
// (WriterStats).
type writerCounts struct {
	writes       atomic.Int64 // Writes handed to a connection
	socketWrites atomic.Int64 // system calls that wrote them
	corked       atomic.Int64 // Writes held for the read side
	waited       atomic.Int64 // Writes that waited for room, or behind one that did
	handoffs     atomic.Int64 // background flushers started
}

// WriterStats is what the connection writers did since the broker started:
// how many Writes were handed in, in how many system calls they left
// (Writes / SocketWrites is the coalescing), and why.
type WriterStats struct {
	Writes       int64 // Writes handed to a client connection (a packet, or a pump's batch)
	SocketWrites int64 // socket writes that carried them
	Bytes        int64 // bytes those socket writes carried
	Corked       int64 // answers held until the client's packets already read were handled
	Waited       int64 // Writes that found the pending buffer full (or others waiting) and waited for room
	Handoffs     int64 // times the bytes that gathered during a write went to a background flusher
}

// WriterStats reports the connection writers' counts.
func (b *Broker) WriterStats() WriterStats {
	if b.gate == nil {
		return WriterStats{}
	}
	w := &b.gate.writes
	return WriterStats{Writes: w.writes.Load(), SocketWrites: w.socketWrites.Load(), Bytes: int64(b.gate.wire.sum().bytesOut),
		Corked: w.corked.Load(), Waited: w.waited.Load(), Handoffs: w.handoffs.Load()}
}

// connWriter is a clientConn's writing half; its fields are guarded by mu.
// It is kept small: every connection, idle ones too, carries it.
type connWriter struct {
	mu sync.Mutex
	// Writers waiting for room take turns in arrival order: next is the
	// next ticket to give, serving the one whose turn it is.
	next, serving uint32
	pending       *pendingBuf // bytes accepted and not yet written; nil when none
	// wake is closed (and dropped) whenever a waiting Write may proceed:
	// room made, a flush ended, a turn passed, the connection ended. Made
	// only when somebody waits.
	wake       chan struct{}
	flushing   bool // a flusher owns the socket's write side
	background bool // the flusher is the background one (Close waits for it to end)
	closing    bool // Close has begun (or the socket is closed): no Write is accepted
	failed     bool // a write failed or missed its bound: the connection is over
}

// bound is what each write of this connection is bounded by: write_timeout,
// else the keep-alive span (rfcs/limits.md), else nothing (0).
func (c *clientConn) bound() time.Duration {
	if c.writeTimeout > 0 {
		return c.writeTimeout
	}
	return time.Duration(c.span.Load())
}

func deadline(bound time.Duration) time.Time {
	if bound <= 0 {
		return time.Time{}
	}
	return time.Now().Add(bound)
}

func (c *clientConn) now() time.Time {
	if c.l != nil && c.l.now != nil {
		return c.l.now()
	}
	return time.Now()
}

func (c *clientConn) counts() *writerCounts { return &c.l.g.writes }

// Write hands the client whole packets (see above). It returns once they
// are written or accepted to be written; an error means the connection is
// over.
func (c *clientConn) Write(b []byte) (int, error) {
	return c.write(b, c.bound())
}

// write is Write bounded by bound (0: unbounded) instead of the
// connection's own bound: the door's refusals use their own.
func (c *clientConn) write(b []byte, bound time.Duration) (int, error) {
	if wire.EndsConnection(b) {
		// The slot is let go before the refusal or DISCONNECT is written
		// (docs/configuration.md "`broker.limits`" connection admission).
		c.letGo()
	}
	st := c.counts()
	st.writes.Add(1)
	by := deadline(bound)
	w := &c.w
	var ticket uint32
	queued, waited := false, false
	w.mu.Lock()
	for {
		if err := w.stopped(); err != nil {
			w.mu.Unlock()
			return 0, err
		}
		if !queued && w.next != w.serving {
			// Others wait for room: behind them.
			ticket, queued = w.next, true
			w.next++
		}
		if !queued || ticket == w.serving {
			if !w.flushing {
				if c.corkable(b) {
					c.cork(b)
					w.passTurn(queued)
					w.mu.Unlock()
					return len(b), nil
				}
				return c.flushOwn(b, by, queued)
			}
			// A Write is appended whole or not at all, so the pending
			// buffer only ever holds whole packets: what Close writes of
			// it never ends inside one. One larger than the bound waits
			// for the flush to end and then writes itself.
			if len(b) <= pendingMax-w.pendingLen() {
				w.appendPending(b)
				w.passTurn(queued)
				w.mu.Unlock()
				return len(b), nil
			}
			if !queued {
				// No one was waiting: this Write is first in line.
				ticket, queued = w.next, true
				w.next++
			}
		}
		if !waited {
			waited = true
			st.waited.Add(1)
		}
		ch := w.wakeCh()
		w.mu.Unlock()
		if !c.await(ch, by) {
			// invariant 16: no room within the bound — the client took
			// nothing in that time. It is disconnected, and this writer
			// waits no longer.
			c.fail()
			return 0, errWriteTimedOut
		}
		w.mu.Lock()
	}
}

// flushOwn writes b as the flusher, after any held answers. Called with mu
// held and no flush running; it unlocks.
func (c *clientConn) flushOwn(b []byte, by time.Time, queued bool) (int, error) {
	w := &c.w
	bufs := [][]byte{b}
	held := w.pending
	if held != nil {
		// Held answers go first: they answer packets read before.
		if len(held.b)+len(b) <= pendingMax {
			w.appendPending(b)
			held = w.pending
			bufs = [][]byte{held.b}
		} else {
			bufs = [][]byte{held.b, b}
		}
		w.pending = nil
	}
	w.flushing = true
	w.passTurn(queued)
	w.mu.Unlock()
	err := c.writeOut(by, bufs...)
	if held != nil {
		putPending(held)
	}
	if err != nil {
		c.fail()
		return 0, err
	}
	w.mu.Lock()
	c.flushed()
	w.mu.Unlock()
	return len(b), nil
}

// flushed ends a flusher's write (mu held): what gathered meanwhile goes to
// a background flusher, or the flush is over.
func (c *clientConn) flushed() {
	w := &c.w
	if w.pending != nil && !w.failed {
		w.background = true
		c.counts().handoffs.Add(1)
		go c.flushLoop() // owned by the connection: ends when nothing is pending, or the connection fails; Close waits for it
		return
	}
	w.flushing = false
	w.broadcast()
}

// flushLoop is the background flusher: it writes what is pending, one
// system call per round, until nothing is, or the connection fails.
func (c *clientConn) flushLoop() {
	w := &c.w
	w.mu.Lock()
	for w.pending != nil && !w.failed {
		p := w.pending
		w.pending = nil
		w.broadcast() // room for whoever waits
		bound := c.bound()
		w.mu.Unlock()
		err := c.writeOut(deadline(bound), p.b)
		putPending(p)
		if err != nil {
			c.fail()
			w.mu.Lock()
			break
		}
		w.mu.Lock()
	}
	w.flushing, w.background = false, false
	w.broadcast()
	w.mu.Unlock()
}

// writeOut is one socket write (a vectored one for several buffers),
// bounded by by.
func (c *clientConn) writeOut(by time.Time, bufs ...[]byte) error {
	// invariant 16: every write to a client is bounded by write_timeout;
	// with write_timeout none, by the client's keep-alive span.
	if err := c.Conn.SetWriteDeadline(by); err != nil {
		return err
	}
	st := c.counts()
	st.socketWrites.Add(1) // before: whoever sees the bytes sees the count
	var n int64
	var err error
	if len(bufs) == 1 {
		var m int
		m, err = c.Conn.Write(bufs[0])
		n = int64(m)
	} else {
		nb := net.Buffers(bufs)
		n, err = nb.WriteTo(c.Conn)
	}
	// Per connection group, not broker-wide (metrics_counters.go).
	c.shard().bytesOut.Add(uint64(n))
	return err
}

// fail ends the connection after a write that failed or missed its bound
// (invariant 16). Closing here is what disconnects the client whoever
// wrote: the substrate's own writers only log a failed write and go on,
// and after a partial write the stream is corrupt, so no later write may
// follow it. The read loop then fails and the connection is torn down as
// any other that ends.
func (c *clientConn) fail() {
	w := &c.w
	w.mu.Lock()
	w.failed = true
	if w.pending != nil {
		putPending(w.pending)
		w.pending = nil
	}
	w.broadcast()
	w.mu.Unlock()
	_ = c.shut()
}

// corkable reports whether b, a whole Write arriving with no flush
// running, is held for the read side (mu held): it is answers only, the
// client's next packet is already read (the read loop will handle it
// without waiting on the socket), and what is held stays within corkMax
// and corkLinger, and the connection's writes have a bound (Close can then
// write what it holds).
func (c *clientConn) corkable(b []byte) bool {
	w := &c.w
	if !c.readAhead.Load() || w.pendingLen()+len(b) > corkMax || !answersOnly(b) {
		return false
	}
	if c.bound() <= 0 {
		// Under write_timeout none with no keep-alive, Close writes
		// nothing it holds (it would wait for good): hold nothing.
		return false
	}
	return w.pending == nil || c.now().Sub(w.pending.since) < corkLinger
}

// cork holds b for the read side (mu held).
func (c *clientConn) cork(b []byte) {
	w := &c.w
	if w.pending == nil {
		w.appendPending(b)
		w.pending.since = c.now()
	} else {
		w.appendPending(b)
	}
	c.counts().corked.Add(1)
}

// uncork writes the held answers: the reader is about to wait on the
// socket, and what it read has been answered.
func (c *clientConn) uncork() {
	w := &c.w
	w.mu.Lock()
	if w.flushing || w.pending == nil || w.stopped() != nil {
		w.mu.Unlock()
		return
	}
	held := w.pending
	w.pending = nil
	w.flushing = true
	bound := c.bound()
	w.mu.Unlock()
	err := c.writeOut(deadline(bound), held.b)
	putPending(held)
	if err != nil {
		c.fail()
		return
	}
	w.mu.Lock()
	c.flushed()
	w.mu.Unlock()
}

// toSocket is called by the reader before it reads the socket: held
// answers leave first, and from here nothing is held for the read side.
func (c *clientConn) toSocket() {
	c.readAhead.Store(false)
	c.uncork()
}

// answersOnly reports whether b holds only packets the substrate's read
// loop writes in answer to a client's packet.
func answersOnly(b []byte) bool {
	return !wire.AnyPacket(b, func(typ byte, _ int) bool {
		switch typ {
		case 4, 5, 6, 7, 9, 11, 13: // PUBACK PUBREC PUBREL PUBCOMP SUBACK UNSUBACK PINGRESP
			return false
		}
		return true
	})
}

// drain is Close's first half: no Write is accepted from here, waiting
// writers are released, and what was accepted is written — held answers,
// a DISCONNECT appended behind a running flush — within the connection's
// bound. With no bound (write_timeout none, keep-alive 0) nothing is
// waited for: Close cuts at once (invariant 16: a shutdown or takeover
// never waits for good).
func (c *clientConn) drain() {
	w := &c.w
	w.mu.Lock()
	w.closing = true
	w.broadcast()
	bound := c.bound()
	if w.failed || bound <= 0 {
		w.mu.Unlock()
		return
	}
	by := deadline(bound)
	if !w.flushing && w.pending != nil {
		held := w.pending
		w.pending = nil
		w.flushing = true
		w.mu.Unlock()
		err := c.writeOut(by, held.b)
		putPending(held)
		w.mu.Lock()
		w.flushing = false
		w.failed = w.failed || err != nil
		w.broadcast()
		w.mu.Unlock()
		return
	}
	for w.flushing && !w.failed {
		ch := w.wakeCh()
		w.mu.Unlock()
		if !c.await(ch, by) {
			return
		}
		w.mu.Lock()
	}
	w.mu.Unlock()
}

// await waits for ch, the connection's end, or by (zero: no bound). False:
// by passed.
func (c *clientConn) await(ch chan struct{}, by time.Time) bool {
	if by.IsZero() {
		select {
		case <-ch:
		case <-c.closedCh:
		}
		return true
	}
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-c.closedCh:
		return true
	case <-t.C:
		return false
	}
}

func (w *connWriter) stopped() error {
	if w.failed {
		return errWriterFailed
	}
	if w.closing {
		return net.ErrClosed
	}
	return nil
}

func (w *connWriter) pendingLen() int {
	if w.pending == nil {
		return 0
	}
	return len(w.pending.b)
}

// appendPending copies p into the pending buffer, moving it to a larger
// pooled size when needed (the caller keeps the total within pendingMax).
func (w *connWriter) appendPending(p []byte) {
	switch {
	case w.pending == nil:
		w.pending = getPending(len(p))
	case len(w.pending.b)+len(p) > cap(w.pending.b):
		np := getPending(len(w.pending.b) + len(p))
		np.b = append(np.b, w.pending.b...)
		np.since = w.pending.since
		putPending(w.pending)
		w.pending = np
	}
	w.pending.b = append(w.pending.b, p...)
}

// passTurn gives the next waiting writer its turn, if this one had one.
func (w *connWriter) passTurn(queued bool) {
	if queued {
		w.serving++
		w.broadcast()
	}
}

func (w *connWriter) wakeCh() chan struct{} {
	if w.wake == nil {
		w.wake = make(chan struct{})
	}
	return w.wake
}

func (w *connWriter) broadcast() {
	if w.wake != nil {
		close(w.wake)
		w.wake = nil
	}
}

// cutConnection ends cl's connection without writing what is pending on
// it, then stops the client: a stop or a shutdown whose grace has passed
// (invariant 16: neither waits for good on a client that is not reading).
// A plain Stop would close the socket through Close, which first writes
// what was accepted within the connection's bound — minutes under a long
// write_timeout, the very wait the cut is there to end. A connection that
// is not ours (an inline client) is only stopped.
func cutConnection(cl *mqtt.Client, cause error) {
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		cc.fail()
	}
	cl.Stop(cause)
}
