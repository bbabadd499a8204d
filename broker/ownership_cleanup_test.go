package broker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
)

// The substrate's own cleanup of a connection whose session ends with it
// runs after OnDisconnect returns, and it works by client id: it deletes the
// id's entry from its client table. A goroutine descheduled between
// Sagüin's teardown and that cleanup would let a new connection of the same
// id register in between, and the cleanup would then unregister the new
// connection — it stays connected and is served nothing (invariant 17).
// The pause below is that descheduling, made certain: the new connection
// is given up to pauseFor to register before the old goroutine goes on.
func TestInvariant17_SubstrateCleanupAfterTeardownLeavesTheNewConnectionAlone(t *testing.T) {
	r := newQueueRig(t, queueConfig)
	const pauseFor = 500 * time.Millisecond
	paused := make(chan struct{}, 1)
	resume := make(chan struct{})
	var once sync.Once
	r.b.PauseAfterTeardown("device", func() {
		once.Do(func() {
			paused <- struct{}{}
			<-resume
		})
	})
	pub := brokertest.Connect(t, r.b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})

	old := brokertest.Connect(t, r.b.Address(), "device", brokertest.ClientOptions{CleanStart: true})
	old.Subscribe("plain/old", 0)
	old.Close()
	select {
	case <-paused:
	case <-time.After(wait):
		t.Fatal("the old connection's teardown never ran")
	}

	connected := make(chan *brokertest.Client, 1)
	failed := make(chan error, 1)
	go func() {
		c, err := brokertest.Dial(t, r.b.Address(), "device", brokertest.ClientOptions{CleanStart: true})
		if err != nil {
			failed <- err
			return
		}
		connected <- c
	}()
	var c *brokertest.Client
	select {
	case c = <-connected:
		// Registered while the old goroutine is paused: the cleanup that
		// follows must leave it alone.
	case err := <-failed:
		t.Fatalf("the new connection was refused: %v", err)
	case <-time.After(pauseFor):
		// Waiting behind the old connection's end: it registers after.
	}
	close(resume)
	if c == nil {
		select {
		case c = <-connected:
		case err := <-failed:
			t.Fatalf("the new connection was refused: %v", err)
		case <-time.After(wait):
			t.Fatal("the new connection never got its CONNACK")
		}
	}
	if sa, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "plain/x", QoS: 1}}}); err != nil || len(sa.Reasons) != 1 || sa.Reasons[0] != 1 {
		t.Fatalf("the new connection's SUBSCRIBE: %+v %v", sa, err)
	}
	if resp, err := pub.Publish(&paho.Publish{Topic: "plain/x", QoS: 1, Payload: []byte("hello")}); err != nil || resp.ReasonCode != 0 {
		t.Fatalf("publish: %v %+v", err, resp)
	}
	select {
	case m := <-c.Msgs:
		if string(m.Payload) != "hello" {
			t.Fatalf("the new connection got %q, want hello", m.Payload)
		}
	case <-time.After(wait):
		t.Fatal(`the new connection of client id "device" receives nothing its subscription matches: the old connection's cleanup unregistered it`)
	}
}
