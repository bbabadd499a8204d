//go:build saguinfaults

package faults

import (
	"slices"
	"strings"
	"testing"
)

// Run with: go test -tags saguinfaults ./internal/faults/ (the chaos
// harness's negative controls run this build end to end).

func env(v string) func(string) string {
	return func(k string) string {
		if k == Env {
			return v
		}
		return ""
	}
}

func TestFaultBuildMapsEveryName(t *testing.T) {
	if !Compiled {
		t.Fatal("the saguinfaults build reports fault injection not compiled in")
	}
	s, err := FromEnv(env(" next-offset-max-plus-one, split-dead-letter,crash-between-dead-letter-halves,sqlite-sync-off,panic-on-packet "))
	if err != nil {
		t.Fatal(err)
	}
	f := s.SQLite
	if !slices.Equal(s.Names, names) || f == nil || !f.NextOffsetFromMaxPlusOne || !f.SplitDeadLetter ||
		f.BetweenDeadLetterHalves == nil || !f.SyncOff || f.InReliefWrite != nil || s.PanicTopic != PanicTopic {
		t.Fatalf("FromEnv = %+v (sqlite %+v)", s, f)
	}
	one, err := FromEnv(env("split-dead-letter"))
	if err != nil || !one.SQLite.SplitDeadLetter || one.SQLite.BetweenDeadLetterHalves != nil || one.SQLite.SyncOff || one.PanicTopic != "" {
		t.Fatalf("only split-dead-letter: %+v %v", one.SQLite, err)
	}
	none, err := FromEnv(env(""))
	if err != nil || none.Active() || none.SQLite != nil {
		t.Fatalf("unset: %+v %v", none, err)
	}
}

func TestFaultBuildRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, v := range []string{"sqlite-sync-of", "split-dead-letter,split-dead-letter"} {
		if _, err := FromEnv(env(v)); err == nil || !strings.Contains(err.Error(), Env) {
			t.Errorf("%q: err = %v, want a refusal naming %s", v, err, Env)
		}
	}
}
