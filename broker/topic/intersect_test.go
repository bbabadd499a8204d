package topic

import (
	"testing"

	"pgregory.net/rapid"
)

func TestIntersectTable(t *testing.T) {
	for _, tc := range []struct {
		a, b, want string
		ok         bool
	}{
		{"a/#", "a", "a", true},
		{"a/#", "a/+/c", "a/+/c", true},
		{"#", "events/+/x", "events/+/x", true},
		{"+/temp", "site/#", "site/temp", true},
		{"a/+", "+/b", "a/b", true},
		{"a/b", "a/c", "", false},
		{"a/+", "a/b/c", "", false},
		{"a/+/#", "a/#", "a/+/#", true},
		{"#", "$SYS/x", "", false},
		{"$SYS/#", "$SYS/+", "$SYS/+", true},
		{"+", "/#", "", false}, // "" is no topic; "/" has two levels
		{"#", "#", "#", true},
	} {
		got, ok := Intersect(tc.a, tc.b)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Intersect(%q, %q) = %q, %v; want %q, %v", tc.a, tc.b, got, ok, tc.want, tc.ok)
		}
	}
}

// Intersect's filter matches exactly the topics both filters match.
func TestIntersectAgreesWithBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := genFilter(t, "a"), genFilter(t, "b")
		got, ok := Intersect(a, b)
		if ok {
			if err := ValidFilter(got); err != nil {
				t.Fatalf("Intersect(%q, %q) = %q, not a valid filter: %v", a, b, got, err)
			}
		}
		for _, tp := range universe5 {
			want := refMatch(a, tp) && refMatch(b, tp)
			have := ok && refMatch(got, tp)
			if want != have {
				t.Fatalf("Intersect(%q, %q) = %q, %v: topic %q matched %v, both filters %v", a, b, got, ok, tp, have, want)
			}
		}
	})
}
