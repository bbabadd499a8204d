package broker_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker"
	"saguin.dev/broker/config"
)

// A configuration naming what this build does not enforce — a password
// file, an ACL, TLS, a WebSocket door — is refused at start, naming each
// key, instead of a broker that admits every client or serves plaintext
// where TLS was asked for. Nothing is opened (the data directory stays
// empty).
func TestConfigurationThisBuildCannotKeepIsRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "passwords")
	if err := os.WriteFile(pw, []byte("dev:$2y$10$abcdefghijklmnopqrstuuJ2V1mO1aK3G0m5cVY9h0g8sL6n6h1bW\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", sqliteProvider, 1)
	tmpl = strings.Replace(tmpl, "  mqtt:\n", "  mqtt:\n    password_file: \""+pw+"\"\n", 1)
	tmpl = strings.Replace(tmpl, "      tcp:\n        address: \"127.0.0.1:0\"\n",
		"      tcp:\n        address: \"127.0.0.1:0\"\n      ws:\n        address: \"127.0.0.1:0\"\n", 1)
	path := filepath.Join(dir, "saguin.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(tmpl, "{{.Dir}}", dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("the loader refused the configuration itself: %v", err)
	}
	b, err := broker.New(cfg, broker.Options{})
	if err == nil {
		b.Close()
		t.Fatal("a broker started with a password file and a WebSocket door it does not serve")
	}
	for _, want := range []string{"broker.mqtt.password_file", "WebSocket"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %s: %v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "saguin.db")); !os.IsNotExist(err) {
		t.Errorf("the refused start opened storage: %v", err)
	}
}
