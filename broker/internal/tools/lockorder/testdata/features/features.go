// Package features exercises what the lock-order walk follows and what it
// does not (lockorder_test.go): each function says what it should find.
package features

import (
	"sync"
	"time"
)

type outer struct{ mu sync.Mutex }
type inner struct{ mu sync.Mutex }

type target interface{ acked() }

type byInner struct{ in *inner }

func (t byInner) acked() { t.in.mu.Lock(); t.in.mu.Unlock() }

// found: an interface call is followed into the package's implementation.
func (i *inner) viaInterface(t target) {
	i.mu.Lock()
	defer i.mu.Unlock()
	t.acked()
}

// found: the lock a *sync.Mutex parameter is given is the caller's outer.mu.
func lockThrough(mu *sync.Mutex) { mu.Lock(); mu.Unlock() }

func (i *inner) viaParameter(o *outer) {
	i.mu.Lock()
	lockThrough(&o.mu)
	i.mu.Unlock()
}

// found: a literal passed as an argument runs during the call.
func each(f func()) { f() }

func (i *inner) viaArgument(o *outer) {
	i.mu.Lock()
	each(func() { o.mu.Lock(); o.mu.Unlock() })
	i.mu.Unlock()
}

// not found: a goroutine, a callee that starts its argument in one, and
// time.AfterFunc hold nothing of the caller's.
func later(f func()) { go f() }

func (i *inner) notViaGoroutines(o *outer) {
	i.mu.Lock()
	defer i.mu.Unlock()
	go func() { o.mu.Lock(); o.mu.Unlock() }()
	later(func() { o.mu.Lock(); o.mu.Unlock() })
	time.AfterFunc(time.Second, func() { o.mu.Lock(); o.mu.Unlock() })
}

// not found: a callee that lets go of its caller's lock before taking
// another (the flushOwn pattern), and a bound unlock function.
func (i *inner) letGoThenTake(o *outer) {
	i.mu.Unlock()
	o.mu.Lock()
	o.mu.Unlock()
}

func (i *inner) notAfterRelease(o *outer) {
	i.mu.Lock()
	i.letGoThenTake(o)
}

func (i *inner) notAfterBoundUnlock(o *outer) {
	unlock := i.mu.Unlock
	i.mu.Lock()
	unlock()
	o.mu.Lock()
	o.mu.Unlock()
}

// not found: the order's own direction, and a TryLock.
func (o *outer) allowed(i *inner) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i.mu.Lock()
	i.mu.Unlock()
}

func (i *inner) tries(o *outer) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if o.mu.TryLock() {
		o.mu.Unlock()
	}
}
