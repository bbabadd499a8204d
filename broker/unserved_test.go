package broker_test

import (
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
)

// A password file the broker cannot read whole — here a bcrypt ($2y$)
// line, a hash type Sagüin does not read — stops the start naming the file
// and line, before anything opens (docs/operations.md "A start": the data directory stays
// empty), instead of a broker on which that user could never log in. A
// WebSocket door beside it is served, so it is not named.
func TestPasswordFileThatDoesNotLoadStopsTheStart(t *testing.T) {
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
	b, err := broker.New(cfg, broker.Options{Logger: discardLogger()})
	if err == nil {
		b.Close()
		t.Fatal("a broker started on a password file it cannot read")
	}
	if !strings.Contains(err.Error(), pw+":1:") || !strings.Contains(err.Error(), "$2y$") {
		t.Errorf("the refusal does not name the file, the line and the hash type: %v", err)
	}
	if strings.Contains(err.Error(), "WebSocket") || strings.Contains(err.Error(), "listen.ws") {
		t.Errorf("the refusal names the WebSocket door, which is served: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "saguin.db")); !os.IsNotExist(err) {
		t.Errorf("the refused start opened storage: %v", err)
	}
}

// docs/configuration.md "`broker.operations`": the operations listener binds at start with the MQTT
// doors; a port already in use stops the start, naming the door, and
// leaves nothing bound behind it (the MQTT door's port is free again).
func TestOperationsDoorOnATakenPortStopsTheStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	tmpl := strings.Replace(appendConfig, "{{.Provider}}", sqliteProvider, 1)
	tmpl = strings.Replace(tmpl, "  storage:\n", "  operations:\n    listen:\n      tcp:\n        address: \""+taken.Addr().String()+"\"\n  storage:\n", 1)
	cfg, err := config.Load(brokertest.Config(t, dir, tmpl), broker.ConfigChecks()...)
	if err != nil {
		t.Fatalf("the loader refused the configuration itself: %v", err)
	}
	b, err := broker.New(cfg, broker.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.Start()
	if err == nil || !strings.Contains(err.Error(), "operations listener tcp") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start on a taken port: %v", err)
	}
	mqttAddr := b.Addr()
	if mqttAddr == nil {
		t.Fatal("the MQTT door was never bound")
	}
	again, err := net.Listen("tcp", mqttAddr.String())
	if err != nil {
		t.Fatalf("the MQTT door's port is still held after the refused start: %v", err)
	}
	again.Close()
}

// The warnings the loader computes (docs/operations.md "A start": an inert provider here)
// are logged at start, at warn, each with its file and line.
func TestConfigurationWarningsAreLoggedAtStart(t *testing.T) {
	tmpl := strings.Replace(appendConfigWith(sqliteProvider, ""), "    providers:\n",
		"    providers:\n      spare:\n        type: memory\n        snapshot_dir: none\n", 1)
	cfgPath := brokertest.Config(t, t.TempDir(), tmpl)
	b := brokertest.Start(t, cfgPath)
	if !logHasLine(b.Log.String(), "level=WARN", "broker.storage.providers.spare", "inert", "file="+cfgPath, "line=14") {
		t.Errorf("the inert-provider warning is not logged at start:\n%s", b.Log.Tail(40))
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logHasLine reports whether one line of log holds every part.
func logHasLine(log string, parts ...string) bool {
	for _, l := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}
