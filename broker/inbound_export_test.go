package broker

import mqtt "github.com/mochi-mqtt/server/v2"

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
