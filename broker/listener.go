package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/wire"
)

// door is one MQTT listener as the substrate sees it (its
// listeners.Listener), in place of the substrate's own: that one runs each
// connection's goroutine with nothing to recover a panic, so a fault in
// handling one client's packet ended the process and every client with it
// (issue 12 item 0c), and it logged every connection's end as a WARN with
// an empty message.
type door struct {
	id  string
	ln  net.Listener // admitListener: broker.limits at the door
	b   *Broker
	end atomic.Bool
	mu  sync.Mutex
	// serving counts the door's goroutines: its accept loop (counted by
	// Start, before the substrate starts it) and one per connection. The
	// broker's Close waits for them.
	serving sync.WaitGroup
}

// newDoor wraps a listener already admitting connections (admitListener).
func (b *Broker) newDoor(id string, ln net.Listener) *door {
	return &door{id: id, ln: ln, b: b}
}

var _ listeners.Listener = (*door)(nil)

func (d *door) ID() string                { return d.id }
func (d *door) Address() string           { return d.ln.Addr().String() }
func (d *door) Protocol() string          { return d.ln.Addr().Network() }
func (d *door) Init(_ *slog.Logger) error { return nil }

// acceptBackoff bounds the pause after a failed accept (out of file
// descriptors, say): the door keeps accepting once the cause passes,
// where the substrate's listener stopped for good at the first error.
const acceptBackoff = time.Second

// Serve accepts until the door is closed and runs each connection on its
// own goroutine, under recover.
func (d *door) Serve(establish listeners.EstablishFn) {
	defer d.serving.Done()
	var pause time.Duration
	for !d.end.Load() {
		conn, err := d.ln.Accept()
		if err != nil {
			if d.end.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, 5*time.Millisecond), acceptBackoff)
			if pause == acceptBackoff || pause == 5*time.Millisecond {
				d.b.log.Warn("accepting a connection failed; retrying", "listener", d.id, "error", err, "retry_in", pause)
			}
			time.Sleep(pause)
			continue
		}
		pause = 0
		if d.end.Load() {
			_ = conn.Close() // closed while accepting: nobody will serve it
			return
		}
		d.serving.Add(1)
		go d.serve(establish, conn)
	}
}

// serve is one connection's goroutine: the substrate's whole handling of
// it, from CONNECT to its end.
func (d *door) serve(establish listeners.EstablishFn, conn net.Conn) {
	defer d.serving.Done()
	if cc, ok := conn.(*clientConn); ok {
		// Last, after a recovered panic's end too: the substrate's cleanup
		// of the connection has run by then (ownership.go teardown).
		defer cc.served()
	}
	defer func() {
		if r := recover(); r != nil {
			d.b.recovered(d.id, conn, r)
		}
	}()
	err := establish(d.id, conn)
	if cc, ok := conn.(*clientConn); ok && errors.Is(err, packets.ErrUnsupportedProtocolVersion) {
		// The substrate's own CONNECT check (broker.mqtt.min_protocol_version)
		// refuses without a word; a refusal is the operator's to see.
		cc.refused(refuseConnect, packets.ErrUnsupportedProtocolVersion.Code,
			"CONNECT refused: protocol version below broker.mqtt.min_protocol_version", "remote", conn.RemoteAddr().String())
	}
	attrs := []any{"listener", d.id, "remote", conn.RemoteAddr().String()}
	if cc, ok := conn.(*clientConn); ok {
		if cl := cc.client.Load(); cl != nil {
			attrs = append(attrs, "client", cl.ID)
		}
	}
	if err != nil {
		attrs = append(attrs, "error", err)
	}
	d.b.log.Debug("connection ended", attrs...)
}

// Close stops accepting; closeClients ends the door's connections (once).
func (d *door) Close(closeClients listeners.CloseFn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.end.CompareAndSwap(false, true) {
		closeClients(d.id)
	}
	_ = d.ln.Close()
}

// errPanicked is the end of a connection whose handling panicked.
var errPanicked = errors.New("the broker failed handling this connection's packet (a panic, recovered)")

// recovered ends a connection whose goroutine panicked, leaving every
// other connection served. The substrate's deferred calls already ran as the
// panic unwound (the client is stopped, its connection count and wait group
// released); what did not run is what a connection ending on a network
// error gets next — the broker's end of the connection (its positions
// stored, its Will armed or published, a session that ends with it ended).
// That is run here, as OnDisconnect would have run it.
func (b *Broker) recovered(listener string, conn net.Conn, r any) {
	_ = conn.Close()
	cc, _ := conn.(*clientConn)
	attrs := []any{"listener", listener, "remote", conn.RemoteAddr().String()}
	var cl *mqtt.Client
	if cc != nil {
		attrs = append(attrs, "packet", wire.PacketName(cc.fr.Handling()))
		cl = cc.client.Load()
		if cl != nil {
			attrs = append(attrs, "client", cl.ID)
		}
	}
	msg := fmt.Sprint(r)
	if len(msg) > 200 {
		msg = msg[:200]
	}
	attrs = append(attrs, "panic", msg, "at", panicSite())
	b.log.Error("connection closed: the broker failed handling its packet", attrs...)
	if cl != nil {
		b.endAfterPanic(cl, cc)
	}
}

// endAfterPanic runs the broker's end of a connection whose goroutine
// panicked. invariant 17: it changes what is kept for the client id only
// through connectionEnded and teardown, which act only while this
// connection owns the session (a connection already taken over changes
// nothing, and a successor is never torn down).
func (b *Broker) endAfterPanic(cl *mqtt.Client, cc *clientConn) {
	defer func() {
		// A second fault while ending must not take the process down
		// either; what is left is then the session's expiry to clear.
		if r := recover(); r != nil {
			b.log.Error("ending a connection after a panic failed", "client", cl.ID, "panic", fmt.Sprint(r), "at", panicSite())
		}
	}()
	cl.Stop(errPanicked)
	// A claim it held when it failed (from OnSessionEstablish until its
	// senders started) is let go, or the next CONNECT of the id waits for
	// it for ever; release only releases a claim this connection holds.
	b.claims.release(cl.ID, cl)
	if cc.ending.Load() {
		// It failed inside its own end: running that again could only
		// repeat the failure.
		return
	}
	expire := (cl.Properties.ProtocolVersion == 5 && cl.Properties.Props.SessionExpiryInterval == 0) ||
		(cl.Properties.ProtocolVersion < 5 && cl.Properties.Clean)
	// As OnDisconnect: teardown does, under the id's claim and only while
	// this connection is the one the substrate registers, what the
	// substrate's own cleanup after OnDisconnect would.
	(&hook{b: b}).OnDisconnect(cl, errPanicked, expire)
}

// panicSite names the function and line that panicked: the first frame
// below the runtime's panic machinery.
func panicSite() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	seenPanic := false
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "runtime.") {
			if f.Function == "runtime.gopanic" {
				seenPanic = true
			}
		} else if seenPanic {
			file := f.File
			if i := strings.LastIndexByte(file, '/'); i >= 0 {
				file = file[i+1:]
			}
			fn := f.Function
			if i := strings.LastIndexByte(fn, '/'); i >= 0 {
				fn = fn[i+1:]
			}
			return fmt.Sprintf("%s %s:%d", fn, file, f.Line)
		}
		if !more {
			return "unknown"
		}
	}
}

// panicIfNamed is the panic-on-packet fault: the handling of a packet
// naming Options.PanicTopic panics, here on the connection's goroutine as
// a bug in any packet's handling would.
func (b *Broker) panicIfNamed(pk packets.Packet) {
	named := pk.FixedHeader.Type == packets.Publish && pk.TopicName == b.panicTopic
	if pk.FixedHeader.Type == packets.Subscribe || pk.FixedHeader.Type == packets.Unsubscribe {
		for _, f := range pk.Filters {
			named = named || f.Filter == b.panicTopic
		}
	}
	if named {
		panic("fault injection (panic-on-packet): handling a " + wire.PacketName(pk.FixedHeader.Type) + " naming " + b.panicTopic)
	}
}
