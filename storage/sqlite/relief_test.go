package sqlite

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

// holdWriter parks the writer on an op until the returned release is
// called, so relief writes sent meanwhile queue up and form one group.
func holdWriter(t *testing.T, p *Provider) (release func()) {
	t.Helper()
	hold, held := make(chan struct{}), make(chan struct{})
	go func() {
		_ = p.do(func(*writer) error {
			close(held)
			<-hold
			return nil
		})
	}()
	<-held
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	return release
}

// waitQueued waits until n relief writes wait for the writer.
func waitQueued(t *testing.T, p *Provider, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.w.reliefs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d relief writes queued, want %d", len(p.w.reliefs), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func enqueueJobs(t *testing.T, q storage.QueueStore, n int) map[uint64]int64 {
	t.Helper()
	sizes := map[uint64]int64{}
	for i := range n {
		r, err := q.Enqueue(record(fmt.Sprint("job", i), 100+i))
		if err != nil {
			t.Fatal(err)
		}
		sizes[r.Offset] = r.Size()
	}
	return sizes
}

// checkQueue compares the queue with what the test expects: the held
// offsets with their attempts, and the in-memory depth and bytes summed
// over exactly those.
func checkQueue(t *testing.T, q storage.QueueStore, sizes map[uint64]int64, want map[uint64]uint32) {
	t.Helper()
	items, err := q.Items(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint64]uint32{}
	for _, it := range items {
		got[it.Offset] = it.Attempts
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("queue holds %v (offset: attempts), want %v", got, want)
	}
	var bytes int64
	for off := range want {
		bytes += sizes[off]
	}
	if q.Depth() != len(want) || q.Bytes() != bytes {
		t.Fatalf("depth %d bytes %d, want %d and %d", q.Depth(), q.Bytes(), len(want), bytes)
	}
}

// Relief writes queued together commit in one transaction, each answered
// with its own result (rfcs/storage-sqlite.md "Group commit"; rfcs/storage-sqlite.md).
func TestReliefWritesShareOneTransaction(t *testing.T) {
	p := openAt(t, newDB(t), nil)
	q := mustQueue(t, p, "jobs")
	sizes := enqueueJobs(t, q, reliefMax)
	release := holdWriter(t, p)
	groups, commits := p.stats.reliefGroups.Load(), p.stats.commits.Load()

	errs := make([]error, reliefMax+1)
	var wg sync.WaitGroup
	for off := uint64(1); off <= reliefMax; off++ {
		wg.Go(func() {
			if off%2 == 0 {
				errs[off] = q.Resolve(off)
				return
			}
			it, err := q.CountAttempt(off, storagetest.Base.Add(time.Second))
			if err == nil && (it.Offset != off || it.Attempts != 1 || !it.LastDelivered.Equal(storagetest.Base.Add(time.Second))) {
				err = fmt.Errorf("CountAttempt(%d) returned offset %d attempts %d last %v", off, it.Offset, it.Attempts, it.LastDelivered)
			}
			errs[off] = err
		})
	}
	waitQueued(t, p, reliefMax)
	release()
	wg.Wait()
	for off, err := range errs[1:] {
		if err != nil {
			t.Errorf("write on offset %d: %v", off+1, err)
		}
	}
	if g, c := p.stats.reliefGroups.Load()-groups, p.stats.commits.Load()-commits; g != 1 || c != 1 {
		t.Fatalf("%d relief groups in %d commits, want the %d writes in one", g, c, reliefMax)
	}
	want := map[uint64]uint32{}
	for off := uint64(1); off <= reliefMax; off += 2 {
		want[off] = 1
	}
	checkQueue(t, q, sizes, want)
}

// A failing write rolls its group back; every write of the group is then
// committed alone and answered with its own result, so a failure costs
// nobody else their write and nothing is stored twice or half-stored. An
// offset that is not held is that caller's answer only.
func TestReliefGroupFailureAnswersEachWrite(t *testing.T) {
	path := newDB(t)
	errInjected := errors.New("injected write failure")
	var mu sync.Mutex
	calls := map[uint64]int{}
	faults := &Faults{InReliefWrite: func(offset uint64) error {
		mu.Lock()
		defer mu.Unlock()
		calls[offset]++
		if offset == 2 {
			return errInjected
		}
		return nil
	}}
	p := openAt(t, path, func(o *Options) { o.Faults = faults })
	q := mustQueue(t, p, "jobs")
	sizes := enqueueJobs(t, q, 4)
	release := holdWriter(t, p)
	groups := p.stats.reliefGroups.Load()

	var resolve1, resolve2, resolve99, count3, count4 error
	var wg sync.WaitGroup
	at := storagetest.Base.Add(time.Minute)
	wg.Go(func() { resolve1 = q.Resolve(1) })
	wg.Go(func() { resolve2 = q.Resolve(2) })
	wg.Go(func() { _, count3 = q.CountAttempt(3, at) })
	wg.Go(func() { _, count4 = q.CountAttempt(4, at) })
	wg.Go(func() { resolve99 = q.Resolve(99) })
	waitQueued(t, p, 5)
	release()
	wg.Wait()

	if resolve1 != nil || count3 != nil || count4 != nil {
		t.Fatalf("writes that did not fail: resolve 1 %v, count 3 %v, count 4 %v", resolve1, count3, count4)
	}
	if !errors.Is(resolve2, errInjected) {
		t.Fatalf("the failing write was answered %v", resolve2)
	}
	if !errors.Is(resolve99, storage.ErrNotFound) {
		t.Fatalf("Resolve(99) = %v, want ErrNotFound", resolve99)
	}
	if g := p.stats.reliefGroups.Load() - groups; g != 1+5 {
		t.Fatalf("%d relief transactions, want the group and then each of its 5 writes alone", g)
	}
	mu.Lock()
	if calls[2] != 2 {
		t.Fatalf("the failing write ran %d times, want twice (in the group, then alone)", calls[2])
	}
	mu.Unlock()
	// Counted once each, though the group's count was rolled back and run
	// again; job 2 is still held, with its bytes.
	want := map[uint64]uint32{2: 0, 3: 1, 4: 1}
	checkQueue(t, q, sizes, want)

	// What is in memory is what is stored: depth and bytes summed at open
	// agree.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	checkQueue(t, mustQueue(t, openAt(t, path, nil), "jobs"), sizes, want)
}

// Invariant 18: a relief write is answered only after its transaction
// commits. Writes queued when the provider closes are answered ErrClosed
// and are not stored; every write answered nil is there after reopening.
func TestInvariant18_ReliefAnsweredOnlyAfterCommit(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	q := mustQueue(t, p, "jobs")
	const n = 3 * reliefMax
	sizes := enqueueJobs(t, q, n)
	release := holdWriter(t, p)

	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for off := uint64(1); off <= n; off++ {
		wg.Go(func() { errs[off] = q.Resolve(off) })
	}
	waitQueued(t, p, reliefMax) // the channel is full; the rest wait to send
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	for !p.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	release()
	wg.Wait()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	want := map[uint64]uint32{}
	for off := uint64(1); off <= n; off++ {
		switch err := errs[off]; {
		case err == nil:
		case errors.Is(err, storage.ErrClosed):
			want[off] = 0
		default:
			t.Fatalf("Resolve(%d) = %v, want nil or ErrClosed", off, err)
		}
	}
	checkQueue(t, mustQueue(t, openAt(t, path, nil), "jobs"), sizes, want)
}
