package brokertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The rewrite moves every door and every written file of the shipped
// example into the test's own places, and refuses, rather than passes
// through, an example whose shape it no longer knows: a test that silently
// kept the user's file_path wrote into the data of the broker make run
// serves.
func TestShippedExampleRewriteMovesEveryDoorAndFile(t *testing.T) {
	dir := t.TempDir()
	src, err := filepath.Abs(filepath.Join("..", "..", "examples", "saguin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out, err := rewriteShippedExample(raw, dir)
	if err != nil {
		t.Fatalf("the shipped example: %v", err)
	}
	text := string(out)
	for _, gone := range []string{"/var/tmp/saguin", ":1883", ":9883"} {
		if strings.Contains(text, gone) {
			t.Errorf("the rewritten example still names %s:\n%s", gone, text)
		}
	}
	if !strings.Contains(text, `file_path: "`+dir+"/") {
		t.Errorf("the provider's file_path was not moved into %s:\n%s", dir, text)
	}

	refused := map[string]string{
		"no door named": `broker:
  storage:
    providers:
      local: {type: sqlite, file_path: /var/tmp/x/saguin.db}
`,
		"no storage path": `broker:
  mqtt: {listen: {tcp: {address: ":1883"}}}
  storage:
    providers:
      local: {type: memory}
`,
		"a path left outside the test's folder": `broker:
  mqtt: {listen: {tcp: {address: ":1883"}}}
  acl_file: /etc/saguin/acl.yaml
  storage:
    providers:
      local: {type: sqlite, file_path: /var/tmp/x/saguin.db}
`,
	}
	for name, doc := range refused {
		if _, err := rewriteShippedExample([]byte(doc), dir); err == nil {
			t.Errorf("%s: the rewrite passed a configuration it cannot make safe", name)
		}
	}
}
