// Package topic holds the MQTT topic and filter primitives every part of the
// broker uses: validity, matching, overlap and containment of filters, the
// configuration's brace expansion, the dead-letter rewriting of docs/channels.md "The dead-letter channel",
// and the Resolver that decides which channel holds a topic (invariant 12).
//
// Everything here is pure and allocation-light; a Resolver is immutable once
// built, so one value is shared by every publishing goroutine without locks.
package topic

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

const (
	// Separator divides levels.
	Separator = "/"
	// SingleLevel matches exactly one level.
	SingleLevel = "+"
	// MultiLevel matches any number of levels, zero included; last level only.
	MultiLevel = "#"
	// DeadLetterLevel is the level docs/channels.md "The dead-letter channel" inserts into a queue's
	// filter and topics to derive its dead-letter channel.
	DeadLetterLevel = "__dlq"
	// MaxLength is the longest topic or filter MQTT can carry (a UTF-8
	// string with a two-byte length).
	MaxLength = 65535
)

// Levels counts the levels of a topic or filter: the number of separators
// plus one (docs/configuration.md "`broker.limits`" max_topic_levels). "a//b" has three levels, the
// middle one empty.
func Levels(s string) int {
	return strings.Count(s, Separator) + 1
}

// Split returns the levels of a topic or filter.
func Split(s string) []string {
	return strings.Split(s, Separator)
}

// ValidTopic reports whether t may be published to: non-empty, within
// MQTT's length, valid UTF-8, no NUL and no wildcard character.
func ValidTopic(t string) error {
	if err := validString(t, "topic"); err != nil {
		return err
	}
	if i := strings.IndexAny(t, "+#"); i >= 0 {
		return fmt.Errorf("level %d %q holds a wildcard (%c); a topic names one place and holds no + or #",
			levelIndex(t, i)+1, levelAt(t, i), t[i])
	}
	return nil
}

// ValidFilter reports whether f is a well-formed MQTT filter: + and # each
// stand for a whole level, # only as the last level, no NUL, valid UTF-8.
// The error names the level at fault.
func ValidFilter(f string) error {
	if err := validString(f, "filter"); err != nil {
		return err
	}
	n := Levels(f)
	i := 0
	for pos := 0; pos <= len(f); i++ {
		end := levelEnd(f, pos)
		lvl := f[pos:end]
		if strings.ContainsRune(lvl, '#') {
			if lvl != MultiLevel {
				return fmt.Errorf("level %d %q mixes # with other characters; # stands for a whole level", i+1, lvl)
			}
			if i != n-1 {
				return fmt.Errorf("# is level %d of %d; # may only be the last level", i+1, n)
			}
		}
		if strings.ContainsRune(lvl, '+') && lvl != SingleLevel {
			return fmt.Errorf("level %d %q mixes + with other characters; + stands for a whole level", i+1, lvl)
		}
		pos = end + 1
	}
	return nil
}

func validString(s, what string) error {
	switch {
	case s == "":
		return fmt.Errorf("an empty %s is not allowed; a %s is at least one character long", what, what)
	case len(s) > MaxLength:
		return fmt.Errorf("the %s is %d bytes long; MQTT carries at most %d", what, len(s), MaxLength)
	case !utf8.ValidString(s):
		return fmt.Errorf("the %s is not valid UTF-8", what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("the %s contains a NUL character, which MQTT forbids", what)
	}
	return nil
}

// levelEnd returns the index of the separator ending the level starting at
// pos, or len(s) for the last level.
func levelEnd(s string, pos int) int {
	if i := strings.IndexByte(s[pos:], '/'); i >= 0 {
		return pos + i
	}
	return len(s)
}

func levelIndex(s string, at int) int { return strings.Count(s[:at], Separator) }

func levelAt(s string, at int) string {
	start := strings.LastIndexByte(s[:at], '/') + 1
	return s[start:levelEnd(s, at)]
}

// isWild reports whether a filter level is a wildcard.
func isWild(lvl string) bool { return lvl == SingleLevel || lvl == MultiLevel }

// Match reports whether the valid filter matches the valid topic under MQTT's
// rules: + matches one level, # matches the remaining levels including none
// (so "a/#" matches "a"), and a filter whose first level is a wildcard never
// matches a topic beginning with '$' (MQTT-4.7.2-1). It does not allocate.
func Match(filter, topic string) bool {
	if filter == "" || topic == "" {
		return false
	}
	if topic[0] == '$' && (filter[0] == '+' || filter[0] == '#') {
		return false
	}
	fp, tp := 0, 0
	for {
		fe := levelEnd(filter, fp)
		fl := filter[fp:fe]
		if fl == MultiLevel {
			return true
		}
		te := levelEnd(topic, tp)
		if fl != SingleLevel && fl != topic[tp:te] {
			return false
		}
		fLast, tLast := fe == len(filter), te == len(topic)
		switch {
		case fLast && tLast:
			return true
		case tLast:
			// The topic has ended; only a trailing "#" (zero levels) still matches.
			return filter[fe+1:] == MultiLevel
		case fLast:
			return false
		}
		fp, tp = fe+1, te+1
	}
}

// Overlap reports whether some topic matches both valid filters.
func Overlap(a, b string) bool {
	la, lb := Split(a), Split(b)
	// MQTT-4.7.2-1: a topic beginning with '$' is matched only by filters whose
	// first level is spelled out, so a leading wildcard meets a '$' literal nowhere.
	if dollarBlocked(la[0], lb[0]) || dollarBlocked(lb[0], la[0]) {
		return false
	}
	for i := 0; ; i++ {
		if i == len(la) || i == len(lb) {
			// Both filters accept a topic of exactly i levels, and nothing
			// longer is common. With i = 1 and a first level forced empty
			// that topic would be "", which is no topic.
			if i == 1 && (la[0] == "" || lb[0] == "") {
				return false
			}
			switch {
			case i == len(la) && i == len(lb):
				return true
			case i == len(la):
				return lb[i] == MultiLevel
			default:
				return la[i] == MultiLevel
			}
		}
		x, y := la[i], lb[i]
		if x == MultiLevel || y == MultiLevel {
			return true
		}
		if x != SingleLevel && y != SingleLevel && x != y {
			return false
		}
	}
}

func dollarBlocked(wild, lit string) bool {
	return isWild(wild) && !isWild(lit) && strings.HasPrefix(lit, "$")
}

// Inside reports whether every topic the valid filter inner matches is also
// matched by the valid filter outer.
func Inside(inner, outer string) bool {
	li, lo := Split(inner), Split(outer)
	// "" is no topic, so "#" matches exactly what "+/#" does and "/#" what
	// "/+/#" does; spelled that way they compare correctly level by level.
	switch inner {
	case MultiLevel:
		li = []string{SingleLevel, MultiLevel}
	case Separator + MultiLevel:
		li = []string{"", SingleLevel, MultiLevel}
	}
	if isWild(lo[0]) && !isWild(li[0]) && strings.HasPrefix(li[0], "$") {
		// inner matches '$' topics, which a leading wildcard never does.
		return false
	}
	for i := 0; ; i++ {
		switch {
		case i == len(li) && i == len(lo):
			return true
		case i == len(li):
			// inner's topics end here; outer must accept ending here.
			return lo[i] == MultiLevel
		case i == len(lo):
			return false
		}
		x, y := li[i], lo[i]
		switch {
		case y == MultiLevel:
			return true
		case x == MultiLevel:
			// inner takes any tail, zero levels included; only # does too.
			return false
		case y == SingleLevel:
			continue
		case x == SingleLevel || x != y:
			return false
		}
	}
}

// ErrNoMatch is returned by DeadLetterTopic for a topic the queue's filter
// does not match.
var ErrNoMatch = errors.New("topic does not match the filter")

// DeadLetterFilter derives a dead-letter channel's filter from its queue's
// (docs/channels.md "The dead-letter channel"): the level "__dlq" goes where the filter has "#", or is
// appended when it has none. "jobs/#" becomes "jobs/__dlq/#"; "iot/+/inspect"
// becomes "iot/+/inspect/__dlq".
func DeadLetterFilter(queueFilter string) string {
	if queueFilter == MultiLevel {
		return DeadLetterLevel + Separator + MultiLevel
	}
	if strings.HasSuffix(queueFilter, Separator+MultiLevel) {
		return queueFilter[:len(queueFilter)-1] + DeadLetterLevel + Separator + MultiLevel
	}
	return queueFilter + Separator + DeadLetterLevel
}

// DeadLetterTopic rewrites a queue record's topic the way DeadLetterFilter
// rewrites the filter, so + captures keep their values: with filter
// "iot/+/inspect", "iot/w-7/inspect" becomes "iot/w-7/inspect/__dlq"; with
// "jobs/#", "jobs/a/b" becomes "jobs/__dlq/a/b" (and "jobs" "jobs/__dlq").
// The result therefore matches DeadLetterFilter(queueFilter).
func DeadLetterTopic(queueFilter, topic string) (string, error) {
	if !Match(queueFilter, topic) {
		return "", fmt.Errorf("dead letter of %q under queue filter %q: %w", topic, queueFilter, ErrNoMatch)
	}
	if !strings.HasSuffix(queueFilter, MultiLevel) {
		return topic + Separator + DeadLetterLevel, nil
	}
	// The "#" is level k (0-based); the topic's first k levels are the
	// prefix the filter spelled out, the rest is what "#" captured.
	k := Levels(queueFilter) - 1
	pos := 0
	for i := 0; i < k; i++ {
		pos = levelEnd(topic, pos) + 1
	}
	if pos > len(topic) {
		// "#" captured zero levels: the topic is exactly the prefix.
		return topic + Separator + DeadLetterLevel, nil
	}
	return topic[:pos] + DeadLetterLevel + Separator + topic[pos:], nil
}
