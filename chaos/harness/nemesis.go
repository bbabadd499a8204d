package harness

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Nemesis names.
const (
	// NemesisKill: SIGKILL, then start again. sqlite keeps every committed
	// record (invariant 14); memory keeps its last snapshot.
	NemesisKill = "kill"
	// NemesisTerm: SIGTERM (graceful shutdown: positions stored, snapshots
	// written), then start again. Nothing acknowledged may be lost, on
	// either provider.
	NemesisTerm = "term"
	// NemesisStop: SIGSTOP for up to two visibility timeouts, then SIGCONT:
	// leases time out, publishes hang past their bound, acks arrive late.
	NemesisStop = "stop"
	// NemesisCut: every client's link reset at the proxy and new ones
	// refused for a moment, the broker untouched.
	NemesisCut = "cut"
	// NemesisPowerCut: the fault-injecting filesystem under the data
	// directory drops everything not synced (torn or not), the broker is
	// killed, the filesystem remounted, the broker started again.
	NemesisPowerCut = "powercut"
)

// nemesisCont is the note a stop's SIGCONT leaves: the broker runs again.
const nemesisCont = "cont"

// AllNemeses lists the nemeses in a fixed order.
func AllNemeses() []string {
	return []string{NemesisKill, NemesisTerm, NemesisStop, NemesisCut, NemesisPowerCut}
}

// NemesisWeight is a nemesis and how many times it appears in each shuffled
// round of the schedule.
type NemesisWeight struct {
	Name   string
	Weight int
}

// ParseNemeses reads "kill=3,term,stop,cut,powercut=2": names, each with an
// optional weight (default 1).
func ParseNemeses(s string) ([]NemesisWeight, error) {
	var out []NemesisWeight
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, hasW := strings.Cut(part, "=")
		weight := 1
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 || n > 100 {
				return nil, fmt.Errorf("nemesis %q: weight must be a whole number from 1 to 100", part)
			}
			weight = n
		}
		if !slices.Contains(AllNemeses(), name) {
			return nil, fmt.Errorf("unknown nemesis %q (want %s)", name, strings.Join(AllNemeses(), ", "))
		}
		if seen[name] {
			return nil, fmt.Errorf("nemesis %q named twice", name)
		}
		seen[name] = true
		out = append(out, NemesisWeight{Name: name, Weight: weight})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no nemesis named")
	}
	return out, nil
}

// FormatNemeses is the inverse of ParseNemeses.
func FormatNemeses(ns []NemesisWeight) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = n.Name
		if n.Weight != 1 {
			parts[i] += "=" + strconv.Itoa(n.Weight)
		}
	}
	return strings.Join(parts, ",")
}

// deck deals nemeses in rounds: each round holds every nemesis as many times
// as its weight, shuffled by the seed. So N cycles apply each nemesis at
// least floor(N/round)×weight times — a short campaign is guaranteed its
// kills — and the order is still the seed's to choose.
type deck struct {
	rng   *rand.Rand
	round []string
	next  int
}

func newDeck(ns []NemesisWeight, rng *rand.Rand) *deck {
	d := &deck{rng: rng}
	for _, n := range ns {
		for range n.Weight {
			d.round = append(d.round, n.Name)
		}
	}
	d.next = len(d.round)
	return d
}

func (d *deck) deal() string {
	if d.next == len(d.round) {
		d.rng.Shuffle(len(d.round), func(i, j int) { d.round[i], d.round[j] = d.round[j], d.round[i] })
		d.next = 0
	}
	n := d.round[d.next]
	d.next++
	return n
}
