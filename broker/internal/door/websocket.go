package door

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// MaxUpgradeRequest bounds the HTTP request of a WebSocket upgrade, its
// request line and headers together; a longer one is answered 431.
const MaxUpgradeRequest = 8 << 10

// upgradeReadBuffer is the reader the request is parsed through; a header
// line longer than it is still read (net/textproto joins the pieces), up
// to MaxUpgradeRequest in all.
const upgradeReadBuffer = 1 << 10

// websocketGUID is RFC 6455 §1.3's constant, hashed with the client's key.
const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// WebSocket is a ws door's upgrade: the subprotocol it selects and the
// page origins it admits (docs/configuration.md "`broker.mqtt`"). The origins are replaced whole
// while the door serves (SetOrigins: SIGUSR1); an upgrade reads them once.
type WebSocket struct {
	// Subprotocol is the one the client must offer and is answered with
	// ("mqtt": MQTT 5 §6).
	Subprotocol string
	origins     atomic.Pointer[Origins]
}

// Origins are a ws door's page checks.
type Origins struct {
	// SameOrigin: the page's scheme, host and port must be the request's
	// own (https when the door has TLS).
	SameOrigin bool
	// Allowed lists the admitted origins, scheme://host[:port]; empty is
	// no check. With SameOrigin too, a page must pass both.
	Allowed []string
}

// NewWebSocket is a ws door selecting subprotocol, admitting origins.
func NewWebSocket(subprotocol string, o Origins) *WebSocket {
	w := &WebSocket{Subprotocol: subprotocol}
	w.SetOrigins(o)
	return w
}

// SetOrigins replaces the origin checks for upgrades from now on.
func (w *WebSocket) SetOrigins(o Origins) {
	norm := Origins{SameOrigin: o.SameOrigin}
	for _, a := range o.Allowed {
		if s, ok := normalOrigin(a); ok {
			norm.Allowed = append(norm.Allowed, s)
		}
	}
	w.origins.Store(&norm)
}

// Origins are the checks applied now.
func (w *WebSocket) Origins() Origins { return *w.origins.Load() }

// UpgradeRefusal is an upgrade answered with an HTTP error instead of 101.
type UpgradeRefusal struct {
	Status int
	Reason string
	// Origin is the page's origin when that is what was refused (403).
	Origin string
}

func (e *UpgradeRefusal) Error() string {
	return fmt.Sprintf("WebSocket upgrade refused: HTTP %d: %s", e.Status, e.Reason)
}

// upgrade reads the client's HTTP request from conn and answers it: 101
// and the WebSocket stream, or an HTTP error and an *UpgradeRefusal. The
// bytes the client sent after its request (it should send none before the
// 101) are kept for the stream.
func (w *WebSocket) upgrade(conn net.Conn, secure bool) (*wsConn, error) {
	// invariant 13: the request is read through a bound, whatever it declares.
	lr := &io.LimitedReader{R: conn, N: MaxUpgradeRequest}
	br := bufio.NewReaderSize(lr, upgradeReadBuffer)
	req, err := http.ReadRequest(br)
	if err != nil {
		if lr.N == 0 {
			return nil, w.refuse(conn, &UpgradeRefusal{Status: http.StatusRequestHeaderFieldsTooLarge,
				Reason: fmt.Sprintf("the request's line and headers pass %d bytes", MaxUpgradeRequest)})
		}
		var ne net.Error
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
			return nil, fmt.Errorf("reading the WebSocket upgrade request: %w", err)
		}
		return nil, w.refuse(conn, &UpgradeRefusal{Status: http.StatusBadRequest, Reason: "not an HTTP request: " + err.Error()})
	}
	key, accepted := w.check(req, secure)
	if accepted != nil {
		return nil, w.refuse(conn, accepted)
	}
	sum := sha1.Sum([]byte(key + websocketGUID))
	answer := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Accept: " + base64.StdEncoding.EncodeToString(sum[:]) + "\r\n" +
		"Sec-WebSocket-Protocol: " + w.Subprotocol + "\r\n\r\n"
	if _, err := io.WriteString(conn, answer); err != nil {
		return nil, fmt.Errorf("answering the WebSocket upgrade: %w", err)
	}
	ws := &wsConn{Conn: conn}
	if n := br.Buffered(); n > 0 {
		ws.carry = make([]byte, n)
		_, _ = io.ReadFull(br, ws.carry)
	}
	return ws, nil
}

// check judges an upgrade request (RFC 6455 §4.2.1, docs/configuration.md "`broker.mqtt`"): its
// Sec-WebSocket-Key, or why it is refused.
func (w *WebSocket) check(req *http.Request, secure bool) (string, *UpgradeRefusal) {
	refuse := func(status int, format string, a ...any) (string, *UpgradeRefusal) {
		return "", &UpgradeRefusal{Status: status, Reason: fmt.Sprintf(format, a...)}
	}
	switch {
	case req.ProtoMajor != 1 || req.ProtoMinor != 1:
		return refuse(http.StatusHTTPVersionNotSupported, "%s; a ws door speaks HTTP/1.1 only", req.Proto)
	case req.Method != http.MethodGet:
		return refuse(http.StatusMethodNotAllowed, "method %s; a WebSocket upgrade is a GET", req.Method)
	case req.Host == "":
		return refuse(http.StatusBadRequest, "no Host header")
	case req.ContentLength != 0 || len(req.TransferEncoding) > 0:
		return refuse(http.StatusBadRequest, "an upgrade request has no body")
	case !headerHasToken(req.Header, "Upgrade", "websocket") || !headerHasToken(req.Header, "Connection", "upgrade"):
		return refuse(http.StatusUpgradeRequired, "not a WebSocket upgrade (Upgrade: websocket and Connection: Upgrade are missing); this door serves MQTT over WebSocket")
	case req.Header.Get("Sec-WebSocket-Version") != "13":
		return refuse(http.StatusUpgradeRequired, "Sec-WebSocket-Version %q; this door speaks version 13", req.Header.Get("Sec-WebSocket-Version"))
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 16 {
		return refuse(http.StatusBadRequest, "Sec-WebSocket-Key is not 16 bytes in base64")
	}
	if origins := req.Header.Values("Origin"); len(origins) > 0 {
		if len(origins) > 1 {
			return refuse(http.StatusForbidden, "%d Origin headers; a page has one origin", len(origins))
		}
		if why := w.Origins().refuses(origins[0], req.Host, secure); why != "" {
			return "", &UpgradeRefusal{Status: http.StatusForbidden, Reason: why, Origin: origins[0]}
		}
	}
	if !headerHasToken(req.Header, "Sec-WebSocket-Protocol", w.Subprotocol) {
		return refuse(http.StatusBadRequest, "the client does not offer the WebSocket subprotocol %q (Sec-WebSocket-Protocol: %q)",
			w.Subprotocol, req.Header.Get("Sec-WebSocket-Protocol"))
	}
	return key, nil
}

// refuse answers the HTTP error r and returns it.
func (w *WebSocket) refuse(conn net.Conn, r *UpgradeRefusal) error {
	body := r.Reason + "\n"
	extra := ""
	if r.Status == http.StatusUpgradeRequired {
		extra = "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
	}
	answer := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
		r.Status, http.StatusText(r.Status), len(body), extra, body)
	_, _ = io.WriteString(conn, answer)
	return r
}

// headerHasToken reports whether a comma-separated header holds token
// (case-insensitively).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// refuses says why a page of origin may not open this door ("": it may).
// host is the request's Host header; secure, whether it came over TLS.
func (o Origins) refuses(origin, host string, secure bool) string {
	page, ok := normalOrigin(origin)
	if o.SameOrigin {
		scheme := "http"
		if secure {
			scheme = "https"
		}
		own, _ := normalOrigin(scheme + "://" + host)
		if !ok || page != own {
			return fmt.Sprintf("same_origin: the page's origin %q is not the door's own %q", origin, own)
		}
	}
	if len(o.Allowed) > 0 {
		for _, a := range o.Allowed {
			if ok && page == a {
				return ""
			}
		}
		return fmt.Sprintf("the page's origin %q is not in allowed_origins", origin)
	}
	return ""
}

// normalOrigin is an origin as it is compared: scheme and host in lower
// case, the scheme's default port left out.
func normalOrigin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", false
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if (scheme == "http" || scheme == "ws") && port == "80" || (scheme == "https" || scheme == "wss") && port == "443" {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, true
}
