package ops

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	doorpkg "saguin.dev/broker/internal/door"
	"saguin.dev/broker/passwd"
)

// PrincipalHeader is the header a reverse proxy in front of a unix door
// names its verified caller with (docs/operations.md "Who the caller is"). It is read on unix doors
// only: on tcp anyone could write it.
const PrincipalHeader = "X-Saguin-Principal"

// metricsRoute is the one route a named stranger reaches.
const metricsRoute = "/metrics"

// access is what one request may reach, once the caller is known.
type access struct {
	// all: every route (no identity, on a door that trusts its callers;
	// or an operator whose line has no scope).
	all   bool
	scope passwd.Scope
	// stranger: a name the operator file does not list, or a verified
	// certificate naming nobody: /metrics only.
	stranger bool
	// who says how the caller was known, for the log: "password",
	// "certificate", "proxy", "header" or "none".
	who  string
	name string // the operator's name; "" for none
}

// reaches says whether the caller may have path.
func (a access) reaches(path string) bool {
	switch {
	case a.stranger:
		return passwd.RouteReaches(metricsRoute, path)
	case a.all:
		return true
	}
	return a.scope.Reaches(path)
}

// refusal is a request refused before its route runs: its status, its
// kind (what the log rate-limits it by, per remote host: one caller's
// repeated mistake is not a line each, and a different mistake still
// shows), and the reason the caller is told and the log says — never the
// credential.
type refusal struct {
	status int
	kind   string
	reason string
}

// The kinds of refused request.
const (
	refuseNoCredential  = "no credential"
	refuseWrongPassword = "wrong password"
	refuseName          = "name refused"
	refuseHost          = "host name"
	refuseScope         = "beyond scope"
)

// authorize decides who the caller is and what it may reach (docs/operations.md "Who the caller is"), in this order, the first source present deciding:
//
//  1. an HTTP Basic credential, checked against the door's operator file;
//     one that fails ends the evaluation (401), whatever else the
//     request carries;
//  2. a name: the client certificate this door verified (its CN, else its
//     first DNS name), the CN of a certificate the proxy verified (a unix
//     door with proxy_protocol), or the X-Saguin-Principal header (unix
//     doors only). A name the operator file lists has its scope; any
//     other — a verified certificate with no name included — reaches
//     /metrics only; a name holding a control character is refused (403);
//  3. nothing: the door trusts its callers when it has no password file
//     (the loader allowed that on a loopback address or a unix socket
//     only) — every route, on tcp only for a Host that is an address or
//     localhost (the DNS-rebinding defence); with a password file, 401.
func (s *Server) authorize(d *door, r *http.Request, peer doorpkg.Peer) (access, *refusal) {
	if _, has := r.Header["Authorization"]; has {
		return s.password(d, r)
	}
	name, from, named, bad := callerName(d, r, peer)
	if bad != nil {
		return access{}, bad
	}
	if named {
		if name == "" {
			return access{stranger: true, who: from}, nil
		}
		if err := passwd.CheckUserName(name); err != nil {
			return access{}, &refusal{http.StatusForbidden, refuseName, "the " + from + " name is refused: " + err.Error()}
		}
		if t := s.src.Operators(d.cfg.PasswordFile); d.cfg.PasswordFile != "" && t != nil {
			if scope, listed := t.ScopeOf(name); listed {
				return access{all: scope.All(), scope: scope, who: from, name: name}, nil
			}
		}
		return access{stranger: true, who: from, name: name}, nil
	}
	if d.cfg.PasswordFile != "" {
		return access{}, &refusal{http.StatusUnauthorized, refuseNoCredential, "this door asks who the caller is: send a user name and password (HTTP Basic)"}
	}
	if d.cfg.Kind == "tcp" && !addressedByIP(r.Host) {
		return access{}, &refusal{http.StatusForbidden, refuseHost, "a request with no credential is served here only when it names the broker by an IP address or localhost (Host: " +
			cutString(r.Host, 64) + "); use the address, or set broker.operations.password_file and authenticate"}
	}
	return access{all: true, who: "none"}, nil
}

// password checks an HTTP Basic credential against the door's operator
// file; the same work whatever the name (passwd.Table.Authenticate).
func (s *Server) password(d *door, r *http.Request) (access, *refusal) {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return access{}, &refusal{http.StatusUnauthorized, refuseWrongPassword, "the Authorization header is not HTTP Basic; send a user name and password"}
	}
	t := s.src.Operators(d.cfg.PasswordFile)
	if d.cfg.PasswordFile == "" || t == nil {
		return access{}, &refusal{http.StatusUnauthorized, refuseWrongPassword, "this door has no password_file, so a password cannot be checked here; send none, or set broker.operations.password_file"}
	}
	scope, ok := t.Authenticate(user, []byte(pass))
	if !ok {
		return access{}, &refusal{http.StatusUnauthorized, refuseWrongPassword, "wrong user name or password"}
	}
	return access{all: scope.All(), scope: scope, who: "password", name: user}, nil
}

// callerName is the name the connection or a proxy gives the caller.
// named is true when a source is present, even one naming nobody (a
// verified certificate with neither CN nor DNS name).
func callerName(d *door, r *http.Request, peer doorpkg.Peer) (name, from string, named bool, bad *refusal) {
	switch {
	case peer.TLS && peer.Certificate:
		// Verified by the handshake, or the handshake failed.
		return peer.Name, "certificate", true, nil
	case peer.Proxy != nil && peer.Proxy.SSL != nil && peer.Proxy.SSL.Verified():
		return peer.Proxy.SSL.CN, "proxy", true, nil
	}
	if d.cfg.Kind != "unix" {
		return "", "", false, nil // docs/operations.md "Who the caller is": the header is ignored on tcp
	}
	values := r.Header.Values(PrincipalHeader)
	switch {
	case len(values) > 1:
		// A proxy that appends rather than replaces would let a caller
		// put its own name first: two values name nobody.
		return "", "", false, &refusal{http.StatusForbidden, refuseName, "the " + PrincipalHeader + " header is given more than once; the proxy must set it, replacing any the caller sent"}
	case len(values) == 1 && values[0] != "":
		return values[0], "header", true, nil
	}
	return "", "", false, nil
}

// addressedByIP reports whether a Host header names the broker by an IP
// literal or localhost (with or without a port): what a page served from
// another name, rebound by DNS to 127.0.0.1, cannot send. A request with
// no Host (HTTP/1.0) names nothing.
func addressedByIP(host string) bool {
	if host == "" {
		return true
	}
	h := host
	if sh, _, err := net.SplitHostPort(host); err == nil {
		h = sh
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
		return true
	}
	_, err := netip.ParseAddr(h)
	return err == nil
}

// cutString bounds a value a caller chose that a message quotes.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
