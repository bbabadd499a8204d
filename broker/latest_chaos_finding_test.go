package broker

import (
	"sync"
	"testing"
	"time"

	"saguin.dev/broker/config"
	"saguin.dev/storage"
	"saguin.dev/storage/memory"
)

// racingGets is a ValueStore whose first two Gets of a topic meet: the
// first waits (boundedly) for the second before answering, which is the
// interleaving of chaos seed 4000 — two deletes of one key, each reading
// the key's value before either stored its tombstone. Everything else
// passes through.
type racingGets struct {
	storage.ValueStore
	mu      sync.Mutex
	gets    int
	arrived chan struct{} // closed by the second Get
}

func (r *racingGets) Get(topic string) (storage.Record, bool, error) {
	// Read first, then meet: what each Get answers is the store as it was
	// before either delete could store its tombstone.
	rec, ok, err := r.ValueStore.Get(topic)
	r.mu.Lock()
	r.gets++
	n := r.gets
	r.mu.Unlock()
	switch n {
	case 1:
		// Only a bound, never an assertion: a broker that serialises the
		// two deletes never lets the second Get in while the first waits.
		select {
		case <-r.arrived:
		case <-time.After(300 * time.Millisecond):
		}
	case 2:
		close(r.arrived)
	}
	return rec, ok, err
}

// invariant 14 / docs/channels.md "`latest`" ("deleting a topic with no value stores
// nothing"): two concurrent deletes of a key holding a value store one
// tombstone, not two. Chaos seed 4000 (state/k2): deletes lprod-1-2882 and
// lprod-2-2818 overlapped, both saw lprod-2-2817 as the current value, and
// a subscriber was sent tombstones at offsets 5548 and 5549 — the second a
// delete of a key with no value, which no linearization explains.
func TestInvariant14_ConcurrentLatestDeletesStoreOneTombstone(t *testing.T) {
	p, err := memory.Open(memory.Options{Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	vs, err := p.Values("state")
	if err != nil {
		t.Fatal(err)
	}
	ch := newChannel(config.Channel{Name: "state", Type: "latest"})
	ch.values = vs
	b := &Broker{}
	if err := b.storeLatest(ch, storage.Record{Topic: "state/k2", Payload: []byte("lprod-2 #2817")}); err != nil {
		t.Fatal(err)
	}
	ch.values = &racingGets{ValueStore: vs, arrived: make(chan struct{})}
	before := vs.Next()

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.storeLatest(ch, storage.Record{Topic: "state/k2"})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, err := vs.Since(before, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := vs.Next() - before; got != 1 {
		t.Fatalf("two concurrent deletes of one value took %d offsets (current: %+v); want one tombstone", got, recs)
	}
	cur, ok, err := vs.Get("state/k2")
	if err != nil || !ok || !isTombstone(&cur) {
		t.Fatalf("state/k2 after the deletes: %+v %v %v; want a tombstone", cur, ok, err)
	}
}
