package sqlite

import (
	"runtime"
	"testing"
	"time"

	"saguin.dev/storage"
)

// BenchmarkAppendParallel: 64 concurrent appenders (on this package's
// 2-core CI machine) publishing 128-byte payloads to one channel, collected
// into group commits. ns/op is per record; records/s is the throughput.
// Set TMPDIR to a real disk for representative figures (tmpfs is faster).
func BenchmarkAppendParallel(b *testing.B) {
	p := openAt(b, newDB(b), nil)
	l := mustLog(b, p, "events")
	rec := storage.Record{MessageID: "0195a3c1-7e2f-7b3c-9d4e-1f2a3b4c5d6e", Topic: "devices/d1/temp",
		Timestamp: time.Now(), Payload: make([]byte, 128), QoS: 1}
	// 64 goroutines whatever GOMAXPROCS is.
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(rec); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	s := p.Stats()
	if commits := s.CommitsByCommit + s.CommitsByRecords; commits > 0 {
		b.ReportMetric(float64(s.CommittedRecords)/float64(commits), "records/txn")
	}
}

// BenchmarkAppend: one appender, one record per transaction (rfcs/storage-sqlite.md and rfcs/storage-memory.md
// "BenchmarkAppend").
func BenchmarkAppend(b *testing.B) {
	p := openAt(b, newDB(b), nil)
	l := mustLog(b, p, "events")
	rec := storage.Record{MessageID: "0195a3c1-7e2f-7b3c-9d4e-1f2a3b4c5d6e", Topic: "devices/d1/temp",
		Timestamp: time.Now(), Payload: make([]byte, 128), QoS: 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Append(rec); err != nil {
			b.Fatal(err)
		}
	}
}
