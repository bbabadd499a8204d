package acl

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"saguin.dev/broker/config"
)

// testConfigText is a configuration with one channel of each type and a
// more exact append channel inside events; {{dir}} is the test's
// directory. The channels' lines are asserted by findings naming them.
const testConfigText = `broker:
  id: acl-test
  mqtt:
    password_file: {{dir}}/passwords
    acl_file: {{dir}}/acl.yaml
    listen:
      tcp:
        address: "127.0.0.1:0"
        password_file: {{dir}}/passwords
  limits:
    max_topic_levels: 8
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
  events:
    type: append
    filter: "events/#"
  alarms:
    type: append
    filter: "events/alarms/#"
  iot:
    type: append
    filter: "iot/+/events/+"
  state:
    type: latest
    filter: "site/+/state"
  jobs:
    type: queue
    filter: "jobs/#"
`

// eventsLine is where channel events is written in testConfigText.
const eventsLine = 22

// testConfig writes testConfigText and a password file into dir and loads it.
func testConfig(t testing.TB, dir string) *config.Config {
	t.Helper()
	write(t, dir, "passwords", "alice:$7$101$abcdefghijklmnop$abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijkl==\n")
	path := write(t, dir, "saguin.yaml", strings.ReplaceAll(testConfigText, "{{dir}}", dir))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("the test configuration does not load: %v", err)
	}
	return cfg
}

func write(t testing.TB, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustLoad loads an ACL text that must be valid beside the test configuration.
func mustLoad(t testing.TB, text string) *ACL {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	a, err := Load(write(t, dir, "acl.yaml", text), cfg)
	if err != nil {
		t.Fatalf("the ACL does not load: %v", err)
	}
	return a
}

// findingsOf loads an ACL text that must have findings, and returns them
// with the file's path.
func findingsOf(t *testing.T, text string) ([]config.Finding, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	path := write(t, dir, "acl.yaml", text)
	a, err := Load(path, cfg)
	if err == nil {
		t.Fatalf("the ACL loaded (%d patterns) but findings were expected:\n%s", len(a.entries), text)
	}
	var fs *config.Findings
	if !errors.As(err, &fs) {
		t.Fatalf("the error is not a *config.Findings: %v", err)
	}
	return fs.List, path
}

// want is one expected finding: its line, key, and words its problem holds.
type want struct {
	line  int
	key   string
	words []string
}

func w(line int, key string, words ...string) want { return want{line, key, words} }

// expect asserts that each wanted finding is there, rendered
// "path:line: key ...: problem", and that there are no others.
func expect(t *testing.T, list []config.Finding, path string, wants ...want) {
	t.Helper()
	used := make([]bool, len(list))
next:
	for _, wt := range wants {
		for i, f := range list {
			if used[i] || f.Line != wt.line || f.Key != wt.key {
				continue
			}
			s := f.String()
			if !strings.HasPrefix(s, path+":"+strconv.Itoa(wt.line)+": "+wt.key) {
				t.Errorf("finding %q does not begin with %s:%d: %s", s, path, wt.line, wt.key)
			}
			if !containsAll(f.Problem, wt.words) {
				continue
			}
			used[i] = true
			continue next
		}
		t.Errorf("no finding at line %d on %s saying %q; the findings:\n%s", wt.line, wt.key, wt.words, render(list))
	}
	for i, f := range list {
		if !used[i] {
			t.Errorf("unexpected finding: %s", f)
		}
	}
}

func containsAll(s string, words []string) bool {
	for _, word := range words {
		if !strings.Contains(s, word) {
			return false
		}
	}
	return true
}

func render(list []config.Finding) string {
	var b strings.Builder
	for _, f := range list {
		b.WriteString("  " + f.String() + "\n")
	}
	return b.String()
}
