package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"saguin.dev/broker/passwd"
)

// runCLI runs the command in-process, as the binary would with args.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// docs/operations.md "The command line": --help prints the usage to stdout and exits 0 — it is
// what was asked for, not a mistake.
func TestHelpPrintsUsageToStdoutAndExitsZero(t *testing.T) {
	for _, arg := range []string{"--help", "-help", "-h"} {
		code, out, errOut := runCLI(t, arg)
		if code != 0 {
			t.Errorf("%s: exit %d, want 0 (stderr %q)", arg, code, errOut)
		}
		for _, want := range []string{"usage: saguin", "--config", "--check-config", "--version", "SIGHUP"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the usage on stdout does not mention %q:\n%s", arg, want, out)
			}
		}
		if errOut != "" {
			t.Errorf("%s: wrote to stderr: %q", arg, errOut)
		}
	}
}

// docs/operations.md "The command line": --version prints the name, the version and the revision
// the binary was built from, and is checked before anything else.
func TestVersionPrintsNameVersionAndRevision(t *testing.T) {
	old := revision
	revision = "0123456789ab"
	t.Cleanup(func() { revision = old })
	for _, args := range [][]string{{"--version"}, {"--version", "--config", "/nonexistent/saguin.yaml"}} {
		code, out, errOut := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d (stderr %q)", args, code, errOut)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%v: want a two-line banner and a build line, got:\n%s", args, out)
		}
		if !strings.Contains(lines[0], "Sagüin") {
			t.Errorf("%v: the banner does not name Sagüin: %q", args, lines[0])
		}
		if !strings.Contains(lines[1], version) || !strings.Contains(lines[1], "0123456789ab") {
			t.Errorf("%v: the second line does not give version %s and revision: %q", args, version, lines[1])
		}
		if lines[2] != "build "+version+"+0123456789ab" {
			t.Errorf("%v: build line %q, want %q", args, lines[2], "build "+version+"+0123456789ab")
		}
	}
}

// An argument the binary does not take — a subcommand as other brokers
// have, or an unknown flag — is refused with the usage line on stderr and
// exit 2, never ignored (a broker started with `saguin run` must not
// silently do something else).
func TestUnknownArgumentOrSubcommandIsRefusedWithUsage(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "saguin.yaml", minimalConfig)
	for _, args := range [][]string{
		{"run"},
		{"--config", cfg, "run"},
		{"--check-config", cfg, "extra"},
		{"--bogus"},
		{"-c", cfg},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stdout %q, stderr %q)", args, code, out, errOut)
		}
		if !strings.Contains(errOut, "usage: saguin") {
			t.Errorf("%v: stderr lacks the usage line: %q", args, errOut)
		}
	}
}

// docs/operations.md "The command line": --check-config refuses --config alongside: the operator
// meant one or the other, and guessing which would either start a broker
// they meant only to check, or not start one they meant to run.
func TestCheckConfigWithConfigIsRefused(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "saguin.yaml", minimalConfig)
	code, out, errOut := runCLI(t, "--check-config", cfg, "--config", cfg)
	if code != 2 {
		t.Fatalf("exit %d, want 2 (stdout %q, stderr %q)", code, out, errOut)
	}
	if !strings.Contains(errOut, "--check-config") || !strings.Contains(errOut, "--config") || !strings.Contains(errOut, "usage: saguin") {
		t.Errorf("the refusal does not say why: %q", errOut)
	}
}

// The example configuration passes --check-config exactly as shipped: a
// user's first command works, with no placeholder only make run replaces.
func TestShippedExampleConfigurationPassesCheckConfig(t *testing.T) {
	path, err := filepath.Abs("../../../examples/saguin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "--check-config", path)
	if code != 0 {
		t.Fatalf("examples/saguin.yaml as shipped fails --check-config (exit %d):\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, path+": ok") {
		t.Errorf("no ok line for %s:\n%s", path, out)
	}
}

// findingLine is one finding as --check-config prints it: file:line: key
// ["value"]: problem.
var findingLine = regexp.MustCompile(`^  (/[^:]+):(\d+): (\S+)( "[^"]*")?: (.+)$`)

// --check-config reports every finding in one pass and one format: an
// MQTT password file's damaged line and an operator password file's scope
// naming a route the listener does not serve beside the schema's own
// findings, each with file:line, key and fix — not only once the rest is
// clean, and not in a second format. A tls block naming certificate files
// that do not exist gets its findings in the same pass; the TLS and
// WebSocket doors themselves are served, so not refused.
func TestCheckConfigReportsEveryFindingInOnePassAndOneFormat(t *testing.T) {
	dir := t.TempDir()
	pw := writeFile(t, dir, "passwords", "dev:$7$101$abcdefghijklmnop$abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijkl==\n")
	h, err := passwd.NewHash([]byte("operator password"))
	if err != nil {
		t.Fatal(err)
	}
	opsPw := writeFile(t, dir, "operators", "ops:"+h.String()+":/metrics,/v1/operations/everything\n")
	text := `broker:
  id: test
  log_level: verbose
  mqtt:
    password_file: "` + pw + `"
    listen:
      tcp:
        address: "127.0.0.1:0"
        tls:
          cert_file: "` + dir + `/missing-cert.pem"
          key_file: "` + dir + `/missing-key.pem"
      ws:
        address: "127.0.0.1:0"
  operations:
    password_file: "` + opsPw + `"
    listen:
      tcp:
        address: "127.0.0.1:9090"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
`
	path := writeFile(t, dir, "saguin.yaml", text)
	code, out, errOut := runCLI(t, "--check-config", path)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s%s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimRight(errOut, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "configuration is invalid: "+path) {
		t.Errorf("first line %q; want it to begin %q", lines[0], "configuration is invalid: "+path)
	}
	// key -> file:line. The password file's damaged line is placed in
	// that file, under the key that names it.
	wants := map[string]string{
		"broker.log_level":                     path + ":3",
		"broker.mqtt.password_file":            pw + ":1",
		"broker.mqtt.listen.tcp.tls.cert_file": path + ":10",
		"broker.operations.password_file":      opsPw + ":1",
	}
	seen := map[string]bool{}
	for _, l := range lines[1:] {
		m := findingLine.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("a finding not in the file:line: key: problem format: %q", l)
			continue
		}
		if m[1] != path && m[1] != pw && m[1] != opsPw {
			t.Errorf("finding names file %q, want %q, %q or %q: %q", m[1], path, pw, opsPw, l)
		}
		if m[3] == "broker.operations.password_file" && !strings.Contains(m[5], `"/v1/operations/everything" is not a route the broker serves`) {
			t.Errorf("the operator file's finding does not name the route it does not serve: %q", l)
		}
		if want, ok := wants[m[3]]; ok {
			seen[m[3]] = true
			if got := m[1] + ":" + m[2]; got != want {
				t.Errorf("finding on %s is placed at %s, want %s: %q", m[3], got, want, l)
			}
		}
	}
	for k := range wants {
		if !seen[k] {
			t.Errorf("no finding on %s in:\n%s", k, errOut)
		}
	}
	if out != "" {
		t.Errorf("an invalid configuration printed to stdout: %q", out)
	}
}

// The warnings the loader computes (here an inert provider) are printed by
// --check-config, in the findings' format, and do not fail the check.
func TestCheckConfigPrintsTheLoadersWarnings(t *testing.T) {
	dir := t.TempDir()
	text := minimalConfig + `      spare:
        type: memory
        snapshot_dir: none
`
	path := writeFile(t, dir, "saguin.yaml", text)
	code, out, errOut := runCLI(t, "--check-config", path)
	if code != 0 {
		t.Fatalf("exit %d, want 0 (a warning is not a finding):\n%s%s", code, out, errOut)
	}
	want := "warning: " + path + ":19: broker.storage.providers.spare: "
	if !strings.Contains(out, want) || !strings.Contains(out, "inert") {
		t.Errorf("the inert-provider warning is not printed as %q…:\n%s", want, out)
	}
}

// minimalConfig is a valid configuration with a memory provider keeping
// nothing and one append channel; its providers block is last, so a test
// may append a provider to it (at line 19).
const minimalConfig = `channels:
  events:
    type: append
    filter: "events/#"
broker:
  id: test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
`

// SIGUSR1's re-read sets the level the one logger filters by: a debug line
// written after it is there, one written before it is not.
func TestRereadLogLevelChangesWhatTheLoggerWrites(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", strings.Replace(minimalConfig, "  id: test\n", "  id: test\n  log_level: debug\n", 1))
	var out bytes.Buffer
	level := new(slog.LevelVar) // info
	log := newLogger(&out, level)
	log.Debug("before the re-read")
	rereadLogLevel(path, level, log)
	log.Debug("after the re-read")
	if level.Level() != slog.LevelDebug {
		t.Fatalf("level %v after the re-read, want debug", level.Level())
	}
	if strings.Contains(out.String(), "before the re-read") || !strings.Contains(out.String(), "after the re-read") {
		t.Errorf("the logger did not follow the level:\n%s", out.String())
	}
}

// A configuration that does not load stops a start before logging is set
// up: "configuration is invalid:" and the findings on stderr, exit 1 — and
// the warnings of the same pass are said too, here a door identifying
// nobody beside an acl_file. A relative pid_file is one finding; the damaged
// password file line and the ACL's unknown verbs are others, each placed in
// its own file.
func TestInvalidConfigurationStopsTheStartWithItsFindingsAndWarnings(t *testing.T) {
	dir := t.TempDir()
	pw := writeFile(t, dir, "passwords", "dev:$7$101$abcdefghijklmnop$abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijkl==\n")
	acl := writeFile(t, dir, "acl", "roles:\n  all:\n    - topic: \"#\"\n      allow: [publish, subscribe]\nusers:\n  \"*\": [all]\n")
	text := strings.Replace(minimalConfig, "  mqtt:\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n",
		"  pid_file: saguin.pid\n  mqtt:\n    acl_file: \""+acl+"\"\n    listen:\n      - name: fleet\n        address: \"127.0.0.1:0\"\n        password_file: \""+pw+"\"\n      - name: plain\n        address: \"127.0.0.1:0\"\n", 1)
	text = strings.Replace(text, "    listen:\n      - name", "    listen:\n      tcp:\n      - name", 1)
	path := writeFile(t, dir, "saguin.yaml", text)
	for _, flag := range []string{"--config", "--check-config"} {
		code, out, errOut := runCLI(t, flag, path)
		if code != 1 {
			t.Fatalf("%s: exit %d, want 1:\n%s%s", flag, code, out, errOut)
		}
		for _, want := range []string{
			"configuration is invalid: " + path,
			path + `:7: broker.pid_file "saguin.pid": the path is relative`,
			pw + ":1: broker.mqtt.listen.tcp[fleet].password_file: user \"dev\"",
			acl + `:4: roles.all[0].allow[0] "publish": unknown verb`,
			"warning: " + path + ":15: broker.mqtt.listen.tcp[plain]: identifies nobody",
		} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s: stderr lacks %q:\n%s", flag, want, errOut)
			}
		}
	}
}
