// Package faults lets a fault-injection build of saguin break itself on
// purpose, for the chaos harness's negative controls (issue: "a check that
// cannot fail is a defect"; rfcs/chaos-harness.md).
//
// Built with the tag saguinfaults, FromEnv reads SAGUIN_FAULTS — a
// comma-separated list of the names below — and returns the storage switches
// the daemon hands to the providers it opens. Built without it (every
// production binary), FromEnv reads nothing and returns nothing: no variable
// can break a real broker, because the code that would is not compiled in.
//
//	next-offset-max-plus-one           sqlite: a channel's next offset is
//	                                   MAX(offset)+1 over surviving rows at open
//	                                   (invariant 9's restart bug)
//	split-dead-letter                  sqlite: the dead-letter move is two
//	                                   transactions (invariant 5)
//	crash-between-dead-letter-halves   the process dies (exit 137, as kill -9)
//	                                   between the halves of its first
//	                                   dead-letter move: after the first
//	                                   commit with split-dead-letter, inside
//	                                   the one transaction without it
//	sqlite-sync-off                    sqlite: synchronous=OFF and no WAL
//	                                   fsync, so nothing is ever durable
//	                                   (invariant 14's power-cut promise)
//	panic-on-packet                    handling a PUBLISH to PanicTopic, or
//	                                   a SUBSCRIBE or UNSUBSCRIBE naming it,
//	                                   panics on that connection's goroutine
//	                                   (issue 12: such a panic ends that
//	                                   connection, never the broker)
package faults

import "saguin.dev/storage/sqlite"

// Env is the variable a fault-injection build reads.
const Env = "SAGUIN_FAULTS"

// Set is what a fault-injection build was told to break.
type Set struct {
	// Names are the faults switched on, as Env named them.
	Names []string
	// SQLite is handed to every sqlite provider (nil: none).
	SQLite *sqlite.Faults
	// PanicTopic is handed to the broker (broker.Options.PanicTopic):
	// empty unless panic-on-packet is named.
	PanicTopic string
}

// PanicTopic is the topic panic-on-packet makes the broker panic on.
const PanicTopic = "saguin-fault/panic"

// Active reports whether anything is broken.
func (s Set) Active() bool { return len(s.Names) > 0 }
