package broker

import (
	"errors"
	"sync/atomic"

	"saguin.dev/storage"
)

// dropRefuser is a provider whose hold store refuses its next DropHold
// calls, as a store that cannot write would.
type dropRefuser struct {
	storage.Provider
	storage.HoldStore
	left atomic.Int32
}

var errDropRefused = errors.New("test: the store refuses to drop the hold")

func (d *dropRefuser) DropHold(channel, client string, pid uint16) (bool, error) {
	if d.left.Add(-1) >= 0 {
		return false, errDropRefused
	}
	return d.HoldStore.DropHold(channel, client, pid)
}

// RefuseHoldDrops makes the named provider refuse its next n hold drops.
// Called before any client connects (tests only).
func (b *Broker) RefuseHoldDrops(provider string, n int32) {
	p := b.providers[provider]
	d := &dropRefuser{Provider: p, HoldStore: p.(storage.HoldStore)}
	d.left.Store(n)
	b.providers[provider] = d
}
