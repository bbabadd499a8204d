package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// baseYAML is a small valid configuration; tests patch one key at a time so
// each rule is seen alone. {{dir}} is the test's temporary directory.
const baseYAML = `
broker:
  id: edge-1
  storage:
    default: main
    default_retention_period: 7d
    default_retention_bytes: 1GiB
    providers:
      main:
        type: sqlite
        file_path: {{dir}}/main.db
      mem:
        type: memory
        snapshot_dir: {{dir}}/snap
channels:
  orders:
    type: append
  state:
    type: latest
    filter: site/+/state
  jobs:
    type: queue
    storage: mem
`

// del marks a key to remove.
type delMarker struct{}

var del = delMarker{}

// patch is one change to baseYAML: a dotted path and its new value.
type patch struct {
	path  string
	value any
}

func p(path string, value any) patch { return patch{path, value} }

// build renders baseYAML with the patches applied into dir/config.yaml.
func build(t *testing.T, dir string, patches ...patch) string {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(baseYAML, "{{dir}}", dir)), &doc); err != nil {
		t.Fatal(err)
	}
	for _, pt := range patches {
		sep := "."
		if strings.Contains(pt.path, "|") {
			sep = "|" // for keys that contain dots
		}
		keys := strings.Split(pt.path, sep)
		m := doc
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		last := keys[len(keys)-1]
		if _, isDel := pt.value.(delMarker); isDel {
			delete(m, last)
		} else {
			m[last] = pt.value
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, "config.yaml", strings.ReplaceAll(string(out), "{{dir}}", dir))
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustLoad loads a configuration that must be valid.
func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return cfg
}

// findings loads a configuration that must be refused and returns its findings.
func findings(t *testing.T, path string) []Finding {
	t.Helper()
	cfg, err := Load(path)
	if err == nil {
		t.Fatalf("Load accepted the configuration (%d channels); want findings", len(cfg.Channels))
	}
	var f *Findings
	if !errors.As(err, &f) {
		t.Fatalf("Load error is %T (%v), want *Findings", err, err)
	}
	return f.List
}

// expectOne asserts exactly one finding, on key, whose text holds want.
func expectOne(t *testing.T, list []Finding, key, want string) {
	t.Helper()
	if len(list) != 1 {
		var b strings.Builder
		for _, f := range list {
			b.WriteString("\n  " + f.String())
		}
		t.Fatalf("got %d findings, want exactly 1 on %s:%s", len(list), key, b.String())
	}
	f := list[0]
	if f.Key != key {
		t.Errorf("finding on key %q, want %q: %s", f.Key, key, f)
	}
	if !strings.Contains(f.String(), want) {
		t.Errorf("finding %q does not contain %q", f.String(), want)
	}
	if f.Problem == "" {
		t.Errorf("finding %q has no explanation", f)
	}
}

// certFiles writes a self-signed certificate and its key into dir.
func certFiles(t *testing.T, dir, prefix string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: prefix},
		NotBefore:    time.Unix(0, 0),
		NotAfter:     time.Unix(4102444800, 0),
		IsCA:         true,
		KeyUsage:     x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath = writeFile(t, dir, prefix+".crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyPath = writeFile(t, dir, prefix+".key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	return certPath, keyPath
}
