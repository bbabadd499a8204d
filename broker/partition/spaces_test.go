package partition

import (
	"strings"
	"sync"
	"testing"
)

func mustParse(t *testing.T, values ...string) Matcher {
	t.Helper()
	m, err := Parse(values)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// rfcs/partition.md: two subscribers on one identical
// filter declaring different counts is logged naming both; overlapping but
// different filters are different spaces and never compared.
func TestSpacesReportDifferentCountsOnOneFilter(t *testing.T) {
	var s Spaces
	three0 := mustParse(t, "topic_hash(3, 0)")
	three1 := mustParse(t, "topic_hash(3, 1)")
	two0 := mustParse(t, "topic_hash(2, 0)")

	if _, bad := s.Declare("iot/+/events", "a", three0); bad {
		t.Fatal("first member reported a disagreement")
	}
	if d, bad := s.Declare("iot/+/events", "b", three1); bad {
		t.Fatalf("same count reported: %v", d)
	}
	if d, bad := s.Declare("iot/site-a/events", "c", two0); bad {
		t.Fatalf("a different filter string was compared: %v", d)
	}
	d, bad := s.Declare("iot/+/events", "z", two0)
	if !bad {
		t.Fatal("different counts on one filter not reported")
	}
	want := Disagreement{Filter: "iot/+/events", Client: "z", Partitions: 2, Other: "a", OtherPartitions: 3}
	if d != want {
		t.Fatalf("disagreement = %+v, want %+v (the smallest other client id is named)", d, want)
	}
	line := d.String()
	for _, part := range []string{`"z"`, `"a"`, `"iot/+/events"`, "(2 and 3)"} {
		if !strings.Contains(line, part) {
			t.Errorf("log line %q lacks %s", line, part)
		}
	}

	// An undeclared re-subscription leaves the space; forgetting empties it.
	if _, bad := s.Declare("iot/+/events", "z", Matcher{}); bad {
		t.Fatal("an undeclared subscription was compared")
	}
	if got := s.Partitions("iot/+/events", "z"); got != 0 {
		t.Fatalf("z still holds count %d", got)
	}
	if d, bad := s.Declare("iot/+/events", "b", three0); bad {
		t.Fatalf("agreeing members reported after z left: %v", d)
	}
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want 3", s.Len())
	}
	s.Forget("iot/+/events", "a")
	s.Forget("iot/+/events", "b")
	s.Forget("iot/site-a/events", "c")
	s.Forget("never/held", "nobody")
	if s.Len() != 0 || len(s.filters) != 0 {
		t.Fatalf("entries left after forgetting everything: %v", s.filters)
	}
}

// A member changing its own count replaces its entry rather than
// disagreeing with itself.
func TestSpacesMemberChangesItsOwnCount(t *testing.T) {
	var s Spaces
	s.Declare("f", "a", mustParse(t, "topic_hash(3, 0)"))
	if d, bad := s.Declare("f", "a", mustParse(t, "topic_hash(4, 0)")); bad {
		t.Fatalf("a member disagreed with its own earlier declaration: %v", d)
	}
	if s.Partitions("f", "a") != 4 || s.Len() != 1 {
		t.Fatalf("partitions %d len %d", s.Partitions("f", "a"), s.Len())
	}
}

func TestSpacesConcurrentUse(t *testing.T) {
	var s Spaces
	m := mustParse(t, "topic_hash(4, 1)")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := string(rune('a' + g))
			for i := 0; i < 200; i++ {
				s.Declare("f", client, m)
				s.Forget("f", client)
			}
		}()
	}
	wg.Wait()
	if s.Len() != 0 {
		t.Fatalf("Len = %d after every member left", s.Len())
	}
}
