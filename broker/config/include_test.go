package config

import (
	"path/filepath"
	"strings"
	"testing"
)

const includeMain = `broker:
  id: edge-1
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      - !include providers/main.yaml
      - spare:
          type: memory
          snapshot_dir: none
channels:
  - !include channels/a.yaml
  - !include channels/b.yaml
  - inline:
      type: latest
`

func includeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		writeFile(t, dir, name, strings.ReplaceAll(content, "{{dir}}", dir))
	}
	return filepath.Join(dir, "conf", "saguin.yaml")
}

func TestIncludesAreReadRelativeToTheIncludingFile(t *testing.T) {
	path := includeTree(t, map[string]string{
		"conf/saguin.yaml":          includeMain,
		"conf/providers/main.yaml":  "main:\n  type: sqlite\n  file_path: {{dir}}/main.db\n",
		"conf/channels/a.yaml":      "orders:\n  type: append\n",
		"conf/channels/b.yaml":      "jobs:\n  type: queue\n  storage: spare\n",
		"providers/main.yaml":       "wrong: {type: memory}\n", // relative to cwd would find this
		"conf/unrelated/extra.yaml": "",
	})
	cfg := mustLoad(t, path)
	var names []string
	for _, c := range cfg.Channels {
		names = append(names, c.Name)
	}
	if got := strings.Join(names, " "); got != "inline jobs jobs__dlq orders" {
		t.Fatalf("channels = %s", got)
	}
	if pr, ok := cfg.Providers["main"]; !ok || pr.Type != "sqlite" {
		t.Fatalf("providers = %+v", cfg.Providers)
	}
	if c, _ := cfg.Channel("orders"); !strings.HasSuffix(c.File, filepath.Join("conf", "channels", "a.yaml")) || c.Line != 1 {
		t.Fatalf("orders is at %s:%d; want channels/a.yaml:1", c.File, c.Line)
	}
}

func TestIncludeFindingsNameTheIncludedFileAndLine(t *testing.T) {
	path := includeTree(t, map[string]string{
		"conf/saguin.yaml":         includeMain,
		"conf/providers/main.yaml": "main:\n  type: sqlite\n  file_path: {{dir}}/main.db\n",
		"conf/channels/a.yaml":     "orders:\n  type: append\n\n  colour: red\n",
		"conf/channels/b.yaml":     "jobs:\n  type: queue\n  storage: spare\n",
	})
	list := findings(t, path)
	expectOne(t, list, "channels.orders.colour", "unknown key")
	if f := list[0]; !strings.HasSuffix(f.File, filepath.Join("channels", "a.yaml")) || f.Line != 4 {
		t.Fatalf("finding at %s:%d, want channels/a.yaml:4", f.File, f.Line)
	}
}

func TestIncludeRules(t *testing.T) {
	okProviders := "main:\n  type: sqlite\n  file_path: {{dir}}/main.db\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		key   string
		want  string
	}{
		{"channel defined in two files", map[string]string{
			"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": okProviders,
			"conf/channels/a.yaml": "orders:\n  type: append\n",
			"conf/channels/b.yaml": "\norders:\n  type: latest\n",
		}, "channels.orders", "channel orders is defined twice: "},
		{"nested include", map[string]string{
			"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": okProviders,
			"conf/channels/a.yaml": "- !include more.yaml\n",
			"conf/channels/b.yaml": "jobs: {type: queue, storage: spare}\n",
		}, "!include", "cannot include another"},
		{"glob", map[string]string{
			"conf/saguin.yaml": strings.Replace(includeMain, "channels/a.yaml", "channels/*.yaml", 1), "conf/providers/main.yaml": okProviders,
			"conf/channels/b.yaml": "jobs: {type: queue, storage: spare}\n",
		}, "channels[0]", "not a pattern"},
		{"missing file", map[string]string{
			"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": okProviders,
			"conf/channels/b.yaml": "jobs: {type: queue, storage: spare}\n",
		}, "channels[0]", "no such file or directory"},
		{"include outside the two lists", map[string]string{
			"conf/saguin.yaml":         strings.Replace(includeMain, "  id: edge-1\n", "  id: edge-1\n  limits: !include limits.yaml\n", 1),
			"conf/providers/main.yaml": okProviders,
			"conf/channels/a.yaml":     "orders: {type: append}\n", "conf/channels/b.yaml": "jobs: {type: queue, storage: spare}\n",
		}, "broker.limits", "allowed only as a list entry under channels: or broker.storage.providers"},
		{"included file is a list", map[string]string{
			"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": okProviders,
			"conf/channels/a.yaml": "- orders\n", "conf/channels/b.yaml": "jobs: {type: queue, storage: spare}\n",
		}, "channels", "holds just the mapping"},
		{"same file twice", map[string]string{
			"conf/saguin.yaml":         strings.Replace(includeMain, "channels/b.yaml", "channels/a.yaml", 1),
			"conf/providers/main.yaml": okProviders, "conf/channels/a.yaml": "orders: {type: append}\n",
		}, "channels[1]", "is included twice"},
		{"same filter across files", map[string]string{
			"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": okProviders,
			"conf/channels/a.yaml": "orders:\n  type: append\n  filter: shop/#\n",
			"conf/channels/b.yaml": "jobs:\n  type: queue\n  storage: spare\n  filter: shop/#\n",
		}, "channels.jobs.filter", "channels orders ("},
		{"list entry neither include nor map", map[string]string{
			"conf/saguin.yaml":         strings.Replace(includeMain, "  - !include channels/b.yaml\n", "  - just-a-name\n", 1),
			"conf/providers/main.yaml": okProviders, "conf/channels/a.yaml": "orders: {type: append}\n",
		}, "channels[1]", `each list entry is "!include <path>" or an inline mapping`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectOne(t, findings(t, includeTree(t, tc.files)), tc.key, tc.want)
		})
	}
}

func TestChannelDefinedTwiceNamesBothFiles(t *testing.T) {
	path := includeTree(t, map[string]string{
		"conf/saguin.yaml": includeMain, "conf/providers/main.yaml": "main:\n  type: sqlite\n  file_path: {{dir}}/main.db\n",
		"conf/channels/a.yaml": "orders:\n  type: append\n",
		"conf/channels/b.yaml": "\norders:\n  type: latest\n",
	})
	list := findings(t, path)
	msg := list[0].String()
	if !strings.Contains(msg, filepath.Join("channels", "a.yaml")+":1") || !strings.Contains(msg, filepath.Join("channels", "b.yaml")+":2") {
		t.Fatalf("finding %q does not name both files with lines", msg)
	}
}
