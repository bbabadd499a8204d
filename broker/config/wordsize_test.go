package config

import (
	"strings"
	"testing"
)

// On a 32-bit build the whole broker lives in about 3 GiB of address
// space, and a memory provider's records live in it: a max_bytes the
// process cannot reach would end it out of memory, with no log line,
// before the bound ever refused a publish (invariant 13). Such a bound is a
// warning — printed by --check-config, logged at start — naming the
// provider, its max_bytes and the fix; on a 64-bit build, nothing.

// addressWarnings is the warnings of a configuration as a build of
// wordSize bits loads it, those about address space only.
func addressWarnings(t *testing.T, path string, wordSize int) []Finding {
	t.Helper()
	cfg, err := loadFor(path, wordSize)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	var out []Finding
	for _, w := range cfg.Warnings {
		if strings.Contains(w.Problem, "32-bit") {
			out = append(out, w)
		}
	}
	return out
}

func TestMemoryBoundBeyondA32BitAddressSpaceIsAWarning(t *testing.T) {
	dir := t.TempDir()
	big := build(t, dir, p("broker.storage.providers.mem.max_bytes", "2GiB"))
	if w := addressWarnings(t, big, 64); len(w) != 0 {
		t.Errorf("64-bit build: %v; want no warning", w)
	}
	w := addressWarnings(t, big, 32)
	if len(w) != 1 {
		t.Fatalf("32-bit build: %d warnings %v; want one", len(w), w)
	}
	if w[0].Key != "broker.storage.providers.mem.max_bytes" || w[0].Value != "2GiB" || w[0].Line == 0 {
		t.Errorf("warning on %s %q line %d; want broker.storage.providers.mem.max_bytes \"2GiB\" with its line", w[0].Key, w[0].Value, w[0].Line)
	}
	for _, want := range []string{"32-bit", "1GiB or less", "sqlite provider", "64-bit build"} {
		if !strings.Contains(w[0].Problem, want) {
			t.Errorf("warning %q does not say %q", w[0].Problem, want)
		}
	}

	// At the limit: no warning; a sqlite provider of any size: none.
	if w := addressWarnings(t, build(t, dir, p("broker.storage.providers.mem.max_bytes", "1GiB"),
		p("broker.storage.providers.main.max_bytes", "20GiB")), 32); len(w) != 0 {
		t.Errorf("a 1GiB memory provider and a 20GiB sqlite one on 32-bit: %v; want no warning", w)
	}

	// The memory providers share the one address space: two that fit alone
	// and not together are each named, with the total.
	two := build(t, dir, p("broker.storage.providers.mem.max_bytes", "768MiB"),
		p("broker.storage.providers.mem2", m("type", "memory", "snapshot_dir", "none", "max_bytes", "768MiB")),
		p("channels.spill", m("type", "append", "storage", "mem2")))
	w = addressWarnings(t, two, 32)
	if len(w) != 2 || w[0].Key != "broker.storage.providers.mem.max_bytes" || w[1].Key != "broker.storage.providers.mem2.max_bytes" {
		t.Fatalf("two memory providers of 768MiB on 32-bit: %v; want a warning on each", w)
	}
	if !strings.Contains(w[0].Problem, "1536MiB") {
		t.Errorf("warning %q does not name the memory providers' total (1536MiB)", w[0].Problem)
	}
	if w := addressWarnings(t, two, 64); len(w) != 0 {
		t.Errorf("64-bit build: %v; want no warning", w)
	}
}
