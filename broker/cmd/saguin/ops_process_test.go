package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"saguin.dev/broker/brokertest"
)

// opsStatus asks the operations door at addr for path as user with
// password, and returns the HTTP status.
func opsStatus(t *testing.T, addr, path, user, password string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	c := &http.Client{Timeout: wait, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

var opsAddress = regexp.MustCompile(`address=(\S+)`)

// docs/operations.md "The routes", docs/operations.md "A start": the binary says, for each operations
// door, "operations listening" with its address, the paths it serves, the
// min_scrape_interval and how /metrics is authenticated there. SIGUSR1
// re-reads the operator password file (docs/operations.md "Who the caller is"): a password changed
// with saguin --passwd applies from then on, the old one no longer does;
// a file broken since changes nothing.
func TestOperationsListeningLineAndSIGUSR1RereadsTheOperators(t *testing.T) {
	dir, sockDir := t.TempDir(), t.TempDir()
	sock := filepath.Join(sockDir, "ops.sock")
	operators := filepath.Join(dir, "operators")
	mustPasswd(t, nil, "add", operators, "root", "first-password")
	mustPasswd(t, nil, "add", operators, "scraper", "scrape-password")
	mustPasswd(t, nil, "scope", operators, "scraper", "/metrics")
	cfg := memoryConfig(t, dir, `  operations:
    password_file: "`+operators+`"
    min_scrape_interval: 2m
    listen:
      tcp:
        address: "127.0.0.1:0"
      unix:
        path: "`+sock+`"
`)
	proc := brokertest.StartProcess(t, cfg)
	for _, door := range []string{"tcp", "unix"} {
		if !proc.WaitOutput(`msg="operations listening" broker=test listener=`+door, wait) {
			t.Fatalf("no operations listening line for the %s door:\n%s", door, proc.Output())
		}
	}
	tcp := lineWith(proc.Output(), `msg="operations listening" broker=test listener=tcp`)
	unix := lineWith(proc.Output(), `msg="operations listening" broker=test listener=unix`)
	for door, l := range map[string]string{"tcp": tcp, "unix": unix} {
		for _, want := range []string{`paths="/health /metrics /v1/operations/"`, "min_scrape_interval=120s", "metrics_authentication=basic"} {
			if !strings.Contains(l, want) {
				t.Errorf("the %s door's line lacks %s: %q", door, want, l)
			}
		}
	}
	if !strings.Contains(unix, "address="+sock) {
		t.Errorf("the unix door's line does not give its path: %q", unix)
	}
	m := opsAddress.FindStringSubmatch(tcp)
	if m == nil || !strings.HasPrefix(m[1], "127.0.0.1:") {
		t.Fatalf("the tcp door's line gives no address: %q", tcp)
	}
	addr := m[1]
	if !strings.Contains(proc.Output(), `msg="operator password file read" broker=test path=`+operators+" operators=2") {
		t.Errorf("the start does not say what the operator file holds:\n%s", proc.Output())
	}

	if s := opsStatus(t, addr, "/v1/operations/sessions", "root", "first-password"); s != http.StatusOK {
		t.Fatalf("root with its password: HTTP %d", s)
	}
	mustPasswd(t, nil, "add", operators, "root", "second-password")
	proc.Signal(syscall.SIGUSR1)
	if !proc.WaitOutput(`msg="SIGUSR1: operator password file read"`, wait) {
		t.Fatalf("no re-read line after SIGUSR1:\n%s", proc.Output())
	}
	if s := opsStatus(t, addr, "/v1/operations/sessions", "root", "first-password"); s != http.StatusUnauthorized {
		t.Errorf("the replaced password after SIGUSR1: HTTP %d, want 401", s)
	}
	if s := opsStatus(t, addr, "/v1/operations/sessions", "root", "second-password"); s != http.StatusOK {
		t.Errorf("the new password after SIGUSR1: HTTP %d, want 200", s)
	}
	if s := opsStatus(t, addr, "/v1/operations/sessions", "scraper", "scrape-password"); s != http.StatusForbidden {
		t.Errorf("the scraper outside its scope: HTTP %d, want 403", s)
	}

	// A file that no longer loads: nothing changes.
	text, err := os.ReadFile(operators)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(operators, append(text, []byte("eve:$argon2id$v=19$m=65536,t=2,p=1$c2FsdA$aGFzaA\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	proc.Signal(syscall.SIGUSR1)
	if !proc.WaitOutput("SIGUSR1: password files and ACL not re-read: nothing changed", wait) {
		t.Fatalf("no refusal of the broken file after SIGUSR1:\n%s", proc.Output())
	}
	if l := lineWith(proc.Output(), "not re-read: nothing changed"); !strings.Contains(l, operators+":3") {
		t.Errorf("the refusal does not name the file and line: %q", l)
	}
	if s := opsStatus(t, addr, "/v1/operations/sessions", "root", "second-password"); s != http.StatusOK {
		t.Errorf("the password in force before the broken re-read: HTTP %d, want 200", s)
	}
	if code := proc.Stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, proc.Output())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the operations socket outlived the shutdown: %v", err)
	}
	t.Logf("%s\n%s", tcp, unix)
}
