package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  string
	}{
		{in: "0s", want: 0},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "30s", want: 30 * time.Second},
		{in: "90m", want: 90 * time.Minute},
		{in: "12h", want: 12 * time.Hour},
		{in: "30d", want: 30 * 24 * time.Hour},
		{in: "007s", want: 7 * time.Second},
		{in: "106751d", want: 106751 * 24 * time.Hour},
		{in: "", bad: "empty"},
		{in: "30", bad: "30 has no unit; write 30s, 30m"},
		{in: "1h30m", bad: "exactly one unit; write 90m rather than 1h30m"},
		{in: "1.5h", bad: "whole numbers only; write 90m"},
		{in: "0.5s", bad: "write 500ms"},
		{in: "2.5d", bad: "write 60h"},
		{in: "-5s", bad: "cannot be negative"},
		{in: "+5s", bad: "without a sign"},
		{in: "5 s", bad: "right after the number"},
		{in: "5us", bad: `unknown unit "us"`},
		{in: "5S", bad: `unknown unit "S"`},
		{in: "s", bad: "a whole number and one unit"},
		{in: "none", bad: "a whole number and one unit"},
		{in: "106752d", bad: "too long"},
		{in: "99999999999999999999s", bad: "too long"},
	} {
		got, err := ParseDuration(tc.in)
		switch {
		case tc.bad == "" && (err != nil || got != tc.want):
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("ParseDuration(%q) error = %v; want one containing %q", tc.in, err, tc.bad)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512B", want: 512},
		{in: "8KiB", want: 8 << 10},
		{in: "64MiB", want: 64 << 20},
		{in: "20GiB", want: 20 << 30},
		{in: "2TiB", want: 2 << 40},
		{in: "8388607TiB", want: 8388607 << 40},
		{in: "", bad: "empty"},
		{in: "64MB", bad: "binary units; write 64MiB (64 × 2^20 bytes)"},
		{in: "1GB", bad: "write 1GiB"},
		{in: "8K", bad: "write 8KiB"},
		{in: "64mib", bad: "case-sensitive; write 64MiB"},
		{in: "1.5GiB", bad: "whole numbers only; write 1536MiB"},
		{in: "0.5KiB", bad: "write 512B"},
		{in: "1GiB512MiB", bad: "exactly one unit"},
		{in: "-1KiB", bad: "cannot be negative"},
		{in: "64 MiB", bad: "right after the number"},
		{in: "8PiB", bad: `unknown unit "PiB"`},
		{in: "MiB", bad: "a whole number"},
		{in: "8388608TiB", bad: "too large"},
		{in: "99999999999999999999", bad: "too large"},
	} {
		got, err := ParseBytes(tc.in)
		switch {
		case tc.bad == "" && (err != nil || got != tc.want):
			t.Errorf("ParseBytes(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("ParseBytes(%q) error = %v; want one containing %q", tc.in, err, tc.bad)
		}
	}
}

func TestFormatRoundTrips(t *testing.T) {
	for _, n := range []int64{1, 1000, 1024, 2113536, 1 << 20, 3 << 30, 5 << 40} {
		if got, err := ParseBytes(FormatBytes(n)); err != nil || got != n {
			t.Errorf("FormatBytes(%d) = %q parses to %d, %v", n, FormatBytes(n), got, err)
		}
	}
	if FormatBytes(2113536) != "2064KiB" || FormatBytes(1<<20) != "1MiB" || FormatBytes(1000) != "1000B" {
		t.Errorf("FormatBytes spellings: %s %s %s", FormatBytes(2113536), FormatBytes(1<<20), FormatBytes(1000))
	}
	for _, d := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, time.Minute, 90 * time.Minute, 36 * time.Hour, 30 * Day} {
		if got, err := ParseDuration(FormatDuration(d)); err != nil || got != d {
			t.Errorf("FormatDuration(%v) = %q parses to %v, %v", d, FormatDuration(d), got, err)
		}
	}
	if FormatDuration(90*time.Minute) != "90m" || FormatDuration(30*Day) != "30d" {
		t.Errorf("FormatDuration spellings: %s %s", FormatDuration(90*time.Minute), FormatDuration(30*Day))
	}
}

// The grammar is whole number + exactly one unit: anything accepted must
// look like that and must format back to the same value.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"0s", "500ms", "30s", "90m", "12h", "30d", "1h30m", "1.5h", "-5s", "5 s", "", "none",
		"106751d", "106752d", "9223372036854775807ms", "18446744073709551616s", "٣s", "5µs", "0.0s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseDuration(%q): empty error text", s)
			}
			return
		}
		n := leadingDigits(s)
		unit := s[n:]
		if n == 0 || (unit != "ms" && unit != "s" && unit != "m" && unit != "h" && unit != "d") {
			t.Fatalf("ParseDuration(%q) accepted a value outside the grammar: %v", s, d)
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		if back, err := ParseDuration(FormatDuration(d)); err != nil || back != d {
			t.Fatalf("ParseDuration(%q) = %v formats as %q, which parses to %v, %v", s, d, FormatDuration(d), back, err)
		}
	})
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"0", "512B", "8KiB", "64MiB", "20GiB", "2TiB", "64MB", "64mib", "1.5GiB", "-1", "",
		"8388607TiB", "8388608TiB", "9223372036854775807", "9223372036854775808", "1GiB512MiB", "١KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseBytes(%q): empty error text", s)
			}
			return
		}
		d := leadingDigits(s)
		switch unit := s[d:]; {
		case d == 0:
			t.Fatalf("ParseBytes(%q) accepted a value with no number", s)
		case unit != "" && unit != "B" && unit != "KiB" && unit != "MiB" && unit != "GiB" && unit != "TiB":
			t.Fatalf("ParseBytes(%q) accepted unit %q", s, unit)
		}
		if n < 0 {
			t.Fatalf("ParseBytes(%q) = %d, negative", s, n)
		}
		if back, err := ParseBytes(FormatBytes(n)); err != nil || back != n {
			t.Fatalf("ParseBytes(%q) = %d formats as %q, which parses to %d, %v", s, n, FormatBytes(n), back, err)
		}
	})
}
