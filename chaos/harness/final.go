package harness

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// final ends a campaign the way the checks need it to end: the broker left
// alone, producers stopped, the queue drained (workers ack everything until
// nothing has been offered for longer than the visibility timeout plus a
// tick, which CheckQueueResolution presumes), and then every checked channel
// read from its floor to its head by a fresh consumer, so that an
// acknowledged record that is missing is seen missing (invariant 14).
func (c *campaign) final(ctx context.Context) error {
	e := c.env
	c.logf("final: stopping producers, draining the queue")
	if !sleepCtx(ctx, time.Second) {
		return ctx.Err()
	}
	c.closeProducers()
	c.producers.Wait()
	e.draining.Store(true)

	quiet := (c.opt.VisibilityTimeout + 1500*time.Millisecond).Nanoseconds()
	drainStart := time.Now()
	bound := drainStart.Add(time.Duration(c.opt.MaxAttempts+2)*4*c.opt.VisibilityTimeout + time.Minute)
	for {
		if e.outstanding.Load() == 0 && e.now()-e.lastDelivery.Load() > quiet {
			break
		}
		if time.Now().After(bound) {
			c.findings = append(c.findings, Finding{Check: "drain", Invariant: 2, Channel: chanJobs,
				Msg: fmt.Sprintf("the queue was still offering work %s after producers stopped, with every worker acknowledging", time.Since(drainStart).Round(time.Second))})
			c.aborted = "the queue did not drain"
			e.note(Note{Kind: NoteAbort, Detail: c.aborted})
			return errAbort
		}
		if err := c.wait(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	e.note(Note{Kind: NoteDrained})
	if err := c.awaitWills(ctx); err != nil {
		return err
	}

	c.logf("final: reading every channel from its floor")
	if err := c.finalRead(ctx, chanEvents); err != nil {
		return err
	}
	return c.finalRead(ctx, chanJobs+"__dlq")
}

// finalRead asks a fresh session for the channel's head and then reads the
// channel from its floor up to it with another fresh durable consumer.
func (c *campaign) finalRead(ctx context.Context, channel string) error {
	e := c.env
	p := newProber(e, "final-prober-"+channel, 0)
	var head int64
	var ok bool
	for attempt := 0; attempt < 5 && !ok; attempt++ {
		pc, err := e.dial(ctx, p.opts())
		if err != nil {
			sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		if channel == chanEvents {
			head, ok = p.head(ctx, pc, channel)
		} else {
			var reply string
			reply, _, ok = p.seek(ctx, pc, channel, "-1")
			if ok {
				var perr error
				head, perr = strconv.ParseInt(reply, 10, 64)
				ok = perr == nil && head >= 1
			}
		}
		pc.close()
	}
	if !ok {
		return fmt.Errorf("final read of %s: no head from the broker", channel)
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	highest := int64(0)
	progress := make(chan struct{}, 1)
	onRead := func(off int64, _ string) {
		mu.Lock()
		highest = max(highest, off)
		mu.Unlock()
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	name := "final-" + channel
	var wg sync.WaitGroup
	wg.Add(1)
	if channel == chanEvents {
		r := &reader{env: e, name: name, filter: filterEvents, channel: chanEvents, topic: topicEvents, onRead: onRead}
		go func() { defer wg.Done(); r.run(rctx) }()
	} else {
		r := &dlqReader{env: e, name: name, onRead: onRead}
		go func() { defer wg.Done(); r.run(rctx) }()
	}
	reached := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return highest >= head-1
	}
	// Give up only when the reader makes no progress for a while, however
	// long the channel.
	stall := time.NewTimer(10 * time.Second)
	for !reached() {
		select {
		case <-progress:
			stall.Reset(10 * time.Second)
			continue
		case <-stall.C:
		case <-ctx.Done():
		}
		break
	}
	stall.Stop()
	complete := reached()
	// Let the last acknowledgements go out, then end the reader.
	sleepCtx(ctx, 100*time.Millisecond)
	cancel()
	wg.Wait()
	detail := "complete"
	if !complete {
		detail = "incomplete"
	}
	e.note(Note{Kind: NoteFinalRead, ClientID: name, Channel: channel, Value: head, Detail: detail})
	c.logf("final read of %s: head %d, %s", channel, head, detail)
	return nil
}

// awaitWills lets the Wills that are due be published before the campaign
// ends: it waits until the watcher has seen every Will whose connection
// ended in a way that announces its client (wills.go), bounded by the
// latest due moment plus willGrace. The check, not this wait, decides
// which of them had to come.
func (c *campaign) awaitWills(ctx context.Context) error {
	e := c.env
	for {
		n, last := e.wills.outstanding()
		if n == 0 || e.now() > last+willGrace.Nanoseconds() {
			if n > 0 {
				c.logf("final: %d Wills unseen %s after the last fell due", n, willGrace)
			}
			break
		}
		if err := c.wait(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	e.note(Note{Kind: NoteWillsDone})
	return nil
}

// willGrace is how long past its due moment a Will is waited for at the
// end: the broker checks waiting Wills once a second, and a Will owed
// across a restart is published at the start (docs/channels.md).
const willGrace = 5 * time.Second
