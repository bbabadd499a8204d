package sqlite

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"saguin.dev/storage"
)

// replayRecords is how many records BenchmarkReadReplay replays: the size
// of the channel the broker's replay figure is quoted for.
const replayRecords = 100_000

// fillReplay appends n records shaped like a typical publish (128-byte
// payload, two headers) from 64 appenders, so group commits fill the
// channel in seconds rather than one transaction per record.
func fillReplay(b *testing.B, l storage.AppendLog, n int) {
	b.Helper()
	const appenders = 64
	var wg sync.WaitGroup
	errs := make(chan error, appenders)
	for g := range appenders {
		wg.Go(func() {
			for i := g; i < n; i += appenders {
				rec := storage.Record{
					MessageID: fmt.Sprintf("0195a3c1-7e2f-7b3c-9d4e-%012d", i),
					Topic:     "devices/d1/temp",
					Timestamp: time.Unix(1_700_000_000, int64(i)),
					Headers:   []storage.Header{{Name: "source", Value: "sensor-7"}, {Name: "unit", Value: "celsius"}},
					Payload:   make([]byte, 128),
					QoS:       1,
				}
				if _, err := l.Append(rec); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkReadReplay: a consumer replays a 100,000-record channel the way
// the broker's pump does, Read(from, 256) in a loop from the floor to next.
// One op is one full replay; records/s is the replay rate. cpu-ns/record
// is the process's CPU time (every goroutine, GC included) per record
// replayed: on a loaded machine it moves far less than records/s does, so
// it is the figure to compare two builds by.
func BenchmarkReadReplay(b *testing.B) {
	p := openAt(b, newDB(b), nil)
	l := mustLog(b, p, "events")
	fillReplay(b, l, replayRecords)
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU(b)
	total := 0
	for b.Loop() {
		from, n := uint64(1), 0
		for {
			recs, _, err := l.Read(from, 256)
			if err != nil {
				b.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			n += len(recs)
			from = recs[len(recs)-1].Offset + 1
		}
		if n != replayRecords {
			b.Fatalf("replayed %d records, want %d", n, replayRecords)
		}
		total += n
	}
	b.ReportMetric(float64(total)/time.Since(start).Seconds(), "records/s")
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(total), "cpu-ns/record")
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
