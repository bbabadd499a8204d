package broker_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
)

var (
	proxiedClient = netip.MustParseAddrPort("203.0.113.7:51515")
	proxyFront    = netip.MustParseAddrPort("192.0.2.1:8883")
)

// proxyDoor is a tcp door and a unix door at sock reading PROXY v2
// headers.
func proxyDoor(t *testing.T, dir, sock string, limits ...string) string {
	t.Helper()
	return doorsConfig(t, dir, `      tcp:
        address: "127.0.0.1:0"
      unix:
        path: "`+sock+`"
        proxy_protocol: true
`, limits...)
}

// connectProxied sends a PROXY header and a CONNECT as id, and returns
// what the door knew of the client once it is connected.
func connectProxied(t *testing.T, b *brokertest.Broker, sock string, header []byte, id string) broker.PeerView {
	t.Helper()
	c := dialNetBytes(t, "unix", sock)
	c.write(append(append([]byte(nil), header...), connectBytes(t, 5, id)...))
	if ack, err := c.read(5); err != nil || ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("%s: %v %+v", id, err, ack.FixedHeader)
	}
	return awaitPeer(t, b, id)
}

// docs/configuration.md "`broker.mqtt`" proxy_protocol: the client's address and a certificate's
// CN come from the PROXY v2 header. The CN is the client's name only when
// the SSL TLV says TLS and a certificate and a verify result of 0; with
// any other verify result the client has no name, and the line says
// verify_result=N. A LOCAL header (the proxy's health check) is served
// with no address.
func TestProxyV2HeaderNamesTheClient(t *testing.T) {
	dir, sock := t.TempDir(), socketPath(t)
	b := brokertest.Start(t, proxyDoor(t, dir, sock))
	p := connectProxied(t, b, sock, brokertest.ProxyV2(proxiedClient, proxyFront,
		&brokertest.ProxySSL{Client: 0x01 | 0x02, Verify: 0, CN: "gateway-7"}), "verified")
	if !p.Proxied || p.Name != "gateway-7" || p.From != "proxy" || !p.Certificate || p.Client != "203.0.113.7:51515" || p.Door != "unix" {
		t.Errorf("a verified proxied certificate: %+v", p)
	}
	p = connectProxied(t, b, sock, brokertest.ProxyV2(proxiedClient, proxyFront,
		&brokertest.ProxySSL{Client: 0x01 | 0x02, Verify: 20, CN: "gateway-7"}), "unverified")
	if p.Name != "" || p.From != "" || !p.Certificate || p.VerifyResult != 20 {
		t.Errorf("a certificate the proxy did not verify: %+v, want no name and verify result 20", p)
	}
	if !logHasLine(b.Log.String(), "proxied client certificate not believed", "verify_result=20", "listener=unix") {
		t.Errorf("no line with verify_result=20:\n%s", b.Log.Tail(20))
	}
	p = connectProxied(t, b, sock, brokertest.ProxyV2(proxiedClient, proxyFront, nil), "plain-tcp")
	if p.Name != "" || p.Certificate || p.Client != "203.0.113.7:51515" {
		t.Errorf("a client that reached the proxy without TLS: %+v", p)
	}
	p = connectProxied(t, b, sock, brokertest.ProxyV2Local(), "health")
	if !p.Proxied || p.Client != "" || p.Name != "" {
		t.Errorf("a LOCAL header: %+v", p)
	}
}

// With proxy_protocol set a connection without a header is refused (it
// skipped the proxy), a version 1 header is refused with a line naming the
// setting, and a header that does not arrive within its deadline ends the
// connection — here the deadline is shortened for the test (the broker's
// is a fixed 5 s), and connect_timeout is an hour, so nothing else closes
// it.
func TestProxyV2HeaderIsRequired(t *testing.T) {
	dir, sock := t.TempDir(), socketPath(t)
	b := brokertest.Start(t, proxyDoor(t, dir, sock, "connect_timeout: 1h"),
		func(o *broker.Options) { o.ProxyHeaderWithin = 300 * time.Millisecond })
	bare := dialNetBytes(t, "unix", sock)
	bare.write(connectBytes(t, 5, "skipped-the-proxy"))
	bare.closedSilently()
	v1 := dialNetBytes(t, "unix", sock)
	v1.write(append([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51515 8883\r\n"), connectBytes(t, 5, "nginx-client")...))
	v1.closedSilently()
	if !logHasLine(b.Log.String(), "level=WARN", "proxy_protocol", "version 1") {
		t.Errorf("the v1 header's refusal does not name proxy_protocol:\n%s", b.Log.Tail(20))
	}
	slow := dialNetBytes(t, "unix", sock)
	slow.write(brokertest.ProxyV2(proxiedClient, proxyFront, nil)[:10])
	slow.closedSilently()
	if _, ok := broker.PeerOf(b.Broker, "skipped-the-proxy"); ok {
		t.Error("a client that sent no header was served")
	}
}

// HAProxy (Debian's) terminating TLS with client-certificate verification
// in front of the unix door, sending send-proxy-v2-ssl-cn: the CN of the
// certificate the client showed HAProxy reaches the broker as its name,
// and the client's address as its address.
func TestProxyV2FromHAProxyCarriesTheCN(t *testing.T) {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatalf("haproxy is not installed (apt-get install haproxy; .ci/run installs it): %v", err)
	}
	dir, sock := t.TempDir(), socketPath(t)
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("front")
	cert := pki.Client("fleet", "fleet-3")
	b := brokertest.Start(t, proxyDoor(t, dir, sock))
	bundle := filepath.Join(dir, "front-bundle.pem")
	var pem []byte
	for _, f := range []string{srv.CertFile, srv.KeyFile} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pem = append(pem, data...)
	}
	if err := os.WriteFile(bundle, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := free.Addr().String()
	_ = free.Close()
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global
  maxconn 64
defaults
  mode tcp
  timeout connect 10s
  timeout client 60s
  timeout server 60s
frontend mqtts
  bind %s ssl crt %s ca-file %s verify required
  default_backend saguin
backend saguin
  server broker %s send-proxy-v2-ssl-cn
`, front, bundle, pki.CAFile, sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(haproxy, "-f", cfg, "-db")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	tcfg := &tls.Config{RootCAs: pki.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{cert.TLSCertificate(t)}}
	var conn *tls.Conn
	deadline := time.Now().Add(wait)
	for {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", front, tcfg)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy never served %s: %v\n%s", front, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	local := conn.LocalAddr().String()
	if _, err := brokertest.DialOver(t, conn, "via-haproxy", brokertest.ClientOptions{CleanStart: true}); err != nil {
		t.Fatalf("MQTT through haproxy: %v\n%s", err, out.String())
	}
	p := awaitPeer(t, b, "via-haproxy")
	if p.Name != "fleet-3" || p.From != "proxy" || p.Client != local || !strings.HasPrefix(p.Client, "127.0.0.1:") {
		t.Errorf("through haproxy the client is known as %+v; want fleet-3 from the proxy, at %s", p, local)
	}
}
