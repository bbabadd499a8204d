package brokertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
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
	// Every place the example itself names — its doors' addresses and its
	// storage's paths, read from the file rather than typed in here — is
	// gone from the rewrite.
	gone := examplePlaces(t, raw)
	if len(gone) < 2 {
		t.Fatalf("the example names %q: fewer places than a door and a storage path; the check reads nothing", gone)
	}
	for _, g := range gone {
		if strings.Contains(text, g) {
			t.Errorf("the rewritten example still names %s:\n%s", g, text)
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

// examplePlaces are the values of the example's address, path, file_path,
// dir and snapshot_dir keys: where the broker it describes listens and
// writes.
func examplePlaces(t *testing.T, raw []byte) []string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				switch k.Value {
				case "address", "path", "file_path", "dir", "snapshot_dir":
					if v.Kind == yaml.ScalarNode && v.Value != "" {
						out = append(out, v.Value)
					}
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	return out
}
