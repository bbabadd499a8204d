package main

// The table's scenarios beyond plain publishing (tload.go): the queue
// cycle, the connection storm and the deaf subscriber.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tqueueResult is one queue cycle run.
type tqueueResult struct {
	jobs    int64
	elapsed time.Duration // first publish to the last job's ack acknowledged
}

// tqueue has producers publish jobs to jobs/<tag>/p<i> for the duration
// while workers consume $saguin/queue/jobs, each answering every job with
// "ack" on the job's Response Topic and Correlation Data (spec
// configuration.md, $saguin/queue/<queue>/response). Every job must reach a
// worker exactly once (no lease runs out within the run) and every ack be
// acknowledged 0x00.
func tqueue(ctx context.Context, addr, tag string, producers, window, workers int, duration time.Duration, payload int, ackTimeout time.Duration) (tqueueResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu       sync.Mutex
		seen     = map[uint64]bool{} // pub<<40 | seq; guarded by mu
		done     atomic.Int64
		lastDone atomic.Int64
		begin    time.Time
		beginSet = make(chan struct{})
		readers  sync.WaitGroup
		conns    []*wconn
	)
	defer func() {
		for _, c := range conns {
			c.close()
		}
		readers.Wait()
	}()
	for i := range workers {
		c, err := wDial(ctx, addr, wdial{id: fmt.Sprintf("%s-w%d", tag, i), version: mqtt5, clean: true, timeout: ackTimeout})
		if err != nil {
			return tqueueResult{}, err
		}
		conns = append(conns, c)
		if err := c.subscribe("$saguin/queue/jobs", 1, ackTimeout); err != nil {
			return tqueueResult{}, err
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			var p wpublish
			var ackID uint16
			acks := map[uint16]bool{} // this worker's acks in flight
			for {
				typ, flags, body, err := c.read()
				if err != nil {
					cancel(fmt.Errorf("worker %d: %w", i, err))
					return
				}
				switch typ {
				case pPUBACK:
					id, reason, err := pubackReason(body)
					if err == nil && reason != 0 {
						err = fmt.Errorf("ack answered 0x%02x", reason)
					}
					if err == nil && !acks[id] {
						err = fmt.Errorf("PUBACK for packet id %d, not in flight", id)
					}
					if err != nil {
						cancel(fmt.Errorf("worker %d: %w", i, err))
						return
					}
					delete(acks, id)
					<-beginSet
					lastDone.Store(int64(time.Since(begin)))
					done.Add(1)
				case pPUBLISH:
					if err := c.decodePublishBody(flags, body, &p); err != nil {
						cancel(fmt.Errorf("worker %d: %w", i, err))
						return
					}
					pub, seq, _, ok := getPayload(p.payload)
					if !ok || p.props.responseTopic == "" || p.props.correlation == nil {
						cancel(fmt.Errorf("worker %d: a job without a payload of this run, a Response Topic or Correlation Data", i))
						return
					}
					key := uint64(pub)<<40 | seq
					mu.Lock()
					dup := seen[key]
					seen[key] = true
					mu.Unlock()
					if dup {
						cancel(fmt.Errorf("worker %d: duplicate: job %d of producer %d offered twice", i, seq, pub))
						return
					}
					if p.qos > 0 {
						_ = c.writePuback(p.id)
					}
					ackID++
					if ackID == 0 {
						ackID = 1
					}
					acks[ackID] = true
					err := c.writePublish(p.props.responseTopic, 1, ackID, []byte("ack"), &pubProps{correlation: p.props.correlation})
					if err == nil {
						err = c.flush()
					}
					if err != nil {
						cancel(fmt.Errorf("worker %d: %w", i, err))
						return
					}
				}
			}
		}()
	}
	begin = time.Now()
	close(beginSet)
	res, err := tpublish(ctx, tpubConfig{addr: addr, version: mqtt5, ids: tag + "-prod", topic: "jobs/" + tag,
		pubs: producers, window: window, qos: 1, duration: duration, payload: payload, ackTimeout: ackTimeout})
	if err != nil {
		return tqueueResult{}, fmt.Errorf("producing: %w", err)
	}
	err = waitFor(ctx, func() bool { return done.Load() >= res.acked }, done.Load, ackTimeout, "waiting for workers to finish the jobs")
	if err == nil {
		time.Sleep(quiet)
		err = context.Cause(ctx)
	}
	if err == nil && done.Load() != res.acked {
		err = fmt.Errorf("%d jobs acked by workers, %d published", done.Load(), res.acked)
	}
	return tqueueResult{jobs: res.acked, elapsed: time.Duration(lastDone.Load())}, err
}

// tstormResult is one connection storm.
type tstormResult struct {
	elapsed    time.Duration
	base, held int64 // broker VmRSS, KiB: before, and with every client connected
}

func (r tstormResult) perConn(n int) float64 { return float64(r.held-r.base) / float64(n) }

// tstorm connects n clients (clean sessions, no subscriptions), dialers at
// a time, times the last CONNACK, and reads the broker's memory with all
// of them held.
func (b *bench) tstorm(ctx context.Context, p *brokerProc, version byte, n int) (tstormResult, error) {
	var r tstormResult
	if !b.sleep(ctx, b.o.rssSettle) {
		return r, context.Cause(ctx)
	}
	var err error
	if r.base, err = readRSS(p.pid()); err != nil {
		return r, err
	}
	tag := runTag()
	conns := make([]*wconn, n)
	defer func() {
		_ = forEach(context.WithoutCancel(ctx), n, b.o.dialers, func(_ context.Context, i int) error {
			if conns[i] != nil {
				conns[i].close()
			}
			return nil
		})
	}()
	begin := time.Now()
	err = forEach(ctx, n, b.o.dialers, func(ctx context.Context, i int) error {
		c, err := wDial(ctx, p.addr, wdial{id: fmt.Sprintf("st-%s-%d", tag, i), version: version, clean: true, small: true, timeout: b.o.ackTimeout})
		conns[i] = c
		return err
	})
	r.elapsed = time.Since(begin)
	if err != nil {
		return r, err
	}
	if !b.sleep(ctx, b.o.rssSettle) {
		return r, context.Cause(ctx)
	}
	if dead := p.alive(); dead != nil {
		return r, dead
	}
	r.held, err = readRSS(p.pid())
	return r, err
}

// tdeafResult is one deaf-subscriber run.
type tdeafResult struct {
	deafAck, liveAck time.Duration // publisher's time to its last PUBACK
	deafErr, liveErr error         // the publisher stalled, or a loss
	// disconnected and how, per deaf subscriber: [0] at QoS 0, [1] at
	// QoS 1.
	disconnected [2]bool
	how          [2]string
}

// deafRcvBuf is the deaf subscribers' socket receive buffer: small, so
// that they stop taking data within a few messages rather than after the
// kernel has buffered megabytes.
const deafRcvBuf = 4096

// tdeaf measures one publisher's 'messages' QoS 1 publishes (64 in flight)
// to a topic with a subscriber that keeps up, then to one with two
// subscribers that stop reading after their SUBACK, one at QoS 1 and one
// at QoS 0, then whether the broker disconnected each within -deaf-wait of
// the publishing's end: each reads again, and a closed connection (after
// whatever was buffered) means disconnected. The two differ by design: a
// broker bounds a QoS 1 subscriber's unacknowledged deliveries (Receive
// Maximum, its own window), so that socket may never fill; QoS 0 has no
// window, and a broker that keeps writing to it must block on it.
func (b *bench) tdeaf(ctx context.Context, addr string, version byte, col string, liveQoS0 bool) tdeafResult {
	var r tdeafResult
	tag := runTag()
	cfg := tpubConfig{addr: addr, version: version, ids: "live-" + tag, topic: "deaf/live-" + tag, pubs: 1, window: 64, qos: 1,
		duration: maxRunDuration, messages: int64(b.o.deafMessages), subscribe: true, subQoS0: liveQoS0, payload: b.o.payload, ackTimeout: b.o.ackTimeout}
	live, err := tpublish(ctx, cfg)
	r.liveAck, r.liveErr = live.lastAck, err
	if err == nil {
		b.progress("%s: %s QoS 1 publishes, a subscriber keeping up: last PUBACK after %s, all delivered once, in order",
			col, commas(float64(live.acked)), live.lastAck.Round(time.Millisecond))
	} else {
		b.progress("%s: subscriber keeping up: FAILED: %v", col, err)
	}
	var deaf [2]*wconn
	defer func() {
		for _, c := range deaf {
			if c != nil {
				c.close()
			}
		}
	}()
	for qos := range deaf {
		c, err := wDial(ctx, addr, wdial{id: fmt.Sprintf("deaf%d-%s", qos, tag), version: version, clean: true, receiveMax: 65535, rcvBuf: deafRcvBuf, timeout: b.o.ackTimeout})
		if err == nil {
			deaf[qos] = c
			err = c.subscribe("deaf/"+tag+"/#", byte(qos), b.o.ackTimeout)
		}
		if err != nil {
			r.deafErr = fmt.Errorf("deaf QoS %d subscriber: %w", qos, err)
			return r
		}
	}
	cfg.ids, cfg.topic, cfg.subscribe, cfg.subQoS0 = "deafpub-"+tag, "deaf/"+tag, false, false
	res, err := tpublish(ctx, cfg)
	ended := time.Now()
	r.deafAck, r.deafErr = res.lastAck, err
	if err == nil {
		b.progress("%s: %s QoS 1 publishes, subscribers at QoS 0 and 1 not reading: last PUBACK after %s", col, commas(float64(res.acked)), res.lastAck.Round(time.Millisecond))
	} else {
		b.progress("%s: subscribers not reading: publisher %s (%d of %d acknowledged)", col, err, res.acked, res.sent)
	}
	if !b.sleep(ctx, time.Until(ended.Add(b.o.deafWait))) {
		r.how[0] = "not checked: " + context.Cause(ctx).Error()
		r.how[1] = r.how[0]
		return r
	}
	for qos, c := range deaf {
		r.disconnected[qos], r.how[qos] = drainDeaf(c, b.o.ackTimeout)
		b.progress("%s: the QoS %d subscriber not reading, read again %s after the last publish: %s", col, qos, b.o.deafWait, r.how[qos])
	}
	return r
}

// drainDeaf reads the deaf connection until it ends or stays silent for
// idle: an end means the broker had disconnected it.
func drainDeaf(c *wconn, idle time.Duration) (bool, string) {
	var n int64
	limit := time.Now().Add(2 * time.Minute)
	for time.Now().Before(limit) {
		_ = c.c.SetReadDeadline(time.Now().Add(min(idle, 3*time.Second)))
		typ, _, body, err := c.read()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			return false, fmt.Sprintf("still connected (%d buffered messages read, then silence)", n)
		case errors.Is(err, io.EOF) || err != nil:
			return true, fmt.Sprintf("disconnected (%d buffered messages read first; %v)", n, err)
		case typ == pDISCONNECT:
			reason := "0x00"
			if len(body) > 0 {
				reason = fmt.Sprintf("0x%02x", body[0])
			}
			return true, fmt.Sprintf("disconnected with DISCONNECT %s (%d buffered messages read first)", reason, n)
		case typ == pPUBLISH:
			n++
		}
	}
	return false, fmt.Sprintf("still connected (still delivering after 2 minutes, %d messages)", n)
}

// treadBack reads an append channel's records under filter from the
// floor with a fresh subscriber and requires exactly want of them: each
// publisher's sequence whole, in order, nothing twice - so an append row's
// PUBACKs are checked against what the channel holds (invariant 18).
func treadBack(ctx context.Context, addr, id, filter string, pubs int, want int64, ackTimeout time.Duration) (time.Duration, error) {
	c, err := wDial(ctx, addr, wdial{id: id, version: mqtt5, clean: true, receiveMax: 1024, timeout: ackTimeout})
	if err != nil {
		return 0, err
	}
	defer c.close()
	begin := time.Now()
	if err := c.subscribe(filter, 1, ackTimeout); err != nil {
		return 0, err
	}
	check := newSeqCheck(pubs)
	var got int64
	var p wpublish
	var last time.Duration
	for {
		wait := ackTimeout
		if got == want {
			wait = quiet // anything more is a duplicate or a stranger
		}
		_ = c.c.SetReadDeadline(time.Now().Add(wait))
		typ, flags, body, err := c.read()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout() && got == want:
			return last, nil
		case err != nil:
			return 0, fmt.Errorf("reading back %s: %d of %d records: %w", filter, got, want, err)
		case typ != pPUBLISH:
			continue
		}
		if err := c.decodePublishBody(flags, body, &p); err != nil {
			return 0, err
		}
		if _, err := check.observe(p.payload); err != nil {
			return 0, fmt.Errorf("reading back %s: %w", filter, err)
		}
		if p.qos > 0 {
			_ = c.writePuback(p.id)
			if c.r.Buffered() == 0 {
				_ = c.flush()
			}
		}
		got++
		if got > want {
			return 0, fmt.Errorf("reading back %s: more than the %d records acknowledged", filter, want)
		}
		last = time.Since(begin)
	}
}
