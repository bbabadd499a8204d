// Package bridge links a Sagüin broker to a peer broker as an MQTT 5
// client: records the peer publishes under an in rule are stored here and
// acknowledged to the peer only once stored; records stored here under an
// out rule are read from a stored position that moves only when the peer
// acknowledged them (docs/bridge.md).
//
// The package imports nothing of the broker's: it says what it needs of
// the broker as interfaces of its own, and the broker implements them.
// The arrow points one way, broker → bridge.
//
// What is here so far:
//
//   - rule.go: which topics cross, which way, and the name each takes on
//     the other side.
//   - link.go: one link to a peer over autopaho with manual
//     acknowledgement — a persistent session (Clean Start only never),
//     our Receive Maximum, subscriptions made again only when the peer lost
//     our session, rebuilt by closing the connection it dialled (never
//     through ConnectionManager.Disconnect, which is terminal).
//   - inbound.go: the in half. paho's callback only hands a PUBLISH off
//     to the inbox; one goroutine maps it by the first in rule, stores it
//     through Local and only then acknowledges it, in receive order,
//     batched by ack_interval. A broker that cannot hold a record now
//     (Retry) holds the peer back at our Receive Maximum; one that never
//     can (Never) is acknowledged and counted; a DUP redelivery of a
//     record stored already (dedup.go) is acknowledged, not stored again.
//
// Goroutines: Link.Run owns autopaho's and the inbound goroutine, and
// returns once both ended. Not yet here: the out half (reading channels
// from a stored position), the link's metrics and the broker's side.
package bridge
