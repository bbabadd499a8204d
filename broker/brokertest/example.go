package brokertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// ShippedExample rewrites a configuration a user runs as shipped (such as
// examples/saguin.yaml, which make run serves) so that a test can start it
// beside that user's broker without touching it: every door's address
// becomes a free loopback port, and every file the broker would write —
// a provider's file_path or dir, a unix door's path, the pid file — moves
// into dir. It returns the rewritten file's path.
//
// A shipped example that changes shape must not quietly keep its user's
// paths: the rewrite fails the test when it finds no door address or no
// storage path to move, and when any value it leaves still names a path
// outside dir or a fixed port (the invariant the suite keeps: make test
// passes beside make run and leaves its data alone; README "Quick start").
func ShippedExample(t testing.TB, src, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out, err := rewriteShippedExample(raw, dir)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	path := filepath.Join(dir, "saguin.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rewriteShippedExample is ShippedExample's rewrite, apart so that a test
// can show it refuses what it cannot make safe.
func rewriteShippedExample(raw []byte, dir string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("not YAML: %w", err)
	}
	rw := exampleRewrite{dir: dir}
	rw.walk(&doc, nil)
	switch {
	case rw.addresses == 0:
		return nil, fmt.Errorf("no door address found to move to a free port: the rewrite no longer matches the example's shape")
	case rw.paths == 0:
		return nil, fmt.Errorf("no storage path (file_path or dir) found to move into the test's directory: the rewrite no longer matches the example's shape")
	case len(rw.left) > 0:
		return nil, fmt.Errorf("values a test must not use are left after the rewrite: %s", strings.Join(rw.left, "; "))
	}
	return yaml.Marshal(&doc)
}

type exampleRewrite struct {
	dir       string
	addresses int      // door addresses moved to 127.0.0.1:0
	paths     int      // storage paths moved into dir
	left      []string // absolute paths outside dir, or fixed ports, still in the document
}

// fileKeys are the keys whose value the broker writes to (or binds, for a
// unix door): each moves into the test's directory, under its own name.
var fileKeys = map[string]bool{"file_path": true, "dir": true, "path": true, "pid_file": true}

func (rw *exampleRewrite) walk(n *yaml.Node, keys []string) {
	// The example's comments speak of the user's paths and ports; the
	// test's copy drops them so that what is left can be checked whole.
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			rw.walk(c, keys)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			k.HeadComment, k.LineComment, k.FootComment = "", "", ""
			rw.walk(n.Content[i+1], append(keys[:len(keys):len(keys)], n.Content[i].Value))
		}
	case yaml.ScalarNode:
		rw.scalar(n, keys)
	}
}

func (rw *exampleRewrite) scalar(n *yaml.Node, keys []string) {
	if len(keys) == 0 {
		return
	}
	key, where := keys[len(keys)-1], strings.Join(keys, ".")
	switch {
	case key == "address" && inListen(keys):
		n.Value = "127.0.0.1:0"
		rw.addresses++
		return
	case fileKeys[key] && filepath.IsAbs(n.Value):
		// Keep the file's name (a provider's database, a unix socket) so
		// the broker sees the same shape, in a folder of the test's own.
		sub := filepath.Join(rw.dir, strings.ReplaceAll(strings.Join(keys[:len(keys)-1], "."), "/", "_"))
		if err := os.MkdirAll(sub, 0o700); err == nil {
			n.Value = filepath.Join(sub, filepath.Base(n.Value))
		}
		if key != "path" && key != "pid_file" {
			rw.paths++
		}
	}
	if filepath.IsAbs(n.Value) && !strings.HasPrefix(n.Value, rw.dir+string(filepath.Separator)) && !strings.HasPrefix(n.Value, "/dev/") {
		rw.left = append(rw.left, fmt.Sprintf("%s: %q", where, n.Value))
	}
}

// inListen: an address under a listen block (the MQTT doors and the
// operations listener's), not a value that merely is called address.
func inListen(keys []string) bool {
	for _, k := range keys {
		if k == "listen" {
			return true
		}
	}
	return false
}
