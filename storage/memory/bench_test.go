package memory

import (
	"fmt"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

func benchRecord() storage.Record {
	return storage.Record{
		MessageID: "0195a3c1-7e2f-7b3c-9d4e-1f2a3b4c5d6e",
		Topic:     "devices/d1/temp",
		Timestamp: storagetest.Base,
		Headers:   []storage.Header{{Name: "unit", Value: "C"}},
		Payload:   make([]byte, 128),
		QoS:       1,
	}
}

// BenchmarkAppend is one 128-byte record per op on one channel.
func BenchmarkAppend(b *testing.B) {
	p := mustOpen(&testing.T{}, Options{})
	defer p.Close()
	l, _ := p.Append("events")
	r := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Append(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendParallel is many publishers on one channel.
func BenchmarkAppendParallel(b *testing.B) {
	p := mustOpen(&testing.T{}, Options{})
	defer p.Close()
	l, _ := p.Append("events")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := benchRecord()
		for pb.Next() {
			if _, err := l.Append(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkTrimOnALongChannel is the steady state of a channel at its
// size: one append and one trim removing one record per op, on a channel
// of 100,000 records. Cost is proportional to what is removed, not to the
// channel's length (docs/channels.md "When retention passes a position").
func BenchmarkTrimOnALongChannel(b *testing.B) {
	p := mustOpen(&testing.T{}, Options{})
	defer p.Close()
	l, _ := p.Append("events")
	r := benchRecord()
	for range 100_000 {
		l.Append(r)
	}
	limit := l.Bytes()
	b.ReportAllocs()
	for b.Loop() {
		l.Append(r)
		if n, _, _ := l.Trim(time.Time{}, limit); n != 1 {
			b.Fatalf("trimmed %d", n)
		}
	}
}

// BenchmarkSnapshotWrite is a shutdown writing one channel of n records.
func BenchmarkSnapshotWrite(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			r := benchRecord()
			for b.Loop() {
				b.StopTimer()
				p := mustOpen(&testing.T{}, Options{SnapshotDir: b.TempDir()})
				l, _ := p.Append("events")
				for range n {
					l.Append(r)
				}
				b.StartTimer()
				if err := p.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
