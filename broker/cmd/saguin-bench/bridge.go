package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/internal/loadgen"
)

// The bridge scenario (-scenarios bridge): records published at a
// mosquitto hub, QoS 1, cross a bridge into a Sagüin append channel; the
// figure is records/s from the first publish at the hub to the last record
// read at the far side. Beside it, in the same run, the same load crossing
// a mosquitto bridge into a mosquitto edge.

// bridgeResults are the scenario's two figures.
type bridgeResults struct {
	saguin, mosquitto cell
	ran               bool
}

// bridgeRecords is how many records cross in each run.
func (b *bench) bridgeRecords() int {
	if b.o.quick {
		return 5000
	}
	return 50000
}

const bridgePublishers = 8

func (b *bench) runBridge(ctx context.Context, bin string) {
	r := &b.results.bridge
	r.ran = true
	n := b.bridgeRecords()

	// The hub queues for each bridge what it has not yet sent: mosquitto
	// drops what a client has queued past max_queued_messages (1,000 by
	// default), a loss neither bridge could see, so the hub keeps them all.
	hub, err := loadgen.StartMosquittoWith(ctx, b.o.mosquitto, mkdir(b, "bridge-hub"), "max_queued_messages 0")
	if err != nil {
		b.results.saguinError("bridge: the mosquitto hub", err)
		return
	}
	defer hub.Stop(5 * time.Second)
	if b.mosqVer == "" {
		b.mosqVer = hub.Version
	}

	// Sagüin bridging the hub's records in: the bench's own configuration,
	// its events channel receiving them.
	dir := mkdir(b, "bridge-saguin")
	body, err := saguinConfig("sqlite", dir)
	if err != nil {
		b.results.saguinError("bridge", err)
		return
	}
	body += fmt.Sprintf(`bridges:
  hub:
    peer: tcp://%s
    client_id: bench-edge
    receive_maximum: 100
    topics:
      - {filter: "load/#", direction: in, topic: "events/bridged/$#"}
`, hub.Addr())
	cfg, err := writeConfigBody(dir, body)
	if err != nil {
		b.results.saguinError("bridge", err)
		return
	}
	p, err := startSaguin(ctx, bin, cfg)
	if err != nil {
		b.results.saguinError("bridge: start", err)
		return
	}
	res, err := b.bridgeRun(ctx, hub.Addr(), p.addr, "events/bridged/#", "load/saguin", n)
	_ = p.term()
	if err != nil {
		b.results.saguinError("bridge: Sagüin", err)
		r.saguin = cell{err: err.Error()}
	} else {
		r.saguin = res
	}
	b.progress("bridge, mosquitto -> Sagüin append channel: %s records/s", figure(r.saguin, true))

	// mosquitto bridging the same load into a mosquitto edge.
	edge, err := loadgen.StartMosquittoWith(ctx, b.o.mosquitto, mkdir(b, "bridge-mosquitto-edge"), fmt.Sprintf(`connection hub
address %s
bridge_protocol_version mqttv50
cleansession false
clientid bench-mosquitto-edge
notifications false
topic # in 1 bridged/load/ load/`, hub.Addr()))
	if err != nil {
		b.results.refError("bridge: the mosquitto edge", err)
		return
	}
	defer edge.Stop(5 * time.Second)
	res, err = b.bridgeRun(ctx, hub.Addr(), edge.Addr(), "bridged/#", "load/mosquitto", n)
	if err != nil {
		b.results.refError("bridge: mosquitto to mosquitto", err)
		r.mosquitto = cell{err: err.Error()}
	} else {
		r.mosquitto = res
	}
	b.progress("bridge, mosquitto -> mosquitto: %s records/s", figure(r.mosquitto, true))
}

func mkdir(b *bench, name string) string {
	d := filepath.Join(b.dir, name)
	_ = os.MkdirAll(d, 0o755)
	return d
}

// bridgeRun subscribes at the far side, waits until a probe crosses (the
// bridge is up and subscribed), publishes n QoS 1 records at the hub under
// prefix with bridgePublishers publishers, and measures from the first
// publish to the n-th record read at the far side.
func (b *bench) bridgeRun(ctx context.Context, hubAddr, farAddr, farFilter, prefix string, n int) (cell, error) {
	var got atomic.Int64
	var last atomic.Int64
	probe := prefix + "/probe"
	probed := make(chan struct{}, 1)
	far, err := dialCounting(ctx, farAddr, "bench-far", farFilter, func(p *paho.Publish) {
		if len(p.Payload) == len("probe") && string(p.Payload) == "probe" {
			select {
			case probed <- struct{}{}:
			default:
			}
			return
		}
		got.Add(1)
		last.Store(time.Now().UnixNano())
	})
	if err != nil {
		return cell{}, fmt.Errorf("far side: %w", err)
	}
	defer func() { _ = far.Disconnect(&paho.Disconnect{}) }()
	pub, err := dialCounting(ctx, hubAddr, "bench-probe", "", nil)
	if err != nil {
		return cell{}, fmt.Errorf("hub: %w", err)
	}
	defer func() { _ = pub.Disconnect(&paho.Disconnect{}) }()
	deadline := time.Now().Add(30 * time.Second)
	for waiting := true; waiting; {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := pub.Publish(pctx, &paho.Publish{Topic: probe, Payload: []byte("probe"), QoS: 1})
		cancel()
		if err != nil {
			return cell{}, fmt.Errorf("probe: %w", err)
		}
		select {
		case <-probed:
			waiting = false
		case <-time.After(200 * time.Millisecond):
			if time.Now().After(deadline) {
				return cell{}, fmt.Errorf("no probe crossed the bridge within 30s")
			}
		}
	}
	time.Sleep(300 * time.Millisecond) // late probes
	got.Store(0)

	start := time.Now()
	_, err = loadgen.Publish(ctx, loadgen.PublishConfig{
		Addr: hubAddr, TopicPrefix: prefix, Publishers: bridgePublishers, Window: 4, Messages: int64(n),
		ClientIDPrefix: "bench-" + filepath.Base(prefix),
	})
	if err != nil {
		return cell{}, fmt.Errorf("publishing at the hub: %w", err)
	}
	wait := time.Now().Add(2 * time.Minute)
	for got.Load() < int64(n) {
		if time.Now().After(wait) || ctx.Err() != nil {
			return cell{}, fmt.Errorf("%d of %d records crossed within 2 minutes of the last PUBACK", got.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Unix(0, last.Load()).Sub(start)
	return cell{rate: float64(n) / elapsed.Seconds(), ok: true}, nil
}

// dialCounting connects a QoS 1 client to addr (and, with a filter,
// subscribes, calling onMsg for each record it receives).
func dialCounting(ctx context.Context, addr, id, filter string, onMsg func(*paho.Publish)) (*paho.Client, error) {
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cc := paho.ClientConfig{Conn: conn, ClientID: id}
	if onMsg != nil {
		cc.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			onMsg(pr.Packet)
			return true, nil
		}}
	}
	c := paho.NewClient(cc)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rm := uint16(1000)
	if _, err := c.Connect(cctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}}); err != nil {
		return nil, err
	}
	if filter != "" {
		if _, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// reportBridge prints the bridge rows and their ratio.
func (b *bench) reportBridge() {
	r := b.results.bridge
	if !r.ran {
		return
	}
	w := b.out
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "bridge: %s QoS 1 records from a mosquitto hub, %d publishers\trecords/s\t\n", commas(float64(b.bridgeRecords())), bridgePublishers)
	fmt.Fprintf(tw, "into a Sagüin append channel (sqlite), stored before acknowledged\t%s\t\n", figure(r.saguin, true))
	fmt.Fprintf(tw, "into a mosquitto edge (mosquitto's bridge, QoS 1)\t%s\t\n", figure(r.mosquitto, true))
	fmt.Fprintf(tw, "ratio Sagüin / mosquitto\t%s\t\n", ratio(r.saguin, r.mosquitto))
	_ = tw.Flush()
}
