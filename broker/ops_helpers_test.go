package broker_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/passwd"
)

// opsChannels are opsConfig's channels: an append channel "events"
// retained an hour, a queue "jobs" and a latest "state".
const opsChannels = `  events:
    type: append
    filter: "events/#"
    retention_period: 1h
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
  state:
    type: latest
    filter: "state/#"
`

// loopbackOps is an operations block with one loopback tcp door and no
// password file: every route, to the test's client.
const loopbackOps = "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"

// opsConfig is a broker with the mqtt block and the operations block given
// (each the YAML under its key, indented four spaces; "" mqtt is one tcp
// door), over opsChannels on a memory provider.
func opsConfig(t *testing.T, dir, mqtt, operations string) string {
	t.Helper()
	return opsConfigWith(t, dir, mqtt, operations, opsChannels)
}

// opsConfigWith is opsConfig with the channels block given: appendConfig
// on memory with its MQTT doors, an operations block and its channels
// replaced.
func opsConfigWith(t *testing.T, dir, mqtt, operations, channels string) string {
	t.Helper()
	text := appendConfigWith(memoryProvider, "")
	if mqtt != "" {
		text = strings.Replace(text, "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n", mqtt, 1)
	}
	text = strings.Replace(text, "  storage:\n", "  operations:\n"+operations+"  storage:\n", 1)
	text = text[:strings.Index(text, "channels:\n")] + "channels:\n" + channels
	return brokertest.Config(t, dir, text)
}

// startWithPasswords is a broker whose MQTT door checks user names
// against a password file naming dev-1 (password pw-dev-1), with the
// broker.mqtt key given beside it, and a client of its loopback operations
// door.
func startWithPasswords(t *testing.T, mqttKey string) (*brokertest.Broker, *opsHTTP) {
	t.Helper()
	dir := t.TempDir()
	pw := filepath.Join(dir, "passwd")
	writePasswordFile(t, pw, "dev-1")
	mqtt := "    password_file: \"" + pw + "\"\n    " + mqttKey + "\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"
	b := brokertest.Start(t, opsConfig(t, dir, mqtt, loopbackOps))
	return b, opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
}

// writeFileT writes a file the test reads back or the broker reads.
func writeFileT(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// operator is one line of an operator password file: its password is
// "pw-" + name; scope "" reaches every route.
type operator struct{ name, scope string }

// writeOperators writes an operator password file at path.
func writeOperators(t *testing.T, path string, ops ...operator) {
	t.Helper()
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	f := passwd.NewFile(path, passwd.Operator)
	for _, o := range ops {
		h, err := passwd.NewHash([]byte("pw-" + o.name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Set(o.name, h); err != nil {
			t.Fatal(err)
		}
		if o.scope != "" {
			s, err := passwd.ParseScope(o.scope)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.SetScope(o.name, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
}

// opsHTTP is a real HTTP client of one operations door: one connection per
// request (a unix door behind a proxy gets its PROXY header on each).
type opsHTTP struct {
	t    *testing.T
	c    *http.Client
	base string
}

// opsOverTCP is a client of the door at addr; tlsConf nil for plain HTTP.
func opsOverTCP(t *testing.T, addr string, tlsConf *tls.Config) *opsHTTP {
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true, TLSClientConfig: tlsConf,
		ResponseHeaderTimeout: 30 * time.Second}
	scheme := "http://"
	if tlsConf != nil {
		scheme = "https://"
	}
	return &opsHTTP{t: t, c: &http.Client{Transport: tr, Timeout: 60 * time.Second}, base: scheme + addr}
}

// opsOverUnix is a client of the unix door at sock, writing preface (a
// PROXY header, or nothing) first on each connection.
func opsOverUnix(t *testing.T, sock string, preface []byte) *opsHTTP {
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true, ResponseHeaderTimeout: 30 * time.Second,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", sock)
			if err != nil || len(preface) == 0 {
				return c, err
			}
			if _, err := c.Write(preface); err != nil {
				_ = c.Close()
				return nil, err
			}
			return c, nil
		}}
	return &opsHTTP{t: t, c: &http.Client{Transport: tr, Timeout: 60 * time.Second}, base: "http://saguin"}
}

// opsReply is one answer.
type opsReply struct {
	status int
	header http.Header
	body   []byte
	err    error // the request got no answer (a refused handshake)
}

// reqOpt changes a request.
type reqOpt func(*http.Request)

func basic(user, password string) reqOpt {
	return func(r *http.Request) { r.SetBasicAuth(user, password) }
}
func withHeader(k, v string) reqOpt { return func(r *http.Request) { r.Header.Add(k, v) } }
func withHost(h string) reqOpt      { return func(r *http.Request) { r.Host = h } }
func withMethod(m string) reqOpt    { return func(r *http.Request) { r.Method = m } }

// get sends a request for path and reads the whole answer.
func (o *opsHTTP) get(path string, opts ...reqOpt) opsReply {
	o.t.Helper()
	req, err := http.NewRequest(http.MethodGet, o.base+path, nil)
	if err != nil {
		o.t.Fatal(err)
	}
	for _, f := range opts {
		f(req)
	}
	resp, err := o.c.Do(req)
	if err != nil {
		return opsReply{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		o.t.Fatalf("reading the answer to %s: %v", path, err)
	}
	return opsReply{status: resp.StatusCode, header: resp.Header, body: body}
}

// must sends the request and fails the test unless the answer is status.
func (o *opsHTTP) must(status int, path string, opts ...reqOpt) opsReply {
	o.t.Helper()
	r := o.get(path, opts...)
	if r.err != nil {
		o.t.Fatalf("%s: no answer: %v", path, r.err)
	}
	if r.status != status {
		o.t.Fatalf("%s: HTTP %d, want %d: %s", path, r.status, status, r.body)
	}
	return r
}

// decode reads a JSON answer into v.
func (r opsReply) decode(t *testing.T, v any) {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json: %s", ct, r.body)
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("the answer is not the JSON expected: %v\n%s", err, r.body)
	}
}

// object reads a JSON object answer as generic JSON.
func (r opsReply) object(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	r.decode(t, &m)
	return m
}

// errorText is an error answer's message.
func (r opsReply) errorText(t *testing.T) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	r.decode(t, &e)
	if e.Error == "" {
		t.Fatalf("an error answer (HTTP %d) with no message: %s", r.status, r.body)
	}
	return e.Error
}

// opsSocket is a unix socket path short enough for sun_path.
func opsSocket(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(filepath.Dir(socketPath(t)), name)
}

// fieldNames are an object's keys, for a shape check.
func fieldNames(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// sameKeys fails unless m has exactly want's keys.
func sameKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	got := map[string]bool{}
	for k := range m {
		got[k] = true
	}
	for _, k := range want {
		if !got[k] {
			t.Errorf("%s has no field %q: %v", what, k, fieldNames(m))
		}
		delete(got, k)
	}
	if len(got) > 0 {
		t.Errorf("%s has fields beyond the contract: %v (all: %v)", what, got, strings.Join(fieldNames(m), ","))
	}
}
