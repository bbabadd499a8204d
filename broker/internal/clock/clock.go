// Package clock is the broker's source of time. Production uses the wall
// clock; tests inject a Fake so that visibility timeouts, retention sweeps and
// expiry are driven by advancing time rather than by sleeping (the CI machine
// is shared and noisy, so a test that sleeps is a test that flakes).
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes tickers.
type Clock interface {
	Now() time.Time
	// NewTicker delivers the time on C every d until Stop is called.
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of time.Ticker the broker uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
type Real struct{}

func (Real) Now() time.Time { return time.Now() }

func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Fake is a clock that moves only when Advance is called. Tickers fire (at
// most once per Advance, like a real ticker that drops ticks a slow reader
// missed) when the advance crosses their next deadline.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	tickers []*fakeTicker
}

// NewFake starts a fake clock at t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) NewTicker(d time.Duration) Ticker {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTicker{clock: f, period: d, next: f.now.Add(d), c: make(chan time.Time, 1)}
	f.tickers = append(f.tickers, t)
	return t
}

// Advance moves the clock forward by d and fires every ticker whose deadline
// it crossed.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	now := f.now
	due := make([]*fakeTicker, 0, len(f.tickers))
	for _, t := range f.tickers {
		if !t.next.After(now) {
			for !t.next.After(now) {
				t.next = t.next.Add(t.period)
			}
			due = append(due, t)
		}
	}
	f.mu.Unlock()
	sort.SliceStable(due, func(i, j int) bool { return due[i].period < due[j].period })
	for _, t := range due {
		select {
		case t.c <- now:
		default: // the reader has not taken the last tick; like time.Ticker, drop it
		}
	}
}

type fakeTicker struct {
	clock  *Fake
	period time.Duration
	next   time.Time
	c      chan time.Time
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) Stop() {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, x := range f.tickers {
		if x == t {
			f.tickers = append(f.tickers[:i], f.tickers[i+1:]...)
			return
		}
	}
}
