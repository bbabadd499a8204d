// Package mosquittotest runs Debian's Eclipse Mosquitto tools in tests:
// the mosquitto broker on a password file, mosquitto_pub to log in to it,
// and mosquitto_passwd to write files. Sagüin's password files must be
// files these tools read and write (docs/configuration.md "Password files and `saguin --passwd`"), so the tests that
// say so run the real tools.
package mosquittotest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// wait bounds every wait on a tool: generous, for a loaded 2-core machine.
const wait = 30 * time.Second

// Need fails the test when a tool is missing, naming the Debian package
// (.ci/run installs them).
func Need(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (Debian packages mosquitto and mosquitto-clients; .ci/run installs them)", tool)
		}
	}
}

// Passwd runs mosquitto_passwd with args and fails the test unless it
// exits 0 and says no "Error" (mosquitto_passwd 2.0.11 reports a file it
// cannot read, "Corrupt password file", and still exits 0).
func Passwd(t testing.TB, args ...string) {
	t.Helper()
	Need(t, "mosquitto_passwd")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	out, err := exec.CommandContext(ctx, "mosquitto_passwd", args...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Error") {
		t.Fatalf("mosquitto_passwd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Broker is a mosquitto started on a password file, anonymous clients
// refused.
type Broker struct {
	Host, Port string
	logPath    string // mosquitto's stdout and stderr
}

// Start runs mosquitto on passwordFile on a free loopback port and waits
// until it accepts connections; the test's cleanup stops it.
func Start(t testing.TB, passwordFile string) *Broker {
	t.Helper()
	Need(t, "mosquitto", "mosquitto_pub")
	// A free port found by binding 0 may be taken again before mosquitto
	// binds it (mosquitto cannot report a port 0 gave it): try again then.
	for attempt := 0; ; attempt++ {
		b, err := start(t, passwordFile)
		if err == nil {
			return b
		}
		if !errors.Is(err, errPortTaken) || attempt == 4 {
			t.Fatal(err)
		}
	}
}

var errPortTaken = errors.New("port taken")

func start(t testing.TB, passwordFile string) (*Broker, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	_ = l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "mosquitto.conf")
	text := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous false\npassword_file %s\n", port, passwordFile)
	// Started as root, mosquitto becomes the user "mosquitto", who cannot
	// read a test's private directory; "user" keeps it as whoever runs
	// the test (and is ignored when that is not root).
	if u, err := user.Current(); err == nil {
		text += "user " + u.Username + "\n"
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	b := &Broker{Host: "127.0.0.1", Port: port, logPath: filepath.Join(dir, "mosquitto.log")}
	logFile, err := os.Create(b.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command("mosquitto", "-c", conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(wait)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(b.Host, port), time.Second)
		if err == nil {
			_ = c.Close()
			return b, nil
		}
		select {
		case <-exited:
			if strings.Contains(b.Log(), "in use") {
				return nil, errPortTaken
			}
			return nil, fmt.Errorf("mosquitto exited before listening:\n%s", b.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mosquitto did not listen within %v:\n%s", wait, b.Log())
		}
	}
}

// Log is what mosquitto has printed.
func (b *Broker) Log() string {
	data, err := os.ReadFile(b.logPath)
	if err != nil {
		return fmt.Sprintf("(mosquitto's log cannot be read: %v)", err)
	}
	return string(data)
}

// Pub publishes one message as user with password using mosquitto_pub
// (MQTT 3.1.1) and returns its exit code and output: 0 when the broker
// admitted the login, 5 with "not authorised" when it refused it.
func (b *Broker) Pub(t testing.TB, user, password string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mosquitto_pub", "-h", b.Host, "-p", b.Port,
		"-u", user, "-P", password, "-t", "passwd/test", "-m", "hello")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("mosquitto_pub did not finish within %v:\n%s", wait, out)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}
