package partition

import (
	"fmt"
	"hash/fnv"
	"testing"

	"pgregory.net/rapid"
)

// The worked examples of rfcs/partition.md, both halves and both
// moduli. These values are the RFC's; they are never adjusted to fit the code.
func TestTopicHashWorkedExamples(t *testing.T) {
	for _, tc := range []struct {
		topic      string
		fnv, mixed uint64
		mod3, mod8 uint32
	}{
		{"iot/depot/events/dev-1", 9321193355118713112, 16961261177379703000, 1, 0},
		{"iot/water/w-7/inspect", 14147658934179859562, 16406880391913018636, 2, 4},
		{"orders/resize/thumbnails/42", 15020795679369718730, 10596179872049748585, 0, 1},
		{"a", 12638187200555641996, 198367012849983736, 1, 0},
	} {
		t.Run(tc.topic, func(t *testing.T) {
			if got := FNV1a64(tc.topic); got != tc.fnv {
				t.Errorf("FNV1a64 = %d, RFC says %d", got, tc.fnv)
			}
			if got := Mix(tc.fnv); got != tc.mixed {
				t.Errorf("Mix(%d) = %d, RFC says %d", tc.fnv, got, tc.mixed)
			}
			if got := TopicHash(tc.topic); got != tc.mixed {
				t.Errorf("TopicHash = %d, RFC says %d", got, tc.mixed)
			}
			if got := SliceOf(tc.topic, 3); got != tc.mod3 {
				t.Errorf("SliceOf(3) = %d, RFC says %d", got, tc.mod3)
			}
			if got := SliceOf(tc.topic, 8); got != tc.mod8 {
				t.Errorf("SliceOf(8) = %d, RFC says %d", got, tc.mod8)
			}
			// The slice is taken after mixing, and each example's slice is
			// the only one of its space holding it.
			for _, n := range []uint32{3, 8} {
				want := map[uint32]uint32{3: tc.mod3, 8: tc.mod8}[n]
				for i := uint32(0); i < n; i++ {
					if got := (Slice{n, i}).Contains(tc.topic); got != (i == want) {
						t.Errorf("Slice{%d,%d}.Contains = %v", n, i, got)
					}
				}
			}
		})
	}
}

// The first half is plain FNV-1a over bytes; the standard library's is an
// independent implementation of it. Topics are drawn as arbitrary strings,
// multi-byte UTF-8 included, since the hash reads bytes, not characters.
func TestFNVHalfAgreesWithStandardLibrary(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		topic := rapid.String().Draw(t, "topic")
		h := fnv.New64a()
		h.Write([]byte(topic))
		if got, want := FNV1a64(topic), h.Sum64(); got != want {
			t.Fatalf("FNV1a64(%q) = %d, hash/fnv says %d", topic, got, want)
		}
	})
}

// rfcs/partition.md: topics carrying an identifier
// twice defeat FNV-1a's low bits and leave two of four members with nothing,
// while the mixed hash splits them evenly. The topics are fixed, so this is
// deterministic; the bound is loose (±10% of an even share).
func TestMixingSpreadsRepeatedIdentifiers(t *testing.T) {
	const topics, members = 4000, 4
	var plain, mixed [members]int
	for i := 0; i < topics; i++ {
		id := fmt.Sprintf("dev-%d", i)
		tp := "devices/" + id + "/messages/devicebound/" + id
		plain[FNV1a64(tp)%members]++
		mixed[SliceOf(tp, members)]++
	}
	empty := 0
	for _, n := range plain {
		if n == 0 {
			empty++
		}
	}
	if empty != 2 {
		t.Errorf("FNV-1a alone split the topics %v; the RFC's case leaves two members empty", plain)
	}
	for i, n := range mixed {
		if n < 900 || n > 1100 {
			t.Errorf("member %d of %d received %d of %d topics after mixing (%v); want about %d",
				i, members, n, topics, mixed, topics/members)
		}
	}
}

// genTopic draws topics that look like topics (levels of short text,
// occasionally empty or multi-byte) so sets have realistic shapes.
func genTopic(t *rapid.T, label string) string {
	levels := rapid.SliceOfN(rapid.StringMatching(`[a-z0-9ü_-]{0,8}`), 1, 6).Draw(t, label)
	out := ""
	for i, l := range levels {
		if i > 0 {
			out += "/"
		}
		out += l
	}
	if out == "" {
		return "x"
	}
	return out
}

// For any partition count, the slices 0..N-1 partition every topic set
// exactly: each topic is in one slice, never none, never two. This is what
// makes a group whose members together hold every index receive each record
// once.
func TestSlicesPartitionTopicsExactly(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := uint32(rapid.IntRange(1, 64).Draw(t, "partitions"))
		topics := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) string { return genTopic(t, "topic") }), 1, 40).Draw(t, "topics")
		for _, tp := range topics {
			holders := 0
			for i := uint32(0); i < n; i++ {
				if (Slice{n, i}).Contains(tp) {
					holders++
				}
			}
			if holders != 1 {
				t.Fatalf("topic %q is in %d of the %d slices", tp, holders, n)
			}
		}
		// A group of members holding disjoint sets of indexes that together
		// cover 0..N-1 receives every topic exactly once.
		// Every member owns at least one index: one owning none would have
		// declared nothing, and so receive everything.
		members := rapid.IntRange(1, int(n)).Draw(t, "members")
		owner := make([]int, n)
		for i := range owner {
			if i < members {
				owner[i] = i
			} else {
				owner[i] = rapid.IntRange(0, members-1).Draw(t, "owner")
			}
		}
		owner = rapid.Permutation(owner).Draw(t, "assignment")
		matchers := make([]Matcher, members)
		for m := range matchers {
			var d Declaration
			for i, o := range owner {
				if o == m {
					if err := d.Add(Slice{n, uint32(i)}.String()); err != nil {
						t.Fatal(err)
					}
				}
			}
			matchers[m] = d.Matcher()
		}
		for _, tp := range topics {
			got := 0
			for _, m := range matchers {
				if m.Match(tp) {
					got++
				}
			}
			if got != 1 {
				t.Fatalf("topic %q received by %d of %d members covering %d slices", tp, got, members, n)
			}
		}
	})
}

// The same for counts up to the bound, where enumerating the slices is out
// of reach: the slice SliceOf names holds the topic and no other drawn one does.
func TestLargeSpacesHoldEachTopicOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := uint32(rapid.IntRange(1, MaxPartitions).Draw(t, "partitions"))
		tp := genTopic(t, "topic")
		home := SliceOf(tp, n)
		if home >= n {
			t.Fatalf("SliceOf(%q, %d) = %d, outside the space", tp, n, home)
		}
		if !(Slice{n, home}).Contains(tp) {
			t.Fatalf("Slice{%d,%d} does not contain %q", n, home, tp)
		}
		other := uint32(rapid.IntRange(0, int(n)-1).Draw(t, "other"))
		if other != home && (Slice{n, other}).Contains(tp) {
			t.Fatalf("Slice{%d,%d} contains %q, whose slice is %d", n, other, tp, home)
		}
	})
}
