package linearizability

import (
	"math/rand/v2"
	"testing"
	"time"
)

// fullSteps draws like randDrawer but always takes the most steps, so a
// scale run is as long as asked.
type fullSteps struct{ randDrawer }

func (f fullSteps) int(name string, lo, hi int) int {
	if name == "steps" {
		return hi
	}
	return f.randDrawer.int(name, lo, hi)
}

// Chaos runs record thousands of operations with crashes in between, and a
// porcupine search can go exponential. Long legal histories must check, and
// quickly enough to be no concern (a few hundred milliseconds here, logged);
// a regression into an exponential search shows up as this test hanging until
// go test's own timeout, not as a timing assertion on a noisy machine.
func TestScaleHistoriesCheck(t *testing.T) {
	const steps = 20000
	d := fullSteps{randDrawer{rand.New(rand.NewPCG(1, 2))}}
	ah, _ := genAppendHistory(d, steps)
	q := genQueueHistory(d, steps)
	lh := genLatestHistory(d, steps)
	for _, c := range []struct {
		k   Kind
		ops []Op
	}{{KindAppend, ah.ops}, {KindQueue, q.h.ops}, {KindLatest, lh.ops}} {
		start := time.Now()
		rep, err := Check(c.ops, c.k, Options{Dense: true, Resolution: true})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			t.Fatalf("%s: legal history of %d ops rejected: %s %v %v", c.k, len(c.ops), rep.Result, rep.Failed, rep.Violations)
		}
		t.Logf("%s: %d ops, %d partitions, %v", c.k, len(c.ops), rep.Partitions, time.Since(start))
	}
}
