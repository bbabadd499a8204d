package metrics

import (
	rtmetrics "runtime/metrics"
)

// runtimeSamples is the exporter's reusable runtime/metrics buffer: the
// names the Go families read (docs/operations.md "Metrics", "The Go runtime"), read at the recompute only,
// never through runtime.ReadMemStats, which stops the world.
type runtimeSamples [10]rtmetrics.Sample

func newRuntimeSamples() *runtimeSamples {
	names := [len(runtimeSamples{})]string{
		"/gc/heap/live:bytes",
		"/gc/heap/goal:bytes",
		"/gc/cycles/total:gc-cycles",
		"/cpu/classes/gc/total:cpu-seconds",
		"/cpu/classes/gc/mark/assist:cpu-seconds",
		"/memory/classes/heap/stacks:bytes",
		"/gc/heap/allocs:bytes",
		"/gc/heap/allocs:objects",
		"/gc/gogc:percent",
		"/gc/gomemlimit:bytes",
	}
	var s runtimeSamples
	for i, name := range names {
		s[i].Name = name
	}
	return &s
}

// read fills r from the runtime. A name this Go does not know reads 0
// (KindBad): the series stays, as the catalogue is closed.
func (s *runtimeSamples) read(r *RuntimeFigures) {
	rtmetrics.Read(s[:])
	v := func(i int) float64 {
		switch s[i].Value.Kind() {
		case rtmetrics.KindUint64:
			return float64(s[i].Value.Uint64())
		case rtmetrics.KindFloat64:
			return s[i].Value.Float64()
		}
		return 0
	}
	*r = RuntimeFigures{
		HeapLiveBytes: v(0), HeapGoalBytes: v(1), GCCycles: v(2),
		GCCPUSeconds: v(3), GCAssistCPUSeconds: v(4), StackBytes: v(5),
		AllocatedBytes: v(6), AllocatedObjects: v(7),
		GOGCPercent: gogc(s[8].Value), MemoryLimitBytes: v(9),
	}
}

// gogc reads /gc/gogc:percent, which the runtime reports as a uint64 that
// holds -1 (all bits set) when the collector is off.
func gogc(v rtmetrics.Value) float64 {
	if v.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return float64(int64(v.Uint64()))
}
