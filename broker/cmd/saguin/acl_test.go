package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"saguin.dev/broker/brokertest"
)

// aclConfigText names an acl_file beside a password file (an ACL needs
// someone to name); {{dir}} is the test's directory.
const aclConfigText = `broker:
  id: test
  mqtt:
    password_file: {{dir}}/passwords
    acl_file: {{dir}}/acl.yaml
    listen:
      tcp:
        address: "127.0.0.1:0"
  limits:
    publish_rate: 50
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
channels:
  iot:
    type: append
    filter: "iot/+/events/+"
  events:
    type: append
    filter: "events/#"
`

const aclText = `roles:
  devices:
    - channel: iot
      allow: [write]
    - channel: events
      filter: "events/%u/#"
      allow: [read]
    - topic: "home/%c/#"
      allow: [read, write]
  guard:
    - broker: features
      deny: [will, qos2]
users:
  "dev-*":
    roles: [devices, guard]
    client_ids: "%u-*"
    limits: {publish_bytes: 64KiB}
  "*": [guard]
`

// aclSetup writes a configuration, its password file and the ACL text,
// and returns the configuration's path.
func aclSetup(t *testing.T, acl string) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, "passwords", "dev-7:$7$101$abcdefghijklmnop$abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijkl==\n")
	writeFile(t, dir, "acl.yaml", acl)
	return writeFile(t, dir, "saguin.yaml", strings.ReplaceAll(aclConfigText, "{{dir}}", dir))
}

// saguin runs the real binary with args and stdin.
func saguin(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := brokertest.Command(t, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case asExit(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("saguin %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

func asExit(err error, exit **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*exit = e
	return ok
}

// docs/operations.md "The command line": seven tab-separated columns: the patterns matched (the one
// that applies, the ones it shadows), the client id's verdict, each grant
// with %u and %c substituted, the publish figures on every row.
func TestACLExplainsOneUserAsTSV(t *testing.T) {
	cfg := aclSetup(t, aclText)
	code, out, errOut := saguin(t, "", "--acl", cfg, "dev-7", "dev-7-a")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := `# user	role	kind	subject	verbs	rate	bytes
dev-7	-	pattern	dev-*	applies	50	64KiB
dev-7	-	pattern	*	shadowed	50	64KiB
dev-7	-	client_id	dev-7-a	allowed	50	64KiB
dev-7	devices	channel	iot (iot/+/events/+)	write	50	64KiB
dev-7	devices	channel	events (events/dev-7/#)	read	50	64KiB
dev-7	devices	topic	home/dev-7-a/#	write,read	50	64KiB
dev-7	guard	broker	features	deny:will,qos2	50	64KiB
`
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	_, out, _ = saguin(t, "", "--acl", cfg, "dev-7", "other")
	if !strings.Contains(out, "dev-7\t-\tclient_id\tother\trefused\t50\t64KiB\n") {
		t.Errorf("a client id client_ids does not admit:\n%s", out)
	}
}

// With no user operand the names come from stdin, one per line: the same
// rows for each; a blank line is skipped, a CRLF line end taken off, and a
// name no client could have reported on stderr without stopping the list.
func TestACLReadsNamesFromStdin(t *testing.T) {
	cfg := aclSetup(t, aclText)
	code, out, errOut := saguin(t, "visitor\n\ndev-a/b\r\nbad\x01name\n", "--acl", cfg)
	if code != 1 {
		t.Errorf("exit %d, want 1 for the bad name (stderr %q)", code, errOut)
	}
	want := `# user	role	kind	subject	verbs	rate	bytes
visitor	-	pattern	*	applies	50	no bound
visitor	guard	broker	features	deny:will,qos2	50	no bound
dev-a/b	-	pattern	dev-*	applies	50	64KiB
dev-a/b	-	pattern	*	shadowed	50	64KiB
dev-a/b	devices	channel	iot (iot/+/events/+)	write	50	64KiB
dev-a/b	devices	topic	home/%c/#	write,read	50	64KiB
dev-a/b	guard	broker	features	deny:will,qos2	50	64KiB
dev-a/b	devices	channel	events (events/%u/#)	withheld: %u is the user name, which holds "/"	50	64KiB
`
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errOut, "stdin line 4: holds a control character") {
		t.Errorf("stderr does not name the bad line: %q", errOut)
	}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if n := strings.Count(line, "\t"); n != 6 {
			t.Errorf("a row of %d columns: %q", n+1, line)
		}
	}
}

// --json: one compact object per name, the flag allowed after the
// operands; a name matching nothing has empty grants and a null pattern.
func TestACLJSONOnePerLine(t *testing.T) {
	cfg := aclSetup(t, strings.Replace(aclText, `  "*": [guard]`+"\n", "", 1))
	code, out, errOut := saguin(t, "", "--acl", cfg, "dev-7", "x-1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var x map[string]any
	if err := json.Unmarshal([]byte(out), &x); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("not one JSON object on one line: %v\n%s", err, out)
	}
	grants, _ := x["grants"].([]any)
	if len(grants) != 4 {
		t.Fatalf("%d grants, want 4: %s", len(grants), out)
	}
	last, _ := grants[3].(map[string]any)
	if x["user"] != "dev-7" || !strings.HasSuffix(x["acl_file"].(string), "/acl.yaml") || x["pattern_applied"] != "dev-*" ||
		x["client_id_allowed"] != false || x["grants_withheld"] == nil ||
		last["kind"] != "broker" || fmt.Sprint(last["denies"]) != "[will qos2]" {
		t.Errorf("explanation: %s", out)
	}

	code, out, _ = saguin(t, "nobody\ndev-1\n", "--json", "--acl", cfg)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("exit %d, %d lines:\n%s", code, len(lines), out)
	}
	if !strings.HasPrefix(lines[0], `{"user":"nobody","acl_file":"`) ||
		!strings.HasSuffix(lines[0], `","pattern_applied":null,"patterns_matched":[],"patterns_in_file":["dev-*"],"client_id_allowed":null,"grants":[],"grants_withheld":[]}`) {
		t.Errorf("a name matching nothing: %s", lines[0])
	}
}

// Without an acl_file everything is allowed, and --acl says so.
func TestACLWithoutAnACLFile(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "saguin.yaml", minimalConfig)
	code, out, errOut := saguin(t, "", "--acl", cfg, "anyone", "--json")
	if code != 0 || out != `{"acl_file":null,"everything_allowed":true}`+"\n" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, out, _ = saguin(t, "", "--acl", cfg, "anyone")
	if !strings.HasSuffix(out, "anyone\t-\t-\t-\teverything\tno bound\tno bound\n") {
		t.Errorf("TSV: %q", out)
	}
}

// --json alone, --acl beside --config or --check-config, and a third
// operand are usage errors (exit 2); an ACL with findings is exit 1 with
// the findings, each at its file and line, as --check-config prints them.
func TestACLRefusals(t *testing.T) {
	cfg := aclSetup(t, aclText)
	for _, args := range [][]string{
		{"--json"},
		{"--json", "--config", cfg},
		{"--acl", cfg, "--config", cfg},
		{"--acl", cfg, "alice", "--check-config", cfg},
		{"--acl", cfg, "a", "b", "c"},
	} {
		code, _, errOut := saguin(t, "", args...)
		if code != 2 || !strings.Contains(errOut, "usage: saguin") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	bad := aclSetup(t, strings.Replace(aclText, "allow: [write]", "allow: [write, consume]", 1))
	code, out, errOut := saguin(t, "", "--acl", bad, "dev-7")
	if code != 1 || out != "" || !strings.Contains(errOut, "configuration is invalid: "+bad) ||
		!strings.Contains(errOut, "/acl.yaml:4: roles.devices[0].allow[1] \"consume\": only a queue is consumed") {
		t.Errorf("exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}
	// --check-config reports the same finding in its one pass.
	code, _, errOut = runCLI(t, "--check-config", bad)
	if code != 1 || !strings.Contains(errOut, "/acl.yaml:4: roles.devices[0].allow[1] \"consume\": only a queue is consumed") {
		t.Errorf("--check-config: exit %d:\n%s", code, errOut)
	}
}
