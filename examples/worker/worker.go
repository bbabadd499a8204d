// Command worker consumes a Sagüin queue with nothing but a stock MQTT 5
// client (paho.golang): it subscribes to the queue form, does each job and
// answers it, from its own session, on the delivery's Response Topic with
// the delivery's Correlation Data (docs/channels.md "Queue").
//
//	worker -broker 127.0.0.1:1883 -queue jobs [-id worker-1] [-max N] [-fail]
//
// With -fail it answers every job "return", as a worker that cannot do the
// job would: the job comes back until retry.max_attempts is spent, and is
// then moved to the queue's dead-letter channel.
//
// The answer has to come from the connection the job was delivered to: the
// broker applies an answer only when the session that sends it is the one
// holding the job (invariant 3). That is why a shell pair of mosquitto_sub
// and mosquitto_pub cannot work a queue: mosquitto_pub is a second session,
// so its "ack" is logged and ignored, and the job comes back when its
// visibility timeout ends. worker.py beside this file is the same worker in
// Python.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

func main() {
	broker := flag.String("broker", "127.0.0.1:1883", "broker address host:port")
	queue := flag.String("queue", "jobs", "the queue channel to consume")
	id := flag.String("id", "", "client id (default worker-<pid>)")
	max := flag.Int("max", 0, "stop after answering this many jobs (0: until SIGINT or SIGTERM)")
	fail := flag.Bool("fail", false, "answer every job \"return\", as a worker that cannot do it would")
	flag.Parse()
	if *id == "" {
		*id = fmt.Sprintf("worker-%d", os.Getpid())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	process := printJob
	if *fail {
		process = func(job *paho.Publish) error {
			_ = printJob(job)
			return errors.New("failed on purpose (-fail)")
		}
	}
	n, err := Work(ctx, Options{Broker: *broker, Queue: *queue, ClientID: *id, Max: *max, Process: process, Out: os.Stdout})
	fmt.Printf("answered %d job(s)\n", n)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// Options say where the queue is and what to do with each job.
type Options struct {
	Broker   string
	Queue    string
	ClientID string
	// Max stops the worker after this many answers (0: until ctx ends).
	Max int
	// Process does one job. An error answers "return" (the job is offered
	// again, after the queue's backoff, until its attempts are spent); nil
	// answers "ack" (the job is done and leaves the queue). Nil: print it.
	Process func(job *paho.Publish) error
	// Out receives one line per answer (nil: discarded).
	Out io.Writer
}

// Work connects, consumes the queue and answers every job it is given. It
// returns how many jobs it answered.
func Work(ctx context.Context, o Options) (int, error) {
	if o.Process == nil {
		o.Process = printJob
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	// The queue hands this worker one job at a time; a small buffer keeps
	// the receive handler from ever blocking paho's router.
	jobs := make(chan *paho.Publish, 8)
	conn, err := net.DialTimeout("tcp", o.Broker, 10*time.Second)
	if err != nil {
		return 0, err
	}
	c := paho.NewClient(paho.ClientConfig{
		Conn:     packets.NewThreadSafeConn(conn),
		ClientID: o.ClientID,
		// paho acknowledges the PUBLISH (PUBACK) when this handler returns.
		// The PUBACK only says the job arrived; the visibility timeout
		// starts then, and the job is done only when it is answered below.
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			jobs <- pr.Packet
			return true, nil
		}},
	})
	// Clean Start and no Session Expiry: the session ends with the
	// connection, so a job this worker holds when it goes away is handed
	// back at once rather than at the end of its visibility timeout.
	ca, err := c.Connect(ctx, &paho.Connect{ClientID: o.ClientID, KeepAlive: 30, CleanStart: true})
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	if ca.ReasonCode != 0 {
		return 0, fmt.Errorf("connect refused: reason code 0x%02x", ca.ReasonCode)
	}
	defer func() { _ = c.Disconnect(&paho.Disconnect{}) }()

	form := "$saguin/queue/" + o.Queue
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: form, QoS: 1}}})
	if err != nil {
		return 0, fmt.Errorf("subscribe %s: %w", form, err)
	}
	if sa.Reasons[0] != 1 {
		// 0x8F: no queue has that name; 0x83: asked at QoS 0.
		return 0, fmt.Errorf("subscribe %s: reason code 0x%02x", form, sa.Reasons[0])
	}

	n := 0
	for o.Max == 0 || n < o.Max {
		var job *paho.Publish
		select {
		case job = <-jobs:
		case <-c.Done():
			return n, errors.New("connection lost")
		case <-ctx.Done():
			return n, ctx.Err()
		}
		if job.Properties == nil || job.Properties.ResponseTopic == "" || len(job.Properties.CorrelationData) == 0 {
			// Not a delivery of the queue form: nothing to answer.
			continue
		}
		verdict := "ack"
		if err := o.Process(job); err != nil {
			verdict = "return"
		}
		// The answer: the delivery's Response Topic, its Correlation Data
		// (the Delivery ID) echoed unchanged, and "ack" or "return". Its
		// PUBACK says the broker received the answer, never whether it was
		// applied: a late answer for a job that went to another worker is
		// logged by the broker and changes nothing.
		if _, err := c.Publish(ctx, &paho.Publish{
			Topic: job.Properties.ResponseTopic, QoS: 1, Payload: []byte(verdict),
			Properties: &paho.PublishProperties{CorrelationData: job.Properties.CorrelationData},
		}); err != nil {
			return n, fmt.Errorf("answer %s: %w", job.Topic, err)
		}
		n++
		fmt.Fprintf(o.Out, "%s %s attempt %s\n", verdict, job.Topic, job.Properties.User.Get("saguin-attempt"))
	}
	return n, nil
}

// printJob is the example's work: it prints the job. A real worker would
// resize the image, send the mail... and may read saguin-expires, the
// publisher's deadline, to decide whether stale work is still worth doing.
func printJob(job *paho.Publish) error {
	fmt.Printf("job %s %s (saguin-id %s, offset %s)\n", job.Topic, job.Payload,
		job.Properties.User.Get("saguin-id"), job.Properties.User.Get("saguin-offset"))
	return nil
}
