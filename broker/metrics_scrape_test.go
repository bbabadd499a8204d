package broker_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// docs/operations.md "Metrics": the catalogue is recomputed at most once per
// min_scrape_interval on the broker's clock; a scrape sooner is answered
// with the previous result, byte for byte, although a counter moved (and
// the clock with it: uptime would differ had it been recomputed).
func TestMetricsScrapeCache(t *testing.T) {
	m := newMetricsRig(t, metricsConfig)
	pub := brokertest.Connect(t, m.b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
	first, f := m.scrape()
	before, _ := f.value("saguin_published_total", "channel=events")

	mustPublish(t, pub, "events/a", "a")
	m.clk.Advance(scrapeInterval - time.Second)
	second, _ := m.scrape()
	if !bytes.Equal(first, second) {
		t.Fatalf("a scrape within min_scrape_interval was recomputed:\nfirst:\n%s\nsecond:\n%s", first, second)
	}

	m.clk.Advance(time.Second) // the interval has passed
	_, f = m.scrape()
	if after, _ := f.value("saguin_published_total", "channel=events"); after != before+1 {
		t.Fatalf("published to events: %v before, %v once the interval passed; want one more", before, after)
	}
}

// The operations listener's scraper may ask for gzip: the answer is the
// same exposition, compressed, said so in Content-Encoding.
func TestMetricsGzip(t *testing.T) {
	m := newMetricsRig(t, metricsConfig)
	brokertest.Connect(t, m.b.Address(), "someone", brokertest.ClientOptions{CleanStart: true})
	plain, _ := m.scrape()
	rec := m.get("Accept-Encoding", "gzip")
	if enc := rec.Header().Get("Content-Encoding"); enc != "gzip" {
		t.Fatalf("Content-Encoding %q with Accept-Encoding: gzip", enc)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	zr, err := gzip.NewReader(rec.Body)
	if err != nil {
		t.Fatalf("the body is not gzip: %v", err)
	}
	unzipped, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(unzipped, plain) {
		t.Fatalf("the gzip body decodes to something else:\n%s\nplain:\n%s", unzipped, plain)
	}
	if rec := m.get(); rec.Header().Get("Content-Encoding") != "" {
		t.Fatalf("compressed without being asked: %q", rec.Header().Get("Content-Encoding"))
	}
}

// No client id, topic or filter becomes a label (docs/operations.md "Metrics", "Not there, on purpose"): a
// thousand distinct clients, each with its own subscription and topics,
// leave the number of series where ten left it.
func TestMetricsCardinality(t *testing.T) {
	m := newMetricsRig(t, metricsConfig)
	clients := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("device-%04d", i)
			c, _ := brokertest.DialRaw(t, m.b.Address(), id, true, 0)
			if ack := c.Subscribe(1, "devices/"+id+"/#", 1); ack.ReasonCodes[0] != 1 {
				t.Fatalf("%s: SUBACK %v", id, ack.ReasonCodes)
			}
			for j, topic := range []string{"devices/" + id + "/temp", "events/" + id} {
				c.SendPublish(packets.Packet{FixedHeader: packets.FixedHeader{Qos: 1}, TopicName: topic,
					PacketID: uint16(j + 1), Payload: []byte(id)})
			}
			for acks := 0; acks < 2; {
				switch pk := c.Read(); pk.FixedHeader.Type {
				case packets.Puback:
					acks++
				case packets.Publish: // its own broadcast, delivered back
					c.Puback(pk.PacketID)
				}
			}
		}
	}
	clients(0, 10)
	ten := m.until("ten clients", atLeast(10, "saguin_connections"))
	clients(10, 1000)
	thousand := m.until("a thousand clients", atLeast(1000, "saguin_connections"))
	if got, _ := thousand.value("saguin_published_total", "channel=events"); got != 1000 {
		t.Fatalf("published to events = %v, want 1000", got)
	}
	if a, b := ten.series(), thousand.series(); a != b {
		t.Fatalf("%d series with ten clients, %d with a thousand:\n%s", a, b, exposition(thousand))
	}
	for name, mf := range thousand {
		if len(mf.GetMetric()) != len(ten[name].GetMetric()) {
			t.Errorf("%s: %d series with ten clients, %d with a thousand", name, len(ten[name].GetMetric()), len(mf.GetMetric()))
		}
	}
}

// promtoolAccepts runs Prometheus's own linter on a scrape (Debian's
// prometheus package ships it; .ci/run installs it).
func promtoolAccepts(t *testing.T, body []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (apt-get install prometheus)")
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
