package broker_test

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// secretsOf is what of the file at path no answer may show: a password
// file's hashes and whole lines, a PEM file's base64 lines, and every
// file's whole contents.
func secretsOf(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{strings.TrimSpace(string(data))}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "-----"):
		case strings.Count(line, ":") >= 1 && strings.HasPrefix(strings.SplitN(line, ":", 3)[1], "$"):
			out = append(out, line, strings.SplitN(line, ":", 3)[1]) // user:hash[:scope]
		case len(line) >= 16 && !strings.ContainsAny(line, " :"):
			out = append(out, line) // a PEM body line
		}
	}
	return out
}

// docs/operations.md "The routes": no route shows a payload, a password, a hash or a key.
// Every file the configuration names — the MQTT and operator password
// files, the ACL, every door's certificate, key and CA, the configuration
// itself — is read, and no answer of any route, headers included, holds
// any of their secret contents, nor a payload published, nor a password
// sent.
func TestOperationsNoRouteShowsASecret(t *testing.T) {
	dir, sock := t.TempDir(), opsSocket(t, "ops.sock")
	pki := brokertest.NewPKI(t, dir, "edge-ca")
	mqttCert, opsCert := pki.Server("mqtt-server"), pki.Server("ops-server")
	pw, operators, aclPath := filepath.Join(dir, "passwd"), filepath.Join(dir, "operators"), filepath.Join(dir, "acl.yaml")
	writePasswordFile(t, pw, authPasswords...)
	writeOperators(t, operators, operator{"root", ""}, operator{"scraper", "/metrics"})
	writeFileT(t, aclPath, authACL)
	mqtt := `    password_file: "` + pw + `"
    acl_file: "` + aclPath + `"
    listen:
      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: fleet
          address: "127.0.0.1:0"
          tls: ` + tlsBlock(mqttCert, `, client_ca_file: "`+pki.CAFile+`", require_certificate: false`) + `
`
	operations := `    password_file: "` + operators + `"
    listen:
      tcp:
        address: "127.0.0.1:0"
        tls: ` + tlsBlock(opsCert, "") + `
      unix:
        path: "` + sock + `"
`
	cfgPath := opsConfig(t, dir, mqtt, operations)
	b := brokertest.Start(t, cfgPath)

	// Traffic: payloads on every kind of channel and on broadcast, a
	// refused password.
	alice, _ := dialMx(t, b.ListenerAddr("plain").String(), "alice", mxConnect{clean: true, user: "alice", password: "pw-alice"})
	alice.publish1(1, "jobs/x", "payload-job-3e8a", packets.Properties{})
	reader, _ := dialMx(t, b.ListenerAddr("plain").String(), "sensor-1", mxConnect{clean: true, expiry: 600, user: "sensor-1", password: "pw-sensor-1"})
	reader.publish1(1, "events/sensor-1/t", "payload-event-91c2", packets.Properties{})
	reader.publish1(2, "state/sensor-1/v", "payload-state-77d0", packets.Properties{})
	reader.publish1(3, "devices/sensor-1/x", "payload-broadcast-5f1a", packets.Properties{})
	if _, ack := connectMx(t, b.ListenerAddr("plain").String(), "alice", mxConnect{clean: true, user: "alice", password: "password-guess-4d21"}); ack.ReasonCode != 0x86 {
		t.Fatalf("a wrong password: CONNACK 0x%02X", ack.ReasonCode)
	}

	var secrets []string
	for _, f := range []string{cfgPath, pw, operators, aclPath, pki.CAFile, mqttCert.CertFile, mqttCert.KeyFile, opsCert.CertFile, opsCert.KeyFile} {
		secrets = append(secrets, secretsOf(t, f)...)
	}
	secrets = append(secrets, "payload-job-3e8a", "payload-event-91c2", "payload-state-77d0", "payload-broadcast-5f1a",
		"password-guess-4d21", "pw-alice", "pw-sensor-1", "pw-root")

	routes := []string{"/health", "/metrics", "/v1/operations/acl?user=alice&client_id=alice", "/v1/operations/acl?user=sensor-1",
		"/v1/operations/config", "/v1/operations/consumers", "/v1/operations/position-lost", "/v1/operations/refused",
		"/v1/operations/sessions", "/v1/operations/users", "/v1/operations/queues/jobs"}
	for _, s := range []string{"bridges", "channels", "limits", "listeners", "operations", "providers", "storage"} {
		routes = append(routes, "/v1/operations/config?section="+s)
	}
	clients := map[string]*opsHTTP{
		"tcp+tls": opsOverTCP(t, b.OperationsAddr("tcp").String(), &tls.Config{RootCAs: pki.Pool()}),
		"unix":    opsOverUnix(t, sock, nil),
	}
	for door, c := range clients {
		for _, path := range routes {
			r := c.must(http.StatusOK, path, basic("root", "pw-root"))
			var all bytes.Buffer
			_ = r.header.Write(&all)
			all.Write(r.body)
			for _, s := range secrets {
				if bytes.Contains(all.Bytes(), []byte(s)) {
					t.Errorf("%s %s shows %.60q", door, path, s)
				}
			}
		}
		// The refusals say no more.
		for _, path := range []string{"/v1/operations/sessions", "/v1/operations/queues/nothing", "/v1/operations/config?section=x"} {
			r := c.get(path, basic("root", "pw-wrong-ab12"))
			for _, s := range append(secrets, "pw-wrong-ab12") {
				if bytes.Contains(r.body, []byte(s)) {
					t.Errorf("%s %s refused shows %.60q", door, path, s)
				}
			}
		}
	}
	if b.Log.Contains("pw-wrong-ab12") || b.Log.Contains("password-guess-4d21") {
		t.Error("the log holds a refused password")
	}
}
