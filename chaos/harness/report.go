package harness

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Finding is one violation found in a run.
type Finding struct {
	Check     string // which check
	Invariant int    // the invariant it guards (0: none in particular)
	Channel   string
	Msg       string
	Lines     []int // history lines involved, when known
}

func (f Finding) String() string {
	var b strings.Builder
	if f.Invariant > 0 {
		fmt.Fprintf(&b, "invariant %d: ", f.Invariant)
	}
	b.WriteString(f.Check)
	if f.Channel != "" {
		fmt.Fprintf(&b, " [%s]", f.Channel)
	}
	b.WriteString(": ")
	b.WriteString(f.Msg)
	if len(f.Lines) > 0 {
		fmt.Fprintf(&b, " (history lines %v)", f.Lines)
	}
	return b.String()
}

// Report is the outcome of a campaign.
type Report struct {
	Seed     uint64
	Provider string
	Control  string
	Nemeses  string
	Cycles   int            // nemeses applied
	Applied  map[string]int // per nemesis
	Elapsed  time.Duration  // the whole campaign, checks included
	// CheckTime is the part of Elapsed spent checking.
	CheckTime time.Duration
	// MaxShutdown is the longest a SIGTERM took to end the broker.
	MaxShutdown time.Duration
	Aborted     string // why the campaign ended early ("" = it ran to the end)

	Stats      Stats
	Violations []Finding
	// Waived are findings of the checks named in Options.Waive.
	Waived []Finding
	// Inconclusive names the models whose search ran out of CheckTimeout.
	Inconclusive []string

	OutDir, History, NotesPath string
	HTML                       []string // visualisations written for failing models
}

// OK reports a clean run: no violation, nothing inconclusive, not aborted.
func (r *Report) OK() bool {
	return len(r.Violations) == 0 && len(r.Inconclusive) == 0 && r.Aborted == ""
}

// Summary is a few lines for a terminal.
func (r *Report) Summary() string {
	var b strings.Builder
	status := "PASS"
	if !r.OK() {
		status = "FAIL"
	}
	fmt.Fprintf(&b, "%s seed=%d provider=%s nemeses=%s cycles=%d %v operations=%d violations=%d elapsed=%s (checks %s)",
		status, r.Seed, r.Provider, r.Nemeses, r.Cycles, formatApplied(r.Applied), r.Stats.Operations, len(r.Violations),
		r.Elapsed.Round(time.Second), r.CheckTime.Round(100*time.Millisecond))
	if r.Control != "" {
		fmt.Fprintf(&b, " control=%s", r.Control)
	}
	fmt.Fprintf(&b, "\n  %s max-shutdown=%s", r.Stats, r.MaxShutdown.Round(time.Millisecond))
	if r.Aborted != "" {
		fmt.Fprintf(&b, "\n  aborted: %s", r.Aborted)
	}
	for _, k := range r.Inconclusive {
		fmt.Fprintf(&b, "\n  inconclusive: %s", k)
	}
	if len(r.Waived) > 0 {
		byCheck := map[string]int{}
		for _, w := range r.Waived {
			byCheck[w.Check]++
		}
		for _, k := range slices.Sorted(maps.Keys(byCheck)) {
			fmt.Fprintf(&b, "\n  waived (known gap): %s x%d, e.g. %s", k, byCheck[k], firstOf(r.Waived, k))
		}
	}
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(&b, "\n  ... %d more", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(&b, "\n  %s", v)
	}
	for _, h := range r.HTML {
		fmt.Fprintf(&b, "\n  visualisation: %s", h)
	}
	if !r.OK() {
		fmt.Fprintf(&b, "\n  history: %s\n  replay: -seed %d -provider %s -nemeses %s", r.History, r.Seed, r.Provider, r.Nemeses)
		if r.Control != "" {
			fmt.Fprintf(&b, " -control %s", r.Control)
		}
	}
	return b.String()
}

// Details is the whole report: the summary, then every violation and
// waived finding in full.
func (r *Report) Details() string {
	var b strings.Builder
	b.WriteString(r.Summary())
	b.WriteString("\n\nviolations:\n")
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	b.WriteString("\nwaived:\n")
	for _, v := range r.Waived {
		fmt.Fprintf(&b, "- %s\n", v)
	}
	return b.String()
}

func firstOf(fs []Finding, check string) string {
	for _, f := range fs {
		if f.Check == check {
			return f.Msg
		}
	}
	return ""
}

func formatApplied(m map[string]int) string {
	var parts []string
	for _, n := range AllNemeses() {
		if m[n] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", n, m[n]))
		}
	}
	return "(" + strings.Join(parts, " ") + ")"
}
