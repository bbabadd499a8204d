package msgid

import (
	"regexp"
	"testing"
	"time"
)

var uuidV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestIDsAreVersion7AndIncreaseWithinAMillisecond(t *testing.T) {
	var g Generator
	now := time.UnixMilli(1_780_000_000_000)
	prev := ""
	for i := 0; i < 10000; i++ { // more than 4096: crosses the counter's spill
		id := g.New(now)
		if !uuidV7.MatchString(id) {
			t.Fatalf("id %q is not a UUIDv7", id)
		}
		if id <= prev {
			t.Fatalf("id %d %q does not sort after %q", i, id, prev)
		}
		prev = id
	}
}

func TestIDsKeepIncreasingWhenTheClockStepsBack(t *testing.T) {
	var g Generator
	a := g.New(time.UnixMilli(2_000_000))
	b := g.New(time.UnixMilli(1_000_000))
	if b <= a {
		t.Fatalf("after a clock step back %q does not sort after %q", b, a)
	}
}
