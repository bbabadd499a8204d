package config

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Finding is one thing wrong with a configuration file (or, in
// Config.Warnings, one thing worth knowing). It names the key, the value as
// written, and what to write instead, so an operator can fix every finding
// from the message alone.
type Finding struct {
	File string // the file the key is written in ("" when the key is absent everywhere)
	Line int    // 1-based; 0 when unknown
	// Key is the dotted path, e.g. "broker.log_level" or "channels.jobs.retry.max_attempts".
	Key string
	// Value is the value as written; HasValue is false for a missing key or a block.
	Value    string
	HasValue bool
	// Problem says what is wrong and how to fix it.
	Problem string
}

// maxShownValue bounds how much of a value a message repeats: a finding
// about a 4 MiB scalar does not need to print it.
const maxShownValue = 120

// String renders "file:line: key "value": problem".
func (f Finding) String() string {
	var b strings.Builder
	if f.File != "" {
		b.WriteString(f.File)
		if f.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(f.Line))
		}
		b.WriteString(": ")
	}
	b.WriteString(f.Key)
	if f.HasValue {
		v := f.Value
		if len(v) > maxShownValue {
			v = v[:maxShownValue] + "…"
		}
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(v))
	}
	b.WriteString(": ")
	b.WriteString(f.Problem)
	return b.String()
}

// Attrs is the finding as log/slog key=value attributes: file, line, key,
// value (when it has one) and problem.
func (f Finding) Attrs() []any {
	attrs := []any{"file", f.File, "line", f.Line, "key", f.Key}
	if f.HasValue {
		v := f.Value
		if len(v) > maxShownValue {
			v = v[:maxShownValue] + "…"
		}
		attrs = append(attrs, "value", v)
	}
	return append(attrs, "problem", f.Problem)
}

// Findings is the error Load returns: every finding in the configuration at
// once (docs/configuration.md "How values are written": all findings, not just the first), in file order.
type Findings struct {
	Source string
	List   []Finding
	// Warnings are the warnings of the same pass (Config.Warnings), kept
	// so that a caller reporting the findings can say them too.
	Warnings []Finding
}

func (f *Findings) Error() string {
	var b strings.Builder
	n := len(f.List)
	if n == 1 {
		fmt.Fprintf(&b, "%s: 1 finding:", f.Source)
	} else {
		fmt.Fprintf(&b, "%s: %d findings:", f.Source, n)
	}
	for _, x := range f.List {
		b.WriteString("\n  ")
		b.WriteString(x.String())
	}
	return b.String()
}

// sortFindings orders findings by file (in the order files were read), then
// line, keeping discovery order for equal positions.
func sortFindings(list []Finding, fileOrder map[string]int) {
	sort.SliceStable(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.File != b.File {
			return fileOrder[a.File] < fileOrder[b.File]
		}
		return a.Line < b.Line
	})
}
