package broker_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

const benchQueueConfig = `
broker:
  id: bench
  log_level: error
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
{{.Provider}}
channels:
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
`

func benchQueueBroker(b *testing.B, provider string) *brokertest.Broker {
	dir := b.TempDir()
	p := strings.ReplaceAll(provider, "snapshots", "none")
	return brokertest.Start(b, brokertest.Config(b, dir, strings.Replace(benchQueueConfig, "{{.Provider}}", p, 1)))
}

// benchWorker answers every job with ack from inside its message handler,
// as a Paho worker does; it records when each job arrived.
func benchWorker(b *testing.B, addr, id string, rm uint16, arrived func(*paho.Publish)) *brokertest.Client {
	c := brokertest.Connect(b, addr, id, brokertest.ClientOptions{CleanStart: true, ReceiveMaximum: rm})
	go func() {
		for p := range c.Msgs {
			arrived(p)
			_, _ = c.Client.PublishWithOptions(b.Context(), &paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1,
				Payload: []byte("ack"), Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}},
				paho.PublishOptions{Method: paho.PublishMethod_AsyncSend})
		}
	}()
	c.Subscribe("$saguin/queue/jobs", 1)
	return c
}

// BenchmarkQueueCycle measures the full publish → offer → ack cycle: jobs
// per second with 1, 4 and 16 workers, on memory and sqlite, and the
// latency from a job's publish to its offer (p50, p99), with 16 producers.
func BenchmarkQueueCycle(b *testing.B) {
	for _, prov := range []struct{ name, cfg string }{{"memory", memoryProvider}, {"sqlite", sqliteProvider}} {
		for _, workers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/workers=%d", prov.name, workers), func(b *testing.B) {
				br := benchQueueBroker(b, prov.cfg)
				var done atomic.Int64
				var mu sync.Mutex
				published := map[string]time.Time{}
				var latencies []time.Duration
				all := make(chan struct{})
				arrived := func(p *paho.Publish) {
					mu.Lock()
					if t0, ok := published[string(p.Payload)]; ok {
						latencies = append(latencies, time.Since(t0))
						delete(published, string(p.Payload))
					}
					mu.Unlock()
					if done.Add(1) == int64(b.N) {
						close(all)
					}
				}
				for i := 0; i < workers; i++ {
					benchWorker(b, br.Address(), fmt.Sprintf("w%d", i), 0, arrived)
				}
				// Producers publish concurrently, each one job in flight: the
				// cycle, not one publisher's round trip, is what is measured.
				const producers = 16
				pubs := make([]*brokertest.Client, producers)
				for i := range pubs {
					pubs[i] = brokertest.Connect(b, br.Address(), fmt.Sprintf("producer%d", i), brokertest.ClientOptions{CleanStart: true})
				}
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for p := 0; p < producers; p++ {
					wg.Add(1)
					go func(p int) {
						defer wg.Done()
						for i := p; i < b.N; i += producers {
							payload := strconv.Itoa(i)
							mu.Lock()
							published[payload] = time.Now()
							mu.Unlock()
							r, err := pubs[p].Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte(payload)})
							if err != nil || r.ReasonCode != 0 {
								b.Errorf("publish: %v %+v", err, r)
								return
							}
						}
					}(p)
				}
				wg.Wait()
				select {
				case <-all:
				case <-time.After(5 * time.Minute):
					b.Fatalf("only %d of %d jobs offered", done.Load(), b.N)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
				mu.Lock()
				reportPercentiles(b, latencies)
				mu.Unlock()
			})
		}
	}
}

// BenchmarkQueueDrain300 is the time one worker takes to drain a 300-job
// backlog at Receive Maximum 1, 2 and unset (docs/channels.md "`queue`" quotes
// 53–213ms for a reference implementation).
func BenchmarkQueueDrain300(b *testing.B) {
	for _, rm := range []uint16{1, 2, 0} {
		name := "rm=unset"
		if rm > 0 {
			name = fmt.Sprintf("rm=%d", rm)
		}
		b.Run(name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				br := benchQueueBroker(b, memoryProvider)
				pub := brokertest.Connect(b, br.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
				for j := 0; j < 300; j++ {
					if r, err := pub.Publish(&paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("j")}); err != nil || r.ReasonCode != 0 {
						b.Fatal(err, r)
					}
				}
				var n atomic.Int64
				all := make(chan struct{})
				b.StartTimer()
				start := time.Now()
				benchWorker(b, br.Address(), "w", rm, func(*paho.Publish) {
					if n.Add(1) == 300 {
						close(all)
					}
				})
				<-all
				total += time.Since(start)
				b.StopTimer()
				_ = br.Close()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/drain")
		})
	}
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "p50-offer-ms")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds())/1000, "p99-offer-ms")
}
