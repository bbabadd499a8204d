// Package wire checks the bytes a client sends, at the level of MQTT's
// framing, before the substrate (mochi-mqtt/server) decodes a byte of them
// (rfcs/wire-validation.md; the limits at the door, rfcs/limits.md).
//
// What it checks: a Framer follows each packet's Remaining Length and
// judges its declared size against limits.max_connect_size (the CONNECT)
// or limits.max_message_size (every later packet) before anything is
// allocated for it (invariant 13), then reads every length, count, flag and
// property in the packet against the packet's own bounds and against what
// MQTT 3.1.1 and 5 allow (check.go). Only a packet that passes is handed
// on, one packet per Read; a refused one gets a Refusal, which the
// connection answers (Framer.Answer: CONNACK or DISCONNECT with the reason
// code, or a silent close) before any state of the broker changes.
//
// Why at the byte level: the substrate's decoders trust the lengths they
// read — a SUBSCRIBE missing its options byte indexed past its buffer and
// the panic ended the whole process — and accept packets MQTT calls
// malformed or protocol errors, on which the broker would then act. A
// decoded packet is too late: the check has to run on the bytes, and it
// has to hold no more of them than the packet's limit allows.
//
// The package knows nothing of the broker: it reads bytes from a Conn and
// hands its verdicts to it (the broker's clientConn, admission.go, counts,
// answers and logs them). It also reads the opening bytes of a CONNECT for
// a socket answered before it is admitted (ReadConnectOpening,
// ReadVersion) and scans the whole packets the broker writes (AnyPacket).
// broker/wire_seam_test.go keeps the checks here: package broker may
// declare none of them.
package wire
