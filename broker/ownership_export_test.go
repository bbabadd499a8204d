package broker

import (
	"errors"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"

	"saguin.dev/storage"
)

// SessionStoreFault makes the session store of a running broker refuse
// every write while it is on: a test-only seam for invariant 18's second
// exception (a DISCONNECT's writes refused). Reads pass through.
type SessionStoreFault struct {
	storage.ValueStore
	on   atomic.Bool
	full atomic.Bool // refuse with storage.ErrFull (no room) instead
}

// errSessionStoreFault is what the fault answers a write with.
var errSessionStoreFault = errors.New("injected session store failure")

// Set switches the refusal on or off.
func (f *SessionStoreFault) Set(on bool) { f.on.Store(on) }

// SetFull makes the refusal "no room" (storage.ErrFull) rather than a
// failure.
func (f *SessionStoreFault) SetFull(full bool) { f.full.Store(full) }

func (f *SessionStoreFault) err() error {
	if f.full.Load() {
		return storage.ErrFull
	}
	return errSessionStoreFault
}

func (f *SessionStoreFault) Put(rec storage.Record) (storage.Record, error) {
	if f.on.Load() {
		return storage.Record{}, f.err()
	}
	return f.ValueStore.Put(rec)
}

func (f *SessionStoreFault) Remove(topic string) (bool, error) {
	if f.on.Load() {
		return false, f.err()
	}
	return f.ValueStore.Remove(topic)
}

// InjectSessionStoreFault wraps b's session store; call it before any
// client connects.
func InjectSessionStoreFault(b *Broker) *SessionStoreFault {
	f := &SessionStoreFault{ValueStore: b.sessionStore}
	b.sessionStore = f
	return f
}

// PauseAfterTeardown makes every connection of client id id run pause at
// the end of OnDisconnect, before the substrate's own cleanup of it — the
// moment a descheduled goroutine would leave a late teardown. Set it before
// the broker serves that id.
func (b *Broker) PauseAfterTeardown(id string, pause func()) {
	f := func(cl *mqtt.Client) {
		if cl.ID == id {
			pause()
		}
	}
	b.afterTeardown.Store(&f)
}
