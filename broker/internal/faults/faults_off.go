//go:build !saguinfaults

package faults

// Compiled reports whether this build can inject faults: not this one.
const Compiled = false

// FromEnv returns nothing in a production build, whatever the environment
// holds: it does not even read it.
func FromEnv(func(string) string) (Set, error) { return Set{}, nil }
