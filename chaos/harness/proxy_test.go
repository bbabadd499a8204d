package harness

import (
	"bufio"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers every line with the same line until the connection ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	return nil
}

func TestProxyRelaysCutsAndFollowsTheUpstream(t *testing.T) {
	var clock atomic.Int64
	clock.Store(100)
	p, err := NewProxy(echoServer(t), func() int64 { return clock.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(t, c, r, "hello"); err != nil {
		t.Fatalf("relay: %v", err)
	}

	cutAt := p.Cut(true)
	if got, ok := p.CutTime(c.LocalAddr().String()); !ok || got != cutAt {
		t.Fatalf("cut time for the relayed connection: %d %v, want %d", got, ok, cutAt)
	}
	// The link is gone: the next round trip fails.
	if err := roundTrip(t, c, r, "after cut"); err == nil {
		t.Fatal("a cut connection still relayed")
	}
	// While blocked, a new connection is reset at once.
	// (The reset may even beat the dial's return.)
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if err := roundTrip(t, c2, bufio.NewReader(c2), "blocked"); err == nil {
			t.Fatal("a connection went through while the proxy was blocking")
		}
		c2.Close()
	}

	// Unblocked and pointed at a new upstream, new connections relay.
	p.SetUpstream(echoServer(t))
	p.Unblock()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := roundTrip(t, c3, bufio.NewReader(c3), "again"); err != nil {
		t.Fatalf("relay after unblock: %v", err)
	}
	if _, ok := p.CutTime(c3.LocalAddr().String()); ok {
		t.Fatal("a connection never cut has a cut time")
	}
}

// A broker that is down: the client's connection is reset, not left hanging.
func TestProxyResetsWhenTheUpstreamIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p, err := NewProxy(dead, func() int64 { return 1 })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return // reset before the dial even returned: ended, as it should be
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("read from a proxy with no upstream: %v, want the connection ended", err)
	}
}

func TestParseNemeses(t *testing.T) {
	ns, err := ParseNemeses("kill=3, term,powercut=2")
	if err != nil {
		t.Fatal(err)
	}
	if got := FormatNemeses(ns); got != "kill=3,term,powercut=2" {
		t.Fatalf("round trip: %s", got)
	}
	for _, bad := range []string{"", "kill,kill", "nuke", "kill=0", "kill=x", "kill=101"} {
		if _, err := ParseNemeses(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Each round of the schedule deals every nemesis its weight's worth of
// times, in an order the seed decides and repeats.
func TestScheduleDealsEveryNemesisEachRoundAndRepeatsBySeed(t *testing.T) {
	ns := []NemesisWeight{{NemesisKill, 3}, {NemesisPowerCut, 2}, {NemesisStop, 1}}
	deal := func(seed uint64) []string {
		d := newDeck(ns, rand.New(rand.NewPCG(seed, 1)))
		var out []string
		for range 60 {
			out = append(out, d.deal())
		}
		return out
	}
	a, b, other := deal(7), deal(7), deal(8)
	for round := 0; round < 10; round++ {
		counts := map[string]int{}
		for _, n := range a[round*6 : round*6+6] {
			counts[n]++
		}
		if counts[NemesisKill] != 3 || counts[NemesisPowerCut] != 2 || counts[NemesisStop] != 1 {
			t.Fatalf("round %d: %v", round, counts)
		}
	}
	same := true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 dealt differently: %v vs %v", a, b)
		}
		same = same && a[i] == other[i]
	}
	if same {
		t.Fatal("seeds 7 and 8 dealt the same schedule")
	}
}
