package loadgen

import (
	"strings"
	"testing"
)

func payload(run, pub uint32, seq uint64) []byte {
	b := make([]byte, DefaultPayload)
	encodePayload(b, run, pub, seq)
	return b
}

func TestPayloadRoundTrip(t *testing.T) {
	b := payload(0xdeadbeef, 63, 1<<40+5)
	run, pub, seq, ok := decodePayload(b)
	if !ok || run != 0xdeadbeef || pub != 63 || seq != 1<<40+5 {
		t.Fatalf("decoded %x %d %d %v", run, pub, seq, ok)
	}
	if _, _, _, ok := decodePayload(b[:headerSize-1]); ok {
		t.Fatal("a payload shorter than the header decoded")
	}
}

func newTestTracker(t *testing.T, order bool, published []uint64) *Tracker {
	t.Helper()
	tr, err := NewTracker(1, len(published), order, func(p int) uint64 { return published[p] })
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestTrackerExactDelivery(t *testing.T) {
	tr := newTestTracker(t, true, []uint64{200, 3})
	for seq := range uint64(200) {
		tr.Observe(payload(1, 0, seq))
	}
	for seq := range uint64(3) {
		tr.Observe(payload(1, 1, seq))
	}
	n, err := tr.Check([]uint64{200, 3})
	if err != nil || n != 203 {
		t.Fatalf("distinct %d, err %v", n, err)
	}
}

// Each anomaly the benchmark promises to fail on, caught on its own.
func TestTrackerAnomalies(t *testing.T) {
	cases := []struct {
		name    string
		order   bool
		observe [][3]uint64 // run, publisher, sequence
		acked   []uint64
		want    string
	}{
		{"lost", true, [][3]uint64{{1, 0, 0}, {1, 0, 2}}, []uint64{3}, "1 lost"},
		{"duplicate", true, [][3]uint64{{1, 0, 0}, {1, 0, 1}, {1, 0, 1}}, []uint64{2}, "1 duplicated"},
		{"never published", true, [][3]uint64{{1, 0, 0}, {1, 0, 9}}, []uint64{1}, "1 never published"},
		{"unknown publisher", true, [][3]uint64{{1, 5, 0}}, []uint64{0}, "1 never published"},
		{"other run", true, [][3]uint64{{2, 0, 0}, {1, 0, 0}}, []uint64{1}, "1 from elsewhere"},
		{"reordered", true, [][3]uint64{{1, 0, 1}, {1, 0, 0}}, []uint64{2}, "1 out of order"},
		{"published but not acknowledged", true, [][3]uint64{{1, 0, 0}, {1, 0, 1}}, []uint64{1}, "1 not acknowledged"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The publishers took up to 4 sequences each, so 9 is beyond.
			tr := newTestTracker(t, c.order, make4(len(c.acked)))
			for _, o := range c.observe {
				tr.Observe(payload(uint32(o[0]), uint32(o[1]), o[2]))
			}
			_, err := tr.Check(c.acked)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want error containing %q, got %v", c.want, err)
			}
		})
	}
}

func make4(n int) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = 4
	}
	return s
}

// Without the order check (a window above one), a reordering is no error.
func TestTrackerOrderOnlyWhenAsked(t *testing.T) {
	tr := newTestTracker(t, false, []uint64{2})
	tr.Observe(payload(1, 0, 1))
	tr.Observe(payload(1, 0, 0))
	if _, err := tr.Check([]uint64{2}); err != nil {
		t.Fatal(err)
	}
}

func TestTrackerBounds(t *testing.T) {
	if _, err := NewTracker(1, 0, false, nil); err == nil {
		t.Fatal("0 publishers accepted")
	}
	if _, err := NewTracker(1, maxPublishers+1, false, nil); err == nil {
		t.Fatal("too many publishers accepted")
	}
	// A huge sequence number is refused before it sizes anything.
	tr := newTestTracker(t, false, []uint64{1 << 62})
	tr.Observe(payload(1, 0, 1<<62))
	if len(tr.seen[0]) != 0 {
		t.Fatalf("bitset grew to %d words for a sequence never published", len(tr.seen[0]))
	}
}

func TestLedgerAcrossRuns(t *testing.T) {
	l := NewLedger()
	if err := l.Add(Result{Run: 10, AckedBy: []uint64{2, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(Result{Run: 11, AckedBy: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(Result{Run: 11, AckedBy: []uint64{1}}); err == nil {
		t.Fatal("a run added twice was accepted")
	}
	if l.Total() != 4 {
		t.Fatalf("total %d, want 4", l.Total())
	}
	for _, p := range [][]byte{payload(10, 0, 0), payload(11, 0, 0), payload(10, 1, 0), payload(10, 0, 1)} {
		l.Observe(p)
	}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	l.Observe(payload(12, 0, 0))
	if err := l.Check(); err == nil || !strings.Contains(err.Error(), "no registered run") {
		t.Fatalf("want a foreign-run error, got %v", err)
	}
}
