package partition

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// The Reason Strings, spelled out here rather than taken from the code, so a
// change to what a client author reads on the wire fails this test.
const (
	sentNotACall           = "The saguin-filter value is not a function call; a slice is declared as topic_hash(<partitions>, <index>)."
	sentUnknownFunction    = "The saguin-filter value calls a function Sagüin does not have; the only one is topic_hash, spelled exactly, as topic_hash(<partitions>, <index>)."
	sentArgumentCount      = "The saguin-filter value gives topic_hash the wrong number of arguments; it takes two, as topic_hash(<partitions>, <index>)."
	sentNotDigits          = "A saguin-filter argument is not a number: write decimal digits 0-9 only, with no sign, 0x or exponent, as topic_hash(<partitions>, <index>)."
	sentTooLarge           = "A saguin-filter argument is above the bound of 2147483647; both arguments of topic_hash(<partitions>, <index>) are at most 2147483647."
	sentZeroPartitions     = "The saguin-filter partition count is 0; in topic_hash(<partitions>, <index>) the count is at least 1."
	sentIndexOutOfRange    = "The saguin-filter index is at or above the partition count; in topic_hash(<partitions>, <index>) the count comes first and the index runs from 0 to partitions - 1."
	sentMixedPartitions    = "The saguin-filter properties on this SUBSCRIBE name different partition counts; every topic_hash(<partitions>, <index>) on one SUBSCRIBE names the same count."
	sentEmpty              = "The saguin-filter value is empty; a slice is declared as topic_hash(<partitions>, <index>), and declaring nothing receives everything."
	sentValueTooLong       = "The saguin-filter value is longer than 128 bytes; a slice is declared as topic_hash(<partitions>, <index>)."
	sentTooMany            = "This SUBSCRIBE carries more than 256 saguin-filter properties; declare at most 256 slices of topic_hash(<partitions>, <index>) on one SUBSCRIBE."
	sentSharedSubscription = "saguin-filter is refused on a $share/ subscription: a shared subscription already divides its stream between its members."
	sentQueueSubscription  = "saguin-filter is refused on a $saguin/queue/ subscription: a queue already divides its work between its workers."
)

func TestParseSliceAccepts(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  Slice
	}{
		{"topic_hash(3, 0)", Slice{3, 0}},
		{"topic_hash(3,2)", Slice{3, 2}},
		{"topic_hash(1, 0)", Slice{1, 0}}, // legal and degenerate: one slice, everything
		{"topic_hash(2147483647, 2147483646)", Slice{MaxPartitions, MaxPartitions - 1}},
		{"topic_hash(2147483647, 0)", Slice{MaxPartitions, 0}},
		// Leading zeros mean what they say.
		{"topic_hash(008, 007)", Slice{8, 7}},
		{"topic_hash(00000000000000000002147483647, 0)", Slice{MaxPartitions, 0}},
		{"topic_hash(8, 00)", Slice{8, 0}},
		// Whitespace, the ASCII four, around the name, parentheses and comma.
		{"  topic_hash ( 8 , 1 )  ", Slice{8, 1}},
		{"\ttopic_hash\t(\t8\t,\t1\t)\t", Slice{8, 1}},
		{"\r\ntopic_hash\n(\r8\n,\r1\n)\r\n", Slice{8, 1}},
		{"topic_hash(8 ,1)", Slice{8, 1}},
	} {
		got, err := ParseSlice(tc.value)
		if err != nil {
			t.Errorf("ParseSlice(%q): %v", tc.value, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseSlice(%q) = %+v, want %+v", tc.value, got, tc.want)
		}
		back, err := ParseSlice(got.String())
		if err != nil || back != got {
			t.Errorf("canonical %q of %q parses to %+v, %v", got.String(), tc.value, back, err)
		}
	}
}

// Every refusal rfcs/partition.md lists for one value,
// with the sentence the broker sends as the SUBACK Reason String.
func TestParseSliceRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		value   string
		refusal Refusal
		reason  string
	}{
		{"empty", "", RefusedEmpty, sentEmpty},
		{"whitespace only", " \t\r\n", RefusedEmpty, sentEmpty},

		{"bare numbers", "3, 0", RefusedNotACall, sentNotACall},
		{"bare name", "topic_hash", RefusedNotACall, sentNotACall},
		{"operator syntax", "$topic_hash % 3 == 0", RefusedNotACall, sentNotACall},
		{"expression of calls", "topic_hash(3, 0) || topic_hash(3, 1)", RefusedNotACall, sentNotACall},
		{"comma list of calls", "topic_hash(3, 0), topic_hash(3, 1)", RefusedNotACall, sentNotACall},
		{"trailing text", "topic_hash(3, 0);", RefusedNotACall, sentNotACall},
		{"unclosed", "topic_hash(3, 0", RefusedNotACall, sentNotACall},
		{"no name", "(3, 0)", RefusedNotACall, sentNotACall},
		{"nested call", "topic_hash(topic_hash(3, 0), 1)", RefusedNotACall, sentNotACall},
		{"two words", "topic hash(3, 0)", RefusedNotACall, sentNotACall},
		{"JSON", `{"partitions": 3, "index": 0}`, RefusedNotACall, sentNotACall},

		{"upper case", "TOPIC_HASH(3, 0)", RefusedUnknownFunction, sentUnknownFunction},
		{"other function", "murmur3(3, 0)", RefusedUnknownFunction, sentUnknownFunction},
		{"prefix of the name", "topic_has(3, 0)", RefusedUnknownFunction, sentUnknownFunction},
		{"non-breaking space before the name", "\u00a0topic_hash(3, 0)", RefusedUnknownFunction, sentUnknownFunction},
		{"vertical tab is not one of the four", "\vtopic_hash(3, 0)", RefusedUnknownFunction, sentUnknownFunction},
		{"camel case", "topicHash(3, 0)", RefusedUnknownFunction, sentUnknownFunction},

		{"no arguments", "topic_hash()", RefusedArgumentCount, sentArgumentCount},
		{"blank arguments", "topic_hash(  )", RefusedArgumentCount, sentArgumentCount},
		{"one argument", "topic_hash(3)", RefusedArgumentCount, sentArgumentCount},
		{"three arguments", "topic_hash(3, 0, 1)", RefusedArgumentCount, sentArgumentCount},
		{"trailing comma after two", "topic_hash(3, 0,)", RefusedArgumentCount, sentArgumentCount},

		{"sign", "topic_hash(+3, 0)", RefusedArgumentNotDigits, sentNotDigits},
		{"negative index", "topic_hash(3, -1)", RefusedArgumentNotDigits, sentNotDigits},
		{"hex", "topic_hash(0x8, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"exponent", "topic_hash(1e3, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"decimal point", "topic_hash(3.0, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"empty first", "topic_hash(, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"empty second", "topic_hash(3, )", RefusedArgumentNotDigits, sentNotDigits},
		{"space inside a number", "topic_hash(1 0, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"underscore separator", "topic_hash(1_000, 1)", RefusedArgumentNotDigits, sentNotDigits},
		{"non-breaking space in an argument", "topic_hash(3,\u00a00)", RefusedArgumentNotDigits, sentNotDigits},
		{"non-ASCII digit", "topic_hash(\u0663, 0)", RefusedArgumentNotDigits, sentNotDigits},
		{"named argument", "topic_hash(partitions=3, index=0)", RefusedArgumentNotDigits, sentNotDigits},

		{"partitions one above", "topic_hash(2147483648, 0)", RefusedArgumentTooLarge, sentTooLarge},
		{"index one above", "topic_hash(2147483647, 2147483648)", RefusedArgumentTooLarge, sentTooLarge},
		{"10^23", "topic_hash(100000000000000000000000, 1)", RefusedArgumentTooLarge, sentTooLarge},
		{"uint32 max", "topic_hash(4294967295, 1)", RefusedArgumentTooLarge, sentTooLarge},
		{"uint64 wrap", "topic_hash(18446744073709551619, 1)", RefusedArgumentTooLarge, sentTooLarge},

		{"zero partitions", "topic_hash(0, 0)", RefusedZeroPartitions, sentZeroPartitions},
		{"zero partitions, zeros", "topic_hash(000, 0)", RefusedZeroPartitions, sentZeroPartitions},

		{"index equal to count", "topic_hash(3, 3)", RefusedIndexOutOfRange, sentIndexOutOfRange},
		{"index above count", "topic_hash(3, 7)", RefusedIndexOutOfRange, sentIndexOutOfRange},
		{"swapped arguments", "topic_hash(1, 8)", RefusedIndexOutOfRange, sentIndexOutOfRange},
		{"count of one, index one", "topic_hash(1, 1)", RefusedIndexOutOfRange, sentIndexOutOfRange},

		{"too long", "topic_hash(" + strings.Repeat("0", 120) + "3, 0)", RefusedValueTooLong, sentValueTooLong},
		{"too long even if blank", strings.Repeat(" ", MaxValueLength+1), RefusedValueTooLong, sentValueTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSlice(tc.value)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("ParseSlice(%q) = %v; want refusal %q", tc.value, err, tc.reason)
			}
			if e.Refusal != tc.refusal {
				t.Errorf("refusal = %q\nwant      %q", e.Reason(), tc.reason)
			}
			if e.Reason() != tc.reason {
				t.Errorf("Reason() = %q\nwant        %q", e.Reason(), tc.reason)
			}
			if e.Code() != 0x83 {
				t.Errorf("Code() = %#x, want 0x83", e.Code())
			}
			if !errors.Is(err, &Error{Refusal: tc.refusal}) {
				t.Errorf("errors.Is does not recognise refusal %d", tc.refusal)
			}
			// The log line carries the value (cut to a bounded length) and the reason.
			if !strings.Contains(err.Error(), tc.reason) || !strings.HasPrefix(err.Error(), "saguin-filter #1 ") {
				t.Errorf("Error() = %q", err.Error())
			}
			if len(err.Error()) > len(tc.reason)+len("saguin-filter #1 ")+2*maxQuotedValue+16 {
				t.Errorf("Error() is %d bytes; the quoted value must be bounded", len(err.Error()))
			}
		})
	}
}

// The bound of 2147483647 is the same for both arguments, and digits one
// past it are "too large" however they are written.
func TestArgumentBoundIsExact(t *testing.T) {
	for _, tc := range []struct {
		arg string
		ok  bool
	}{
		{"2147483647", true},
		{"02147483647", true},
		{"2147483648", false},
		{"9999999999", false},
		{"10000000000", false},
		{"21474836470", false},
	} {
		_, r := parseArgument(tc.arg)
		if (r == 0) != tc.ok || (!tc.ok && r != RefusedArgumentTooLarge) {
			t.Errorf("parseArgument(%q) refusal %d, want ok=%v", tc.arg, r, tc.ok)
		}
	}
}

func TestParseRepeatedDeclarations(t *testing.T) {
	t.Run("nothing declared matches everything", func(t *testing.T) {
		m, err := Parse(nil)
		if err != nil || m.Declared() || m.Partitions() != 0 || !m.Match("any/topic") || m.String() != "everything" {
			t.Fatalf("Parse(nil) = %v, %v", m, err)
		}
	})
	t.Run("repeats are an OR", func(t *testing.T) {
		m, err := Parse([]string{"topic_hash(8, 5)", "topic_hash(8,1)"})
		if err != nil {
			t.Fatal(err)
		}
		if !m.Declared() || m.Partitions() != 8 || !slices.Equal(m.Indexes(), []uint32{1, 5}) {
			t.Fatalf("matcher = %v (partitions %d, indexes %v)", m, m.Partitions(), m.Indexes())
		}
		if got, want := m.String(), "topic_hash(8, 1) OR topic_hash(8, 5)"; got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
		for i := 0; i < 500; i++ {
			tp := "fleet/dev-" + strconv.Itoa(i) + "/state"
			s := SliceOf(tp, 8)
			if m.Match(tp) != (s == 1 || s == 5) {
				t.Fatalf("Match(%q) = %v with slice %d", tp, m.Match(tp), s)
			}
		}
	})
	t.Run("asking twice for one slice is not an error", func(t *testing.T) {
		m, err := Parse([]string{"topic_hash(3, 0)", "topic_hash(003, 0)", " topic_hash(3,0) "})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.Indexes(), []uint32{0}) || !slices.Equal(m.Values(), []string{"topic_hash(3, 0)"}) {
			t.Fatalf("indexes %v values %v", m.Indexes(), m.Values())
		}
	})
	t.Run("count of one holds everything", func(t *testing.T) {
		m, err := Parse([]string{"topic_hash(1, 0)"})
		if err != nil || !m.Declared() || !m.Match("a") || !m.Match("b/c") {
			t.Fatalf("%v %v", m, err)
		}
	})
}

// The refusals that need more than one value, and the bound on how many.
func TestParseRefusesAcrossDeclarations(t *testing.T) {
	many := func(n int) []string {
		v := make([]string, n)
		for i := range v {
			v[i] = Slice{1000, uint32(i)}.String()
		}
		return v
	}
	for _, tc := range []struct {
		name        string
		values      []string
		refusal     Refusal
		reason      string
		declaration int
	}{
		{"different counts", []string{"topic_hash(4, 0)", "topic_hash(6, 1)"}, RefusedMixedPartitions, sentMixedPartitions, 1},
		{"different counts later", []string{"topic_hash(4, 0)", "topic_hash(4, 1)", "topic_hash(04, 2)", "topic_hash(5, 3)"}, RefusedMixedPartitions, sentMixedPartitions, 3},
		{"a bad value after good ones", []string{"topic_hash(4, 0)", "topic_hash(4, 4)"}, RefusedIndexOutOfRange, sentIndexOutOfRange, 1},
		{"an empty value among good ones", []string{"topic_hash(4, 0)", ""}, RefusedEmpty, sentEmpty, 1},
		{"too many", many(MaxDeclarations + 1), RefusedTooManyDeclarations, sentTooMany, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.values)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %v; want %q", err, tc.reason)
			}
			if e.Refusal != tc.refusal || e.Reason() != tc.reason || e.Declaration != tc.declaration {
				t.Errorf("got refusal %q at declaration %d\nwant        %q at %d", e.Reason(), e.Declaration, tc.reason, tc.declaration)
			}
			// Fed one by one, a Declaration refuses at the same value.
			var d Declaration
			var derr error
			for _, v := range tc.values {
				if derr = d.Add(v); derr != nil {
					break
				}
			}
			if !errors.Is(derr, &Error{Refusal: tc.refusal}) {
				t.Errorf("Declaration.Add refused with %v", derr)
			}
		})
	}
	if _, err := Parse(many(MaxDeclarations)); err != nil {
		t.Errorf("%d declarations refused: %v", MaxDeclarations, err)
	}
	if !strings.Contains(sentTooMany, strconv.Itoa(MaxDeclarations)) || !strings.Contains(sentValueTooLong, strconv.Itoa(MaxValueLength)) {
		t.Error("the bound sentences must state the bounds the code enforces")
	}
}

// Invariant 13: the count is checked before the value is read, so the value
// past the bound is refused for the count, not for its content.
func TestDeclarationBoundCheckedBeforeParsing(t *testing.T) {
	var d Declaration
	for i := 0; i < MaxDeclarations; i++ {
		if err := d.Add("topic_hash(2, 1)"); err != nil {
			t.Fatal(err)
		}
	}
	err := d.Add("not a call at all")
	if !errors.Is(err, &Error{Refusal: RefusedTooManyDeclarations}) {
		t.Fatalf("Add past the bound = %v", err)
	}
	if got := d.Matcher(); !slices.Equal(got.Indexes(), []uint32{1}) || got.Partitions() != 2 {
		t.Errorf("matcher after refusal = %v", got)
	}
}

// rfcs/partition.md: refused on $share/ and on the queue form,
// decided by the prefixes as strings; allowed everywhere else.
func TestCheckFilter(t *testing.T) {
	for _, tc := range []struct {
		filter string
		reason string // "" = allowed
	}{
		{"$share/group/iot/#", sentSharedSubscription},
		{"$share/g/a", sentSharedSubscription},
		{"$saguin/queue/orders", sentQueueSubscription},
		{"$saguin/queue/", sentQueueSubscription},
		{"iot/+/events", ""},
		{"#", ""},
		{"orders/#", ""},
		{"$SYS/#", ""},
		{"$SHARE/g/a", ""},         // not a shared subscription; refused elsewhere as malformed
		{"$saguin/queueish/x", ""}, // not the queue form
		{"share/g/a", ""},
	} {
		err := CheckFilter(tc.filter)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("CheckFilter(%q) = %v; want allowed", tc.filter, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Reason() != tc.reason || e.Code() != 0x83 {
			t.Errorf("CheckFilter(%q) = %v\nwant %q", tc.filter, err, tc.reason)
			continue
		}
		if !strings.Contains(e.Error(), tc.filter) {
			t.Errorf("Error() = %q does not name the filter", e.Error())
		}
	}
	long := "$share/g/" + strings.Repeat("x", 60000)
	if err := CheckFilter(long); err == nil || len(err.Error()) > 400 {
		t.Errorf("a long filter's error is %d bytes; the quoted filter must be bounded", len(err.Error()))
	}
}

// Every refusal has its own sentence, each naming the property: the
// sentences are how a client author tells the cases apart.
func TestEverySentenceIsDistinctAndNamesTheProperty(t *testing.T) {
	seen := map[string]Refusal{}
	for r := RefusedNotACall; r <= RefusedQueueSubscription; r++ {
		s := r.Sentence()
		if !strings.Contains(s, PropertyName) {
			t.Errorf("refusal %d sentence %q does not name %s", r, s, PropertyName)
		}
		if prev, dup := seen[s]; dup {
			t.Errorf("refusals %d and %d share the sentence %q", prev, r, s)
		}
		seen[s] = r
		if r != RefusedSharedSubscription && r != RefusedQueueSubscription && !strings.Contains(s, "topic_hash(<partitions>, <index>)") {
			t.Errorf("refusal %d sentence %q does not state the form", r, s)
		}
	}
}

// The matcher is exactly the OR of its declared slices, for any subset of
// any space.
func TestMatcherIsTheOrOfItsSlices(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := uint32(rapid.IntRange(1, 32).Draw(t, "partitions"))
		picked := rapid.SliceOfN(rapid.IntRange(0, int(n)-1), 1, 12).Draw(t, "indexes")
		values := make([]string, len(picked))
		for i, x := range picked {
			values[i] = Slice{n, uint32(x)}.String()
		}
		m, err := Parse(values)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(m.Values())
		if err != nil || !again.Equal(m) {
			t.Fatalf("Parse(%q) = %v, %v; want %v", m.Values(), again, err, m)
		}
		for i := 0; i < 30; i++ {
			tp := genTopic(t, "topic")
			want := false
			for _, x := range picked {
				want = want || (Slice{n, uint32(x)}).Contains(tp)
			}
			if m.Match(tp) != want {
				t.Fatalf("Match(%q) = %v for slices %v of %d", tp, !want, picked, n)
			}
		}
	})
}

func TestMatchDoesNotAllocate(t *testing.T) {
	m, err := Parse([]string{"topic_hash(16, 3)", "topic_hash(16, 9)"})
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { m.Match("site/a/pump-3/flow") }); n != 0 {
		t.Errorf("Match allocates %v times per call", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	m, err := Parse([]string{"topic_hash(16, 3)", "topic_hash(16, 9)"})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		m.Match("site/1234/pump-3/telemetry/flow")
	}
}
