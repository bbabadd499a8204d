package broker

import (
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A retained broadcast publish and a new subscription matching it meet in
// two places: the retained store, which the subscription's retained pass
// reads, and the substrate's subscription index, which the publish's
// fan-out reads. MQTT 5 §3.3.1.3 sends a subscription the retained values
// there are "when the subscription is made"; what is published after that
// is delivered live (§3.8.4). Each retained publish therefore reaches the
// new subscriber once — in the pass (RETAIN 1) or live, never both, which a
// QoS 0/1 subscriber could not tell from two messages.
//
// Broker.retainedOrder makes the two one order. A retained broadcast
// publish holds it shared from before its value is stored until it has been
// fanned out; a SUBSCRIBE holds it exclusively while it enters the filter
// in the index and reads the retained store. So a publish either finishes
// before the subscription is made (it is in the read, and the fan-out did
// not see the filter) or starts after (it is not in the read, and the
// fan-out sees the filter). Neither side writes to a socket under it: the
// pass is written after the SUBACK, outside the lock, and the fan-out only
// queues to outboxes (invariant 16: no publisher waits on a subscriber). A
// subscription waits at most for the retained publishes in progress — a
// store write each — and they for one index entry and one store read.

// retainedBroadcast reports whether a PUBLISH from cl is a retained
// publish to a broadcast topic, which takes retainedOrder shared across
// its store and fan-out. The Will's injected copy is not: publishWill
// holds the order for it across both of its steps.
func (b *Broker) retainedBroadcast(cl *mqtt.Client, pk packets.Packet) bool {
	if !pk.FixedHeader.Retain || cl.Net.Inline {
		return false
	}
	if pk.FixedHeader.Qos == 2 && !inProcessPublisher(cl) && b.bcastHolds != nil {
		// Held until its PUBREL, which retains and delivers it under the
		// order (releaseBroadcast); nothing is stored or fanned out now.
		return false
	}
	_, claimed := b.resolver.Resolve(pk.TopicName)
	return !claimed
}

// pausePoint is a place in the broker's own code where a test can hold the
// goroutine passing it (export_test.go), to order two clients' packets
// through the broker's state rather than by sleeping. Nil, and one atomic
// load, in production.
type pausePoint struct{ fn atomic.Pointer[func()] }

func (p *pausePoint) at() {
	if f := p.fn.Load(); f != nil {
		(*f)()
	}
}

// pausePoints are the places tests hold.
type pausePoints struct {
	// beforeRetainedPass: a SUBSCRIBE's SUBACK is written and its
	// retained values not yet.
	beforeRetainedPass pausePoint
	// afterRetainStored: a retained broadcast publish is in the retained
	// store and not yet fanned out.
	afterRetainStored pausePoint
	// subscribeAtOrder: a SUBSCRIBE has reached the broker and is about
	// to take retainedOrder for a broadcast filter.
	subscribeAtOrder pausePoint
}
