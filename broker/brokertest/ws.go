package brokertest

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
)

// WSConn is an MQTT client's WebSocket connection (gorilla/websocket, a
// stock client library) as a net.Conn: each Write is one binary message,
// Read joins the messages the broker sends.
type WSConn struct {
	*websocket.Conn
	r io.Reader
}

// DialWS opens a WebSocket to url ("ws://host:port/mqtt" or "wss://…")
// offering the mqtt subprotocol, with origin as its Origin header ("" for
// none) and tlsConfig for wss. On a refused upgrade the HTTP response is
// returned with the error.
func DialWS(url, origin string, tlsConfig *tls.Config) (*WSConn, *http.Response, error) {
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, TLSClientConfig: tlsConfig, HandshakeTimeout: 10 * time.Second}
	h := http.Header{}
	if origin != "" {
		h.Set("Origin", origin)
	}
	c, resp, err := d.Dial(url, h)
	if err != nil {
		return nil, resp, err
	}
	return &WSConn{Conn: c}, resp, nil
}

func (c *WSConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			typ, r, err := c.NextReader()
			if err != nil {
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				continue
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if err == io.EOF {
			c.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (c *WSConn) Write(p []byte) (int, error) {
	if err := c.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// SetDeadline sets both deadlines of the WebSocket.
func (c *WSConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

var _ net.Conn = (*WSConn)(nil)
