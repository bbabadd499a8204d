// Package door is what stands between an accepted socket and the bytes of
// the protocol served on it: a PROXY protocol v2 header (unix doors behind
// a proxy), TLS with optional client certificates, and the HTTP upgrade and
// framing of a WebSocket door (docs/configuration.md "`broker.mqtt`", rfcs/doors.md).
//
// It knows nothing of MQTT beyond the WebSocket subprotocol name it is
// given, so the operations listener can reuse the TLS certificates, their
// reload and the PROXY reading. Its consumer accepts the socket, takes what
// the socket costs (a connection slot, a connect deadline) and wraps it
// with Wrap; the layers are set up lazily, on the connection's own
// goroutine at its first Read, under the deadline the consumer gave, so an
// accept loop never waits on one client's handshake.
//
// Everything read before the protocol's own bytes is bounded: the PROXY
// header (MaxProxyHeader), the HTTP request (MaxUpgradeRequest), WebSocket
// control frames (125 bytes, RFC 6455 §5.5), the client certificate chain
// (MaxClientChain certificates; its bytes are bounded by crypto/tls's
// handshake message limit) and the PEM files (MaxPEMFile).
package door
