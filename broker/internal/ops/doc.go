// Package ops is the operations listener (docs/operations.md "The operations listener"): /health,
// /metrics and the read-only /v1/operations/ routes, served over HTTP on
// the doors of broker.operations — tcp (optionally TLS, with client
// certificates) and unix (optionally behind a proxy sending a PROXY v2
// header). rfcs/operations-listener.md records its decisions.
//
// It holds no broker state. Every answer comes from the broker through
// Source, the one interface it consumes: the broker copies what a route
// needs under its own locks, and this package formats it with none held.
// What it owns is the HTTP side: the doors' servers and their bounds, who
// the caller is (caller.go), the routes and their answers (routes.go),
// the configuration document rendered once at start (configdoc.go) and
// the shapes of the /v1 bodies (views.go), which are a contract: fields
// may be added, never renamed or dropped.
//
// The broker binds the doors (as it binds MQTT doors: a unix socket under
// its lock, its mode set before anyone connects) and hands each to Serve;
// Close stops them and waits for every request being handled.
package ops
