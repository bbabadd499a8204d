package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// passwdAdd adds user to the password file at path with the real binary,
// the password on standard input as an operator's script would give it.
func passwdAdd(t *testing.T, path, user, password string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := brokertest.CommandContext(ctx, t, "--passwd", "add", path, user)
	cmd.Stdin = strings.NewReader(password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("saguin --passwd add %s %s: %v\n%s", path, user, err, out)
	}
}

// waitCount waits until the process has printed s at least n times; a
// signal's lines repeat, so the n-th says the n-th signal was handled.
func waitCount(t *testing.T, p *brokertest.Process, s string, n int) {
	t.Helper()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for strings.Count(p.Output(), s) < n {
		select {
		case <-deadline.C:
			t.Fatalf("%q printed %d times, want %d (exited=%v):\n%s", s, strings.Count(p.Output(), s), n, p.Exited(), p.Output())
		case <-tick.C:
		}
	}
}

// lineHolding is the first line of text that holds s, and its number
// counted from 1 (0 and "" when none does).
func lineHolding(text, s string) (int, string) {
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1, l
		}
	}
	return 0, ""
}

// docs/operations.md "Signals" (3), invariant 16, on the real binary: SIGUSR1 makes
// the running process read its password file and its ACL again. A user
// added with saguin --passwd add connects after the signal; a read grant
// withdrawn from the ACL stops a live subscriber's deliveries, and once
// restored it is served what it missed, in order, nothing skipped; an ACL
// with a syntax error is logged at ERROR naming the file and line and
// changes nothing: the subscriber goes on receiving.
func TestSIGUSR1RereadsPasswordsAndACLInTheRunningBinary(t *testing.T) {
	dir := t.TempDir()
	pw, aclPath := filepath.Join(dir, "passwd"), filepath.Join(dir, "acl.yaml")
	passwdAdd(t, pw, "sensor-1", "pw-sensor-1")
	writeACL := func(text string) {
		t.Helper()
		if err := os.WriteFile(aclPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeACL(authACL)
	p := brokertest.StartProcess(t, brokertest.Config(t, dir, authConfig))
	addr := p.Address()

	expectConnackCode(t, addr, "alice", as("alice", mxConnect{clean: true}), 0x86, "a user not yet in the password file")
	passwdAdd(t, pw, "alice", "pw-alice")
	p.Signal(syscall.SIGUSR1)
	waitCount(t, p, "SIGUSR1: password file read", 1)
	alice, s1 := readingAlice(t, addr)

	writeACL(strings.Replace(authACL, "    - channel: events\n      allow: [read, seek]\n", "", 1))
	p.Signal(syscall.SIGUSR1)
	waitCount(t, p, "SIGUSR1: authorization is on", 2)
	for i, r := range []string{"r2", "r3", "r4"} {
		s1.publish1(uint16(2+i), "events/sensor-1/t", r, packets.Properties{})
	}
	alice.quiet(time.Second, "read withdrawn: nothing more is delivered")

	writeACL(authACL)
	p.Signal(syscall.SIGUSR1)
	waitCount(t, p, "SIGUSR1: authorization is on", 3)
	for i, want := range []string{"r2", "r3", "r4"} {
		pk := alice.nextPublish(want + " once read is granted again")
		if string(pk.Payload) != want || prop(pk, "saguin-offset") != fmt.Sprint(2+i) {
			t.Fatalf("delivered %q at offset %s, want %q at offset %d: nothing skipped, in order", pk.Payload, prop(pk, "saguin-offset"), want, 2+i)
		}
		alice.puback(pk.PacketID)
	}

	broken := strings.Replace(authACL, "      allow: [consume]\n", "      allow: [consume\n", 1)
	line, _ := lineHolding(broken, "allow: [consume")
	writeACL(broken)
	p.Signal(syscall.SIGUSR1)
	const refused = "SIGUSR1: password files and ACL not re-read: nothing changed"
	waitCount(t, p, refused, 1)
	_, logged := lineHolding(p.Output(), refused)
	if where := fmt.Sprintf("%s:%d:", aclPath, line); !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, where) {
		t.Errorf("the refused re-read is not an ERROR naming %s: %q", where, logged)
	}
	s1.publish1(5, "events/sensor-1/t", "r5", packets.Properties{})
	if pk := alice.nextPublish("r5: the broken file changed nothing"); string(pk.Payload) != "r5" {
		t.Fatalf("delivered %q, want r5", pk.Payload)
	}
	// The rules in force are still the last good file's, not none.
	s1.publish(6, 1, "events/sensor-2/t", []byte("x"), packets.Properties{})
	if ack := s1.expect(packets.Puback, "PUBACK outside sensor-1's grant"); ack.ReasonCode != 0x87 {
		t.Errorf("after the refused re-read, a publish outside the grant: PUBACK 0x%02x, want 0x87", ack.ReasonCode)
	}
	if code := p.Stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.Output())
	}
}

// --check-config on the real binary places a password file's problem and
// an ACL's in their own files, on their own lines, in one pass, exit 1:
// an argon2id hash (which Sagüin does not read) and an unknown verb.
func TestCheckConfigPlacesPasswordAndACLProblemsOnTheirLines(t *testing.T) {
	dir := t.TempDir()
	pw, aclPath := filepath.Join(dir, "passwd"), filepath.Join(dir, "acl.yaml")
	passwdAdd(t, pw, "sensor-1", "pw-sensor-1")
	f, err := os.OpenFile(pw, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// As Mosquitto 2.1's mosquitto_passwd writes with -H argon2id.
	_, err = f.WriteString("alice:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	acl := strings.Replace(authACL, "      allow: [consume]\n", "      allow: [consume, publish]\n", 1)
	if err := os.WriteFile(aclPath, []byte(acl), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := brokertest.Config(t, dir, authConfig)

	code, out := brokertest.Run(t, "--check-config", cfg)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	verbLine, _ := lineHolding(acl, "[consume, publish]")
	for _, want := range []string{
		fmt.Sprintf("%s:2: broker.mqtt.password_file: user \"alice\": argon2id", pw),
		fmt.Sprintf("%s:%d: roles.worker[0].allow[1] \"publish\": unknown verb", aclPath, verbLine),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--check-config does not say %q:\n%s", want, out)
		}
	}
	if !strings.HasPrefix(out, "configuration is invalid: "+cfg+": 2 findings:") {
		t.Errorf("want exactly the two findings, placed in their own files:\n%s", out)
	}
}
