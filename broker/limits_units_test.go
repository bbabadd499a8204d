package broker

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/wire"
)

// header encodes a fixed header declaring a body of n bytes.
func header(first byte, n int) []byte {
	b := []byte{first}
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 128
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

// invariant 13: the framer judges each packet on its declared size, the
// whole packet as MQTT counts it (header and length bytes too), and hands
// on nothing of an oversized packet — so the substrate never learns the
// size, let alone allocates it.
func TestInvariant13_FramerJudgesDeclaredSize(t *testing.T) {
	// An MQTT 5 CONNECT: no properties, empty client id (13-byte body).
	connect := append(header(0x10, 13), 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 60, 0, 0, 0)
	t.Run("connect at and over max_connect_size", func(t *testing.T) {
		c := scriptedConn(t, wire.NewFramer(int64(len(connect)), 1000), connect, 1)
		handed, err := c.drain()
		if !bytes.Equal(handed, connect) || c.fr.Version() != 5 || !c.connected.Load() {
			t.Fatalf("CONNECT at the limit: handed %x (%v), version %d", handed, err, c.fr.Version())
		}
		c = scriptedConn(t, wire.NewFramer(int64(len(connect))-1, 1000), connect, 1)
		handed, err = c.drain()
		if len(handed) != 0 || !errors.Is(err, errPacketTooLarge) {
			t.Fatalf("CONNECT one byte over: handed %x, err %v", handed, err)
		}
		if got := c.sc.out.Bytes(); !bytes.Equal(got, []byte{0x20, 3, 0, 0x95, 0}) {
			t.Fatalf("CONNECT one byte over answered %x, want CONNACK 0x95", got)
		}
	})
	t.Run("publish over max_message_size, length split across reads", func(t *testing.T) {
		// 1+2+197 = 200 bytes: topic "t" (3), packet id... QoS 0: no id;
		// property length 0 (1); payload 193.
		ok := append(header(0x30, 197), append([]byte{0, 1, 't', 0}, make([]byte, 193)...)...)
		big := header(0x32, 100<<20) // declares 100MiB
		stream := append(append(append([]byte{}, connect...), ok...), big...)
		// Fed a byte at a time, as a slow client would send it.
		c := scriptedConn(t, wire.NewFramer(1000, 200), stream, 1)
		handed, err := c.drain()
		if !errors.Is(err, errPacketTooLarge) {
			t.Fatalf("oversize not refused: %v", err)
		}
		if want := len(connect) + len(ok); len(handed) != want {
			t.Fatalf("handed on %d bytes, want %d (nothing of the oversized packet)", len(handed), want)
		}
		if got := c.sc.out.Bytes(); !bytes.Equal(got, []byte{0xE0, 2, 0x95, 0}) {
			t.Fatalf("answered %x, want DISCONNECT 0x95", got)
		}
	})
	t.Run("three bytes over is still over", func(t *testing.T) {
		// The substrate's own check leaves the length bytes out; ours
		// does not.
		stream := append(append([]byte{}, connect...), header(0x30, 198)...)
		c := scriptedConn(t, wire.NewFramer(1000, 200), stream, 64)
		if handed, err := c.drain(); !errors.Is(err, errPacketTooLarge) || len(handed) != len(connect) {
			t.Fatalf("a 201-byte packet passed a 200-byte limit: handed %d, %v", len(handed), err)
		}
	})
}

// limits.max_connect_rate: bursts up to twice the rate, then one per
// 1/rate; a wait takes nothing, so the excess waits rather than being
// refused.
func TestInvariant13_MaxConnectRateBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newTokenBucket(10, 20, t0)
	for i := range 20 {
		if d := b.wait(t0); d != 0 {
			t.Fatalf("burst accept %d waited %v", i, d)
		}
	}
	d := b.wait(t0)
	if d != 100*time.Millisecond {
		t.Fatalf("past the burst: wait %v, want 100ms", d)
	}
	if d := b.wait(t0.Add(50 * time.Millisecond)); d <= 0 {
		t.Fatal("admitted before its token")
	}
	if d := b.wait(t0.Add(100 * time.Millisecond)); d != 0 {
		t.Fatalf("token due at 100ms: wait %v", d)
	}
	// An idle hour refills only to the burst.
	later := t0.Add(time.Hour)
	n := 0
	for b.wait(later) == 0 {
		n++
	}
	if n != 20 {
		t.Fatalf("after an hour idle %d accepted at once, want the burst of 20", n)
	}
}

// limits.publish_rate / publish_bytes: over either ⇒ refused and nothing
// charged; a message larger than the whole byte budget is admitted on a
// full budget and goes into deficit; the budget follows the client id and
// is dropped once refilled (the bound on what is kept).
func TestInvariant13_PublishBudgets(t *testing.T) {
	t0 := time.Unix(1000, 0)
	p := publishBudgets{}
	pf := budgetFigures{rate: 2, bytes: 1000}
	for i := range 2 {
		if ok, _ := p.admit("a", 10, t0, pf); !ok {
			t.Fatalf("message %d within the rate refused", i)
		}
	}
	if ok, which := p.admit("a", 10, t0, pf); ok || which != "publish_rate" {
		t.Fatalf("third in the same instant: %v %q", ok, which)
	}
	if ok, _ := p.admit("b", 10, t0, pf); !ok {
		t.Fatal("another client id was charged")
	}
	if ok, _ := p.admit("a", 10, t0.Add(500*time.Millisecond), pf); !ok {
		t.Fatal("refilled token refused")
	}

	q := publishBudgets{}
	qf := budgetFigures{bytes: 1000}
	if ok, _ := q.admit("c", 600, t0, qf); !ok {
		t.Fatal("600 of 1000 refused")
	}
	if ok, which := q.admit("c", 600, t0, qf); ok || which != "publish_bytes" {
		t.Fatalf("600 more: %v %q", ok, which)
	}
	if ok, _ := q.admit("c", 400, t0, qf); !ok {
		t.Fatal("the refused message was charged: 400 left should fit")
	}
	t1 := t0.Add(10 * time.Second)
	if ok, _ := q.admit("c", 5000, t1, qf); !ok {
		t.Fatal("a message over the whole budget refused on a full budget")
	}
	// 4000 in deficit: four seconds pays it back, one more refills.
	if ok, _ := q.admit("c", 1, t1.Add(3*time.Second), qf); ok {
		t.Fatal("admitted while in deficit")
	}
	if ok, _ := q.admit("c", 1, t1.Add(5*time.Second), qf); !ok {
		t.Fatal("refused after the deficit was paid back")
	}
	if q.held() != 1 {
		t.Fatalf("held %d budgets", q.held())
	}
	// Once refilled, a budget is dropped (at the next check a second on).
	if ok, _ := q.admit("d", 1, t1.Add(time.Hour), qf); !ok {
		t.Fatal("d refused")
	}
	if q.held() != 1 {
		t.Fatalf("refilled budget kept: %d held, want only d's", q.held())
	}
}

// A budget made for other figures (an ACL entry's limits changed by a
// reload, or the client id now connecting as another user) follows the new
// figures without refilling: what was spent stays spent.
func TestPublishBudgetFollowsNewFiguresWithoutRefilling(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var p publishBudgets
	for i := range 5 {
		if ok, _ := p.admit("a", 1, t0, budgetFigures{rate: 5}); !ok {
			t.Fatalf("message %d within 5/s refused", i)
		}
	}
	// Raised to 100/s: the five spent this instant stay spent, so the
	// burst left is 95, not a fresh 100.
	n := 0
	for ; n < 200; n++ {
		if ok, _ := p.admit("a", 1, t0, budgetFigures{rate: 100}); !ok {
			break
		}
	}
	if n != 0 {
		t.Errorf("after the raise, %d admitted at once; the old bucket was empty, so none should be", n)
	}
	// Lowered: the tokens left are capped by the new burst.
	var q publishBudgets
	q.admit("b", 1, t0, budgetFigures{rate: 100})
	n = 0
	for ; n < 200; n++ {
		if ok, _ := q.admit("b", 1, t0, budgetFigures{rate: 3}); !ok {
			break
		}
	}
	if n != 3 {
		t.Errorf("lowered to 3/s: %d admitted at once, want 3", n)
	}
}

// limits.max_connections: slots first, then min(max_connections, 32)
// overflow places served FIFO as slots free; past that, nothing.
func TestInvariant13_MaxConnectionsGate(t *testing.T) {
	g := newGate(config.Limits{MaxConnections: 2})
	for i := range 2 {
		if w, ok := g.admit(); !ok || w != nil {
			t.Fatalf("slot %d: %v %v", i, w, ok)
		}
	}
	w1, ok1 := g.admit()
	w2, ok2 := g.admit()
	if !ok1 || !ok2 || w1 == nil || w2 == nil {
		t.Fatal("overflow places not given")
	}
	if _, ok := g.admit(); ok {
		t.Fatal("budget of 2 full, yet admitted")
	}
	g.release()
	select {
	case <-w1.granted:
	default:
		t.Fatal("freed slot not handed to the oldest waiter")
	}
	if g.giveUp(w2) {
		t.Fatal("w2 given a slot nobody freed")
	}
	g.leaveOverflow() // w2 answered busy
	if slots, places := g.held(); slots != 2 || places != 0 {
		t.Fatalf("held %d slots, %d places", slots, places)
	}
	g.release()
	g.release()
	if slots, _ := g.held(); slots != 0 {
		t.Fatalf("%d slots after all released", slots)
	}
	if big := newGate(config.Limits{MaxConnections: 10000}); big.budget != 32 {
		t.Fatalf("overflow budget %d, want 32", big.budget)
	}
}
