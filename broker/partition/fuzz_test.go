package partition

import (
	"errors"
	"math/big"
	"regexp"
	"strings"
	"testing"
)

// refCall is the accepted grammar of docs/channels.md "What a subscriber may
// declare" written as a regular expression, independently of the parser:
// the name spelled exactly, two runs of ASCII digits, and the ASCII four as
// the only whitespace, around the name, the parentheses and the comma.
var refCall = regexp.MustCompile(`^[ \t\n\r]*topic_hash[ \t\n\r]*\([ \t\n\r]*([0-9]+)[ \t\n\r]*,[ \t\n\r]*([0-9]+)[ \t\n\r]*\)[ \t\n\r]*$`)

// refParse is what the reference accepts, using arbitrary-precision numbers
// so no overflow can make it agree with a parser that wraps.
func refParse(v string) (Slice, bool) {
	if len(v) > MaxValueLength {
		return Slice{}, false
	}
	m := refCall.FindStringSubmatch(v)
	if m == nil {
		return Slice{}, false
	}
	p, _ := new(big.Int).SetString(m[1], 10)
	i, _ := new(big.Int).SetString(m[2], 10)
	limit := big.NewInt(MaxPartitions)
	if p.Sign() == 0 || p.Cmp(limit) > 0 || i.Cmp(p) >= 0 {
		return Slice{}, false
	}
	return Slice{uint32(p.Uint64()), uint32(i.Uint64())}, true
}

// FuzzParseFilter checks, for two arbitrary saguin-filter values on one
// SUBSCRIBE: no panic; a value is accepted exactly when the reference
// grammar accepts it, with the same slice; every refusal is an *Error with a
// known refusal; an accepted slice's canonical form parses back to it; and
// two values together are accepted exactly when each is and their counts
// agree, compiling to the OR of the two.
func FuzzParseFilter(f *testing.F) {
	for _, seed := range [][2]string{
		{"topic_hash(3, 0)", "topic_hash(3, 2)"},
		{"topic_hash(8, 1)", "topic_hash(8, 5)"},
		{"  topic_hash ( 8 , 1 )  ", "\ttopic_hash(08,\r\n7)"},
		{"topic_hash(4, 0)", "topic_hash(6, 1)"},
		{"topic_hash(1, 8)", "TOPIC_HASH(8, 1)"},
		{"topic_hash(+3, 0)", "topic_hash(0x8, 1)"},
		{"topic_hash(2147483647, 2147483646)", "topic_hash(2147483648, 0)"},
		{"topic_hash(100000000000000000000000, 1)", "topic_hash(0, 0)"},
		{"$topic_hash % 3 == 0", ""},
		{"topic_hash(3, 0) || topic_hash(3, 1)", "topic_hash()"},
		{"topic_hash(3,\u00a00)", "\u00a0topic_hash(3, 0)"},
		{"topic_hash(3, 0, 1)", "topic_hash(3)"},
		{"topic_hash(" + strings.Repeat("0", 200) + "1, 0)", "topic_hash((3), 0)"},
		{"\xff\xfe", "topic_hash(3, 0)\x00"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, okA := checkOne(t, a)
		sb, okB := checkOne(t, b)

		m, err := Parse([]string{a, b})
		wantOK := okA && okB && sa.Partitions == sb.Partitions
		if (err == nil) != wantOK {
			t.Fatalf("Parse(%q, %q) error %v; each alone: %v %v", a, b, err, okA, okB)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse refused with %T %v, not *Error", err, err)
			}
			// The first value at fault is the one named.
			switch {
			case !okA && e.Declaration != 0:
				t.Fatalf("first value %q refused, but the error names declaration %d: %v", a, e.Declaration, err)
			case okA && !okB && e.Declaration != 1:
				t.Fatalf("second value %q refused, but the error names declaration %d: %v", b, e.Declaration, err)
			case okA && okB && e.Refusal != RefusedMixedPartitions:
				t.Fatalf("two valid values with counts %d and %d refused as %v", sa.Partitions, sb.Partitions, err)
			}
			return
		}
		if m.Partitions() != sa.Partitions {
			t.Fatalf("matcher partitions %d, want %d", m.Partitions(), sa.Partitions)
		}
		want := []uint32{sa.Index, sb.Index}
		if sa.Index > sb.Index {
			want = []uint32{sb.Index, sa.Index}
		}
		if sa.Index == sb.Index {
			want = want[:1]
		}
		got := m.Indexes()
		if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
			t.Fatalf("indexes %v, want %v", got, want)
		}
		again, err := Parse(m.Values())
		if err != nil || !again.Equal(m) {
			t.Fatalf("canonical values %q parse to %v, %v", m.Values(), again, err)
		}
		for _, tp := range []string{a, b, "x", "iot/depot/events/dev-1"} {
			if tp == "" {
				continue
			}
			if m.Match(tp) != (sa.Contains(tp) || sb.Contains(tp)) {
				t.Fatalf("Match(%q) is not the OR of %v and %v", tp, sa, sb)
			}
		}
	})
}

// checkOne parses one value and checks it against the reference.
func checkOne(t *testing.T, v string) (Slice, bool) {
	t.Helper()
	got, err := ParseSlice(v)
	want, ok := refParse(v)
	if (err == nil) != ok {
		t.Fatalf("ParseSlice(%q) = %+v, %v; the reference grammar says accepted=%v", v, got, err, ok)
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Refusal < RefusedNotACall || e.Refusal > RefusedTooManyDeclarations ||
			e.Refusal == RefusedMixedPartitions || e.Refusal == RefusedTooManyDeclarations {
			t.Fatalf("ParseSlice(%q) refused with %T %v, not a one-value refusal", v, err, err)
		}
		if len(e.Value) > maxQuotedValue+len("...") {
			t.Fatalf("refused value kept at %d bytes", len(e.Value))
		}
		return Slice{}, false
	}
	if got != want {
		t.Fatalf("ParseSlice(%q) = %+v, reference %+v", v, got, want)
	}
	back, err := ParseSlice(got.String())
	if err != nil || back != got {
		t.Fatalf("canonical %q of %q parses to %+v, %v", got.String(), v, back, err)
	}
	return got, true
}
