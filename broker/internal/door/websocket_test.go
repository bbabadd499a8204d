package door

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The origin rules of docs/configuration.md "`broker.mqtt`", case by case.
func TestWebSocketOrigins(t *testing.T) {
	for _, c := range []struct {
		o      Origins
		origin string
		host   string
		secure bool
		admit  bool
	}{
		{Origins{SameOrigin: true}, "http://broker.example:8080", "broker.example:8080", false, true},
		{Origins{SameOrigin: true}, "HTTPS://Broker.Example", "broker.example:443", true, true},
		{Origins{SameOrigin: true}, "http://broker.example:8080", "broker.example:8080", true, false}, // https on TLS
		{Origins{SameOrigin: true}, "http://evil.example:8080", "broker.example:8080", false, false},
		{Origins{SameOrigin: true}, "http://broker.example:8081", "broker.example:8080", false, false},
		{Origins{SameOrigin: true}, "null", "broker.example:8080", false, false},
		{Origins{Allowed: []string{"https://app.example"}}, "https://app.example:443", "broker.example:8884", true, true},
		{Origins{Allowed: []string{"https://app.example"}}, "https://other.example", "broker.example:8884", true, false},
		{Origins{SameOrigin: true, Allowed: []string{"https://app.example"}}, "https://app.example", "broker.example", true, false},
		{Origins{SameOrigin: true, Allowed: []string{"https://broker.example"}}, "https://broker.example", "broker.example", true, true},
		{Origins{}, "https://anything.example", "broker.example", true, true},
	} {
		w := NewWebSocket("mqtt", c.o)
		why := w.Origins().refuses(c.origin, c.host, c.secure)
		if (why == "") != c.admit {
			t.Errorf("%+v origin %q host %q secure %v: %q, want admitted %v", c.o, c.origin, c.host, c.secure, why, c.admit)
		}
	}
}

// pipeConn is a net.Conn reading a fixed input and collecting what is
// written.
type pipeConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (p *pipeConn) Read(b []byte) (int, error)       { return p.in.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error)      { return p.out.Write(b) }
func (p *pipeConn) Close() error                     { return nil }
func (p *pipeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (p *pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (p *pipeConn) SetDeadline(time.Time) error      { return nil }
func (p *pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (p *pipeConn) SetWriteDeadline(time.Time) error { return nil }

const goodUpgrade = "GET /mqtt HTTP/1.1\r\nHost: broker.example:8080\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqttv3.1, mqtt\r\n"

// The upgrade answers 101 with RFC 6455's accept value (its own example)
// and the mqtt subprotocol, and every request it cannot serve with the
// HTTP error that says why — before any upgrade.
func TestWebSocketUpgradeAnswers(t *testing.T) {
	w := NewWebSocket("mqtt", Origins{SameOrigin: true})
	for _, c := range []struct {
		req    string
		status string
	}{
		{goodUpgrade + "\r\n", "101 Switching Protocols"},
		{goodUpgrade + "Origin: http://broker.example:8080\r\n\r\n", "101"},
		{goodUpgrade + "Origin: http://evil.example\r\n\r\n", "403 Forbidden"},
		{strings.Replace(goodUpgrade, "mqttv3.1, mqtt", "mqttv3.1", 1) + "\r\n", "400 Bad Request"},
		{strings.Replace(goodUpgrade, "HTTP/1.1", "HTTP/1.0", 1) + "\r\n", "505"},
		{strings.Replace(goodUpgrade, "GET", "POST", 1) + "\r\n", "405"},
		{strings.Replace(goodUpgrade, "Version: 13", "Version: 8", 1) + "\r\n", "426"},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "426"},
		{goodUpgrade + "X-Filler: " + strings.Repeat("f", MaxUpgradeRequest) + "\r\n\r\n", "431"},
		{"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00", ""},
	} {
		pc := &pipeConn{in: bytes.NewReader([]byte(c.req))}
		ws, err := w.upgrade(pc, false)
		answer := pc.out.String()
		if c.status == "101" || strings.HasPrefix(c.status, "101") {
			if err != nil || ws == nil {
				t.Errorf("%q: %v", c.req[:40], err)
				continue
			}
			if !strings.Contains(answer, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n") ||
				!strings.Contains(answer, "Sec-WebSocket-Protocol: mqtt\r\n") {
				t.Errorf("101 answer lacks the accept value or subprotocol:\n%s", answer)
			}
			continue
		}
		var ur *UpgradeRefusal
		if c.status == "" {
			if err == nil || answer != "" && !strings.HasPrefix(answer, "HTTP/1.1 400") {
				t.Errorf("MQTT bytes on a ws door: %v, answered %q", err, answer)
			}
			continue
		}
		if !errors.As(err, &ur) || !strings.HasPrefix(answer, "HTTP/1.1 "+c.status) {
			t.Errorf("%.60q: %v, answered %.60q; want %s", c.req, err, answer, c.status)
		}
		if ur != nil && ur.Status != http.StatusForbidden && ur.Origin != "" {
			t.Errorf("a refusal not for its origin names one: %+v", ur)
		}
	}
}

// FuzzUpgradeRequest feeds arbitrary bytes to the upgrade: it never panics,
// reads at most MaxUpgradeRequest of them, and answers 101 only to a
// request that offers the subprotocol.
func FuzzUpgradeRequest(f *testing.F) {
	f.Add([]byte(goodUpgrade + "\r\n"))
	f.Add([]byte(goodUpgrade + "Origin: http://evil.example\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w := NewWebSocket("mqtt", Origins{SameOrigin: true})
		pc := &pipeConn{in: bytes.NewReader(b)}
		ws, err := w.upgrade(pc, false)
		if read := len(b) - pc.in.Len(); read > MaxUpgradeRequest {
			t.Fatalf("read %d bytes of the request", read)
		}
		if err == nil && (ws == nil || !strings.HasPrefix(pc.out.String(), "HTTP/1.1 101 ")) {
			t.Fatalf("accepted without a 101: %q", pc.out.String())
		}
	})
}
