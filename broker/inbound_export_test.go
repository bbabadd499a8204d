package broker

import (
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// InboundUsage reports what the pipeline of the connection with client id
// holds: publishes owed an answer, the QoS 1 ones among them, and the bytes
// they are charged (tests only).
func (b *Broker) InboundUsage(id string) (entries, acks int, bytes int64, ok bool) {
	b.inbound.Range(func(k, v any) bool {
		if k.(*mqtt.Client).ID != id {
			return true
		}
		entries, acks, bytes = v.(*inbound).usage()
		ok = true
		return false
	})
	return entries, acks, bytes, ok
}

// ReceiveMaximum is what every MQTT 5 CONNACK advertises (tests only).
const ReceiveMaximum = receiveMaximum

// SetAnswerLinger replaces how long an answering goroutine with nothing
// owed waits for the next publish (tests only).
func (b *Broker) SetAnswerLinger(d time.Duration) { b.answerLinger.Store(int64(d)) }

// Answering reports whether the connection with client id has an answering
// goroutine running, answering or lingering (tests only).
func (b *Broker) Answering(id string) (running, ok bool) {
	b.inbound.Range(func(k, v any) bool {
		if k.(*mqtt.Client).ID != id {
			return true
		}
		running, ok = v.(*inbound).answering(), true
		return false
	})
	return running, ok
}
