package broker

import "sync/atomic"

// pauseOnce arms p: the first goroutine to pass it signals reached and
// waits for release; later ones pass.
func pauseOnce(p *pausePoint) (reached <-chan struct{}, release func()) {
	r, proceed := make(chan struct{}), make(chan struct{})
	var taken atomic.Bool
	f := func() {
		if !taken.CompareAndSwap(false, true) {
			return
		}
		close(r)
		<-proceed
	}
	p.fn.Store(&f)
	return r, func() { close(proceed) }
}

// PauseBeforeRetainedPass holds the next SUBSCRIBE after its SUBACK is
// written and before its retained values are (tests only).
func (b *Broker) PauseBeforeRetainedPass() (reached <-chan struct{}, release func()) {
	return pauseOnce(&b.pauses.beforeRetainedPass)
}

// PauseAfterRetainStored holds the next retained broadcast publish after
// its value is stored and before it is fanned out (tests only).
func (b *Broker) PauseAfterRetainStored() (reached <-chan struct{}, release func()) {
	return pauseOnce(&b.pauses.afterRetainStored)
}

// NotifySubscribeAtOrder signals when the next SUBSCRIBE of a broadcast
// filter has reached the broker and is about to take the retained order,
// without holding it (tests only).
func (b *Broker) NotifySubscribeAtOrder() (reached <-chan struct{}) {
	r, release := pauseOnce(&b.pauses.subscribeAtOrder)
	release()
	return r
}
