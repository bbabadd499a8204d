package config

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTLSBlock(t *testing.T) {
	dir := t.TempDir()
	cert, key := certFiles(t, dir, "server")
	ca, _ := certFiles(t, dir, "ca")
	_, otherKey := certFiles(t, dir, "other")
	garbage := writeFile(t, dir, "garbage.pem", "not a certificate\n")

	door := func(tlsBlock map[string]any) patch {
		return p("broker.mqtt.listen.tcp", m("address", ":8883", "tls", tlsBlock))
	}

	t.Run("valid with mTLS resolves", func(t *testing.T) {
		cfg := mustLoad(t, build(t, dir, door(m("cert_file", cert, "key_file", key, "client_ca_file", ca, "min_version", "1.3"))))
		got := cfg.Broker.Listeners[0].TLS
		want := &TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca, RequireCertificate: true, MinVersion: tls.VersionTLS13}
		if *got != *want {
			t.Fatalf("TLS = %+v, want %+v", got, want)
		}
	})
	t.Run("require_certificate false keeps the CA", func(t *testing.T) {
		cfg := mustLoad(t, build(t, dir, door(m("cert_file", cert, "key_file", key, "client_ca_file", ca, "require_certificate", false))))
		if got := cfg.Broker.Listeners[0].TLS; got.RequireCertificate || got.MinVersion != tls.VersionTLS12 {
			t.Fatalf("TLS = %+v, want mixed mode at TLS 1.2", got)
		}
	})
	runRules(t, []ruleCase{
		{"require_certificate without CA", []patch{door(m("cert_file", cert, "key_file", key, "require_certificate", true))},
			"broker.mqtt.listen.tcp.tls.require_certificate", "needs tls.client_ca_file"},
		{"min_version 1.1", []patch{door(m("cert_file", cert, "key_file", key, "min_version", "1.1"))},
			"broker.mqtt.listen.tcp.tls.min_version", "nothing below TLS 1.2"},
		{"key missing", []patch{door(m("cert_file", cert))}, "broker.mqtt.listen.tcp.tls.key_file", "missing"},
		{"cert relative", []patch{door(m("cert_file", "server.crt", "key_file", key))}, "broker.mqtt.listen.tcp.tls.cert_file", "relative"},
		{"cert unreadable", []patch{door(m("cert_file", filepath.Join(dir, "absent.crt"), "key_file", key))},
			"broker.mqtt.listen.tcp.tls.cert_file", "broker.mqtt.listen.tcp cannot open its certificate"},
		{"key does not match", []patch{door(m("cert_file", cert, "key_file", otherKey))},
			"broker.mqtt.listen.tcp.tls.cert_file", "do not load as a pair"},
		{"CA garbage", []patch{door(m("cert_file", cert, "key_file", key, "client_ca_file", garbage))},
			"broker.mqtt.listen.tcp.tls.client_ca_file", "holds no PEM certificate"},
		{"unknown tls key", []patch{door(m("cert_file", cert, "key_file", key, "ciphers", "all"))}, "broker.mqtt.listen.tcp.tls.ciphers", "unknown key"},
	})

	t.Run("every bad file at once", func(t *testing.T) {
		list := findings(t, build(t, dir,
			p("broker.mqtt.listen.tcp", []any{
				m("name", "a", "address", ":8883", "tls", m("cert_file", filepath.Join(dir, "no1.crt"), "key_file", key)),
				m("name", "b", "address", ":8884", "tls", m("cert_file", cert, "key_file", filepath.Join(dir, "no2.key"), "client_ca_file", garbage)),
			})))
		var keys []string
		for _, f := range list {
			keys = append(keys, f.Key)
		}
		want := []string{"broker.mqtt.listen.tcp[a].tls.cert_file", "broker.mqtt.listen.tcp[b].tls.key_file", "broker.mqtt.listen.tcp[b].tls.client_ca_file"}
		for _, w := range want {
			if !strings.Contains(strings.Join(keys, " "), w) {
				t.Errorf("no finding on %s; findings on %v", w, keys)
			}
		}
		if len(list) != 3 {
			t.Errorf("%d findings, want 3: %v", len(list), keys)
		}
	})

	t.Run("a door asking for certificates may refuse anonymous clients without a password file", func(t *testing.T) {
		mustLoad(t, build(t, dir, door(m("cert_file", cert, "key_file", key, "client_ca_file", ca)),
			p("broker.mqtt.allow_anonymous", false)))
	})
	if os.Getuid() != 0 {
		t.Run("unreadable key", func(t *testing.T) {
			locked := writeFile(t, dir, "locked.key", "x")
			if err := os.Chmod(locked, 0); err != nil {
				t.Fatal(err)
			}
			expectOne(t, findings(t, build(t, dir, door(m("cert_file", cert, "key_file", locked)))),
				"broker.mqtt.listen.tcp.tls.key_file", "permission denied")
		})
	}
}
