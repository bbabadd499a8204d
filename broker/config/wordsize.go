package config

import "fmt"

// A 32-bit process addresses at most 4 GiB, and Linux gives it about 3 GiB
// of that (the kernel keeps the rest; some ARM kernels keep 2 GiB). A
// memory provider keeps its records in the process's heap, and Go's
// collector lets the heap grow to about twice what is live before it
// collects (GOGC 100), so records bounded at B need about 2B of address
// space; the rest of the broker — the runtime, goroutine stacks, sqlite's
// page caches, connection buffers and session outboxes, the binary itself
// — needs room beside them. A memory provider, or several together, bound
// above memoryBound32 on a 32-bit build would end the process out of memory
// — a crash with no log line, and everything since the last snapshot lost
// — before the bound it was given ever refused a publish: a bound that is
// no bound (invariant 13). So memoryBound32 leaves 1 GiB of heap to the
// records (about 2 GiB with the collector's headroom) and 1 GiB to the rest.
const memoryBound32 = 1 << 30

// memoryBound is one memory provider's max_bytes as written.
type memoryBound struct {
	provider string
	bytes    int64
	at       val
}

// warnAddressSpace warns, on a 32-bit build only, of memory providers
// whose max_bytes together exceed what the process can hold: a warning,
// not a finding (the configuration is valid, and right on the 64-bit build
// of the same file), printed by --check-config and logged at start. Each
// memory provider is named, since lowering any of them helps. sqlite
// providers keep their records on disk and are not counted. An unbounded
// memory provider is not a bound that cannot be reached, and is the same
// choice on every build.
func (l *loader) warnAddressSpace(p *parsed) {
	if l.wordSize > 32 || len(p.memoryBounds) == 0 {
		return
	}
	var total int64
	for _, m := range p.memoryBounds {
		total += m.bytes
	}
	if total <= memoryBound32 {
		return
	}
	together := ""
	if len(p.memoryBounds) > 1 {
		together = fmt.Sprintf(" (the memory providers together: %s)", FormatBytes(total))
	}
	for _, m := range p.memoryBounds {
		text, _ := m.at.scalarText()
		l.warnings = append(l.warnings, Finding{File: m.at.file, Line: m.at.line(), Key: m.at.key, Value: text, HasValue: true,
			Problem: fmt.Sprintf("this is a 32-bit build, whose whole process has about 3GiB of address space, and memory provider %s keeps its records there with the garbage collector's headroom beside them: at max_bytes %s%s the broker runs out of memory, with no log line, before the bound refuses a publish; lower max_bytes so the memory providers together hold %s or less, keep these channels on a sqlite provider, or run the 64-bit build",
				m.provider, FormatBytes(m.bytes), together, FormatBytes(memoryBound32))})
	}
}
