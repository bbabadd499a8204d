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
// What is here so far: the rules (rule.go) — which topics cross, which
// way, and the name each takes on the other side.
package bridge
