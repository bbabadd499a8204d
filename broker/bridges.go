package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/bridge"
	"saguin.dev/broker/config"
	"saguin.dev/broker/internal/metrics"
)

// bridgeListener names the stand-in connections a bridge's inbound
// records are published from (docs/bridge.md "What crosses, inbound").
const bridgeListener = "bridge"

// inProcessPublisher reports whether cl is a stand-in of ours — a Will's or
// a bridge's — whose QoS 2 publish is written at once: nobody will send a
// Will's PUBREL, and a bridge answers its peer's exchange only once the
// record is stored (rfcs/qos2-holds.md "Only client publishes are held").
func inProcessPublisher(cl *mqtt.Client) bool {
	return cl.Net.Listener == willListener || cl.Net.Listener == bridgeListener
}

// bridgeClientID is the client id a bridge's records are published under
// (the publisher of each record; also its user name under an acl_file).
func bridgeClientID(name string) string { return "bridge:" + name }

// bridgeLocal is the broker as a bridge's link sees it (bridge.Local): a
// record brought in is published through the clients' publish path from a
// stand-in connection, and the link acknowledges it to the peer only once
// that publish is stored.
type bridgeLocal struct {
	b    *Broker
	name string
}

// Store publishes rec and says what became of it (bridge.Local).
// invariants 10, 13, 18: a bridge's record takes the clients' publish path — every bound, the ACL for the bridge's user, the channel's own limits — and is acknowledged to the peer only once stored.
func (k bridgeLocal) Store(_ context.Context, rec bridge.Record) (bridge.Outcome, string) {
	b := k.b
	if b.closing.Load() {
		return bridge.Retry, ""
	}
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: rec.QoS, Retain: rec.Retain},
		TopicName:   rec.Topic,
		Payload:     rec.Payload,
		Properties: packets.Properties{
			ContentType: rec.ContentType, ResponseTopic: rec.ResponseTopic, CorrelationData: rec.CorrelationData,
		},
		ProtocolVersion: 5,
	}
	if rec.PayloadFormat != nil {
		pk.Properties.PayloadFormat, pk.Properties.PayloadFormatFlag = *rec.PayloadFormat, true
	}
	if rec.MessageExpiry != nil {
		pk.Properties.MessageExpiryInterval = *rec.MessageExpiry
	}
	if rec.ID != "" {
		// invariant 8: the record keeps the identity it had at the peer.
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: "saguin-id", Val: rec.ID})
	}
	for _, u := range rec.User {
		pk.Properties.User = append(pk.Properties.User, packets.UserProperty{Key: u.Key, Val: u.Value})
	}
	id := bridgeClientID(k.name)
	as := b.mqtt.NewClient(nil, bridgeListener, id, false)
	as.Properties.ProtocolVersion = 5
	as.Properties.Username = []byte(id)
	err := b.publishFrom(as, bridgeListener, pk)
	if err == nil {
		return bridge.Stored, ""
	}
	var code packets.Code
	switch {
	case errors.As(err, &code) && retryable(code):
		// A full channel or store, a publish rate, a store that failed:
		// held back and tried again; the peer waits at our Receive
		// Maximum meanwhile (docs/bridge.md "What crosses, inbound").
		return bridge.Retry, ""
	case errors.As(err, &code):
		// A bound the record is over, a topic or grant refused: the
		// refusal is logged as a client's would be (one bounded line).
		return bridge.Never, bridge.CauseNeverAccepted
	case errors.Is(err, packets.ErrRejectPacket):
		// A QoS 0 record refused: at most once, and this was the once.
		return bridge.Never, bridge.CauseNeverAccepted
	}
	// The fan-out's injection failed (the substrate stopping): tried again.
	return bridge.Retry, ""
}

// retryable tells a refusal that room or time may cure — a full channel or
// retained store, a publish rate, a store that failed — from one no retry
// can (a bound the record is over, a topic refused).
func retryable(code packets.Code) bool {
	switch code.Code {
	case codeImplementation.Code:
		return true
	case codeQuotaExceeded.Code:
		return strings.Contains(code.Reason, " is full") || strings.HasPrefix(code.Reason, publishRateReason)
	}
	return false
}

// makeBridges makes a link for each configured bridge (Start calls it
// before anything listens, so a link that cannot be made stops the start).
func (b *Broker) makeBridges() error {
	for _, bc := range b.cfg.Bridges {
		cfg, err := linkConfig(bc, b)
		if err != nil {
			return err
		}
		l, err := bridge.New(cfg, bridgeLocal{b: b, name: bc.Name})
		if err != nil {
			return err
		}
		b.bridges = append(b.bridges, l)
	}
	return nil
}

// runBridges starts the links once channels, sessions and the queues'
// engines are up (Start calls it last): records brought in find their
// channels ready. Each link is a background goroutine of the broker,
// ended by Close (b.ctx) before the providers close.
func (b *Broker) runBridges() {
	for _, l := range b.bridges {
		b.background(func(ctx context.Context) {
			if err := l.Run(ctx); err != nil {
				b.log.Error("bridge stopped", "error", err)
			}
		})
	}
}

// linkConfig turns a configured bridge into its link's configuration. The
// TLS files are read at every handshake, so a renewed certificate is used
// at the next connection without a restart.
func linkConfig(bc config.Bridge, b *Broker) (bridge.Config, error) {
	u := &url.URL{Scheme: bc.Scheme, Host: bc.Host}
	rules := make([]*bridge.Rule, len(bc.Rules))
	for i, r := range bc.Rules {
		rules[i] = r.Rule
	}
	cfg := bridge.Config{
		Name: bc.Name, Peer: u, ClientID: bc.ClientID, SessionExpiry: bc.SessionExpiry,
		ReceiveMaximum: bc.ReceiveMaximum, AckInterval: bc.AckInterval, Rules: rules, Log: b.log,
		// invariant 13: the peer is told our limit, so nothing larger is read off the link.
		MaximumPacketSize: uint32(min(b.cfg.Broker.Limits.MaxMessageSize, 1<<28-1)),
	}
	if bc.Encrypted() {
		host := u.Hostname()
		cfg.TLS = func() (*tls.Config, error) { return bridgeTLS(bc, host) }
	}
	return cfg, nil
}

// bridgeTLS reads a bridge's TLS files for one handshake.
func bridgeTLS(bc config.Bridge, host string) (*tls.Config, error) {
	tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if bc.CAFile != "" {
		pem, err := os.ReadFile(bc.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", bc.CAFile)
		}
		tc.RootCAs = pool
	}
	if bc.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(bc.CertFile, bc.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file and key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// bridgeFigures copies each link's counters for the metric catalogue
// (saguin_bridge_*), each through the link's own Stats.
func (b *Broker) bridgeFigures() []metrics.BridgeFigures {
	out := make([]metrics.BridgeFigures, 0, len(b.bridges))
	for _, l := range b.bridges {
		st := l.Stats()
		f := metrics.BridgeFigures{
			Name: st.Name, Peer: st.Peer, Connected: st.Connected,
			Received: uint64(st.Received), Unstored: map[string]uint64{}, Unsent: map[string]uint64{},
			OldestUnacknowledgedSeconds: st.OldestUnacknowledged.Seconds(),
		}
		if st.Connects > 1 {
			f.Reconnects = uint64(st.Connects - 1)
		}
		for cause, n := range st.Unstored {
			f.Unstored[cause] = uint64(n)
		}
		out = append(out, f)
	}
	return out
}

// reloadBridgeCertificates is SIGUSR1 for the bridges (ReloadCertificates
// calls it): each encrypted link's files are read now, and where they load
// the link is rebuilt so its next handshake, at once, uses them — the
// session kept at the peer. Files that do not load are logged and the link
// is left as it is (it reads them again at its next handshake anyway).
func (b *Broker) reloadBridgeCertificates() error {
	var errs []error
	for i, bc := range b.cfg.Bridges {
		if !bc.Encrypted() || i >= len(b.bridges) {
			continue
		}
		if _, err := bridgeTLS(bc, (&url.URL{Host: bc.Host}).Hostname()); err != nil {
			errs = append(errs, fmt.Errorf("bridge %s: %w", bc.Name, err))
			b.log.Error("bridge certificates not reloaded: a file is bad", "bridge", bc.Name, "error", err)
			continue
		}
		b.bridges[i].Rebuild()
		b.log.Info("bridge certificates re-read; the link connects again with them", "bridge", bc.Name)
	}
	return errors.Join(errs...)
}
