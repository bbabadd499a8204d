package broker

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/logging"
	"saguin.dev/broker/internal/wire"
)

// The connection writer (conn_writer.go) over real loopback sockets.

// socketPair is a connected loopback TCP pair: the broker's end and the
// client's. rcvbuf > 0 sets the client's receive buffer before it connects.
func socketPair(t *testing.T, rcvbuf int) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Timeout: 10 * time.Second}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	client, err = d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

// writerConn wraps the broker's end of a socket as Accept does.
func writerConn(conn net.Conn, writeTimeout time.Duration) *clientConn {
	discard := slog.New(slog.DiscardHandler)
	l := &admitListener{g: newGate(config.Limits{MaxConnections: 1}), log: discard,
		refusals: logging.NewRefusalLog(discard, time.Now),
		pending:  map[*clientConn]struct{}{}, done: make(chan struct{})}
	return &clientConn{Conn: conn, l: l, writeTimeout: writeTimeout, closedCh: make(chan struct{})}
}

// countConn counts the writes that reach the socket under it; while gate
// is set, the first write waits for it to be closed (a client slow to take
// it), after telling entered.
type countConn struct {
	net.Conn
	writes  atomic.Int64
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (c *countConn) Write(p []byte) (int, error) {
	if c.writes.Add(1) == 1 && c.gate != nil {
		close(c.entered)
		<-c.gate
	}
	return c.Conn.Write(p)
}

// frame is one test packet: a PUBLISH-typed frame whose body is the
// writer's number, its sequence and a filler of n bytes derived from both.
func frame(writer byte, seq uint32, n int) []byte {
	body := make([]byte, 5+n)
	body[0] = writer
	binary.BigEndian.PutUint32(body[1:], seq)
	for i := range n {
		body[5+i] = writer ^ byte(seq) ^ byte(i)
	}
	out := []byte{0x30}
	for l := len(body); ; {
		b := byte(l % 128)
		l /= 128
		if l > 0 {
			out = append(out, b|128)
			continue
		}
		out = append(out, b)
		break
	}
	return append(out, body...)
}

// readFrames parses frames off r until EOF and checks each is whole; it
// returns them in the order they arrived.
func readFrames(r io.Reader) ([][]byte, error) {
	br := bufio.NewReader(r)
	var got [][]byte
	for {
		first, err := br.ReadByte()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		if first != 0x30 {
			return got, fmt.Errorf("frame %d: first byte %#x: a packet was cut or interleaved", len(got), first)
		}
		length, mul := 0, 1
		for i := 0; ; i++ {
			b, err := br.ReadByte()
			if err != nil {
				return got, err
			}
			length += int(b&127) * mul
			mul *= 128
			if b&128 == 0 {
				break
			}
			if i == 3 {
				return got, fmt.Errorf("frame %d: bad length", len(got))
			}
		}
		body := make([]byte, length)
		if _, err := io.ReadFull(br, body); err != nil {
			return got, fmt.Errorf("frame %d cut short: %w", len(got), err)
		}
		w, seq := body[0], binary.BigEndian.Uint32(body[1:])
		for i, b := range body[5:] {
			if b != w^byte(seq)^byte(i) {
				return got, fmt.Errorf("frame %d (writer %d, #%d): byte %d is another packet's", len(got), w, seq, i)
			}
		}
		got = append(got, body)
	}
}

// Many writers at once: every packet leaves whole, and each writer's
// packets leave in the order it wrote them — small ones, ones that gather
// in the pending buffer, and ones larger than the buffer's bound.
func TestConnWriterConcurrentWritersLeaveWholeInOrder(t *testing.T) {
	server, client := socketPair(t, 0)
	c := writerConn(server, 30*time.Second)
	const writers, each = 8, 300
	done := make(chan error, 1)
	var frames [][]byte
	go func() {
		var err error
		frames, err = readFrames(client)
		done <- err
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range uint32(each) {
				n := int(seq%7) * 40
				if seq%50 == 7 {
					n = pendingMax + 3000 // past the bound: appended in turns
				}
				if _, err := c.Write(frame(byte(w), seq, n)); err != nil {
					t.Errorf("writer %d #%d: %v", w, seq, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(frames) != writers*each {
		t.Fatalf("%d packets arrived, want %d", len(frames), writers*each)
	}
	next := make([]uint32, writers)
	for i, f := range frames {
		w, seq := f[0], binary.BigEndian.Uint32(f[1:])
		if seq != next[w] {
			t.Fatalf("packet %d: writer %d's #%d arrived where #%d was due", i, w, seq, next[w])
		}
		next[w]++
	}
	st := c.counts()
	t.Logf("%d Writes in %d socket writes (%d handoffs, %d waited for room)",
		st.writes.Load(), st.socketWrites.Load(), st.handoffs.Load(), st.waited.Load())
}

// A burst of small Writes while one write is on the socket returns at once
// and leaves in one more socket write, in the order written.
func TestConnWriterCoalescesWritesDuringAFlush(t *testing.T) {
	server, client := socketPair(t, 0)
	cc := &countConn{Conn: server, gate: make(chan struct{}), entered: make(chan struct{})}
	c := writerConn(cc, 30*time.Second)
	first := frame(0, 0, 100)
	firstDone := make(chan error, 1)
	go func() {
		_, err := c.Write(first)
		firstDone <- err
	}()
	<-cc.entered // the first write is on the socket, and stays there
	const burst = 100
	var want bytes.Buffer
	want.Write(first)
	burstDone := make(chan error, 1)
	go func() {
		for i := range burst {
			if _, err := c.Write(frame(1, uint32(i), 10)); err != nil {
				burstDone <- err
				return
			}
		}
		burstDone <- nil
	}()
	for i := range burst {
		want.Write(frame(1, uint32(i), 10))
	}
	select {
	case err := <-burstDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(cc.gate)
		t.Fatalf("a Write made while another was on the socket waited for it (%d socket writes)", cc.writes.Load())
	}
	close(cc.gate)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	got := make([]byte, want.Len())
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("the bytes arrived out of the order they were written")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d Writes left in %d socket writes, want 2 (the first, then the burst together)", 1+burst, n)
	}
}

// Answers the read loop writes while the client's next packets are already
// read are held, and leave together with the answer to the last of them.
func TestConnWriterHoldsAnswersForTheReadSide(t *testing.T) {
	pub := func(id byte) []byte { return []byte{0x32, 7, 0, 1, 't', 0, id, 0, 'x'} } // MQTT 5 QoS 1, no properties
	puback := func(id byte) []byte { return []byte{0x40, 2, 0, id} }
	connack := []byte{0x20, 3, 0, 0, 0}
	three := append(append(append(append([]byte{}, connect5...), pub(1)...), pub(2)...), pub(3)...)
	t0 := time.Unix(1000, 0)
	newConn := func(t *testing.T, stream []byte) (testConn, *countConn) {
		c := scriptedConn(t, wire.NewFramer(1000, 1000), stream, 4096)
		c.l.now = func() time.Time { return t0 } // no linger passes
		c.writeTimeout = time.Second             // a bound: answers may be held
		cc := &countConn{Conn: c.sc}
		c.Conn = cc
		return c, cc
	}
	read := func(t *testing.T, c testConn) {
		t.Helper()
		if _, err := c.Read(make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(t *testing.T, c testConn, b []byte) {
		t.Helper()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	wantOut := func(t *testing.T, c testConn, parts ...[]byte) {
		t.Helper()
		if want := bytes.Join(parts, nil); !bytes.Equal(c.sc.out.Bytes(), want) {
			t.Fatalf("wrote %x, want %x", c.sc.out.Bytes(), want)
		}
	}
	t.Run("the last answer carries them", func(t *testing.T) {
		c, cc := newConn(t, three)
		read(t, c) // CONNECT
		write(t, c, connack)
		for id := byte(1); id <= 3; id++ {
			read(t, c)
			write(t, c, puback(id))
		}
		wantOut(t, c, connack, puback(1), puback(2), puback(3))
		if n := cc.writes.Load(); n != 2 {
			t.Fatalf("CONNACK and three PUBACKs in %d socket writes, want 2", n)
		}
	})
	t.Run("before the reader waits on the socket", func(t *testing.T) {
		stream := append(append([]byte{}, three...), 0x30, 4, 0, 1, 't', 0) // a QoS 0 PUBLISH: no answer
		c, cc := newConn(t, stream)
		read(t, c)
		write(t, c, connack)
		for id := byte(1); id <= 3; id++ {
			read(t, c)
			write(t, c, puback(id))
		}
		read(t, c) // the QoS 0 publish
		if n := cc.writes.Load(); n != 1 {
			t.Fatalf("answers written while packets were still buffered: %d socket writes", n)
		}
		if _, err := c.Read(make([]byte, 4096)); err != io.EOF {
			t.Fatalf("read: %v", err)
		}
		wantOut(t, c, connack, puback(1), puback(2), puback(3))
	})
	t.Run("at close", func(t *testing.T) {
		stream := append(append([]byte{}, three...), 0xE0, 0) // then DISCONNECT
		c, _ := newConn(t, stream)
		read(t, c)
		write(t, c, connack)
		for id := byte(1); id <= 3; id++ {
			read(t, c)
			write(t, c, puback(id))
		}
		read(t, c) // DISCONNECT: the substrate closes the connection
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		wantOut(t, c, connack, puback(1), puback(2), puback(3))
	})
	t.Run("before a write of another kind", func(t *testing.T) {
		c, _ := newConn(t, three)
		read(t, c)
		write(t, c, connack)
		read(t, c)
		write(t, c, puback(1))
		delivery := frame(9, 9, 3)
		write(t, c, delivery) // a pump's PUBLISH
		wantOut(t, c, connack, puback(1), delivery)
	})
	t.Run("at most corkLinger", func(t *testing.T) {
		c, cc := newConn(t, three)
		now := t0
		c.l.now = func() time.Time { return now }
		read(t, c)
		write(t, c, connack)
		read(t, c)
		write(t, c, puback(1))
		now = now.Add(corkLinger)
		read(t, c)
		write(t, c, puback(2)) // the first has waited long enough: both leave
		if n := cc.writes.Load(); n != 2 {
			t.Fatalf("%d socket writes, want 2", n)
		}
		wantOut(t, c, connack, puback(1), puback(2))
	})
}

// invariant 16: a client that stops reading is disconnected after
// write_timeout, and no writer — the one on the socket, those whose bytes
// wait behind it, those waiting for room — waits past it.
func TestInvariant16_DeafClientEndsEveryWriterWithinWriteTimeout(t *testing.T) {
	server, _ := socketPair(t, 4096) // the client never reads
	if tc, ok := server.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	const timeout = 300 * time.Millisecond
	c := writerConn(server, timeout)
	var longest atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for seq := uint32(0); ; seq++ {
				start := time.Now()
				_, err := c.Write(frame(byte(w), seq, 8<<10))
				if d := int64(time.Since(start)); d > longest.Load() {
					longest.Store(d)
				}
				if err != nil {
					return
				}
				if seq > 100_000 {
					t.Errorf("writer %d: the deaf client took %d packets", w, seq)
					return
				}
			}
		})
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("writers to a deaf client still waiting after 30s")
	}
	// Scheduling on a shared machine is slack; a writer held to the
	// socket would wait until the test's end.
	if d := time.Duration(longest.Load()); d > timeout+2*time.Second {
		t.Fatalf("a Write waited %v with write_timeout %v", d, timeout)
	}
	select {
	case <-c.closedCh:
	default:
		t.Fatal("the connection is still open")
	}
	if _, err := c.Write(frame(0, 0, 1)); err == nil {
		t.Fatal("a Write after the failed one was accepted")
	}
}

// Writers waiting for room in a full pending buffer are released by Close,
// whatever the socket is doing; Close then returns once the write on the
// socket ends.
func TestConnWriterCloseReleasesWritersWaitingForRoom(t *testing.T) {
	server, client := socketPair(t, 0)
	go func() { _, _ = io.Copy(io.Discard, client) }()
	cc := &countConn{Conn: server, gate: make(chan struct{}), entered: make(chan struct{})}
	c := writerConn(cc, time.Minute) // no deadline fires during the test
	go func() { _, _ = c.Write(frame(0, 0, 10)) }()
	<-cc.entered
	if _, err := c.Write(frame(1, 0, pendingMax-10)); err != nil { // fills the pending buffer
		t.Fatal(err)
	}
	waiting := make(chan error, 2)
	for w := range 2 {
		go func() {
			_, err := c.Write(frame(byte(2+w), 0, 1000))
			waiting <- err
		}()
	}
	for c.counts().waited.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	for range 2 {
		select {
		case err := <-waiting:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("a waiting writer returned %v, want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			close(cc.gate)
			t.Fatal("Close did not release the writers waiting for room")
		}
	}
	close(cc.gate) // the slow write ends; what was accepted is written
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the socket's write ended")
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d socket writes, want 2: the first, then what was accepted behind it", n)
	}
}

// An idle connection holds no pending buffer, and one that has written
// gives it back.
func TestInvariant13_IdleConnectionHoldsNoWriteBuffer(t *testing.T) {
	server, client := socketPair(t, 0)
	go func() { _, _ = io.Copy(io.Discard, client) }()
	cc := &countConn{Conn: server, gate: make(chan struct{}), entered: make(chan struct{})}
	c := writerConn(cc, 30*time.Second)
	if c.w.pending != nil {
		t.Fatal("a new connection holds a pending buffer")
	}
	go func() { _, _ = c.Write(frame(0, 0, 10)) }()
	<-cc.entered
	if _, err := c.Write(frame(1, 0, 10)); err != nil {
		t.Fatal(err)
	}
	close(cc.gate)
	for {
		c.w.mu.Lock()
		idle := !c.w.flushing && c.w.pending == nil && !c.w.background
		c.w.mu.Unlock()
		if idle {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
