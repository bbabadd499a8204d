package main

// Benchmarks of the table's scenarios against an in-process Sagüin, for
// CPU and heap profiles of the broker under the table's load (the broker
// binary serves no pprof). The load generator runs under the pprof label
// side=load, so its samples can be left out:
//
//	go test -run '^$' -bench BenchmarkTableBroadcast -benchtime 1x -cpuprofile /tmp/cpu.out ./cmd/saguin-bench
//	go tool pprof -top -tagignore side=load /tmp/cpu.out

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
)

const benchRun = 5 * time.Second

func benchBroker(b testing.TB, storage string) *brokertest.Broker {
	dir := b.TempDir()
	body, err := saguinConfigWith(storage, dir, "max_connections: 20000\n    max_connect_rate: none")
	if err != nil {
		b.Fatal(err)
	}
	// The in-process logger is the test harness's (debug, into memory):
	// the configured level keeps it to what the binary would log.
	body = strings.Replace(body, "log_level: info", "log_level: warn", 1)
	cfg, err := writeConfigBody(dir, body)
	if err != nil {
		b.Fatal(err)
	}
	return brokertest.Start(b, cfg)
}

// reportWrites adds what the broker's connection writers did during a run:
// how many Writes each socket write carried, and the share of them held
// for the read side (broker/conn_writer.go).
func reportWrites(b *testing.B, br *brokertest.Broker, before broker.WriterStats) {
	after := br.WriterStats()
	writes, socket := after.Writes-before.Writes, after.SocketWrites-before.SocketWrites
	if socket > 0 {
		b.ReportMetric(float64(writes)/float64(socket), "writes/syscall")
	}
	if writes > 0 {
		b.ReportMetric(float64(after.Corked-before.Corked)/float64(writes), "held/write")
	}
}

// asLoad runs f with the label side=load on it and every goroutine it
// starts.
func asLoad(f func(ctx context.Context)) {
	pprof.Do(context.Background(), pprof.Labels("side", "load"), f)
}

func benchPublish(b *testing.B, storage string, qos byte, subscribe bool, topic string, pubs, window int) {
	br := benchBroker(b, storage)
	addr := br.Address()
	for i := range b.N {
		var res tpubResult
		var err error
		before := br.WriterStats()
		asLoad(func(ctx context.Context) {
			res, err = tpublish(ctx, tpubConfig{addr: addr, version: mqtt5, ids: fmt.Sprintf("b%d", i), topic: fmt.Sprintf("%s/%d", topic, i),
				pubs: pubs, window: window, qos: qos, duration: benchRun, subscribe: subscribe, maxLag: 250, payload: 128, ackTimeout: 10 * time.Second})
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.rate(subscribe), "msgs/s")
		reportWrites(b, br, before)
	}
}

func BenchmarkTableBroadcast(b *testing.B) { benchPublish(b, "memory", 1, true, "bench/b", 64, 1) }
func BenchmarkTableQoS0(b *testing.B)      { benchPublish(b, "memory", 0, true, "bench/q0", 64, 1) }
func BenchmarkTableAppendSqlite(b *testing.B) {
	benchPublish(b, "sqlite", 1, false, "events/b", 64, 1)
}

// The deep-window shape (issue 13): a gateway or bridge pushing 8
// connections with 64 QoS 1 publishes in flight each.
func BenchmarkTableBroadcastDeep(b *testing.B) { benchPublish(b, "memory", 1, true, "bench/d", 8, 64) }
func BenchmarkTableAppendSqliteDeep(b *testing.B) {
	benchPublish(b, "sqlite", 1, false, "events/d", 8, 64)
}

func BenchmarkTableFanOut(b *testing.B) {
	br := benchBroker(b, "memory")
	addr := br.Address()
	for i := range b.N {
		var res tfanResult
		var err error
		before := br.WriterStats()
		asLoad(func(ctx context.Context) {
			res, err = tfanout(ctx, tfanConfig{addr: addr, version: mqtt5, ids: fmt.Sprintf("f%d", i), topic: fmt.Sprintf("bench/f/%d", i),
				subscribers: 50, subQoS: 1, window: 8, maxLag: 250, duration: benchRun, payload: 128, ackTimeout: 10 * time.Second})
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(res.delivered)/res.last.Seconds(), "deliveries/s")
		b.ReportMetric(res.p99.Seconds()*1000, "p99-ms")
		reportWrites(b, br, before)
	}
}

// BenchmarkTableIdleConnections holds 2,000 connected clients and writes
// a heap profile with all of them held to $SAGUIN_BENCH_HEAP (when set):
// what an idle connection costs the broker, by allocation site.
func BenchmarkTableIdleConnections(b *testing.B) {
	addr := benchBroker(b, "memory").Address()
	const n = 2000
	if _, err := raiseFileLimit(n + fdHeadroom); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		time.Sleep(time.Second)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		goroutines := runtime.NumGoroutine()
		conns := make([]*wconn, n)
		err := forEach(context.Background(), n, 64, func(ctx context.Context, i int) error {
			c, err := wDial(ctx, addr, wdial{id: fmt.Sprintf("idle-%d", i), version: mqtt5, clean: true, small: true, timeout: 10 * time.Second})
			conns[i] = c
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Second)
		runtime.GC()
		runtime.ReadMemStats(&after)
		// Both sides share this process; the load side's idle
		// connections start no goroutine and hold 2 KiB of buffers each.
		b.ReportMetric(float64(runtime.NumGoroutine()-goroutines)/n, "goroutines/conn")
		b.ReportMetric(float64(after.StackInuse-before.StackInuse)/n/1024, "stack-KiB/conn")
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n/1024, "heap-KiB/conn")
		if path := os.Getenv("SAGUIN_BENCH_HEAP"); path != "" {
			f, err := os.Create(filepath.Clean(path))
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				b.Fatal(err)
			}
			_ = f.Close()
			// Beside it, who the goroutines held per connection are.
			g, err := os.Create(filepath.Clean(path) + ".goroutines")
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("goroutine").WriteTo(g, 1); err != nil {
				b.Fatal(err)
			}
			_ = g.Close()
		}
		for _, c := range conns {
			c.close()
		}
	}
}
