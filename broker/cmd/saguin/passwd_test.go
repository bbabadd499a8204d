package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/mosquittotest"
	"saguin.dev/broker/passwd"
)

// saguinPasswd runs the real saguin binary with --passwd and args, stdin
// read from in (nil: /dev/null), and returns its exit code and outputs.
func saguinPasswd(t *testing.T, in io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := brokertest.CommandContext(ctx, t, append([]string{"--passwd"}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("saguin --passwd %v did not finish within %v", args, wait)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.String(), errOut.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

// mustPasswd runs saguin --passwd and fails the test unless it exits 0.
func mustPasswd(t *testing.T, in io.Reader, args ...string) string {
	t.Helper()
	code, out, errOut := saguinPasswd(t, in, args...)
	if code != 0 {
		t.Fatalf("saguin --passwd %v: exit %d\n%s%s", args, code, out, errOut)
	}
	return out
}

// docs/configuration.md "Password files and `saguin --passwd`": a file saguin --passwd add writes is a file the real
// mosquitto serves — the right password admitted by mosquitto_pub, a wrong
// one refused — and one mosquitto_passwd can then change and delete in,
// after which Sagüin reads what it wrote.
func TestPasswdFileIsMosquittosFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	mustPasswd(t, nil, "add", path, "alice", "first secret")
	mustPasswd(t, strings.NewReader("p@ss:wörd\n"), "add", path, "bob@example.com")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the created file: %v %v, want mode 0600", fi.Mode(), err)
	}
	if data, _ := os.ReadFile(path); strings.Count(string(data), ":$7$1000$") != 2 {
		t.Fatalf("want two $7$ entries of 1000 iterations:\n%s", data)
	}

	m := mosquittotest.Start(t, path)
	for _, c := range []struct {
		user, password string
		admitted       bool
	}{
		{"alice", "first secret", true},
		{"bob@example.com", "p@ss:wörd", true},
		{"alice", "first secreT", false},
		{"bob@example.com", "first secret", false},
		{"carol", "first secret", false},
	} {
		code, out := m.Pub(t, c.user, c.password)
		if c.admitted && code != 0 {
			t.Errorf("mosquitto refuses %s with the password saguin --passwd stored (exit %d): %s\n%s", c.user, code, out, m.Log())
		}
		if !c.admitted && (code == 0 || !strings.Contains(out, "not authorised")) {
			t.Errorf("mosquitto's answer to %s/%q: exit %d %q; want a refusal, not authorised", c.user, c.password, code, out)
		}
	}

	mosquittotest.Passwd(t, "-b", path, "alice", "changed by mosquitto")
	mosquittotest.Passwd(t, "-D", path, "bob@example.com")
	tab, err := passwd.Load(path, passwd.MQTT)
	if err != nil {
		t.Fatalf("the file after mosquitto_passwd's edits does not load: %v", err)
	}
	if _, ok := tab.Authenticate("alice", []byte("changed by mosquitto")); !ok || tab.Len() != 1 {
		t.Errorf("after mosquitto_passwd: alice's new password refused, or %d users (want 1)", tab.Len())
	}
	if out := mustPasswd(t, nil, "list", path); out != "alice\n" {
		t.Errorf("list after mosquitto_passwd's edits: %q", out)
	}
}

// docs/configuration.md "Password files and `saguin --passwd`", docs/operations.md "Operators": each word of --passwd through the binary,
// with what it prints and its exit code.
func TestPasswdCommandsEndToEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "operators")

	// add creates the file and says what it did; a second add changes
	// the password in place.
	if out := mustPasswd(t, nil, "add", path, "root", "pw-root"); out != path+": added user root\n" {
		t.Errorf("add: %q", out)
	}
	mustPasswd(t, nil, "add", path, "metrics", "pw-metrics")
	if out := mustPasswd(t, strings.NewReader("pw-root-2"), "add", path, "root"); out != path+": changed the password of root\n" {
		t.Errorf("add of an existing user: %q", out)
	}

	// list: names only while nobody is scoped.
	if out := mustPasswd(t, nil, "list", path); out != "root\nmetrics\n" {
		t.Errorf("list: %q", out)
	}

	// scope sets the whole list and prints the new and the previous one.
	out := mustPasswd(t, nil, "scope", path, "metrics", "/metrics,/v1/operations/consumers")
	if !strings.Contains(out, "metrics now reaches /metrics,/v1/operations/consumers (before: all routes)") {
		t.Errorf("scope: %q", out)
	}
	out = mustPasswd(t, nil, "scope", path, "metrics", "/metrics")
	if !strings.Contains(out, "now reaches /metrics (before: /metrics,/v1/operations/consumers)") {
		t.Errorf("scope replacing a scope: %q", out)
	}
	if out := mustPasswd(t, nil, "list", path); out != "root     all routes\nmetrics  /metrics\n" {
		t.Errorf("list with a scoped user: %q", out)
	}
	tab, err := passwd.Load(path, passwd.Operator)
	if err != nil {
		t.Fatal(err)
	}
	if sc, ok := tab.Authenticate("metrics", []byte("pw-metrics")); !ok || !sc.Reaches("/metrics") || sc.Reaches("/v1/operations/consumers") {
		t.Errorf("the scoped user as the broker reads it: ok=%v scope %v", ok, sc)
	}
	if _, ok := tab.Authenticate("root", []byte("pw-root-2")); !ok {
		t.Error("root's changed password is refused")
	}
	out = mustPasswd(t, nil, "scope", path, "metrics", "all")
	if !strings.Contains(out, "now reaches all routes (before: /metrics)") {
		t.Errorf("scope all: %q", out)
	}
	if data, _ := os.ReadFile(path); strings.Count(string(data), ":") != 2 {
		t.Errorf("scope all left a third field:\n%s", data)
	}

	// delete: the user's line goes; an absent user is not an error and
	// leaves the file untouched.
	if out := mustPasswd(t, nil, "delete", path, "metrics"); out != path+": deleted user metrics\n" {
		t.Errorf("delete: %q", out)
	}
	before, _ := os.ReadFile(path)
	if out := mustPasswd(t, nil, "delete", path, "metrics"); !strings.Contains(out, "no user metrics; nothing changed") {
		t.Errorf("delete of an absent user: %q", out)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("deleting an absent user changed the file")
	}

	// Refusals: exit 1, the reason, nothing written.
	for _, c := range []struct {
		args []string
		in   string
		want string
	}{
		{[]string{"add", path, "a:b", "pw"}, "", "holds ':'"},
		{[]string{"add", path, "ev\x01l", "pw"}, "", "control character U+0001"},
		{[]string{"add", path, "#x", "pw"}, "", "begins with '#'"},
		{[]string{"add", path, "eve", ""}, "", "an empty password is refused"},
		{[]string{"add", path, "eve"}, "\n", "an empty password is refused"},
		{[]string{"add", path, "eve"}, "", "no password on standard input"},
		{[]string{"add", path, "eve"}, strings.Repeat("x", passwd.MaxPassword+1) + "\n", "is 65536 bytes; MQTT carries at most 65535"},
		{[]string{"add", path, "eve"}, strings.Repeat("x", 1<<20), "longer than 65535 bytes"},
		{[]string{"scope", path, "root", "/metrics,/nope"}, "", `"/nope" is not a route the broker serves`},
		{[]string{"scope", path, "nobody", "/metrics"}, "", `no user "nobody"`},
		{[]string{"delete", filepath.Join(filepath.Dir(path), "absent"), "root"}, "", "no such file"},
		{[]string{"list", filepath.Join(filepath.Dir(path), "absent")}, "", "no such file"},
	} {
		code, out, errOut := saguinPasswd(t, strings.NewReader(c.in), c.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1 saying %q", c.args, code, out, errOut, c.want)
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Errorf("a refused command changed the file:\n%s", after)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), "absent")); err == nil {
		t.Error("delete or list created a missing file")
	}

	// A file that does not load is refused with every problem listed.
	broken := filepath.Join(t.TempDir(), "broken")
	if err := os.WriteFile(broken, []byte("alice:clear\nbob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := saguinPasswd(t, nil, "add", broken, "carol", "pw")
	if code != 1 || !strings.Contains(errOut, broken+":1: ") || !strings.Contains(errOut, broken+":2: ") || !strings.Contains(errOut, "nothing written") {
		t.Errorf("add to a broken file: exit %d\n%s", code, errOut)
	}
}

// The usage mistakes: exit 2 and the --passwd usage line. --passwd reads
// no configuration, so --config or --check-config beside it is refused,
// before or after its words.
func TestPasswdUsageMistakes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	for _, args := range [][]string{
		{},
		{"frob", path},
		{"list"},
		{"list", path, "extra"},
		{"add", path},
		{"add", path, "u", "pw", "extra"},
		{"delete", path},
		{"scope", path, "u"},
		{"list", "--", "-x"},
		{"list", path, "--config", path},
		{"add", path, "u", "--check-config=" + path},
	} {
		code, out, errOut := saguinPasswd(t, nil, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "usage: saguin --passwd") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and the usage", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{
		{"--config", path, "--passwd", "list", path},
		{"--check-config", path, "--passwd", "list", path},
		{"--passwd", "list", path, "-config", path},
		{"--route", path, "--passwd", "list", path},
		{"--passwd", "add", path, "u", "--", "--config"},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != 2 || out != "" || !strings.Contains(errOut, "reads no configuration") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, --passwd reads no configuration", args, code, out, errOut)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a refused command created the file")
	}
}

// Flags may follow operands (docs/operations.md), so a password that
// begins with '-' is written after "--", which ends the flags.
func TestPasswdPasswordBeginningWithADash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	if code, _, errOut := saguinPasswd(t, nil, "add", path, "alice", "-dashed"); code != 2 || !strings.Contains(errOut, "-dashed") {
		t.Errorf("a password read as a flag: exit %d, %q; want exit 2 naming it", code, errOut)
	}
	mustPasswd(t, nil, "add", path, "alice", "--", "-dashed")
	checkVerifies(t, path, "alice", "-dashed")
}

// checkVerifies loads path as the broker would and checks that password
// is user's.
func checkVerifies(t *testing.T, path, user, password string) {
	t.Helper()
	tab, err := passwd.Load(path, passwd.MQTT)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.Authenticate(user, []byte(password)); !ok {
		t.Errorf("%s's password %q does not verify in %s", user, password, path)
	}
}

// An existing file keeps its mode, and every line but the edited one is
// kept byte for byte (comments included) through the binary.
func TestPasswdAddKeepsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	mosquittotest.Passwd(t, "-c", "-b", path, "alice", "pw")
	head, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := "# gateway users\r\n" + string(head) + "\n"
	if err := os.WriteFile(path, []byte(text), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	mustPasswd(t, nil, "add", path, "bob", "pw2")
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), text) || !strings.HasPrefix(string(data[len(text):]), "bob:$7$1000$") {
		t.Errorf("the file after add:\n%q\nwant it to begin\n%q then bob's line", data, text)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v after add, want 0640 kept", fi.Mode().Perm())
	}
}

// --help names --passwd and its words.
func TestHelpNamesPasswd(t *testing.T) {
	code, out, _ := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "--passwd list FILE | add FILE USER [PASSWORD] | delete FILE USER") || !strings.Contains(out, "scope FILE USER ROUTES|all") {
		t.Errorf("--help does not describe --passwd:\n%s", out)
	}
}
