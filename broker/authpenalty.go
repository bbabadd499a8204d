package broker

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Repeated authentication failures from one address are slowed, not
// answered faster (issue 14 item 2): each address's failures are answered
// one at a time, spaced further apart the more of them there are, so
// opening more connections does not buy more guesses. A right password is
// never delayed. What is kept is bounded (invariant 13).
const (
	// penaltyFreeFailures are answered at once: a user who mistypes a
	// password once or twice is not made to wait.
	penaltyFreeFailures = 2
	// penaltyFirstStep is the spacing after the free failures; it doubles
	// with each further failure up to penaltyMaxStep.
	penaltyFirstStep = 250 * time.Millisecond
	penaltyMaxStep   = 4 * time.Second
	// penaltyMaxWait bounds how long one refused CONNECT is held waiting
	// for its address's turn. A connection that would wait longer is
	// closed with no answer at once: it holds no connection slot in line,
	// and it learns nothing about the password it tried.
	penaltyMaxWait = 10 * time.Second
	// penaltyMemory: an address quiet this long starts again from nothing.
	penaltyMemory = 10 * time.Minute
	// maxPenaltyAddresses bounds the table; past it the address whose
	// last failure is oldest is forgotten first.
	maxPenaltyAddresses = 10000
)

// authPenalties is the table of addresses that failed authentication
// recently. Its lock is a leaf.
type authPenalties struct {
	mu     sync.Mutex
	byAddr map[string]*authPenalty
}

type authPenalty struct {
	failures int
	// next is the earliest time the address's next failure is answered.
	next time.Time
	// last is when its last failure was decided.
	last time.Time
}

func newAuthPenalties() *authPenalties {
	return &authPenalties{byAddr: make(map[string]*authPenalty)}
}

// failed records an authentication failure from addr decided at now and
// returns how long its answer must wait (0: answer at once). answer is
// false when the wait would pass penaltyMaxWait: the connection is then
// closed with no answer, and the failure still counts.
func (p *authPenalties) failed(addr string, now time.Time) (wait time.Duration, answer bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.byAddr[addr]
	if e != nil && now.Sub(e.last) > penaltyMemory {
		e = nil
	}
	if e == nil {
		p.makeRoom(now)
		e = &authPenalty{}
		p.byAddr[addr] = e
	}
	e.failures++
	e.last = now
	at := now
	if e.next.After(at) {
		at = e.next
	}
	if e.failures > penaltyFreeFailures {
		step := penaltyFirstStep << min(e.failures-penaltyFreeFailures-1, 8)
		e.next = at.Add(min(step, penaltyMaxStep))
	}
	wait = at.Sub(now)
	if wait > penaltyMaxWait {
		return 0, false
	}
	return wait, true
}

// makeRoom keeps the table within maxPenaltyAddresses before an entry is
// added: addresses past their memory go first, then the one whose last
// failure is oldest. Called with p.mu held.
func (p *authPenalties) makeRoom(now time.Time) {
	if len(p.byAddr) < maxPenaltyAddresses {
		return
	}
	var oldest string
	var oldestAt time.Time
	for a, e := range p.byAddr {
		if now.Sub(e.last) > penaltyMemory {
			delete(p.byAddr, a)
			continue
		}
		if oldest == "" || e.last.Before(oldestAt) {
			oldest, oldestAt = a, e.last
		}
	}
	if len(p.byAddr) >= maxPenaltyAddresses {
		delete(p.byAddr, oldest)
	}
}

// size is the number of addresses kept (tests).
func (p *authPenalties) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byAddr)
}

// penaltyKey is the address a client's failures are counted under: its IP
// address, an IPv6 one by its /64 (one host is usually given a whole /64,
// so counting single addresses would let it rotate past the penalty).
// Clients of a unix door without a PROXY header share the door's key.
func penaltyKey(remote net.Addr, door string) string {
	if remote == nil {
		return "door:" + door
	}
	switch a := remote.(type) {
	case *net.TCPAddr:
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			return "door:" + door
		}
		ip = ip.Unmap()
		if ip.Is6() {
			p, _ := ip.Prefix(64)
			return p.String()
		}
		return ip.String()
	case *net.UnixAddr:
		return "door:" + door
	}
	if ap, err := netip.ParseAddrPort(remote.String()); err == nil {
		ip := ap.Addr().Unmap()
		if ip.Is6() {
			p, _ := ip.Prefix(64)
			return p.String()
		}
		return ip.String()
	}
	return "door:" + door
}
