package broker

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"saguin.dev/broker/internal/tools/lockorder"
)

// The lock order doc.go declares ("# Locks") is held to the code by a walk
// of the package's call graph (broker/internal/tools/lockorder says what it
// follows and what it does not).

// docLockOrder reads the rank table of doc.go's "# Locks" section: a row
// begins with its rank, and the locks it names (Type.field) continue on
// the indented lines below it up to the next rank.
func docLockOrder(t *testing.T) lockorder.Order {
	t.Helper()
	section := loadDocSource(t).section(t, "Locks")
	row := regexp.MustCompile(`^\t(\d+)\s+(.*)$`)
	cont := regexp.MustCompile(`^\t\s+(\S.*)$`)
	lock := regexp.MustCompile(`\b[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\b`)
	order := lockorder.Order{}
	rank, last := 0, 0
	for _, line := range strings.Split(section, "\n") {
		rest := ""
		if m := row.FindStringSubmatch(line); m != nil {
			r, _ := strconv.Atoi(m[1])
			if r <= last {
				t.Fatalf("doc.go's lock order: rank %d follows rank %d", r, last)
			}
			rank, last, rest = r, r, m[2]
		} else if m := cont.FindStringSubmatch(line); m != nil && rank > 0 {
			rest = m[1]
		} else {
			if rank > 0 {
				break // the table's end
			}
			continue
		}
		for _, name := range lock.FindAllString(rest, -1) {
			if r, dup := order[name]; dup {
				t.Fatalf("doc.go's lock order places %s twice (ranks %d and %d)", name, r, rank)
			}
			order[name] = rank
		}
	}
	if len(order) < 20 {
		t.Fatalf("read only %d locks from doc.go's lock order: the table is not being read", len(order))
	}
	return order
}

func TestLockOrderFollowsDocMap(t *testing.T) {
	order := docLockOrder(t)
	p, err := lockorder.Load(".")
	if err != nil {
		t.Fatal(err)
	}
	res := lockorder.Check(p, order)
	for _, f := range res.Findings {
		t.Errorf("%s", f)
	}
	// Every lock of the table is one the walk saw taken: a renamed
	// field leaves no row behind that nothing checks.
	taken := map[string]bool{}
	for _, l := range res.Locks {
		taken[l] = true
	}
	for name := range order {
		if !taken[name] {
			t.Errorf("doc.go's lock order names %s, which no function of the package takes", name)
		}
	}
	// A function that returns holding a lock hides what its caller takes
	// under it from the walk; these are the ones read and found not to.
	known := map[string]string{
		"Broker.publishPathOpen":  "the TryLocks in its ifs count as held on the paths that fail them",
		"clientConn.write":        "returns through flushOwn, which lets go of connWriter.mu",
		"latestConsumer.offer":    "returns through its wait literal, which lets go of latestConsumer.mu",
		"session.holdSubscribing": "subscribe holds the turn for its whole body (defer); session.subscribing is first in the order, so all subscribe takes under it is allowed, and waitSubscribing (a queue offer) is never reached from subscribe",
	}
	for _, l := range res.Leaks {
		fn, _, _ := strings.Cut(l, " ")
		if known[fn] == "" {
			t.Errorf("%s: the walk does not follow a lock returned held into the caller; make it let go, or read its callers and add it here with why", l)
		}
	}
	if res.Funcs < 500 || len(res.Nestings) < 30 {
		t.Fatalf("walked %d functions and saw %d nestings: the walk is broken", res.Funcs, len(res.Nestings))
	}
	if testing.Verbose() {
		for _, n := range res.Nestings {
			t.Logf("%s → %s (%s)", n.Held, n.Taken, n.Witness)
		}
	}
}

// The negative control: the same walk, with doc.go's order, on a package
// with an inversion planted two calls deep and a lock the order does not
// name taken under Broker.mu. Both are reported, with the path; the
// nesting the order allows is not.
func TestLockOrderCatchesAnInversion(t *testing.T) {
	order := docLockOrder(t)
	p, err := lockorder.Load("testdata/lockorder/inverted")
	if err != nil {
		t.Fatal(err)
	}
	res := lockorder.Check(p, order)
	var got []string
	for _, f := range res.Findings {
		got = append(got, f.String())
	}
	want := []string{
		"session.end holds session.mu (taken at inverted.go:39) and takes Broker.mu: " +
			"calls session.forget at inverted.go:41 → calls Broker.drop at inverted.go:44 → takes Broker.mu at inverted.go:47; " +
			"Broker.mu (rank 5) is above session.mu (rank 9) in the order",
		"Broker.note holds Broker.mu (taken at inverted.go:54) and takes audit.mu: takes audit.mu at inverted.go:55; " +
			"audit.mu is not in the lock order",
	}
	if len(got) != len(want) {
		t.Fatalf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("missing finding %q; got:\n%s", w, strings.Join(got, "\n"))
		}
	}
}
