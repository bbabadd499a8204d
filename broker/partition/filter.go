package partition

import (
	"slices"
	"strconv"
	"strings"
)

const (
	// PropertyName is the SUBSCRIBE User Property that declares a slice.
	PropertyName = "saguin-filter"
	// FunctionName is the only function a declaration may call, spelled
	// exactly: TOPIC_HASH is not it, as $SHARE is not a shared subscription.
	FunctionName = "topic_hash"
	// MaxPartitions bounds both arguments. It is a number every build agrees
	// on, 32-bit gateways included, so one SUBSCRIBE is never legal on one
	// broker and refused on another (rfcs/partition.md).
	MaxPartitions = 2147483647
	// MaxDeclarations bounds the saguin-filter properties on one SUBSCRIBE
	// (invariant 13), checked before each is parsed or stored. A member
	// covering failed peers' shares repeats the property once per slice;
	// 256 slices is far past any group a client coordinates by hand.
	MaxDeclarations = 256
	// MaxValueLength bounds one value in bytes (invariant 13), checked before
	// it is read. The longest canonical value, topic_hash(2147483647,
	// 2147483646), is 34 bytes; the rest is room for whitespace and the
	// leading zeros the RFC lets a client write.
	MaxValueLength = 128
)

// Slice is one declared slice: the topics whose topic_hash mod Partitions is
// Index. Partitions is 1 to MaxPartitions and Index below it.
type Slice struct {
	Partitions uint32
	Index      uint32
}

// Contains reports whether topic falls in the slice.
func (s Slice) Contains(topic string) bool {
	return SliceOf(topic, s.Partitions) == s.Index
}

// String is the canonical saguin-filter value declaring the slice; it parses
// back to s.
func (s Slice) String() string {
	b := make([]byte, 0, 34)
	b = append(b, FunctionName...)
	b = append(b, '(')
	b = strconv.AppendUint(b, uint64(s.Partitions), 10)
	b = append(b, ", "...)
	b = strconv.AppendUint(b, uint64(s.Index), 10)
	b = append(b, ')')
	return string(b)
}

// ParseSlice parses one saguin-filter value. The grammar (docs/channels.md "What a
// subscriber may declare") is
//
//	topic_hash(<partitions>, <index>)
//
// where each argument is one or more ASCII decimal digits - no sign, no 0x,
// no exponent, leading zeros meaning what they say - and whitespace, which is
// the ASCII four (space, tab, line feed, carriage return) and nothing else,
// is ignored around the name, the parentheses and the comma. Nothing else is
// ignored. A refusal is an *Error whose Reason is the SUBACK Reason String.
func ParseSlice(value string) (Slice, error) {
	s, err := parseSlice(value, 0)
	if err != nil {
		return Slice{}, err
	}
	return s, nil
}

// isSpace is the RFC's "ASCII four". A non-breaking space, or any other
// Unicode space, is not one: a value one broker trims and another does not
// is a value the two answer differently.
func isSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r'
}

func trimSpace(s string) string {
	i, j := 0, len(s)
	for i < j && isSpace(s[i]) {
		i++
	}
	for j > i && isSpace(s[j-1]) {
		j--
	}
	return s[i:j]
}

func parseSlice(value string, decl int) (Slice, *Error) {
	// Invariant 13: the length is judged before a byte of the value is read.
	if len(value) > MaxValueLength {
		return Slice{}, refuse(RefusedValueTooLong, decl, value)
	}
	s := trimSpace(value)
	if s == "" {
		// Refused rather than ignored: a client that asked for a slice and
		// was served everything would have no way to notice.
		return Slice{}, refuse(RefusedEmpty, decl, value)
	}
	// A call is <name>(<arguments>): one opening parenthesis after a
	// non-empty name, the value ending with the closing one, and no other
	// parenthesis, so an expression of calls is not a call either.
	open := strings.IndexByte(s, '(')
	if open < 0 || s[len(s)-1] != ')' {
		return Slice{}, refuse(RefusedNotACall, decl, value)
	}
	name, args := trimSpace(s[:open]), s[open+1:len(s)-1]
	if name == "" || strings.ContainsAny(name, " \t\n\r(),") || strings.ContainsAny(args, "()") {
		return Slice{}, refuse(RefusedNotACall, decl, value)
	}
	if name != FunctionName {
		return Slice{}, refuse(RefusedUnknownFunction, decl, value)
	}
	comma := strings.IndexByte(args, ',')
	if trimSpace(args) == "" || comma < 0 || strings.IndexByte(args[comma+1:], ',') >= 0 {
		return Slice{}, refuse(RefusedArgumentCount, decl, value)
	}
	// Arguments are judged in order, each for its spelling and then its
	// bound: "not a number" and "too large" are different sentences because
	// they send a reader looking in different places.
	partitions, r := parseArgument(args[:comma])
	if r != 0 {
		return Slice{}, refuse(r, decl, value)
	}
	index, r := parseArgument(args[comma+1:])
	if r != 0 {
		return Slice{}, refuse(r, decl, value)
	}
	if partitions == 0 {
		return Slice{}, refuse(RefusedZeroPartitions, decl, value)
	}
	// Positional arguments cannot be swapped silently: every valid pair has
	// index < partitions, so its swap is refused here.
	if index >= partitions {
		return Slice{}, refuse(RefusedIndexOutOfRange, decl, value)
	}
	return Slice{Partitions: partitions, Index: index}, nil
}

// parseArgument reads one argument: ASCII digits only, at most MaxPartitions.
func parseArgument(a string) (uint32, Refusal) {
	a = trimSpace(a)
	if a == "" {
		return 0, RefusedArgumentNotDigits
	}
	for i := 0; i < len(a); i++ {
		if a[i] < '0' || a[i] > '9' {
			return 0, RefusedArgumentNotDigits
		}
	}
	// Leading zeros mean what they say: 007 is 7.
	a = strings.TrimLeft(a, "0")
	if len(a) > len("2147483647") {
		return 0, RefusedArgumentTooLarge
	}
	var n uint64
	for i := 0; i < len(a); i++ {
		n = n*10 + uint64(a[i]-'0')
	}
	if n > MaxPartitions {
		return 0, RefusedArgumentTooLarge
	}
	return uint32(n), 0
}

// Declaration accumulates the saguin-filter values of one SUBSCRIBE, in the
// order they appear, so the broker can feed it straight from the packet's
// User Properties without collecting them first. The zero value is ready.
type Declaration struct {
	n          int
	partitions uint32
	indexes    []uint32
}

// Add parses the next saguin-filter value. The first refusal is final: the
// broker refuses every filter of the packet (docs/security.md "Every refusal, and its code"), so there is
// nothing to gain from reading further.
func (d *Declaration) Add(value string) error {
	// Invariant 13: the count is judged before the value is parsed or kept.
	if d.n >= MaxDeclarations {
		return refuse(RefusedTooManyDeclarations, -1, "")
	}
	s, err := parseSlice(value, d.n)
	if err != nil {
		return err
	}
	// One subscription has one partition space: it is what the operations
	// listener reports and what the broker compares between subscribers.
	if d.n > 0 && s.Partitions != d.partitions {
		return refuse(RefusedMixedPartitions, d.n, value)
	}
	d.n++
	d.partitions = s.Partitions
	d.indexes = append(d.indexes, s.Index)
	return nil
}

// Matcher compiles what was added. With nothing added it is the zero
// Matcher, which matches everything.
func (d *Declaration) Matcher() Matcher {
	if d.n == 0 {
		return Matcher{}
	}
	idx := slices.Clone(d.indexes)
	slices.Sort(idx)
	// Asking twice for one slice means what it says and is not an error.
	idx = slices.Clip(slices.Compact(idx))
	return Matcher{partitions: d.partitions, indexes: idx}
}

// Parse compiles every saguin-filter value of one SUBSCRIBE, in packet
// order; repeated values are an OR of their slices. No values is no
// declaration, and the zero Matcher: everything (docs/channels.md "Declare nothing
// and you get everything").
func Parse(values []string) (Matcher, error) {
	if len(values) > MaxDeclarations {
		return Matcher{}, refuse(RefusedTooManyDeclarations, -1, "")
	}
	var d Declaration
	for _, v := range values {
		if err := d.Add(v); err != nil {
			return Matcher{}, err
		}
	}
	return d.Matcher(), nil
}

// Matcher is a compiled declaration: the OR of its slices, all of one
// partition space. The zero Matcher is "no declaration" and matches every
// topic. A Matcher is immutable, so one value is shared by every delivery
// path of a subscription - live traffic, replay, a latest channel's
// current-state pass and the retained handover alike, which docs/channels.md "Where
// it applies" requires to agree.
type Matcher struct {
	partitions uint32
	indexes    []uint32 // sorted, distinct, each < partitions
}

// Declared reports whether the subscription declared any slice.
func (m Matcher) Declared() bool { return m.partitions != 0 }

// Partitions is the declared partition count, 0 when nothing was declared.
// It is what the operations listener reports and what two subscribers on
// one filter are compared by (rfcs/partition.md).
func (m Matcher) Partitions() uint32 { return m.partitions }

// Indexes returns the declared slice indexes, sorted and distinct.
func (m Matcher) Indexes() []uint32 { return slices.Clone(m.indexes) }

// Slices returns the declared slices, sorted by index.
func (m Matcher) Slices() []Slice {
	out := make([]Slice, len(m.indexes))
	for i, x := range m.indexes {
		out[i] = Slice{Partitions: m.partitions, Index: x}
	}
	return out
}

// Match reports whether topic is in one of the declared slices; with no
// declaration, every topic is. It does not allocate.
func (m Matcher) Match(topic string) bool {
	if m.partitions == 0 {
		return true
	}
	_, found := slices.BinarySearch(m.indexes, SliceOf(topic, m.partitions))
	return found
}

// Values returns the canonical saguin-filter values declaring the same
// slices; Parse(m.Values()) equals m.
func (m Matcher) Values() []string {
	out := make([]string, len(m.indexes))
	for i, s := range m.Slices() {
		out[i] = s.String()
	}
	return out
}

// Equal reports whether two matchers declare the same slices.
func (m Matcher) Equal(o Matcher) bool {
	return m.partitions == o.partitions && slices.Equal(m.indexes, o.indexes)
}

// String describes the declaration for logs: "everything", or its values
// joined by " OR ".
func (m Matcher) String() string {
	if !m.Declared() {
		return "everything"
	}
	return strings.Join(m.Values(), " OR ")
}
