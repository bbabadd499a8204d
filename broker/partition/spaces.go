package partition

import (
	"fmt"
	"sync"
)

// Spaces remembers which partition count each subscriber declared on each
// filter, so the broker can log the one coverage mistake it can see: two
// subscribers on one filter declaring different counts (docs/channels.md "What this
// does not build"). That cannot be correct and is no timing artefact, unlike
// a slice nobody holds, which the broker cannot tell from a member that has
// not connected yet and therefore never reports.
//
// It is keyed by the identical filter string: iot/+/events and
// iot/site-a/events are different spaces, deliberately, since where filters
// differ the counts may differ on purpose.
//
// It holds one entry per live declared subscription, so it is bounded by
// the broker's own bounds on subscriptions (invariant 13) provided the
// broker calls Forget whenever such a subscription ends: an UNSUBSCRIBE, a
// SUBSCRIBE replacing it, or the end of the session. It is safe for
// concurrent use.
type Spaces struct {
	mu      sync.Mutex
	filters map[string]map[string]uint32 // filter -> client id -> partitions
}

// Disagreement is two subscribers on one filter with different counts.
type Disagreement struct {
	Filter          string
	Client          string // the subscriber that just declared
	Partitions      uint32
	Other           string // a subscriber already holding another count
	OtherPartitions uint32
}

// String is the log line, naming both clients.
func (d Disagreement) String() string {
	return fmt.Sprintf("clients %q and %q subscribe to %q declaring different partition counts (%d and %d): "+
		"a topic whose slice exists in one space and not the other is received by one of them only, "+
		"or by nobody; give every member of the group the same count (docs/channels.md, Shared subscriptions: partitioning declared by the client)",
		d.Client, d.Other, d.Filter, d.Partitions, d.OtherPartitions)
}

// Declare records that client holds filter with m's declaration, replacing
// what it held there before, and returns a disagreement with another
// subscriber on the same filter if there is one. An undeclared m (nothing
// declared) removes the client from the filter's space: it receives
// everything and is in no space. When several others disagree, the one with
// the smallest client id is named, so the log line is the same every time.
func (s *Spaces) Declare(filter, client string, m Matcher) (Disagreement, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !m.Declared() {
		s.forgetLocked(filter, client)
		return Disagreement{}, false
	}
	if s.filters == nil {
		s.filters = make(map[string]map[string]uint32)
	}
	members := s.filters[filter]
	if members == nil {
		members = make(map[string]uint32)
		s.filters[filter] = members
	}
	members[client] = m.Partitions()
	var d Disagreement
	found := false
	for other, n := range members {
		if n == m.Partitions() || (found && other >= d.Other) {
			continue
		}
		d = Disagreement{Filter: filter, Client: client, Partitions: m.Partitions(), Other: other, OtherPartitions: n}
		found = true
	}
	return d, found
}

// Forget removes client's declaration on filter, if any.
func (s *Spaces) Forget(filter, client string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(filter, client)
}

func (s *Spaces) forgetLocked(filter, client string) {
	members := s.filters[filter]
	if members == nil {
		return
	}
	delete(members, client)
	if len(members) == 0 {
		delete(s.filters, filter)
	}
}

// Partitions returns the count client declared on filter, 0 for none.
func (s *Spaces) Partitions(filter, client string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.filters[filter][client]
}

// Len is the number of declared subscriptions held.
func (s *Spaces) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, members := range s.filters {
		n += len(members)
	}
	return n
}
