//go:build saguinfaults

package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"saguin.dev/storage/sqlite"
)

// Compiled reports whether this build can inject faults: this one can.
const Compiled = true

// names lists every fault FromEnv knows, in the order the package comment
// describes them.
var names = []string{"next-offset-max-plus-one", "split-dead-letter", "crash-between-dead-letter-halves", "sqlite-sync-off",
	"panic-on-packet"}

// FromEnv reads Env through getenv. An unknown or repeated name is an
// error, so a control never runs on a broker that is not broken the way it
// believes.
func FromEnv(getenv func(string) string) (Set, error) {
	var s Set
	v := strings.TrimSpace(getenv(Env))
	if v == "" {
		return s, nil
	}
	f := &sqlite.Faults{}
	for part := range strings.SplitSeq(v, ",") {
		name := strings.TrimSpace(part)
		if name == "" {
			continue
		}
		if !slices.Contains(names, name) {
			return Set{}, fmt.Errorf("%s: unknown fault %q (known: %s)", Env, name, strings.Join(names, ", "))
		}
		if slices.Contains(s.Names, name) {
			return Set{}, fmt.Errorf("%s: fault %q named twice", Env, name)
		}
		s.Names = append(s.Names, name)
		switch name {
		case "next-offset-max-plus-one":
			f.NextOffsetFromMaxPlusOne = true
		case "split-dead-letter":
			f.SplitDeadLetter = true
		case "crash-between-dead-letter-halves":
			f.BetweenDeadLetterHalves = crash
		case "sqlite-sync-off":
			f.SyncOff = true
		case "panic-on-packet":
			s.PanicTopic = PanicTopic
		}
	}
	if len(s.Names) > 0 {
		s.SQLite = f
	}
	return s, nil
}

// crash ends the process the way kill -9 would: no deferred function, no
// provider close, no graceful anything. What the first half committed is in
// the WAL, as after a real crash (invariant 14).
func crash() error {
	fmt.Fprintln(os.Stderr, "saguin: fault injection: dying between the halves of a dead-letter move")
	os.Exit(137)
	return nil
}
