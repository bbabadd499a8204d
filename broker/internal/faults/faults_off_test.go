//go:build !saguinfaults

package faults

import "testing"

// A production build cannot be broken through the environment: the
// variable is not read, and no storage switch comes back.
func TestProductionBuildIgnoresTheVariable(t *testing.T) {
	if Compiled {
		t.Fatal("a build without the saguinfaults tag reports fault injection compiled in")
	}
	read := false
	s, err := FromEnv(func(k string) string {
		read = true
		return "next-offset-max-plus-one,split-dead-letter,crash-between-dead-letter-halves,sqlite-sync-off,panic-on-packet"
	})
	if err != nil || s.Active() || s.SQLite != nil || s.PanicTopic != "" || read {
		t.Fatalf("FromEnv = %+v, %v (variable read: %v); want nothing, unread", s, err, read)
	}
}
