package config

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// scalar returns a plain value's text, refusing blocks, lists, empty values
// and tags (an !include anywhere but a group list is refused here too).
func (l *loader) scalar(v val, want string) (string, bool) {
	if l.misplacedInclude(v) {
		return "", false
	}
	switch {
	case v.isNull():
		l.add(v, "has no value; write %s", want)
		return "", false
	case v.n.Kind != yaml.ScalarNode:
		l.add(v, "this is %s, not %s", want, kindName(v.n))
		return "", false
	}
	if t := v.n.ShortTag(); strings.HasPrefix(t, "!") && !strings.HasPrefix(t, "!!") {
		l.add(v, "unknown tag %s; write %s", t, want)
		return "", false
	}
	return v.n.Value, true
}

func (l *loader) str(v val, want string) (string, bool) {
	s, ok := l.scalar(v, want)
	if !ok {
		return "", false
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		l.add(v, "contains a control character; write %s", want)
		return "", false
	}
	return s, true
}

func (l *loader) boolean(v val) (bool, bool) {
	s, ok := l.scalar(v, "true or false")
	if !ok {
		return false, false
	}
	if v.n.ShortTag() != "!!bool" {
		l.add(v, "it is true or false")
		return false, false
	}
	return s == "true" || s == "True" || s == "TRUE", true
}

// integer reads a whole number within [lo, hi].
func (l *loader) integer(v val, lo, hi int64, fix string) (int64, bool) {
	if _, ok := l.scalar(v, "a whole number"); !ok {
		return 0, false
	}
	var n int64
	if v.n.ShortTag() != "!!int" || v.n.Decode(&n) != nil {
		l.add(v, "it is a whole number; %s", fix)
		return 0, false
	}
	if n < lo || n > hi {
		l.add(v, "%s", fix)
		return 0, false
	}
	return n, true
}

// enum reads one of a closed set of words.
func (l *loader) enum(v val, options []string, fix string) (string, bool) {
	s, ok := l.scalar(v, "one of "+orList(options))
	if !ok {
		return "", false
	}
	for _, o := range options {
		if s == o {
			return s, true
		}
	}
	l.add(v, "it is one of %s; %s", orList(options), fix)
	return "", false
}

func orList(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// durKey says what one duration key accepts.
type durKey struct {
	none      bool          // the literal none is accepted
	noneFix   string        // problem when none is written and not accepted
	subSecond bool          // one of the five keys honouring ms (docs/configuration.md "How values are written")
	zeroFix   string        // problem when zero is written; "" = zero accepted
	min, max  time.Duration // inclusive bounds; max 0 = no ceiling
	rangeFix  string        // problem when outside [min, max]
}

// scalarOrNone reads a scalar that is either the literal none (reported as
// none=true where allowed, refused with noneFix otherwise) or a value of the
// kind example describes, which the caller parses.
func (l *loader) scalarOrNone(v val, example string, allowNone bool, noneFix string) (s string, none, ok bool) {
	want := example
	if allowNone {
		want += " or none"
	}
	s, ok = l.scalar(v, want)
	if !ok {
		return "", false, false
	}
	if s != "none" {
		return s, false, true
	}
	if allowNone {
		return "", true, true
	}
	if noneFix == "" {
		noneFix = "none is not accepted here; write " + example
	}
	l.add(v, "%s", noneFix)
	return "", false, false
}

// duration reads a duration key. none=true means the literal none.
func (l *loader) duration(v val, k durKey) (d time.Duration, none bool, ok bool) {
	s, none, ok := l.scalarOrNone(v, "a duration like 30s", k.none, k.noneFix)
	if !ok || none {
		return 0, none, ok
	}
	d, err := ParseDuration(s)
	var frac *durationFraction
	if err != nil && !k.subSecond && errors.As(err, &frac) {
		if secs, ok := frac.wholeSeconds(); ok {
			// docs/configuration.md "How values are written": only five keys honour milliseconds; the
			// spelling ParseDuration suggests ("1500ms") would be refused
			// here next. Rounded, as the operator who wrote 1.5s meant
			// about that long.
			orNone := ""
			if k.none {
				orNone = " (or none)"
			}
			l.add(v, "whole numbers only, and this key is held in whole seconds; write %ds%s", secs, orNone)
			return 0, false, false
		}
	}
	if err != nil {
		if k.none {
			l.add(v, "%v (or none)", err)
		} else {
			l.add(v, "%v", err)
		}
		return 0, false, false
	}
	if !k.subSecond && d%time.Second != 0 {
		// docs/configuration.md "How values are written": 500ms on a whole-second key would truncate to 0,
		// which is a sentinel; refuse rather than round.
		secs := int64(d / time.Second)
		hint := strconv.FormatInt(secs+1, 10) + "s"
		if secs > 0 {
			hint = strconv.FormatInt(secs, 10) + "s or " + hint
		}
		l.add(v, "this key is held in whole seconds; write %s", hint)
		return 0, false, false
	}
	if d == 0 && k.zeroFix != "" {
		l.add(v, "%s", k.zeroFix)
		return 0, false, false
	}
	if d < k.min || (k.max > 0 && d > k.max) {
		l.add(v, "%s", k.rangeFix)
		return 0, false, false
	}
	return d, false, true
}

// sizeKey says what one size key accepts.
type sizeKey struct {
	none     bool
	noneFix  string
	zeroFix  string
	min, max int64 // max 0 = no ceiling
	rangeFix string
}

func (l *loader) size(v val, k sizeKey) (n int64, none bool, ok bool) {
	s, none, ok := l.scalarOrNone(v, "a size like 64MiB", k.none, k.noneFix)
	if !ok || none {
		return 0, none, ok
	}
	n, err := ParseBytes(s)
	if err != nil {
		if k.none {
			l.add(v, "%v (or none)", err)
		} else {
			l.add(v, "%v", err)
		}
		return 0, false, false
	}
	if n == 0 && k.zeroFix != "" {
		l.add(v, "%s", k.zeroFix)
		return 0, false, false
	}
	if n < k.min || (k.max > 0 && n > k.max) {
		l.add(v, "%s", k.rangeFix)
		return 0, false, false
	}
	return n, false, true
}

// absPath reads a filesystem path, which must be absolute (docs/configuration.md "How values are written":
// nothing is read relative to the working directory). It returns the path
// cleaned, the form paths are compared in.
func (l *loader) absPath(v val, what string) (string, bool) {
	s, ok := l.scalar(v, "an absolute path to "+what)
	if !ok {
		return "", false
	}
	switch {
	case strings.IndexByte(s, 0) >= 0:
		l.add(v, "contains a NUL character; write an absolute path to %s", what)
		return "", false
	case !filepath.IsAbs(s):
		l.add(v, "the path is relative; write an absolute path to %s (paths are never read relative to the working directory)", what)
		return "", false
	}
	return filepath.Clean(s), true
}

// Retention zero: docs/configuration.md "How values are written" refuses it as ambiguous.
const zeroRetention = "zero is refused for a retention bound (there is no way to say \"keep nothing\"); write none to keep everything, or a positive value"
