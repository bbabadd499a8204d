package broker

import (
	"errors"
	"sync/atomic"
	"time"

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

// releaseRefuser is a provider whose hold store fails its next Release
// calls, as a store that cannot write would: the hold stays.
type releaseRefuser struct {
	storage.Provider
	storage.HoldStore
	left atomic.Int32
}

var errReleaseRefused = errors.New("test: the store refuses to release the hold")

func (r *releaseRefuser) Release(channel, client string, pid uint16) (storage.Record, error) {
	if r.left.Add(-1) >= 0 {
		return storage.Record{}, errReleaseRefused
	}
	return r.HoldStore.Release(channel, client, pid)
}

func (r *releaseRefuser) ReleaseAt(channel, client string, pid uint16, at time.Time) (storage.Record, error) {
	if r.left.Add(-1) >= 0 {
		return storage.Record{}, errReleaseRefused
	}
	return r.HoldStore.ReleaseAt(channel, client, pid, at)
}

// RefuseReleases makes the named provider fail its next n releases of a
// held publish, the broadcast log's included when it lives there (tests
// only; called while no PUBREL is being handled).
func (b *Broker) RefuseReleases(provider string, n int32) {
	p := b.providers[provider]
	r := &releaseRefuser{Provider: p, HoldStore: p.(storage.HoldStore)}
	r.left.Store(n)
	b.providers[provider] = r
	if provider == b.sessionProvider {
		b.bcastHolds = r
	}
}
