package main

// The offline backlog scenario (sessions.go describes it): away sessions
// stored a backlog, then reconnecting and receiving it whole and in order.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// backlogPayload is a backlog message: the run's tag, the message's
// sequence number, zero padding to -payload bytes.
func backlogPayload(buf []byte, tag uint64, seq int) {
	clear(buf)
	binary.BigEndian.PutUint64(buf[0:8], tag)
	binary.BigEndian.PutUint64(buf[8:16], uint64(seq))
}

func readBacklogPayload(p []byte, tag uint64) (int, error) {
	if len(p) < 16 {
		return 0, fmt.Errorf("a %d-byte payload, not one of this run's", len(p))
	}
	if t := binary.BigEndian.Uint64(p[0:8]); t != tag {
		return 0, fmt.Errorf("a payload of run %x, not this run's %x", t, tag)
	}
	seq := binary.BigEndian.Uint64(p[8:16])
	if seq > 1<<31 {
		return 0, fmt.Errorf("sequence number %d out of range", seq)
	}
	return int(seq), nil
}

// backlogOrder checks one session's deliveries: messages 0..k-1 in order,
// a message received before coming again only with DUP set (a redelivery,
// MQTT-4.3.2: a QoS 1 message may arrive more than once, flagged).
type backlogOrder struct {
	k    int
	next int
	dups int64
}

func (o *backlogOrder) observe(seq int, dup bool) error {
	switch {
	case seq == o.next && seq < o.k:
		o.next++
		return nil
	case seq < o.next && dup:
		o.dups++
		return nil
	case seq < o.next:
		return fmt.Errorf("message %d again without DUP (already had 0..%d)", seq, o.next-1)
	case seq >= o.k:
		return fmt.Errorf("message %d, but only 0..%d were published", seq, o.k-1)
	default:
		return fmt.Errorf("message %d where %d was due: lost or out of order", seq, o.next)
	}
}

func (o *backlogOrder) done() bool { return o.next == o.k }

// backlog runs the offline backlog scenario on p.
func (b *bench) backlog(ctx context.Context, p *brokerProc, bc *backlogCell) error {
	ctx, cancel := context.WithTimeout(ctx, b.o.sessionsTimeout)
	defer cancel()
	m, k := b.o.backlogSessions, b.o.backlogMessages
	tagText := runTag()
	tag, _ := strconv.ParseUint(tagText, 16, 64)
	topic := "backlog/" + tagText + "/all"
	id := func(i int) string { return fmt.Sprintf("b-%s-%d", tagText, i) }
	err := forEach(ctx, m, b.o.createConcurrency, func(ctx context.Context, i int) error {
		c, _, err := dialSession(ctx, p.addr, sessDial{id: id(i), clean: true, expiry: sessionExpiry, receiveMax: uint16(b.o.receiveMax), timeout: b.o.ackTimeout})
		if err != nil {
			return err
		}
		defer c.disconnect()
		return c.subscribe(topic, b.o.ackTimeout)
	})
	if err != nil {
		return fmt.Errorf("creating the sessions: %w", err)
	}
	// Let the broker finish taking the sessions away before the backlog is
	// published, so every message is stored for an away session rather
	// than sent down a connection that is closing.
	if !b.sleep(ctx, b.o.rssSettle) {
		return context.Cause(ctx)
	}

	store, err := b.publishBacklog(ctx, p.addr, "bp-"+tagText, topic, tag, k)
	if err != nil {
		return fmt.Errorf("publishing the backlog: %w", err)
	}
	bc.store = store
	b.progress("backlog: %d QoS 1 messages to %q stored for %s away sessions in %s (the publisher's last PUBACK; %d in flight)",
		k, topic, commas(float64(m)), store.Round(time.Millisecond), b.o.window)

	var (
		dials   = make(chan struct{}, b.o.dialers)
		wg      sync.WaitGroup
		errs    errFirst
		dups    atomic.Int64
		lastMu  sync.Mutex
		lastAt  time.Time
		rctx, c = context.WithCancel(ctx)
	)
	defer c()
	begin := time.Now()
	for i := range m {
		wg.Add(1)
		go func() {
			defer wg.Done()
			doneAt, d, err := b.receiveBacklog(rctx, p.addr, id(i), topic, tag, k, dials)
			dups.Add(d)
			if err != nil {
				errs.add(err)
				c() // one failure fails the scenario: stop the rest
				return
			}
			lastMu.Lock()
			if doneAt.After(lastAt) {
				lastAt = doneAt
			}
			lastMu.Unlock()
		}()
	}
	wg.Wait()
	if err := errs.err(); err != nil {
		return fmt.Errorf("delivering the backlog: %w", err)
	}
	bc.deliver, bc.dups, bc.ok = lastAt.Sub(begin), dups.Load(), true
	b.progress("backlog: all %s sessions reconnected and had their %d messages, in order, %s after the first dial (%d DUP redeliveries)",
		commas(float64(m)), k, bc.deliver.Round(time.Millisecond), bc.dups)
	return nil
}

// publishBacklog publishes k QoS 1 messages to topic from one clean
// session, -window in flight, and returns the time to the last PUBACK.
// One connection, so the broker owes them in this order (MQTT-4.6.0).
func (b *bench) publishBacklog(ctx context.Context, addr, id, topic string, tag uint64, k int) (time.Duration, error) {
	c, _, err := dialSession(ctx, addr, sessDial{id: id, clean: true, timeout: b.o.ackTimeout})
	if err != nil {
		return 0, err
	}
	defer c.disconnect()
	window := make(chan struct{}, b.o.window)
	acked := make(chan error, 1)
	begin := time.Now()
	go func() {
		outstanding := make([]bool, k+1)
		for got := 0; got < k; {
			_ = c.conn.SetReadDeadline(time.Now().Add(b.o.ackTimeout))
			pk, err := c.read()
			if err != nil {
				acked <- fmt.Errorf("%d of %d PUBACKs: %w", got, k, err)
				return
			}
			pa, ok := pk.Content.(*packets.Puback)
			if !ok {
				acked <- fmt.Errorf("%s where a PUBACK was due", packetName(pk))
				return
			}
			if pa.PacketID < 1 || int(pa.PacketID) > k || outstanding[pa.PacketID] {
				acked <- fmt.Errorf("PUBACK for packet id %d, not one in flight", pa.PacketID)
				return
			}
			if pa.ReasonCode != 0 {
				acked <- fmt.Errorf("PUBACK reason 0x%02x (%s) for message %d", pa.ReasonCode, pa.Reason(), pa.PacketID-1)
				return
			}
			outstanding[pa.PacketID] = true
			got++
			<-window
		}
		acked <- nil
	}()
	buf := make([]byte, b.o.payload)
	for i := range k {
		select {
		case window <- struct{}{}:
		case err := <-acked:
			if err == nil {
				err = errors.New("PUBACKs ended early")
			}
			return 0, err
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
		backlogPayload(buf, tag, i)
		if err := c.publish(uint16(i+1), topic, buf); err != nil {
			return 0, fmt.Errorf("PUBLISH %d: %w", i, err)
		}
	}
	select {
	case err := <-acked:
		if err != nil {
			return 0, err
		}
		return time.Since(begin), nil
	case <-ctx.Done():
		c.close()
		return 0, context.Cause(ctx)
	}
}

// receiveBacklog reconnects one away session (a slot of dials held while
// dialling) and reads until its k messages are in, then for `quiet` more
// to catch any extra. It returns when the last message came.
func (b *bench) receiveBacklog(ctx context.Context, addr, id, topic string, tag uint64, k int, dials chan struct{}) (time.Time, int64, error) {
	select {
	case dials <- struct{}{}:
	case <-ctx.Done():
		return time.Time{}, 0, context.Cause(ctx)
	}
	c, ca, err := dialSession(ctx, addr, sessDial{id: id, clean: false, expiry: sessionExpiry, receiveMax: uint16(b.o.receiveMax), timeout: b.o.ackTimeout})
	<-dials
	if err != nil {
		return time.Time{}, 0, err
	}
	defer c.disconnect()
	if !ca.present {
		return time.Time{}, 0, fmt.Errorf("%s: Session Present 0: the session and its backlog were lost", id)
	}
	stop := context.AfterFunc(ctx, c.close)
	defer stop()
	order := backlogOrder{k: k}
	var doneAt time.Time
	for {
		if c.r.Buffered() == 0 {
			// About to wait on the socket: the PUBACKs gathered so far go
			// first, so the broker's window never waits on them.
			if err := c.flush(); err != nil {
				return doneAt, order.dups, fmt.Errorf("%s: PUBACK: %w", id, err)
			}
		}
		idle := b.o.ackTimeout
		if order.done() {
			idle = time.Until(doneAt.Add(quiet))
		}
		_ = c.conn.SetReadDeadline(time.Now().Add(idle))
		pk, err := c.read()
		if err != nil {
			if order.done() && errors.Is(err, os.ErrDeadlineExceeded) {
				return doneAt, order.dups, nil
			}
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			return doneAt, order.dups, fmt.Errorf("%s: %d of %d messages received: %w", id, order.next, k, err)
		}
		pub, ok := pk.Content.(*packets.Publish)
		if !ok {
			return doneAt, order.dups, fmt.Errorf("%s: unexpected %s", id, packetName(pk))
		}
		if pub.Topic != topic || pub.QoS != 1 {
			return doneAt, order.dups, fmt.Errorf("%s: a QoS %d message on %q, want QoS 1 on %q", id, pub.QoS, pub.Topic, topic)
		}
		seq, err := readBacklogPayload(pub.Payload, tag)
		if err == nil {
			err = order.observe(seq, pub.Duplicate)
		}
		if err != nil {
			return doneAt, order.dups, fmt.Errorf("%s: %w", id, err)
		}
		if order.done() && doneAt.IsZero() {
			doneAt = time.Now()
		}
		if err := c.puback(pub.PacketID); err != nil {
			return doneAt, order.dups, fmt.Errorf("%s: PUBACK: %w", id, err)
		}
	}
}
