package brokertest

import (
	"context"
	stdlog "log"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// Client is a stock paho.golang MQTT 5 client with its received PUBLISH
// packets collected on a channel. It adds no Sagüin behaviour: tests drive
// the broker exactly as any MQTT client would.
type Client struct {
	*paho.Client
	Connack *paho.Connack
	// Msgs receives every PUBLISH the broker sends, in arrival order.
	Msgs chan *paho.Publish
	// Disconnects receives a DISCONNECT the broker sends.
	Disconnects chan *paho.Disconnect
	t           testing.TB
}

// ClientOptions are the CONNECT settings tests vary.
type ClientOptions struct {
	CleanStart     bool
	SessionExpiry  uint32 // seconds; 0 ends the session with the connection
	ManualAck      bool   // the test calls Ack itself (PUBACK only when it says)
	ReceiveMaximum uint16
	Buffer         int // capacity of Msgs (default 100000)
	// ProblemInfo sends Request Problem Information 1. Left false, paho
	// sends 0, and the broker then leaves Reason Strings out (MQTT-3.1.2-29).
	ProblemInfo bool
}

// Connect dials addr and sends CONNECT; it fails the test if the broker
// refuses. The connection is closed when the test ends.
func Connect(t testing.TB, addr, id string, o ClientOptions) *Client {
	t.Helper()
	c, err := Dial(t, addr, id, o)
	if err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	return c
}

// Dial is Connect returning the error instead of failing.
func Dial(t testing.TB, addr, id string, o ClientOptions) (*Client, error) {
	raw, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return DialOver(t, raw, id, o)
}

// DialOver is Dial over a connection the test opened itself (TLS, a
// WebSocket).
func DialOver(t testing.TB, raw net.Conn, id string, o ClientOptions) (*Client, error) {
	conn := &closeWaitConn{Conn: raw, eof: make(chan struct{})}
	if o.Buffer == 0 {
		o.Buffer = 100000
	}
	c := &Client{Msgs: make(chan *paho.Publish, o.Buffer), Disconnects: make(chan *paho.Disconnect, 1), t: t}
	c.Client = paho.NewClient(paho.ClientConfig{
		// paho writes some packets in more than one Write, from more than
		// one goroutine (manual acks): the connection must serialise them.
		Conn:                       packets.NewThreadSafeConn(conn),
		ClientID:                   id,
		EnableManualAcknowledgment: o.ManualAck,
		SendAcksInterval:           5 * time.Millisecond,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				select {
				case c.Msgs <- pr.Packet:
				default:
					t.Errorf("client %s: message buffer full", id)
				}
				return true, nil
			},
		},
		OnServerDisconnect: func(d *paho.Disconnect) {
			select {
			case c.Disconnects <- d:
			default:
			}
		},
	})
	if os.Getenv("SAGUIN_PAHO_DEBUG") != "" {
		c.Client.SetDebugLogger(stdlog.New(os.Stderr, id+" ", stdlog.Lmicroseconds))
		c.Client.SetErrorLogger(stdlog.New(os.Stderr, id+" ERR ", stdlog.Lmicroseconds))
	}
	cp := &paho.Connect{ClientID: id, CleanStart: o.CleanStart, KeepAlive: 30,
		Properties: &paho.ConnectProperties{RequestProblemInfo: o.ProblemInfo}}
	if o.SessionExpiry > 0 {
		se := o.SessionExpiry
		cp.Properties.SessionExpiryInterval = &se
	}
	if o.ReceiveMaximum > 0 {
		rm := o.ReceiveMaximum
		cp.Properties.ReceiveMaximum = &rm
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := c.Client.Connect(ctx, cp)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	c.Connack = ca
	t.Cleanup(func() { _ = c.Client.Disconnect(&paho.Disconnect{}) })
	return c, nil
}

// Subscribe subscribes to one filter and fails the test on a refusal.
func (c *Client) Subscribe(filter string, qos byte) *paho.Suback {
	c.t.Helper()
	sa, err := c.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	if err != nil {
		c.t.Fatalf("subscribe %s: %v", filter, err)
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] >= 0x80 {
		c.t.Fatalf("subscribe %s refused: %v", filter, sa.Reasons)
	}
	return sa
}

// SubscribeWith sends a SUBSCRIBE as given and returns the SUBACK. A refusal
// is returned in the SUBACK's reasons, not as an error.
func (c *Client) SubscribeWith(s *paho.Subscribe) (*paho.Suback, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sa, err := c.Client.Subscribe(ctx, s)
	if sa != nil {
		return sa, nil
	}
	return sa, err
}

// Publish sends one PUBLISH and returns the broker's response (PUBACK reason
// for QoS 1).
func (c *Client) Publish(p *paho.Publish) (*paho.PublishResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Client.Publish(ctx, p)
}

// Next waits for the next PUBLISH from the broker.
func (c *Client) Next(timeout time.Duration) *paho.Publish {
	c.t.Helper()
	select {
	case p := <-c.Msgs:
		return p
	case <-time.After(timeout):
		c.t.Fatalf("no message within %s", timeout)
		return nil
	}
}

// Quiet asserts that no PUBLISH arrives within d.
func (c *Client) Quiet(d time.Duration) {
	c.t.Helper()
	select {
	case p := <-c.Msgs:
		c.t.Fatalf("unexpected message on %s: %q", p.Topic, p.Payload)
	case <-time.After(d):
	}
}

// Close disconnects cleanly (DISCONNECT 0x00) and returns once the broker
// has closed the connection: the close that answers a DISCONNECT, which the
// broker sends only after storing what the DISCONNECT changes (invariant 18).
func (c *Client) Close() {
	_ = c.Client.Disconnect(&paho.Disconnect{ReasonCode: 0})
}

// closeWaitConn makes the client's Close wait for the broker's close: it
// half-closes the write side, then waits for end of stream before closing.
type closeWaitConn struct {
	net.Conn
	eof  chan struct{}
	once sync.Once
}

func (c *closeWaitConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.once.Do(func() { close(c.eof) })
	}
	return n, err
}

func (c *closeWaitConn) Close() error {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		// The client may have stopped reading (it does after a DISCONNECT
		// from the broker), so drain to end of stream here.
		_ = tc.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 512)
		for {
			select {
			case <-c.eof:
				return c.Conn.Close()
			default:
			}
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
	}
	return c.Conn.Close()
}
