package broker

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// Failures from one address are answered one at a time, further apart the
// more there are, whatever number of connections carries them; another
// address is not held back; a quiet address starts again from nothing.
func TestAuthPenaltySpacesFailuresPerAddress(t *testing.T) {
	p := newAuthPenalties()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Many failures arriving at the same instant (parallel connections):
	// each waits behind the ones before it.
	var waits []time.Duration
	for i := 0; i < 8; i++ {
		w, answer := p.failed("192.0.2.1", t0)
		if !answer {
			t.Fatalf("failure %d not answered (wait would exceed %v)", i+1, penaltyMaxWait)
		}
		waits = append(waits, w)
	}
	want := []time.Duration{0, 0, 0, 250 * time.Millisecond, 750 * time.Millisecond, 1750 * time.Millisecond, 3750 * time.Millisecond, 7750 * time.Millisecond}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	// The next would wait past the bound: closed unanswered.
	if _, answer := p.failed("192.0.2.1", t0); answer {
		t.Errorf("a failure that would wait past %v was answered", penaltyMaxWait)
	}
	// Another address is not slowed by the first.
	if w, _ := p.failed("192.0.2.2", t0); w != 0 {
		t.Errorf("another address waits %v", w)
	}
	// After penaltyMemory of quiet the address starts again.
	if w, _ := p.failed("192.0.2.1", t0.Add(penaltyMemory+time.Hour)); w != 0 {
		t.Errorf("after a quiet %v the address still waits %v", penaltyMemory, w)
	}
}

// invariant 13: the table never holds more than maxPenaltyAddresses, and
// what it forgets first is what failed longest ago.
func TestInvariant13_AuthPenaltyTableIsBounded(t *testing.T) {
	p := newAuthPenalties()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < maxPenaltyAddresses+500; i++ {
		p.failed(fmt.Sprintf("addr-%d", i), t0.Add(time.Duration(i)*time.Millisecond))
		if n := p.size(); n > maxPenaltyAddresses {
			t.Fatalf("%d addresses kept after %d failures; bound %d", n, i+1, maxPenaltyAddresses)
		}
	}
	p.mu.Lock()
	_, first := p.byAddr["addr-0"]
	_, last := p.byAddr[fmt.Sprintf("addr-%d", maxPenaltyAddresses+499)]
	p.mu.Unlock()
	if first || !last {
		t.Errorf("kept the oldest address (%v) or dropped the newest (%v)", first, !last)
	}
}

func TestPenaltyKeyCountsAnIPv6HostByItsPrefix(t *testing.T) {
	cases := []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.UnixAddr{Name: "@", Net: "unix"}, "door:d"},
		{nil, "door:d"},
	}
	for _, tc := range cases {
		if got := penaltyKey(tc.addr, "d"); got != tc.want {
			t.Errorf("penaltyKey(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
