package broker_test

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker"
	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/config"
)

// unixConfig is appendConfig on sqlite with a unix door beside the tcp one;
// mode is the door's mode line ("" = the default).
func unixConfig(t *testing.T, dir, sock, mode string) string {
	t.Helper()
	door := "      unix:\n        path: \"" + sock + "\"\n"
	if mode != "" {
		door += "        mode: \"" + mode + "\"\n"
	}
	tmpl := strings.Replace(appendConfigWith(sqliteProvider, ""),
		"      tcp:\n        address: \"127.0.0.1:0\"\n",
		"      tcp:\n        address: \"127.0.0.1:0\"\n"+door, 1)
	return brokertest.Config(t, dir, tmpl)
}

// socketPath is a short path for a unix socket (sun_path holds 107 bytes;
// t.TempDir() under a long TMPDIR may not fit).
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "mqtt.sock")
}

// connackOverUnix sends an MQTT 5 CONNECT on the socket and reports whether
// a CONNACK came back: someone is serving it.
func connackOverUnix(t *testing.T, sock string) bool {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	connect := []byte{0x10, 0x10, 0x00, 0x04, 'M', 'Q', 'T', 'T', 0x05, 0x02, 0x00, 0x3c, 0x00, 0x00, 0x03, 'z', 'z', 'z'}
	if _, err := c.Write(connect); err != nil {
		return false
	}
	head := make([]byte, 1)
	if _, err := io.ReadFull(c, head); err != nil {
		return false
	}
	return head[0] == 0x20
}

func startInProcess(t *testing.T, cfgPath string) (*broker.Broker, error) {
	t.Helper()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatalf("configuration: %v", err)
	}
	b, err := broker.New(cfg, broker.Options{Build: "test", Logger: discardLogger()})
	if err != nil {
		return nil, err
	}
	if err := b.Start(); err != nil {
		_ = b.Close()
		return nil, err
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, nil
}

// docs/configuration.md "`broker.mqtt`": a unix door's socket carries its mode, 0660 when
// the key is absent — not whatever the process umask leaves.
func TestUnixListenerAppliesItsMode(t *testing.T) {
	for _, tc := range []struct{ mode, want string }{{"", "-rw-rw----"}, {"0600", "-rw-------"}, {"0666", "-rw-rw-rw-"}} {
		sock := socketPath(t)
		b := brokertest.Start(t, unixConfig(t, t.TempDir(), sock, tc.mode))
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm().String(); got != tc.want {
			t.Errorf("mode %q: the socket is %s, want %s", tc.mode, got, tc.want)
		}
		if !connackOverUnix(t, sock) {
			t.Errorf("mode %q: nothing serves the socket", tc.mode)
		}
		_ = b.Close()
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("mode %q: the socket is left behind after a clean shutdown: %v", tc.mode, err)
		}
	}
}

// docs/operations.md "A start": a second broker on the socket path a live broker
// serves is refused at start, naming the path — it never takes the socket
// over, leaving the first broker running but unreachable.
func TestUnixListenerRefusesThePathALiveBrokerServes(t *testing.T) {
	sock := socketPath(t)
	brokertest.Start(t, unixConfig(t, t.TempDir(), sock, ""))
	if !connackOverUnix(t, sock) {
		t.Fatal("the first broker does not serve its socket")
	}
	b2, err := startInProcess(t, unixConfig(t, t.TempDir(), sock, ""))
	if err == nil {
		_ = b2.Close()
		t.Fatal("a second broker started on the socket path a live broker serves")
	}
	if !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "another") {
		t.Errorf("the refusal does not name the path and the other broker: %v", err)
	}
	if !connackOverUnix(t, sock) {
		t.Error("after the refused start the first broker no longer serves its socket")
	}
}

// A socket file left by a process that died (no one accepts on it) is
// stale: the broker replaces it.
func TestUnixListenerReplacesAStaleSocket(t *testing.T) {
	sock := socketPath(t)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("no stale socket to test with: %v", err)
	}
	brokertest.Start(t, unixConfig(t, t.TempDir(), sock, ""))
	if !connackOverUnix(t, sock) {
		t.Fatal("the broker did not take the stale socket's place")
	}
}

// docs/operations.md "A start": a socket path occupied by something other than a
// socket is refused — also when it appears after the configuration was
// checked — and left as it was: the broker only ever replaces a socket.
func TestUnixListenerRefusesAPathHoldingAFile(t *testing.T) {
	sock := socketPath(t)
	cfgPath := unixConfig(t, t.TempDir(), sock, "")
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(cfg, broker.Options{Build: "test", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(); err == nil {
		t.Fatal("the broker started on a path holding a regular file")
	} else if !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("the refusal does not name the path and why: %v", err)
	}
	if data, err := os.ReadFile(sock); err != nil || string(data) != "precious" {
		t.Errorf("the file at the socket path was changed: %q %v", data, err)
	}
}

// A data directory that does not exist yet is created at start (0700), as
// a user trying the example expects; --check-config does not ask for it.
func TestDataDirectoryIsCreatedAtStart(t *testing.T) {
	for _, provider := range []string{
		"        type: sqlite\n        file_path: \"{{.Dir}}/data/db/saguin.db\"",
		"        type: memory\n        snapshot_dir: \"{{.Dir}}/data/snapshots\"",
	} {
		dir := t.TempDir()
		b := brokertest.Start(t, brokertest.Config(t, dir, appendConfigWith(provider, "")))
		fi, err := os.Stat(filepath.Join(dir, "data"))
		if err != nil {
			t.Fatalf("%s: %v", provider, err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: the data directory is %v, want 0700", provider, fi.Mode().Perm())
		}
		_ = b.Close()
	}
}
