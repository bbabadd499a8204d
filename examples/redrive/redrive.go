// Command redrive puts dead-lettered jobs back into their queue, with nothing
// but a stock MQTT 5 client (docs/channels.md "The dead-letter channel").
//
//	redrive -broker 127.0.0.1:1883 -queue jobs -filter 'jobs/#' [-max N]
//
// It reads <queue>__dlq as a durable consumer (so a second run carries on
// where the first stopped), takes the __dlq level out of each topic — where
// the queue's filter has its '#', or the last level — and publishes the
// payload back with the publisher's own properties and its saguin-id, so the
// redriven job is the same message (invariant 8) at a new offset with a
// fresh attempt count. The saguin-dlq-* headers cannot ride along: the
// broker strips every saguin-* property but saguin-id from a publish.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	paholog "github.com/eclipse/paho.golang/paho/log"
	"github.com/eclipse/paho.golang/paho/session/state"
)

func main() {
	broker := flag.String("broker", "127.0.0.1:1883", "broker address host:port")
	queue := flag.String("queue", "", "the queue whose dead letters to redrive (required)")
	filter := flag.String("filter", "", "the queue's filter as configured (default <queue>/#)")
	max := flag.Int("max", 0, "stop after this many jobs (0: until the dead-letter channel is drained)")
	idle := flag.Duration("idle", 2*time.Second, "stop when no dead letter arrives for this long")
	flag.Parse()
	if *queue == "" {
		fmt.Fprintln(os.Stderr, "redrive: -queue is required")
		os.Exit(2)
	}
	if *filter == "" {
		*filter = *queue + "/#"
	}
	n, err := Redrive(context.Background(), Options{Broker: *broker, Queue: *queue, Filter: *filter, Max: *max, Idle: *idle})
	fmt.Printf("redrove %d job(s)\n", n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "redrive:", err)
		os.Exit(1)
	}
}

// Options say which queue to redrive and how long to wait.
type Options struct {
	Broker string
	Queue  string
	Filter string
	Max    int
	Idle   time.Duration

	// pahoDebug, when set, is paho's debug logger (tests).
	pahoDebug paholog.Logger
}

// Redrive republishes dead letters until Max jobs or Idle passes with none.
func Redrive(ctx context.Context, o Options) (int, error) {
	deadLetters := make(chan *paho.Publish, 64)
	conn, err := net.DialTimeout("tcp", o.Broker, 10*time.Second)
	if err != nil {
		return 0, err
	}
	// The session state is ours so that ack can write a PUBACK paho's
	// tracker lost (ack).
	sess := state.NewInMemory()
	defer sess.Close()
	c := paho.NewClient(paho.ClientConfig{
		Conn:     packets.NewThreadSafeConn(conn),
		Session:  sess,
		ClientID: "redrive-" + o.Queue,
		// Acknowledge a dead letter only once its job is back in the queue:
		// the durable position then never passes a job not yet redriven.
		EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			deadLetters <- pr.Packet
			return true, nil
		}},
	})
	if o.pahoDebug != nil {
		c.SetDebugLogger(o.pahoDebug)
	}
	expiry := uint32(7 * 24 * 3600)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "redrive-" + o.Queue, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = c.Disconnect(&paho.Disconnect{}) }()
	dlqFilter, err := deadLetterFilter(o.Filter)
	if err != nil {
		return 0, err
	}
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: dlqFilter, QoS: 1}}})
	if err != nil || sa.Reasons[0] > 1 {
		return 0, fmt.Errorf("subscribe %s: %v %v", dlqFilter, err, sa)
	}
	n := 0
	for o.Max == 0 || n < o.Max {
		var dl *paho.Publish
		select {
		case dl = <-deadLetters:
		case <-time.After(o.Idle):
			return n, nil
		case <-ctx.Done():
			return n, ctx.Err()
		}
		if dl.Properties.User.Get("saguin-dlq-channel") != o.Queue {
			if err := ack(c, sess, dl); err != nil {
				return n, err
			}
			continue
		}
		topic, err := OriginalTopic(o.Filter, dl.Topic)
		if err != nil {
			return n, err
		}
		if _, err := c.Publish(ctx, redriven(dl, topic)); err != nil {
			return n, fmt.Errorf("republish %s: %w", topic, err)
		}
		if err := ack(c, sess, dl); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// ack acknowledges a dead letter, in the order received (this loop takes
// them one at a time). paho.golang v0.23.0 starts handling PUBLISHes before
// its Connect resets the manual-acknowledgement tracker, so a dead letter a
// resumed session is sent with its CONNACK can be missing from the tracker:
// Ack answers ErrPacketNotFound and would never send its PUBACK, and the
// next run would put the job back a second time. Such a dead letter is
// acknowledged through the session state directly. It came before every
// dead letter the tracker holds and each is acknowledged only after the
// ones before it, so the PUBACKs still leave in order (MQTT-4.6.0-2).
func ack(c *paho.Client, sess *state.State, dl *paho.Publish) error {
	err := c.Ack(dl)
	if errors.Is(err, paho.ErrPacketNotFound) {
		err = sess.Ack(dl.Packet())
	}
	return err
}

// redriven is the job as its publisher sent it: payload, Content Type,
// Payload Format, Response Topic, Correlation Data, its own User Properties,
// and its saguin-id. Sagüin's labels (saguin-offset, saguin-dlq-*, ...) are
// left out; the broker would drop them anyway.
func redriven(dl *paho.Publish, topic string) *paho.Publish {
	p := &paho.PublishProperties{
		ContentType:     dl.Properties.ContentType,
		PayloadFormat:   dl.Properties.PayloadFormat,
		ResponseTopic:   dl.Properties.ResponseTopic,
		CorrelationData: dl.Properties.CorrelationData,
	}
	for _, u := range dl.Properties.User {
		if !strings.HasPrefix(u.Key, "saguin-") || u.Key == "saguin-id" {
			p.User = append(p.User, u)
		}
	}
	return &paho.Publish{Topic: topic, QoS: 1, Payload: dl.Payload, Properties: p}
}

// deadLetterFilter is the dead-letter channel's filter: __dlq where the
// queue's filter has its '#', or on the end.
func deadLetterFilter(queueFilter string) (string, error) {
	levels := strings.Split(queueFilter, "/")
	if levels[len(levels)-1] == "#" {
		return strings.Join(append(levels[:len(levels)-1:len(levels)-1], "__dlq", "#"), "/"), nil
	}
	return queueFilter + "/__dlq", nil
}

// OriginalTopic takes the __dlq level out of a dead letter's topic, at the
// place the queue's filter puts it.
func OriginalTopic(queueFilter, dlqTopic string) (string, error) {
	f := strings.Split(queueFilter, "/")
	t := strings.Split(dlqTopic, "/")
	at := len(t) - 1 // no '#': __dlq is the last level
	if f[len(f)-1] == "#" {
		at = len(f) - 1
	}
	if at < 0 || at >= len(t) || t[at] != "__dlq" {
		return "", errors.New("topic " + dlqTopic + " has no __dlq level where filter " + queueFilter + " puts it")
	}
	return strings.Join(append(t[:at:at], t[at+1:]...), "/"), nil
}
