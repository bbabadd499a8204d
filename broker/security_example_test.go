package broker_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker"
	"saguin.dev/broker/acl"
	"saguin.dev/broker/config"
)

// The worked setup of docs/security.md is kept from rotting: the
// configuration and ACL it shows are the files in examples/security, byte
// for byte; its openssl commands, run as written, make certificates the
// broker serves; the configuration then loads with every start check and
// the ACL answers as the page says. Certificates are never committed: the
// commands make them here, in a temporary home.
func TestSecurityWorkedExampleLoadsAsDocumented(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is not installed (Debian package openssl; .ci/run installs it)")
	}
	doc := readText(t, "../docs/security.md")
	cfgText := readText(t, "../examples/security/saguin.yaml")
	aclText := readText(t, "../examples/security/acl.yaml")
	blocks := fencedBlocks(doc)
	for name, text := range map[string]string{"examples/security/saguin.yaml": cfgText, "examples/security/acl.yaml": aclText} {
		if !containsBlock(blocks, text) {
			t.Errorf("docs/security.md does not show %s as it is: copy the file into its yaml block", name)
		}
	}

	// The page's certificate block, run as an operator would (bash -e, so
	// a command that fails stops it), in a home of its own.
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", blockHolding(t, blocks, "mkdir -m 0700 ~/fleet-ca"))
	cmd.Env = append(os.Environ(), "HOME="+home)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the certificate commands of docs/security.md: %v\n%s", err, out)
	}
	made := filepath.Join(home, "fleet-ca")

	// /etc/saguin, /var/lib/saguin and /run/saguin under a temporary root.
	root := t.TempDir()
	etc := filepath.Join(root, "etc", "saguin")
	for _, d := range []string{filepath.Join(etc, "tls"), filepath.Join(root, "var", "lib", "saguin"), filepath.Join(root, "run", "saguin")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"ca.pem", "server.pem", "server-key.pem"} {
		if err := os.WriteFile(filepath.Join(etc, "tls", f), []byte(readText(t, filepath.Join(made, f))), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	writePasswordFile(t, filepath.Join(etc, "passwd"), "ops", "worker-1")
	writePasswordFile(t, filepath.Join(etc, "dashboard.passwd"), "dashboard")
	aclPath := filepath.Join(etc, "acl.yaml")
	if err := os.WriteFile(aclPath, []byte(aclText), 0o640); err != nil {
		t.Fatal(err)
	}
	moved := strings.NewReplacer("/etc/saguin/", etc+"/", "/var/lib/saguin/", root+"/var/lib/saguin/",
		"/run/saguin/", root+"/run/saguin/").Replace(cfgText)
	cfgPath := filepath.Join(etc, "saguin.yaml")
	if err := os.WriteFile(cfgPath, []byte(moved), 0o640); err != nil {
		t.Fatal(err)
	}

	cfg, err := config.Load(cfgPath, broker.ConfigChecks()...)
	if err != nil {
		t.Fatalf("the worked configuration does not load:\n%v", err)
	}
	if len(cfg.Warnings) > 0 {
		t.Errorf("the worked configuration has warnings: %v", cfg.Warnings)
	}
	rules, err := acl.Load(aclPath, cfg)
	if err != nil {
		t.Fatalf("the worked ACL does not load:\n%v", err)
	}
	checkDocumentedGrants(t, rules)

	// The devices' certificates name them and are client certificates
	// of the fleet CA; the broker's names every host it is dialled by.
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(readText(t, filepath.Join(made, "ca.pem")))) {
		t.Fatal("ca.pem holds no certificate")
	}
	for _, d := range []string{"sensor-12", "sensor-13"} {
		c := parseCertificate(t, filepath.Join(made, d+".pem"))
		if c.Subject.CommonName != d {
			t.Errorf("%s.pem names %q", d, c.Subject.CommonName)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s.pem is no client certificate of the fleet CA: %v", d, err)
		}
	}
	srv := parseCertificate(t, filepath.Join(made, "server.pem"))
	for _, host := range []string{"gw-7.example.net", "localhost", "127.0.0.1"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Errorf("server.pem does not serve %s: %v", host, err)
		}
	}
}

// checkDocumentedGrants asks the ACL the questions docs/security.md answers
// for it.
func checkDocumentedGrants(t *testing.T, rules *acl.ACL) {
	t.Helper()
	s12 := rules.For("sensor-12", "sensor-12")
	for _, c := range []struct {
		what string
		got  bool
		want bool
	}{
		{"sensor-12 writes its own telemetry", s12.MayWrite("telemetry/sensor-12/temp", "telemetry"), true},
		{"sensor-12 writes sensor-13's telemetry", s12.MayWrite("telemetry/sensor-13/temp", "telemetry"), false},
		{"sensor-12 writes its status", s12.MayWrite("status/sensor-12", ""), true},
		{"sensor-12 reads its commands", s12.MayRead("commands/sensor-12/reboot", ""), true},
		{"sensor-12 reads sensor-13's commands", s12.MayRead("commands/sensor-13/reboot", ""), false},
		{"sensor-12 is denied Wills, QoS 2 and retained", s12.Denies(acl.Will) && s12.Denies(acl.QoS2) && s12.Denies(acl.Retained), true},
		{"client id thermostat as sensor-12", rules.For("sensor-12", "thermostat").ClientIDAllowed(), false},
		{"ops reads every device's telemetry", rules.For("ops", "ops-console").MayRead("telemetry/sensor-13/temp", "telemetry"), true},
		{"worker-1 consumes jobs", rules.For("worker-1", "worker-1").MayConsume("jobs"), true},
		{"the dashboard is denied persistent sessions", rules.For("dashboard", "x").Denies(acl.Persistent), true},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, docs/security.md says %v", c.what, c.got, c.want)
		}
	}
	if err := s12.CheckSubscribe("commands/#"); err == nil {
		t.Error("sensor-12 may subscribe commands/#; docs/security.md shows it refused")
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parseCertificate(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode([]byte(readText(t, path)))
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// fencedBlocks are the bodies of a Markdown page's ``` blocks, each ending
// in a newline, as a file's text does.
func fencedBlocks(doc string) []string {
	var out []string
	var cur *strings.Builder
	for _, line := range strings.SplitAfter(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			if cur == nil {
				cur = &strings.Builder{}
			} else {
				out = append(out, cur.String())
				cur = nil
			}
			continue
		}
		if cur != nil {
			cur.WriteString(line)
		}
	}
	return out
}

func containsBlock(blocks []string, text string) bool {
	for _, b := range blocks {
		if b == text {
			return true
		}
	}
	return false
}

// blockHolding is the one block that holds s.
func blockHolding(t *testing.T, blocks []string, s string) string {
	t.Helper()
	var found []string
	for _, b := range blocks {
		if strings.Contains(b, s) {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/security.md has %d blocks holding %q, want 1", len(found), s)
	}
	return found[0]
}
