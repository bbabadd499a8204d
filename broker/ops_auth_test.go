package broker_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/ops"
)

// metricsType is the Prometheus text exposition's content type.
const metricsType = "text/plain; version=0.0.4; charset=utf-8"

// docs/operations.md "Who the caller is": a request with no identity on a door with no password
// file — the loader allowed that only on a loopback address — reaches
// every route, but on tcp only when its Host is an IP literal or
// localhost: a page served from another name and rebound to 127.0.0.1 by
// DNS gets 403 naming the setting that lifts it, and one line in the log.
// /health is exempt. A route that does not exist is 404, a method a route
// does not take 405 naming the ones it does, and a password offered to a
// door that has no file to check it against is refused, not ignored.
func TestOperationsLoopbackDoorTrustsCallersWithNoIdentityByAddress(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, opsConfig(t, dir, "", "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)

	if r := c.must(http.StatusOK, "/health"); string(r.body) != "{\"status\":\"ok\"}\n" || r.header.Get("Content-Type") != "application/json" {
		t.Errorf("/health: %q %q", r.header.Get("Content-Type"), r.body)
	}
	if r := c.must(http.StatusOK, "/health", withMethod(http.MethodHead)); len(r.body) != 0 {
		t.Errorf("HEAD /health wrote a body: %q", r.body)
	}
	r := c.must(http.StatusOK, "/metrics")
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, metricsType) {
		t.Errorf("/metrics Content-Type %q, want %q", ct, metricsType)
	}
	if !bytes.Contains(r.body, []byte("# TYPE saguin_build_info gauge")) {
		t.Errorf("/metrics is not the text exposition:\n%.300s", r.body)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "LOCALHOST:9090", "[::1]:9090", "localhost."} {
		c.must(http.StatusOK, "/v1/operations/sessions", withHost(host))
	}
	for _, path := range []string{"/v1/operations/sessions", "/metrics"} {
		r := c.must(http.StatusForbidden, path, withHost("status.example.com"))
		if msg := r.errorText(t); !strings.Contains(msg, "broker.operations.password_file") || !strings.Contains(msg, "status.example.com") {
			t.Errorf("the DNS-rebinding refusal does not name the Host and the setting: %q", msg)
		}
	}
	if !logHasLine(b.Log.String(), "level=WARN", `msg="operations request refused"`, "status=403", "path=/v1/operations/sessions") {
		t.Errorf("no line for the refused request:\n%s", b.Log.Tail(20))
	}
	c.must(http.StatusOK, "/health", withHost("status.example.com"))

	for _, path := range []string{"/", "/v1", "/v1/operations", "/v1/operations/", "/metrics/", "/v1/operations/queues",
		"/v1/operations/queues/", "/v1/operations/sessionsX", "/v1/operations/../metrics", "/v2/operations/sessions"} {
		c.must(http.StatusNotFound, path)
	}
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodPost, "/health", "GET, HEAD"},
		{http.MethodDelete, "/metrics", "GET, HEAD"},
		{http.MethodPost, "/v1/operations/sessions", "GET"},
		{http.MethodHead, "/v1/operations/config", "GET"},
		{http.MethodPut, "/v1/operations/queues/jobs", "GET"},
	} {
		r := c.must(http.StatusMethodNotAllowed, tc.path, withMethod(tc.method))
		if got := r.header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	r = c.must(http.StatusUnauthorized, "/metrics", basic("alice", "pw-alice"))
	if msg := r.errorText(t); !strings.Contains(msg, "no password_file") {
		t.Errorf("a password offered to a door with no file: %q", msg)
	}
	if b.Log.Contains("pw-alice") {
		t.Errorf("the log holds the offered password:\n%s", b.Log.Tail(20))
	}
}

// docs/operations.md "Operators"; docs/operations.md "Who the caller is" on a door with an operator password file: a request
// with no credential is 401 with WWW-Authenticate (never on /health); a
// wrong password is 401 and its line holds no credential; an operator
// reaches the routes its scope names, by whole path segments, and gets
// 403 elsewhere; X-Saguin-Principal is ignored on tcp, loopback included.
// /metrics is gzipped when the scraper asks.
func TestOperationsPasswordFileDecidesWhoReachesWhat(t *testing.T) {
	dir := t.TempDir()
	ops := filepath.Join(dir, "operators")
	writeOperators(t, ops, operator{"root", ""}, operator{"scraper", "/metrics"},
		operator{"auditor", "/v1/operations/config,/v1/operations/queues"}, operator{"alice@example.com", "/v1/operations"})
	b := brokertest.Start(t, opsConfig(t, dir, "", "    password_file: \""+ops+"\"\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)

	c.must(http.StatusOK, "/health")
	for _, path := range []string{"/metrics", "/v1/operations/sessions", "/v1/operations/queues/jobs"} {
		r := c.must(http.StatusUnauthorized, path)
		if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Basic realm=") {
			t.Errorf("%s: WWW-Authenticate %q", path, got)
		}
		c.must(http.StatusUnauthorized, path, withHeader("X-Saguin-Principal", "root"))
	}
	r := c.must(http.StatusUnauthorized, "/metrics", basic("root", "hunter2-not-it"))
	if r.header.Get("WWW-Authenticate") == "" {
		t.Error("a wrong password's 401 has no WWW-Authenticate")
	}
	c.must(http.StatusUnauthorized, "/metrics", basic("nobody", "pw-nobody"))
	c.must(http.StatusUnauthorized, "/metrics", withHeader("Authorization", "Bearer pw-root"))
	if !logHasLine(b.Log.String(), `msg="operations request refused"`, "status=401", "wrong user name or password") {
		t.Errorf("no line for the wrong password:\n%s", b.Log.Tail(20))
	}
	for _, secret := range []string{"hunter2-not-it", "pw-nobody", "pw-root"} {
		if b.Log.Contains(secret) {
			t.Errorf("the log holds a credential (%q):\n%s", secret, b.Log.Tail(20))
		}
	}

	all := []string{"/metrics", "/v1/operations/sessions", "/v1/operations/config", "/v1/operations/queues/jobs",
		"/v1/operations/refused", "/v1/operations/users"}
	reach := map[string][]string{
		"root":              all,
		"scraper":           {"/metrics"},
		"auditor":           {"/v1/operations/config", "/v1/operations/queues/jobs"},
		"alice@example.com": all[1:], // every /v1 route
	}
	for user, routes := range reach {
		for _, path := range all {
			want := http.StatusForbidden
			for _, r := range routes {
				if r == path {
					want = http.StatusOK
				}
			}
			r := c.must(want, path, basic(user, "pw-"+user))
			if want == http.StatusForbidden && !strings.Contains(r.errorText(t), "does not reach") {
				t.Errorf("%s on %s: %q", user, path, r.body)
			}
		}
	}

	// gzip, as Prometheus asks for it.
	r = c.must(http.StatusOK, "/metrics", basic("scraper", "pw-scraper"), withHeader("Accept-Encoding", "gzip"))
	if r.header.Get("Content-Encoding") != "gzip" || !strings.HasPrefix(r.header.Get("Content-Type"), metricsType) {
		t.Fatalf("/metrics asked for gzip: %v", r.header)
	}
	zr, err := gzip.NewReader(bytes.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	text, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(text, []byte("# TYPE saguin_build_info gauge")) {
		t.Fatalf("the gzipped exposition: %v\n%.300s", err, text)
	}
}

// tlsOpsDoor is an operations tcp door named name with TLS from srv and
// client certificates verified against ca.
func tlsOpsDoor(srv brokertest.Issued, ca, more string) string {
	return "        tls: {cert_file: \"" + srv.CertFile + "\", key_file: \"" + srv.KeyFile + "\", client_ca_file: \"" + ca + "\"" + more + "}\n"
}

// docs/operations.md "Who the caller is" with client certificates required: a certificate the door
// verified names the caller (CN, else the first DNS name, verbatim); a
// name the operator file lists has its scope, any other — and a
// certificate naming nobody — reaches /metrics only; a name holding a
// control character is 403 and a line. A password offered beside a
// certificate decides, and a wrong one is 401 whatever the certificate.
// With no certificate the handshake fails: the door has no /health either.
func TestOperationsClientCertificateNamesTheCaller(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "ops-ca")
	srv := pki.Server("ops-server")
	ops := filepath.Join(dir, "operators")
	writeOperators(t, ops, operator{"alice", ""}, operator{"gw.example.net", "/v1/operations/sessions"})
	b := brokertest.Start(t, opsConfig(t, dir, "", "    password_file: \""+ops+"\"\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"+
		tlsOpsDoor(srv, pki.CAFile, "")))
	if !logHasLine(b.Log.String(), `msg="operations listening"`, "metrics_authentication=\"basic+client certificate\"", `door="tcp 127.0.0.1:`, "(tls)") {
		t.Errorf("the listening line:\n%s", b.Log.Tail(30))
	}
	addr := b.OperationsAddr("tcp").String()
	as := func(cert brokertest.Issued) *opsHTTP {
		return opsOverTCP(t, addr, &tls.Config{RootCAs: pki.Pool(), Certificates: []tls.Certificate{cert.TLSCertificate(t)}})
	}
	alice := as(pki.Client("alice", "alice"))
	alice.must(http.StatusOK, "/v1/operations/sessions")
	alice.must(http.StatusOK, "/v1/operations/config")
	alice.must(http.StatusOK, "/health")
	dns := as(pki.Client("gw", "", "gw.example.net", "other.example.net"))
	dns.must(http.StatusOK, "/v1/operations/sessions")
	dns.must(http.StatusForbidden, "/v1/operations/config")
	for name, c := range map[string]*opsHTTP{"stranger": as(pki.Client("stranger", "mallory")), "nameless": as(pki.Client("nameless", ""))} {
		c.must(http.StatusOK, "/metrics")
		if msg := c.must(http.StatusForbidden, "/v1/operations/sessions").errorText(t); !strings.Contains(msg, "/metrics only") {
			t.Errorf("%s: %q", name, msg)
		}
	}
	ctl := as(pki.Client("control", "ops\x07bell"))
	if msg := ctl.must(http.StatusForbidden, "/metrics").errorText(t); !strings.Contains(msg, "control character U+0007") {
		t.Errorf("a name with a control character: %q", msg)
	}
	if !logHasLine(b.Log.String(), `msg="operations request refused"`, "status=403", "control character U+0007") {
		t.Errorf("no line for the control character:\n%s", b.Log.Tail(20))
	}
	alice.must(http.StatusOK, "/v1/operations/users", basic("alice", "pw-alice"))
	alice.must(http.StatusUnauthorized, "/v1/operations/users", basic("alice", "wrong"))

	bare := opsOverTCP(t, addr, &tls.Config{RootCAs: pki.Pool()})
	for _, path := range []string{"/health", "/metrics"} {
		if r := bare.get(path); r.err == nil {
			t.Errorf("%s answered HTTP %d to a caller with no certificate on a door requiring one", path, r.status)
		}
	}
}

// docs/operations.md "Who the caller is" on a unix door: X-Saguin-Principal names the caller (a
// proxy in front of the socket sets it); listed, its scope; not listed,
// /metrics only; absent, 401 (the door has a password file); given twice,
// 403 — a proxy appending rather than replacing would let a caller name
// itself; with a control character, 403 and a line.
func TestOperationsPrincipalHeaderOnAUnixDoor(t *testing.T) {
	dir, sock := t.TempDir(), opsSocket(t, "ops.sock")
	ops := filepath.Join(dir, "operators")
	writeOperators(t, ops, operator{"alice", ""}, operator{"bob", "/metrics"})
	b := brokertest.Start(t, opsConfig(t, dir, "", "    password_file: \""+ops+"\"\n    listen:\n      unix:\n        path: \""+sock+"\"\n"))
	if !logHasLine(b.Log.String(), `msg="operations listening"`, "address="+sock, "metrics_authentication=basic") {
		t.Errorf("the listening line:\n%s", b.Log.Tail(30))
	}
	c := opsOverUnix(t, sock, nil)
	c.must(http.StatusOK, "/health")
	c.must(http.StatusUnauthorized, "/v1/operations/sessions")
	c.must(http.StatusOK, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "alice"))
	c.must(http.StatusOK, "/metrics", withHeader("X-Saguin-Principal", "bob"))
	c.must(http.StatusForbidden, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "bob"))
	c.must(http.StatusOK, "/metrics", withHeader("X-Saguin-Principal", "carol"))
	c.must(http.StatusForbidden, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "carol"))
	// U+0085 (NEL), a C1 control: HTTP carries it (a C0 control is
	// refused by the HTTP server before any route runs, 400).
	c.must(http.StatusForbidden, "/metrics", withHeader("X-Saguin-Principal", "al\u0085ice"))
	if !logHasLine(b.Log.String(), `msg="operations request refused"`, "status=403", "control character U+0085") {
		t.Errorf("no line for the control character:\n%s", b.Log.Tail(20))
	}
	c.must(http.StatusForbidden, "/metrics", withHeader("X-Saguin-Principal", "alice"), withHeader("X-Saguin-Principal", "alice"))
	// The Host rule is for tcp: a socket has no name to rebind.
	c.must(http.StatusOK, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "alice"), withHost("anything.example"))
}

// docs/operations.md "Who the caller is": a unix door with proxy_protocol takes the caller's name
// from the CN a PROXY v2 header vouches for, and only when the proxy
// verified the certificate (verify result 0); a verified certificate with
// no CN reaches /metrics only; an unverified one names nobody.
func TestOperationsProxyV2CarriesTheVerifiedCN(t *testing.T) {
	dir, sock := t.TempDir(), opsSocket(t, "ops-proxy.sock")
	ops := filepath.Join(dir, "operators")
	writeOperators(t, ops, operator{"alice", ""})
	b := brokertest.Start(t, opsConfig(t, dir, "", "    password_file: \""+ops+"\"\n    listen:\n      unix:\n        path: \""+sock+
		"\"\n        proxy_protocol: true\n"))
	if !logHasLine(b.Log.String(), `msg="operations listening"`, "(proxy v2)", "metrics_authentication=\"basic+client certificate\"") {
		t.Errorf("the listening line:\n%s", b.Log.Tail(30))
	}
	header := func(verify uint32, cn string) []byte {
		return brokertest.ProxyV2(proxiedClient, proxyFront, &brokertest.ProxySSL{Client: 0x01 | 0x02, Verify: verify, CN: cn})
	}
	verified := opsOverUnix(t, sock, header(0, "alice"))
	verified.must(http.StatusOK, "/v1/operations/sessions")
	unverified := opsOverUnix(t, sock, header(20, "alice"))
	unverified.must(http.StatusUnauthorized, "/v1/operations/sessions")
	nameless := opsOverUnix(t, sock, header(0, ""))
	nameless.must(http.StatusOK, "/metrics")
	nameless.must(http.StatusForbidden, "/v1/operations/sessions")
	plain := opsOverUnix(t, sock, brokertest.ProxyV2(proxiedClient, proxyFront, nil))
	plain.must(http.StatusOK, "/metrics", basic("alice", "pw-alice"))
	r := plain.must(http.StatusUnauthorized, "/metrics", basic("alice", "wrong"))
	_ = r
	if !logHasLine(b.Log.String(), `msg="operations request refused"`, "remote=203.0.113.7:51515") {
		t.Errorf("the refusal does not name the proxied client:\n%s", b.Log.Tail(20))
	}
	// A connection that skips the proxy sends no header and is refused
	// before any HTTP is read.
	if r := opsOverUnix(t, sock, nil).get("/health"); r.err == nil {
		t.Errorf("a connection with no PROXY header was answered HTTP %d", r.status)
	}
}

// docs/operations.md "The routes": /health is 503 {"status":"unavailable"} while the
// broker's publish path cannot be entered — the sessions lock a
// broadcast's fan-out takes, or the retained order a SUBSCRIBE's retained
// pass holds for writing — and 200 again once it can.
func TestOperationsHealthAnswers503WhileThePublishPathIsHeld(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, opsConfig(t, dir, "", "    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
	c.must(http.StatusOK, "/health")
	for name, hold := range map[string]func() func(){"the sessions lock": b.HoldSessionsLock, "the retained order": b.HoldRetainedOrder} {
		release := hold()
		r := c.get("/health")
		h := c.get("/health", withMethod(http.MethodHead))
		release()
		if r.err != nil || r.status != http.StatusServiceUnavailable || string(r.body) != "{\"status\":\"unavailable\"}\n" {
			t.Errorf("/health with %s held: %d %q %v", name, r.status, r.body, r.err)
		}
		if h.status != http.StatusServiceUnavailable || len(h.body) != 0 {
			t.Errorf("HEAD /health with %s held: %d %q", name, h.status, h.body)
		}
		c.must(http.StatusOK, "/health")
	}
}

// docs/operations.md "Who the caller is": SIGUSR1 re-reads every operations door's certificate with
// the MQTT doors', all or nothing: a new certificate is served to the
// connections accepted after it, and a file broken since changes nothing.
func TestOperationsDoorCertificateReloads(t *testing.T) {
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "ops-ca")
	first := pki.Server("ops-server")
	b := brokertest.Start(t, opsConfig(t, dir, "", loopbackOps+"        tls: "+tlsBlock(first, "")+"\n"))
	addr := b.OperationsAddr("tcp").String()
	served := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pki.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if got := served(); got != first.Serial.String() {
		t.Fatalf("serial %s, want %s", got, first.Serial)
	}
	second := pki.Server("ops-server") // the same files, a new certificate
	if err := b.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != second.Serial.String() {
		t.Fatalf("after the reload: serial %s, want %s", got, second.Serial)
	}
	if !logHasLine(b.Log.String(), `msg="TLS certificates reloaded"`, "listener=broker.operations.listen.tcp", "serial="+second.Serial.Text(16)) {
		t.Errorf("no reload line for the operations door:\n%s", b.Log.Tail(10))
	}
	opsOverTCP(t, addr, &tls.Config{RootCAs: pki.Pool()}).must(http.StatusOK, "/v1/operations/sessions")

	pki.Server("ops-server")
	writeFileT(t, second.KeyFile, "not a key\n")
	if err := b.ReloadCertificates(); err == nil {
		t.Fatal("a broken key file was reloaded")
	}
	if got := served(); got != second.Serial.String() {
		t.Fatalf("after a refused reload: serial %s, want %s still", got, second.Serial)
	}
}

// Invariant 13 at the operations doors: a door holds at most
// ops.MaxConnsPerDoor connections — one past them is closed at its
// accept, with a line, and served again once one of them ends — and a
// request's headers past 8 KiB are refused (431) without reaching a route.
func TestInvariant13_OperationsDoorBoundsWhatACallerHolds(t *testing.T) {
	b := brokertest.Start(t, opsConfig(t, t.TempDir(), "", loopbackOps))
	addr := b.OperationsAddr("tcp").String()
	var held []net.Conn
	for range ops.MaxConnsPerDoor {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// Each is known accepted once the door answers on it.
	for _, c := range held {
		if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("a held connection: %q %v", line, err)
		}
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_, _ = over.Write([]byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
	_ = over.SetReadDeadline(time.Now().Add(wait))
	if answer, err := io.ReadAll(over); len(answer) > 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection past the bound was served: %.40q %v", answer, err)
	}
	if !logHasLine(b.Log.String(), `msg="operations connection refused: the door holds its most connections"`, fmt.Sprintf("most=%d", ops.MaxConnsPerDoor)) {
		t.Errorf("no line for the refused connection:\n%s", b.Log.Tail(10))
	}
	held[0].Close()
	c := opsOverTCP(t, addr, nil)
	deadline := time.Now().Add(wait)
	for r := c.get("/health"); r.err != nil || r.status != http.StatusOK; r = c.get("/health") {
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after one of the held ones ended: %v", r.err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Past the header bound the request is answered 431 and the socket
	// closed, the rest of the request unread: the client may see the
	// answer, or only the reset. Never the route.
	big, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	_, _ = big.Write([]byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + strings.Repeat("x", 16<<10) + "\r\n\r\n"))
	_ = big.SetReadDeadline(time.Now().Add(wait))
	answer, err := io.ReadAll(big)
	if bytes.Contains(answer, []byte(" 200 ")) || (len(answer) > 0 && !bytes.HasPrefix(answer, []byte("HTTP/1.1 431"))) ||
		errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a request with 16 KiB of headers: %.40q %v", answer, err)
	}
}
