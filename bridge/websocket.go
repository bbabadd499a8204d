package bridge

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// dialWebSocket opens a ws:// or wss:// link: a WebSocket upgrade offering
// the "mqtt" subprotocol (MQTT 5 §6), over TLS with tc for wss. MQTT's
// bytes travel in binary messages; the connection reads them as one stream.
func dialWebSocket(ctx context.Context, u *url.URL, tc *tls.Config) (net.Conn, error) {
	d := websocket.Dialer{
		Subprotocols:     []string{"mqtt"},
		TLSClientConfig:  tc,
		HandshakeTimeout: 10 * time.Second,
		Proxy:            nil, // the peer is dialled as configured, never through an environment proxy
	}
	ws, resp, err := d.DialContext(ctx, u.String(), nil)
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("websocket upgrade refused: %s: %w", resp.Status, err)
		}
		return nil, fmt.Errorf("websocket upgrade: %w", err)
	}
	if ws.Subprotocol() != "mqtt" {
		_ = ws.Close()
		return nil, fmt.Errorf("websocket upgrade: the peer chose subprotocol %q, not mqtt", ws.Subprotocol())
	}
	return &wsStream{ws: ws}, nil
}

// wsStream is a WebSocket connection read and written as a byte stream:
// each Write is one binary message (gorilla allows one writer at a time,
// so writes take wmu), and Read drains one message after another.
type wsStream struct {
	ws  *websocket.Conn
	wmu sync.Mutex
	rmu sync.Mutex
	cur io.Reader // the message being read; nil between messages
}

func (c *wsStream) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.cur == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				return 0, fmt.Errorf("websocket: a text message on an MQTT link")
			}
			c.cur = r
		}
		n, err := c.cur.Read(p)
		if err == io.EOF {
			c.cur = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (c *wsStream) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsStream) Close() error                       { return c.ws.Close() }
func (c *wsStream) LocalAddr() net.Addr                { return c.ws.LocalAddr() }
func (c *wsStream) RemoteAddr() net.Addr               { return c.ws.RemoteAddr() }
func (c *wsStream) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsStream) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
func (c *wsStream) SetDeadline(t time.Time) error {
	if err := c.ws.SetReadDeadline(t); err != nil {
		return err
	}
	return c.ws.SetWriteDeadline(t)
}
