package broker_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/mosquittotest"
)

// Stock clients and tools against authentication and the ACL (issue 14
// acceptance): a password file made by Debian's mosquitto_passwd, served
// unchanged; mosquitto_pub/mosquitto_sub with -u/-P on a plain door and
// with --cert/--key on a mutual-TLS door, the certificate's Common Name
// being the user the ACL knows.
func TestStockClientsAuthenticateAndAreAuthorized(t *testing.T) {
	mosquittotest.Need(t, "mosquitto_passwd", "mosquitto_pub", "mosquitto_sub")
	dir := t.TempDir()
	pw := filepath.Join(dir, "passwd")
	mosquittotest.Passwd(t, "-c", "-b", pw, "sensor-1", "pw-sensor-1")
	mosquittotest.Passwd(t, "-b", pw, "alice", "pw-alice")
	if err := os.WriteFile(filepath.Join(dir, "acl.yaml"), []byte(authACL), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := brokertest.NewPKI(t, dir, "stock")
	srv := pki.Server("server")
	device := pki.Client("sensor-3", "sensor-3")
	doors := `      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: fleet
          address: "127.0.0.1:0"
          tls: ` + tlsBlock(srv, `, client_ca_file: "`+pki.CAFile+`"`) + "\n"
	tmpl := strings.Replace(authConfig, "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n", "    listen:\n"+doors, 1)
	// The fleet door authenticates by certificate alone: no password file.
	tmpl = strings.Replace(tmpl, `    password_file: "{{.Dir}}/passwd"`+"\n", "", 1)
	tmpl = strings.Replace(tmpl, "        - name: plain\n          address: \"127.0.0.1:0\"\n",
		"        - name: plain\n          address: \"127.0.0.1:0\"\n          password_file: \"{{.Dir}}/passwd\"\n", 1)
	b := brokertest.Start(t, brokertest.Config(t, dir, tmpl))
	plain, fleet := doorPort(t, b, "plain"), doorPort(t, b, "fleet")
	tlsArgs := []string{"--cafile", pki.CAFile, "--cert", device.CertFile, "--key", device.KeyFile}

	if out, err := mosquittoPub(plain, "events/sensor-1/t", "by password", "-i", "sensor-1", "-u", "sensor-1", "-P", "pw-sensor-1"); err != nil {
		t.Fatalf("mosquitto_pub with the right password: %v\n%s", err, out)
	}
	// mosquitto_pub exits with the CONNACK's reason code.
	if out, err := mosquittoPub(plain, "events/sensor-1/t", "x", "-i", "sensor-1", "-u", "sensor-1", "-P", "wrong"); exitCode(err) != 0x86 || !strings.Contains(out, "Bad User Name or Password") {
		t.Errorf("mosquitto_pub with a wrong password: %v, output %q; want exit 134 (CONNACK 0x86)", err, out)
	}
	if out, _ := mosquittoPub(plain, "events/sensor-2/t", "x", "-i", "sensor-1", "-u", "sensor-1", "-P", "pw-sensor-1"); !strings.Contains(out, "Publish 1 failed: Not authorized") {
		t.Errorf("mosquitto_pub outside its grant: output %q; want PUBACK 0x87 reported", out)
	}
	// The certificate's Common Name is the user: sensor-3 writes its own.
	if out, err := mosquittoPub(fleet, "events/sensor-3/t", "by certificate", append([]string{"-i", "sensor-3"}, tlsArgs...)...); err != nil {
		t.Fatalf("mosquitto_pub with a client certificate: %v\n%s", err, out)
	}
	if out, _ := mosquittoPub(fleet, "events/sensor-4/t", "x", append([]string{"-i", "sensor-3"}, tlsArgs...)...); !strings.Contains(out, "Publish 1 failed: Not authorized") {
		t.Errorf("mosquitto_pub by certificate outside its grant: output %q; want PUBACK 0x87 reported", out)
	}
	// alice reads the channel from its floor, authenticated by
	// mosquitto_passwd's hash: exactly the two granted records.
	out, err := exec.Command("mosquitto_sub", "-h", "localhost", "-p", plain, "-V", "5", "-q", "1", "-i", "alice",
		"-u", "alice", "-P", "pw-alice", "-t", "events/#", "-C", "2", "-W", "30").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub as alice: %v\n%s", err, out)
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "\n"); len(got) != 2 || got[0] != "by password" || got[1] != "by certificate" {
		t.Errorf("alice read %q, want the two granted records in order (a refused publish was kept, or a granted one lost)", got)
	}
	// A wrong password: mosquitto_sub is refused too.
	out, err = exec.Command("mosquitto_sub", "-h", "localhost", "-p", plain, "-V", "311", "-i", "alice",
		"-u", "alice", "-P", "wrong", "-t", "events/#", "-C", "1", "-W", "10").CombinedOutput()
	if exitCode(err) != 4 || !strings.Contains(string(out), "bad user name or password") {
		t.Errorf("mosquitto_sub (3.1.1) with a wrong password: %v, output %q; want exit 4 (return code 0x04)", err, out)
	}
}

// exitCode is a tool's exit status (-1 when it did not exit normally).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// docs/security.md "1. Certificates": a certificate whose name holds a control character
// names nobody the ACL could know; the CONNECT is refused 0x86 like a bad
// password, on a mutual-TLS door where the certificate is the only way in.
func TestCertificateNameWithAControlCharacterIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "acl.yaml"), []byte(authACL), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := brokertest.NewPKI(t, dir, "ctl")
	srv := pki.Server("server")
	doors := `      tcp:
        - name: fleet
          address: "127.0.0.1:0"
          tls: ` + tlsBlock(srv, `, client_ca_file: "`+pki.CAFile+`"`) + "\n"
	tmpl := strings.Replace(authConfig, "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n", "    listen:\n"+doors, 1)
	tmpl = strings.Replace(tmpl, `    password_file: "{{.Dir}}/passwd"`+"\n", "", 1)
	b := brokertest.Start(t, brokertest.Config(t, dir, tmpl))
	for _, tc := range []struct {
		cn   string
		code byte
	}{
		{"sensor-5", 0},
		// A name no pattern matches: nothing but the name check refuses it.
		{"operator-\x01x", 0x86},
	} {
		cert := pki.Client(fmt.Sprintf("client-%x", tc.cn), tc.cn)
		conn, err := tls.Dial("tcp", doorAddr(t, b, "fleet"), &tls.Config{RootCAs: pki.Pool(), ServerName: "localhost",
			Certificates: []tls.Certificate{cert.TLSCertificate(t)}})
		if err != nil {
			t.Fatalf("TLS with CN %q: %v", tc.cn, err)
		}
		id := "sensor-5"
		if tc.code != 0 {
			id = "op-1"
		}
		c := &mxConn{t: t, id: id, conn: conn, r: bufio.NewReader(conn), version: 5}
		t.Cleanup(func() { _ = conn.Close() })
		c.write(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
			Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 30}},
			(*packets.Packet).ConnectEncode)
		if ack := c.expect(packets.Connack, "CONNACK"); ack.ReasonCode != tc.code {
			t.Errorf("certificate CN %q: CONNACK 0x%02x, want 0x%02x", tc.cn, ack.ReasonCode, tc.code)
		}
	}
}
