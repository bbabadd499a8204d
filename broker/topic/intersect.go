package topic

import "strings"

// Intersect returns a filter matching exactly the topics both valid filters
// match, and ok=false when no topic matches both. Two MQTT filters always
// meet in one filter: level by level, a literal meets only itself or +,
// + meets anything and keeps the other side, and # takes the other side's
// remaining levels (zero of them included, so "a/#" and "a" meet in "a").
//
// The ACL asks it whether a subscription's part of a channel lies inside a
// narrowing rule (docs/configuration.md "The ACL file"): what a filter reaches of a channel is
// the intersection of the two filters.
func Intersect(a, b string) (string, bool) {
	la, lb := Split(a), Split(b)
	// MQTT-4.7.2-1: a leading wildcard never matches a '$' topic.
	if dollarBlocked(la[0], lb[0]) || dollarBlocked(lb[0], la[0]) {
		return "", false
	}
	out := make([]string, 0, max(len(la), len(lb)))
	for i := 0; ; i++ {
		switch {
		case i == len(la) && i == len(lb):
			return joinTopic(out)
		case i == len(la):
			// a's topics end here; b must accept ending here.
			if lb[i] != MultiLevel {
				return "", false
			}
			return joinTopic(out)
		case i == len(lb):
			if la[i] != MultiLevel {
				return "", false
			}
			return joinTopic(out)
		}
		x, y := la[i], lb[i]
		switch {
		case x == MultiLevel:
			return joinTopic(append(out, lb[i:]...))
		case y == MultiLevel:
			return joinTopic(append(out, la[i:]...))
		case x == SingleLevel:
			out = append(out, y)
		case y == SingleLevel || x == y:
			out = append(out, x)
		default:
			return "", false
		}
	}
}

// joinTopic joins levels into a filter; a single empty level would be the
// empty string, which is no topic and no filter.
func joinTopic(levels []string) (string, bool) {
	if len(levels) == 1 && levels[0] == "" {
		return "", false
	}
	return strings.Join(levels, Separator), true
}
