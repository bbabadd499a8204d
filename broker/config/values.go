package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Day is the "d" duration unit: 24 hours, regardless of calendars.
const Day = 24 * time.Hour

var durationUnits = []struct {
	suffix string
	unit   time.Duration
}{
	{"ms", time.Millisecond},
	{"s", time.Second},
	{"m", time.Minute},
	{"h", time.Hour},
	{"d", Day},
}

// ParseDuration reads a configuration duration: a whole number followed by
// exactly one unit of ms, s, m, h or d (docs/configuration.md "How values are written"), such as "90m" or
// "30d". "1h30m", "1.5h", "-5s", "30" and "30 s" are refused, each with an
// error saying what to write. "none" is not a duration; keys that accept it
// check for it before calling this.
func ParseDuration(s string) (time.Duration, error) {
	digits := leadingDigits(s)
	unitText := s[digits:]
	if digits == 0 {
		switch {
		case s == "":
			return 0, errors.New("empty; a duration is a whole number and one unit (ms, s, m, h or d), like 30s")
		case s[0] == '-':
			return 0, errors.New("a duration cannot be negative")
		case s[0] == '+':
			return 0, errors.New("write the number without a sign, like 30s")
		}
		return 0, errors.New("a duration is a whole number and one unit (ms, s, m, h or d), like 30s or 90m")
	}
	if strings.HasPrefix(unitText, ".") || strings.HasPrefix(unitText, ",") {
		return 0, durationFractionError(s)
	}
	var unit time.Duration
	for _, u := range durationUnits {
		if unitText == u.suffix {
			unit = u.unit
		}
	}
	if unit == 0 {
		switch {
		case unitText == "":
			return 0, fmt.Errorf("%s has no unit; write %ss, %sm or another of ms, s, m, h, d", s, s, s)
		case leadingDigits(strings.TrimLeft(unitText, "abcdefghijklmnopqrstuvwxyzµ")) > 0:
			return 0, errors.New("a duration takes exactly one unit; write 90m rather than 1h30m")
		case strings.TrimSpace(unitText) != unitText:
			return 0, errors.New("write the unit right after the number, like 30s")
		}
		return 0, fmt.Errorf("unknown unit %q; the units are ms, s, m, h and d", unitText)
	}
	n, err := strconv.ParseUint(s[:digits], 10, 63)
	if err != nil || n > uint64(math.MaxInt64/int64(unit)) {
		return 0, errors.New("too long to represent; the longest duration is about 292 years")
	}
	return time.Duration(n) * unit, nil
}

// sizeUnits are the binary units a size may carry (docs/configuration.md "How values are written" writes
// sizes as 64MiB, 8KiB, 20GiB). A plain number, or one ending in B, is bytes.
var sizeUnits = []struct {
	suffix string
	shift  uint
}{
	{"", 0}, {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40},
}

// ParseBytes reads a configuration size: a whole number of bytes, optionally
// followed by one binary unit: B, KiB, MiB, GiB or TiB ("64MiB" is 64 × 2^20
// bytes). Decimal units (KB, MB, GB) are refused rather than guessed at,
// because half the world reads "64MB" as 64 × 10^6 and the other half as
// 64 × 2^20; units are case-sensitive, fractions and signs refused. "none"
// is not a size; keys that accept it check for it first.
func ParseBytes(s string) (int64, error) {
	digits := leadingDigits(s)
	unitText := s[digits:]
	if digits == 0 {
		switch {
		case s == "":
			return 0, errors.New("empty; a size is a whole number of bytes or a whole number with KiB, MiB, GiB or TiB, like 64MiB")
		case s[0] == '-':
			return 0, errors.New("a size cannot be negative")
		case s[0] == '+':
			return 0, errors.New("write the number without a sign, like 64MiB")
		}
		return 0, errors.New("a size is a whole number of bytes or a whole number with KiB, MiB, GiB or TiB, like 64MiB")
	}
	if strings.HasPrefix(unitText, ".") || strings.HasPrefix(unitText, ",") {
		return 0, fractionError(s, sizeSteps)
	}
	shift := uint(99)
	for _, u := range sizeUnits {
		if unitText == u.suffix {
			shift = u.shift
		}
	}
	if shift == 99 {
		return 0, sizeUnitError(s[:digits], unitText)
	}
	n, err := strconv.ParseUint(s[:digits], 10, 63)
	if err != nil || n > uint64(math.MaxInt64)>>shift {
		return 0, errors.New("too large to represent")
	}
	return int64(n << shift), nil
}

func sizeUnitError(num, unit string) error {
	trimmed := strings.TrimSpace(unit)
	for _, u := range sizeUnits[2:] {
		if strings.EqualFold(trimmed, u.suffix) {
			if trimmed == u.suffix {
				return errors.New("write the unit right after the number, like 64MiB")
			}
			return fmt.Errorf("units are case-sensitive; write %s%s", num, u.suffix)
		}
		decimal := u.suffix[:1] + "B" // KB, MB, GB, TB
		if strings.EqualFold(trimmed, decimal) || strings.EqualFold(trimmed, u.suffix[:1]) {
			return fmt.Errorf("sizes take binary units; write %s%s (%s × 2^%d bytes) if that is what you mean",
				num, u.suffix, num, u.shift)
		}
	}
	if leadingDigits(strings.TrimLeft(unit, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")) > 0 {
		return errors.New("a size takes exactly one unit; write 1536MiB rather than 1GiB512MiB")
	}
	return fmt.Errorf("unknown unit %q; the units are B, KiB, MiB, GiB and TiB", unit)
}

func leadingDigits(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// FormatBytes writes a size the way ParseBytes reads it, in the largest
// binary unit that divides it exactly: 2113536 is "2064KiB".
func FormatBytes(n int64) string {
	for i := len(sizeUnits) - 1; i >= 2; i-- {
		u := sizeUnits[i]
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// FormatDuration writes a duration the way ParseDuration reads it, in the
// largest unit that divides it exactly: 90 minutes is "90m".
func FormatDuration(d time.Duration) string {
	for i := len(durationUnits) - 1; i >= 0; i-- {
		u := durationUnits[i]
		if d != 0 && d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.suffix
		}
	}
	if d == 0 {
		return "0s"
	}
	return d.String()
}

// A unit and how many of the next smaller unit it holds, for suggesting a
// whole-number spelling of a fraction ("1.5h" is "90m").
type step struct {
	unit    string
	smaller string
	factor  float64
}

var durationSteps = []step{{"d", "h", 24}, {"h", "m", 60}, {"m", "s", 60}, {"s", "ms", 1000}}
var sizeSteps = []step{{"TiB", "GiB", 1024}, {"GiB", "MiB", 1024}, {"MiB", "KiB", 1024}, {"KiB", "B", 1024}}

// fractionError refuses "1.5h"-style values, naming the exact whole-number
// spelling when a smaller unit has one.
func fractionError(s string, steps []step) error {
	const generic = "whole numbers only; write the value in a smaller unit"
	f, unit, ok := splitFraction(s)
	if !ok {
		return errors.New(generic)
	}
	for k, st := range steps {
		if st.unit != unit {
			continue
		}
		for _, down := range steps[k:] {
			f *= down.factor
			// Within a rounding error of a whole number: 0.1m is 6s,
			// though 0.1 × 60 is not exactly 6 in binary.
			if r := math.Round(f); math.Abs(f-r) <= 1e-9*max(1, r) && r < 1e15 {
				return fmt.Errorf("whole numbers only; write %d%s", int64(r), down.smaller)
			}
		}
	}
	return errors.New(generic)
}

// splitFraction reads a fractional value ("1.5h", "1,5h") as its number and
// its unit.
func splitFraction(s string) (float64, string, bool) {
	i := strings.IndexFunc(s, func(r rune) bool { return !(r >= '0' && r <= '9' || r == '.' || r == ',') })
	if i < 0 {
		return 0, "", false
	}
	num, unit := strings.Replace(s[:i], ",", ".", 1), s[i:]
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, "", false
	}
	return f, unit, true
}

// durationFraction is ParseDuration's refusal of a fractional value. Its
// message names the whole-number spelling in a smaller unit; it keeps the
// value written, so a key held in whole seconds can suggest seconds instead
// of milliseconds it would refuse (loader.duration).
type durationFraction struct {
	msg   string
	value float64 // nanoseconds; NaN when the number could not be read
}

func (e *durationFraction) Error() string { return e.msg }

// wholeSeconds is the value rounded to whole seconds (half up), at least
// 1s — 0 is a sentinel on the keys that take whole seconds — when it is
// not whole seconds already (ok false then, or when it is too long for a
// duration at all: ParseDuration's own message stands).
func (e *durationFraction) wholeSeconds() (secs int64, ok bool) {
	if math.IsNaN(e.value) || e.value >= float64(math.MaxInt64) {
		return 0, false
	}
	ms := math.Round(e.value / float64(time.Millisecond))
	if math.Mod(ms, 1000) == 0 {
		return 0, false
	}
	return max(1, int64(math.Floor(ms/1000+0.5))), true
}

func durationFractionError(s string) error {
	e := &durationFraction{msg: fractionError(s, durationSteps).Error(), value: math.NaN()}
	f, unit, ok := splitFraction(s)
	if !ok {
		return e
	}
	for _, u := range durationUnits {
		if u.suffix == unit {
			e.value = f * float64(u.unit)
		}
	}
	if unit == "ms" && !math.IsNaN(e.value) && f < 1e15 {
		// Nothing is smaller: the fraction is rounded.
		e.msg = fmt.Sprintf("whole numbers only, and milliseconds are the smallest unit; write %dms", max(1, int64(math.Floor(f+0.5))))
	}
	return e
}
