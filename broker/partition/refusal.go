package partition

import (
	"fmt"
	"strings"
)

// ReasonCode is the SUBACK code for every refusal in this package: rfcs/partition.md and "Where it applies" make each of them
// 0x83 (Implementation specific error).
const ReasonCode byte = 0x83

// Refusal names one rule a saguin-filter declaration broke. Each has one
// fixed sentence, which the broker sends as the SUBACK Reason String: the
// person who must act on it is the author of the refused client, who cannot
// read the broker's log (rfcs/partition.md).
type Refusal uint8

// The refusals docs/channels.md lists, in its order, then the two bounds this
// package adds (invariant 13) and the two filter forms the declaration is
// refused on ("Where it applies").
const (
	// RefusedNotACall: the value is not name(arguments).
	RefusedNotACall Refusal = iota + 1
	// RefusedUnknownFunction: a call to anything but topic_hash, spelled exactly.
	RefusedUnknownFunction
	// RefusedArgumentCount: topic_hash with other than two arguments.
	RefusedArgumentCount
	// RefusedArgumentNotDigits: an argument that is not one or more of 0-9.
	RefusedArgumentNotDigits
	// RefusedArgumentTooLarge: an argument above 2147483647.
	RefusedArgumentTooLarge
	// RefusedZeroPartitions: a partition count of 0.
	RefusedZeroPartitions
	// RefusedIndexOutOfRange: an index at or above the partition count.
	RefusedIndexOutOfRange
	// RefusedMixedPartitions: two calls on one SUBSCRIBE naming different counts.
	RefusedMixedPartitions
	// RefusedEmpty: an empty value (or one of whitespace alone).
	RefusedEmpty
	// RefusedValueTooLong: a value longer than MaxValueLength bytes.
	RefusedValueTooLong
	// RefusedTooManyDeclarations: more than MaxDeclarations saguin-filter
	// properties on one SUBSCRIBE.
	RefusedTooManyDeclarations
	// RefusedSharedSubscription: a declaration on a $share/ filter.
	RefusedSharedSubscription
	// RefusedQueueSubscription: a declaration on a $saguin/queue/ filter.
	RefusedQueueSubscription
)

// form is stated in every sentence about the value's shape: docs/channels.md asks
// the reason to name the property and state the form.
const form = "topic_hash(<partitions>, <index>)"

// Sentence is the refusal's Reason String. The sentences are fixed text, so
// they never echo client bytes back and stay well under any Maximum Packet
// Size a client could set; the value at fault is in Error.Error, for the log.
func (r Refusal) Sentence() string {
	switch r {
	case RefusedNotACall:
		return "The saguin-filter value is not a function call; a slice is declared as " + form + "."
	case RefusedUnknownFunction:
		return "The saguin-filter value calls a function Sagüin does not have; the only one is topic_hash, spelled exactly, as " + form + "."
	case RefusedArgumentCount:
		return "The saguin-filter value gives topic_hash the wrong number of arguments; it takes two, as " + form + "."
	case RefusedArgumentNotDigits:
		return "A saguin-filter argument is not a number: write decimal digits 0-9 only, with no sign, 0x or exponent, as " + form + "."
	case RefusedArgumentTooLarge:
		return "A saguin-filter argument is above the bound of 2147483647; both arguments of " + form + " are at most 2147483647."
	case RefusedZeroPartitions:
		return "The saguin-filter partition count is 0; in " + form + " the count is at least 1."
	case RefusedIndexOutOfRange:
		return "The saguin-filter index is at or above the partition count; in " + form + " the count comes first and the index runs from 0 to partitions - 1."
	case RefusedMixedPartitions:
		return "The saguin-filter properties on this SUBSCRIBE name different partition counts; every " + form + " on one SUBSCRIBE names the same count."
	case RefusedEmpty:
		return "The saguin-filter value is empty; a slice is declared as " + form + ", and declaring nothing receives everything."
	case RefusedValueTooLong:
		return "The saguin-filter value is longer than 128 bytes; a slice is declared as " + form + "."
	case RefusedTooManyDeclarations:
		return "This SUBSCRIBE carries more than 256 saguin-filter properties; declare at most 256 slices of " + form + " on one SUBSCRIBE."
	case RefusedSharedSubscription:
		return "saguin-filter is refused on a $share/ subscription: a shared subscription already divides its stream between its members."
	case RefusedQueueSubscription:
		return "saguin-filter is refused on a $saguin/queue/ subscription: a queue already divides its work between its workers."
	}
	return fmt.Sprintf("saguin-filter refusal %d", uint8(r))
}

func (r Refusal) String() string { return r.Sentence() }

// maxQuotedValue bounds how much of a refused value Error.Error repeats, so
// a log line stays one line whatever the client sent.
const maxQuotedValue = 64

// Error is a refused declaration. Refusal decides the Reason String; the
// rest is context for the broker's log, never for the wire.
type Error struct {
	Refusal Refusal
	// Declaration is the 0-based position of the saguin-filter property at
	// fault among those on the SUBSCRIBE, or -1 when the refusal is about the
	// packet (too many properties) or the filter rather than one value.
	Declaration int
	// Value is the refused value, cut to 64 bytes; or the filter, for the
	// two filter-form refusals.
	Value string
}

// Reason is the SUBACK Reason String for this refusal.
func (e *Error) Reason() string { return e.Refusal.Sentence() }

// Code is the SUBACK reason code, 0x83 for every refusal.
func (e *Error) Code() byte { return ReasonCode }

func (e *Error) Error() string {
	switch {
	case e.Refusal == RefusedSharedSubscription || e.Refusal == RefusedQueueSubscription:
		return fmt.Sprintf("filter %q: %s", e.Value, e.Reason())
	case e.Declaration < 0:
		return e.Reason()
	default:
		return fmt.Sprintf("saguin-filter #%d %q: %s", e.Declaration+1, e.Value, e.Reason())
	}
}

// Is makes errors.Is(err, &Error{Refusal: r}) test for the refusal alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Refusal == e.Refusal
}

func refuse(r Refusal, declaration int, value string) *Error {
	if len(value) > maxQuotedValue {
		value = strings.ToValidUTF8(value[:maxQuotedValue], "") + "..."
	}
	return &Error{Refusal: r, Declaration: declaration, Value: value}
}

// The two subscription forms a declaration is refused on. They are compared
// as strings, never by asking what the filter reaches (docs/channels.md "Where it
// applies"), and exactly as the broker recognises them: only the lower-case
// $share/ is a shared subscription ($SHARE/ is refused elsewhere as a
// malformed filter, docs/security.md "Every refusal, and its code").
const (
	SharePrefix = "$share/"
	QueuePrefix = "$saguin/queue/"
)

// CheckFilter reports whether a declaration may apply to filter: nil, or the
// refusal for a shared subscription or a queue's subscription form. The
// broker refuses only that filter of the SUBSCRIBE (docs/security.md "Every refusal, and its code"); a
// malformed declaration, in contrast, refuses every filter in the packet.
func CheckFilter(filter string) error {
	switch {
	case strings.HasPrefix(filter, SharePrefix):
		return refuse(RefusedSharedSubscription, -1, filter)
	case strings.HasPrefix(filter, QueuePrefix):
		return refuse(RefusedQueueSubscription, -1, filter)
	}
	return nil
}
