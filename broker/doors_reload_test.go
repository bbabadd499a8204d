package broker_test

import (
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
)

// servedSerial is the serial of the leaf certificate a new TLS connection
// to addr is served.
func servedSerial(t *testing.T, addr string, pki *brokertest.PKI) *big.Int {
	t.Helper()
	c, err := tlsDial(t, addr, pki, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// docs/operations.md "Signals" item 4, certificate rotation: the files are replaced and
// the certificates reloaded; a client connected with the old certificate
// stays connected and served, a new connection is served the new
// certificate (its serial in the handshake), and the door's line says
// what it now holds. A broken new key changes nothing: the error names the
// door and the file, and new connections still get the certificate that
// was served.
func TestTLSCertificateRotation(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	old := pki.Server("server")
	b := brokertest.Start(t, doorsConfig(t, dir, plainAndTLS("fleet", old, "")))
	secure := doorAddr(t, b, "fleet")
	if got := servedSerial(t, secure, pki); got.Cmp(old.Serial) != 0 {
		t.Fatalf("served serial %x, want %x", got, old.Serial)
	}
	conn, err := tlsDial(t, secure, pki, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := brokertest.DialOver(t, conn, "kept", brokertest.ClientOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	kept.Subscribe("status/#", 1)

	rotated := pki.Server("server") // the same files, a new certificate and key
	if err := b.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, secure, pki); got.Cmp(rotated.Serial) != 0 {
		t.Fatalf("after the reload a new connection was served %x, want %x", got, rotated.Serial)
	}
	if !logHasLine(b.Log.String(), "TLS certificates reloaded", "listener=fleet", "serial="+rotated.Serial.Text(16), "not_after=", "client_ca=none") {
		t.Errorf("the reload's line does not say what the door holds:\n%s", b.Log.Tail(10))
	}
	plain := brokertest.Connect(t, doorAddr(t, b, "plain"), "plain", brokertest.ClientOptions{CleanStart: true})
	if _, err := plain.Publish(&paho.Publish{Topic: "status/x", QoS: 1, Payload: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-kept.Msgs:
		if string(m.Payload) != "still here" {
			t.Fatalf("got %q", m.Payload)
		}
	case <-time.After(wait):
		t.Fatal("the client connected with the old certificate was not served after the reload")
	}

	if err := os.WriteFile(rotated.KeyFile, []byte("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = b.ReloadCertificates()
	if err == nil || !strings.Contains(err.Error(), "broker.mqtt.listen.tcp[fleet]") || !strings.Contains(err.Error(), rotated.KeyFile) {
		t.Fatalf("a broken key: %v, want an error naming the door and %s", err, rotated.KeyFile)
	}
	if !logHasLine(b.Log.String(), "level=ERROR", "listener=fleet", rotated.KeyFile) {
		t.Errorf("no error line names the door and the file:\n%s", b.Log.Tail(10))
	}
	if got := servedSerial(t, secure, pki); got.Cmp(rotated.Serial) != 0 {
		t.Fatalf("after a failed reload a new connection was served %x, want %x (unchanged)", got, rotated.Serial)
	}
}

// All or nothing across doors: one door's bad file keeps every door on
// what it had, the good one too.
func TestTLSCertificateReloadIsAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	a, c := pki.Server("a"), pki.Server("c")
	b := brokertest.Start(t, doorsConfig(t, dir, `      tcp:
        - name: a
          address: "127.0.0.1:0"
          tls: `+tlsBlock(a, "")+`
        - name: c
          address: "127.0.0.1:0"
          tls: `+tlsBlock(c, fmt.Sprintf(", client_ca_file: %q", pki.CAFile))+`
`))
	pki.Server("a") // door a's files rotate
	if err := os.WriteFile(pki.CAFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := b.ReloadCertificates()
	if err == nil || !strings.Contains(err.Error(), "client_ca_file "+pki.CAFile) {
		t.Fatalf("a bad client CA file: %v", err)
	}
	if got := servedSerial(t, doorAddr(t, b, "a"), pki); got.Cmp(a.Serial) != 0 {
		t.Errorf("door a took its new certificate though door c's reload failed: %x, want %x", got, a.Serial)
	}
}

// docs/configuration.md "`broker.mqtt`": a certificate that cannot be served stops the start
// before any port opens, naming each door — all of them at once — and
// nothing is opened (the loader checked the files; they broke after).
func TestBadCertificateStopsTheStartNamingEveryDoor(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	a, c := pki.Server("a"), pki.Server("c")
	path := doorsConfig(t, dir, `      tcp:
        - name: a
          address: "127.0.0.1:0"
          tls: `+tlsBlock(a, "")+`
        - name: c
          address: "127.0.0.1:0"
          tls: `+tlsBlock(c, "")+`
`)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a.CertFile); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.KeyFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	bk, err := broker.New(cfg, broker.Options{Logger: discardLogger()})
	if err == nil {
		bk.Close()
		t.Fatal("a broker started with certificates it cannot serve")
	}
	for _, want := range []string{"broker.mqtt.listen.tcp[a]: tls.cert_file " + a.CertFile, "broker.mqtt.listen.tcp[c]: tls.key_file " + c.KeyFile} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the start's error does not name %q: %v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "saguin.db")); !os.IsNotExist(err) {
		t.Errorf("the refused start opened storage: %v", err)
	}
}

// docs/operations.md "A start": each door's listening line names it — its name when it
// has one, its kind, its address, its layers — and what it does with
// client certificates.
func TestListeningLinesNameEachDoorsLayers(t *testing.T) {
	dir, sock := t.TempDir(), socketPath(t)
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	srv := pki.Server("server")
	b := brokertest.Start(t, doorsConfig(t, dir, `      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: fleet
          address: "127.0.0.1:0"
          tls: `+tlsBlock(srv, fmt.Sprintf(", client_ca_file: %q", pki.CAFile))+`
      ws:
        - name: web
          address: "127.0.0.1:0"
        - name: webs
          address: "127.0.0.1:0"
          tls: `+tlsBlock(srv, fmt.Sprintf(", client_ca_file: %q, require_certificate: false", pki.CAFile))+`
      unix:
        path: "`+sock+`"
        proxy_protocol: true
`))
	log := b.Log.String()
	for name, want := range map[string][]string{
		"plain": {`door="plain tcp ` + doorAddr(t, b, "plain") + `"`, "client_certificates=none"},
		"fleet": {`door="fleet tcp ` + doorAddr(t, b, "fleet") + ` (tls)"`, "client_certificates=required", "client_ca=\"" + pki.CAFile},
		"web":   {`door="web ws ` + doorAddr(t, b, "web") + ` (ws)"`, "client_certificates=none"},
		"webs":  {`door="webs ws ` + doorAddr(t, b, "webs") + ` (wss)"`, "client_certificates=accepted"},
		"unix":  {`door="unix ` + sock + ` (proxy v2)"`, "client_certificates=accepted"},
	} {
		if !logHasLine(log, append([]string{"msg=listening", "listener=" + name + " "}, want...)...) {
			t.Errorf("no listening line for %s with %q:\n%s", name, want, log)
		}
	}
}

// The real binary: SIGUSR1 reloads the TLS door's certificate (a new
// connection is served the new serial; the connected client stays), and
// re-reads a ws door's origins from the edited configuration file.
func TestSIGUSR1ReloadsCertificatesAndOrigins(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	old := pki.Server("server")
	doors := `      tcp:
        address: "127.0.0.1:0"
        tls: ` + tlsBlock(old, "") + `
      ws:
        address: "127.0.0.1:0"
        same_origin: false
`
	path := doorsConfig(t, dir, doors)
	p := brokertest.StartProcess(t, path)
	conn, err := tlsDial(t, p.Address(), pki, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := brokertest.DialOver(t, conn, "kept", brokertest.ClientOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	rotated := pki.Server("server")
	edited := strings.Replace(doors, "same_origin: false", "same_origin: false\n        allowed_origins: [\"https://app.example\"]", 1)
	doorsConfig(t, dir, edited) // rewrites the same file
	p.Signal(syscall.SIGUSR1)
	if !p.WaitOutput("TLS certificates reloaded", wait) || !p.WaitOutput("allowed_origins=https://app.example", wait) {
		t.Fatalf("SIGUSR1 did not reload:\n%s", p.Output())
	}
	if got := servedSerial(t, p.Address(), pki); got.Cmp(rotated.Serial) != 0 {
		t.Fatalf("after SIGUSR1 a new connection was served %x, want %x", got, rotated.Serial)
	}
	if r, err := kept.Publish(&paho.Publish{Topic: "status/x", QoS: 1, Payload: []byte("x")}); err != nil || r.ReasonCode != 0 {
		t.Fatalf("the client connected before the reload: %v %+v", err, r)
	}
}
