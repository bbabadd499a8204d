package broker

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseSeek: a seek payload is client input (docs/channels.md "`append`" "Seek"). Any
// bytes are refused or read as exactly one of the four forms, never a panic
// and never more than 64 bytes read.
func FuzzParseSeek(f *testing.F) {
	for _, s := range []string{"0", "-1", "1", "42", "007", "18446744073709551615", "18446744073709551616",
		"12h", "-90m", "7d", "30s", "0s", "9223372036854775807d", "2026-11-30T00:00:00Z",
		"2026-11-30T00:00:00.5+01:00", "2026-11-30", "", "-2", "1e3", " 1", "T", "h", "-", strings.Repeat("9", 65)} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, p []byte) {
		tgt, err := parseSeek(p, now)
		if err != nil {
			return
		}
		if len(p) == 0 || len(p) > 64 {
			t.Fatalf("accepted a %d-byte payload", len(p))
		}
		s := string(p)
		switch tgt.kind {
		case seekFloor:
			if s != "0" {
				t.Fatalf("%q read as the floor", s)
			}
		case seekHead:
			if s != "-1" {
				t.Fatalf("%q read as the head", s)
			}
		case seekOffset:
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil || n != tgt.offset || n == 0 {
				t.Fatalf("%q read as offset %d", s, tgt.offset)
			}
		case seekTime:
			if _, ago := parseAgo(s); ago {
				if tgt.at.After(now) {
					t.Fatalf("%q, a time ago, read as %s, after now", s, tgt.at)
				}
			} else if !strings.Contains(s, "T") {
				t.Fatalf("%q read as a timestamp without a T", s)
			}
		default:
			t.Fatalf("%q read as kind %d", s, tgt.kind)
		}
	})
}
