package broker_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
)

// doorsConfig is appendConfig on sqlite with its listen block replaced by
// doors (YAML under listen:, indented six spaces) and the broker.limits
// lines given.
func doorsConfig(t *testing.T, dir, doors string, limits ...string) string {
	t.Helper()
	tmpl := strings.Replace(appendConfigWith(sqliteProvider, ""),
		"    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n", "    listen:\n"+doors, 1)
	if len(limits) > 0 {
		block := "  limits:\n"
		for _, l := range limits {
			block += "    " + l + "\n"
		}
		tmpl = strings.Replace(tmpl, "  storage:\n", block+"  storage:\n", 1)
	}
	return brokertest.Config(t, dir, tmpl)
}

// plainAndTLS is a plain tcp door "plain" and a TLS door named name, its
// tls block srv's files and more.
func plainAndTLS(name string, srv brokertest.Issued, more string) string {
	return `      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: ` + name + `
          address: "127.0.0.1:0"
          tls: ` + tlsBlock(srv, more) + "\n"
}

// tlsBlock is a door's tls: block on one line.
func tlsBlock(srv brokertest.Issued, more string) string {
	return fmt.Sprintf("{cert_file: %q, key_file: %q%s}", srv.CertFile, srv.KeyFile, more)
}

// doorPort is the port of the door named name.
func doorPort(t *testing.T, b *brokertest.Broker, name string) string {
	t.Helper()
	a, ok := b.ListenerAddr(name).(*net.TCPAddr)
	if !ok {
		t.Fatalf("no tcp door %s", name)
	}
	return strconv.Itoa(a.Port)
}

// doorAddr is host:port of the door named name.
func doorAddr(t *testing.T, b *brokertest.Broker, name string) string {
	t.Helper()
	return "127.0.0.1:" + doorPort(t, b, name)
}

// awaitPeer waits until client id is connected and returns what its door
// knew of it.
func awaitPeer(t *testing.T, b *brokertest.Broker, id string) broker.PeerView {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if p, ok := broker.PeerOf(b.Broker, id); ok {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %s never connected", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mosquittoSub runs Debian's mosquitto_sub as id on topic doors/<id>,
// waiting for two messages, with the TLS arguments given; its lines come
// on the channel, which is closed when it exits.
func mosquittoSub(t *testing.T, port, id string, tlsArgs ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	args := append([]string{"-h", "localhost", "-p", port, "-V", "5", "-i", id, "-t", "doors/" + id, "-C", "2", "-W", "30"}, tlsArgs...)
	cmd := exec.Command("mosquitto_sub", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("mosquitto_sub: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// nextLine is the next line a tool printed ("" once it has exited).
func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(wait):
		t.Fatal("the tool printed nothing")
		return ""
	}
}

// mosquittoPub publishes one QoS 1 message with Debian's mosquitto_pub and
// returns its error and output.
func mosquittoPub(port, topic, msg string, tlsArgs ...string) (string, error) {
	args := append([]string{"-h", "localhost", "-p", port, "-V", "5", "-q", "1", "-t", topic, "-m", msg}, tlsArgs...)
	out, err := exec.Command("mosquitto_pub", args...).CombinedOutput()
	return string(out), err
}

// docs/configuration.md "`broker.mqtt`"; docs/security.md "1. Certificates" with stock clients: mosquitto_sub and mosquitto_pub
// verify the broker's certificate (--cafile) on a TLS door; on a mutual-TLS
// door a client without a certificate fails its handshake and one with a
// certificate is served, its Common Name exposed as a verified name; on a
// door with require_certificate: false both are served, and only the one
// with a certificate is named.
func TestTLSDoorsServeMosquittoClients(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("server")
	cert := pki.Client("sensor", "sensor-1")
	ca := fmt.Sprintf(", client_ca_file: %q", pki.CAFile)
	b := brokertest.Start(t, doorsConfig(t, dir, `      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: tls
          address: "127.0.0.1:0"
          tls: `+tlsBlock(srv, "")+`
        - name: mtls
          address: "127.0.0.1:0"
          tls: `+tlsBlock(srv, ca)+`
        - name: optional
          address: "127.0.0.1:0"
          tls: `+tlsBlock(srv, ca+", require_certificate: false")+`
`))
	pub := brokertest.Connect(t, doorAddr(t, b, "plain"), "plain-pub", brokertest.ClientOptions{CleanStart: true})
	verifyOnly := []string{"--cafile", pki.CAFile}
	withCert := []string{"--cafile", pki.CAFile, "--cert", cert.CertFile, "--key", cert.KeyFile}

	deliver := func(door, id string, tlsArgs []string, wantName string) {
		t.Helper()
		// Retained: it reaches the subscriber whenever its SUBSCRIBE lands;
		// once it is printed, the subscription is in place.
		if _, err := pub.Publish(&paho.Publish{Topic: "doors/" + id, QoS: 1, Retain: true, Payload: []byte("to " + id)}); err != nil {
			t.Fatal(err)
		}
		cmd, lines := mosquittoSub(t, doorPort(t, b, door), id, tlsArgs...)
		if got := nextLine(t, lines); got != "to "+id {
			t.Fatalf("%s on %s printed %q", id, door, got)
		}
		p := awaitPeer(t, b, id)
		if p.Door != door || p.Name != wantName || (wantName != "") != (p.From == "certificate") || p.Certificate != (wantName != "") {
			t.Errorf("%s on %s: the door knew %+v, want name %q", id, door, p, wantName)
		}
		if _, err := pub.Publish(&paho.Publish{Topic: "doors/" + id, QoS: 1, Payload: []byte("again")}); err != nil {
			t.Fatal(err)
		}
		if got := nextLine(t, lines); got != "again" {
			t.Errorf("%s on %s printed %q, want again", id, door, got)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s on %s: mosquitto_sub: %v", id, door, err)
		}
	}
	deliver("tls", "tls-sub", verifyOnly, "")
	deliver("mtls", "mtls-sub", withCert, "sensor-1")
	deliver("optional", "optional-named", withCert, "sensor-1")
	deliver("optional", "optional-anonymous", verifyOnly, "")

	sub := brokertest.Connect(t, doorAddr(t, b, "plain"), "plain-sub", brokertest.ClientOptions{CleanStart: true})
	sub.Subscribe("secure/#", 1)
	if out, err := mosquittoPub(doorPort(t, b, "mtls"), "secure/no-cert", "x", verifyOnly...); err == nil {
		t.Errorf("mosquitto_pub without a certificate was served on the mutual-TLS door: %s", out)
	}
	if out, err := mosquittoPub(doorPort(t, b, "mtls"), "secure/cert", "signed", withCert...); err != nil {
		t.Errorf("mosquitto_pub with a certificate on the mutual-TLS door: %v %s", err, out)
	}
	if out, err := mosquittoPub(doorPort(t, b, "optional"), "secure/optional", "either", verifyOnly...); err != nil {
		t.Errorf("mosquitto_pub without a certificate on the optional door: %v %s", err, out)
	}
	for _, want := range []string{"secure/cert", "secure/optional"} {
		select {
		case m := <-sub.Msgs:
			if m.Topic != want {
				t.Errorf("got %s, want %s (the certificate-less publish must not arrive)", m.Topic, want)
			}
		case <-time.After(wait):
			t.Fatalf("%s never arrived", want)
		}
	}
	if !logHasLine(b.Log.String(), "TLS handshake failed", "listener=mtls") {
		t.Errorf("the refused handshake was not logged:\n%s", b.Log.Tail(30))
	}
}

// tlsDial opens a TLS connection to addr verifying the broker with pki,
// presenting cert when it is not nil.
func tlsDial(t *testing.T, addr string, pki *brokertest.PKI, cert *brokertest.Issued) (*tls.Conn, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: pki.Pool(), ServerName: "localhost"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLSCertificate(t)}
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nil
}

// paho.golang over TLS, MQTT 5: publish and subscribe through an append
// channel and through broadcast, both directions across a TLS door and a
// plain one; a mutual-TLS client is named by its certificate.
func TestTLSDoorServesPahoMQTT5(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("server")
	cert := pki.Client("meter", "", "meter-9.example") // no CN: the first DNS name names it
	b := brokertest.Start(t, doorsConfig(t, dir, plainAndTLS("secure", srv, fmt.Sprintf(", client_ca_file: %q, min_version: \"1.3\"", pki.CAFile))))
	conn, err := tlsDial(t, doorAddr(t, b, "secure"), pki, &cert)
	if err != nil {
		t.Fatal(err)
	}
	if v := conn.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("TLS version %x, want 1.3 (min_version)", v)
	}
	secure, err := brokertest.DialOver(t, conn, "meter", brokertest.ClientOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	if p := awaitPeer(t, b, "meter"); p.Name != "meter-9.example" || p.From != "certificate" {
		t.Errorf("the mutual-TLS client is known as %+v, want meter-9.example from its certificate", p)
	}
	plain := brokertest.Connect(t, doorAddr(t, b, "plain"), "plain", brokertest.ClientOptions{CleanStart: true})
	secure.Subscribe("events/#", 1)
	secure.Subscribe("status/#", 1)
	plain.Subscribe("replies/#", 1)
	for _, m := range []struct {
		from  *brokertest.Client
		to    *brokertest.Client
		topic string
	}{{plain, secure, "events/meter"}, {plain, secure, "status/meter"}, {secure, plain, "replies/meter"}} {
		payload := bytes.Repeat([]byte(m.topic), 3000) // several TLS records
		if r, err := m.from.Publish(&paho.Publish{Topic: m.topic, QoS: 1, Payload: payload}); err != nil || r.ReasonCode != 0 {
			t.Fatalf("publish %s: %v %+v", m.topic, err, r)
		}
		select {
		case got := <-m.to.Msgs:
			if got.Topic != m.topic || !bytes.Equal(got.Payload, payload) {
				t.Fatalf("got %s (%d bytes), want %s", got.Topic, len(got.Payload), m.topic)
			}
		case <-time.After(wait):
			t.Fatalf("%s never arrived", m.topic)
		}
	}
	// TLS 1.2 is below this door's floor.
	cfg := &tls.Config{RootCAs: pki.Pool(), ServerName: "localhost", MaxVersion: tls.VersionTLS12}
	if c, err := tls.Dial("tcp", doorAddr(t, b, "secure"), cfg); err == nil {
		c.Close()
		t.Error("a TLS 1.2 handshake succeeded on a door with min_version 1.3")
	}
}

// docs/configuration.md "`broker.limits`": connect_timeout covers the TLS handshake, from accept. A
// client that opens a socket to a TLS door and never sends a ClientHello
// is closed at the deadline, with nothing written; one that completes its
// handshake and then sends nothing is closed too.
func TestTLSHandshakeFallsUnderConnectTimeout(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("server")
	b := brokertest.Start(t, doorsConfig(t, dir, `      tcp:
        address: "127.0.0.1:0"
        tls: `+tlsBlock(srv, "")+`
`, "connect_timeout: 1s"))
	silent := dialBytes(t, b.Address())
	silent.closedSilently()
	conn, err := tlsDial(t, b.Address(), pki, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a TLS client that sent no CONNECT was not closed: %v", err)
	}
}

// tinyReceiveBuffer is a dialer's Control giving the socket a 4 KiB
// receive buffer: a client that stops reading then stops taking the
// broker's writes at once.
func tinyReceiveBuffer(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
	})
	if err != nil {
		return err
	}
	return serr
}

// deafConn is a client socket with a tiny receive buffer, the way a
// subscriber that stops reading looks to the broker.
func deafConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second, Control: tinyReceiveBuffer}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// goDeaf connects as id over conn, subscribes to plain/# and stops reading.
func goDeaf(t *testing.T, conn net.Conn, id string) {
	t.Helper()
	r := &rawConn{t: t, conn: conn, r: bufio.NewReader(conn)}
	r.write(connectBytes(t, 5, id))
	r.write([]byte{0x82, 13, 0, 1, 0, 0, 7, 'p', 'l', 'a', 'i', 'n', '/', '#', 0})
	for _, want := range []byte{0x20, 0x90} {
		if pk, err := r.read(5); err != nil || pk.FixedHeader.Type != want>>4 {
			t.Fatalf("%s: %+v %v", id, pk.FixedHeader, err)
		}
	}
}

// floodUntilGone publishes large broadcast messages until the broker logs
// the end of client id's connection.
func floodUntilGone(t *testing.T, b *brokertest.Broker, pubAddr, id string) {
	t.Helper()
	pub := brokertest.Connect(t, pubAddr, "flood-"+id, brokertest.ClientOptions{CleanStart: true})
	payload := make([]byte, 32<<10)
	deadline := time.Now().Add(2 * wait)
	for !deafGone(b, id) {
		if time.Now().After(deadline) {
			t.Fatalf("the deaf client %s was never disconnected", id)
		}
		if _, err := pub.Publish(&paho.Publish{Topic: "plain/flood", QoS: 1, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
}

// invariant 16 over TLS: write_timeout still disconnects a subscriber that
// stops reading — the write deadline reaches the socket under the TLS
// layer — and the publisher is served on.
func TestInvariant16_DeafSubscriberOverTLSIsDisconnected(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("server")
	b := brokertest.Start(t, doorsConfig(t, dir, plainAndTLS("secure", srv, ""), "write_timeout: 2s"))
	raw := deafConn(t, doorAddr(t, b, "secure"))
	tc := tls.Client(raw, &tls.Config{RootCAs: pki.Pool(), ServerName: "localhost"})
	goDeaf(t, tc, "deaf-tls")
	floodUntilGone(t, b, doorAddr(t, b, "plain"), "deaf-tls")
}
