package brokertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	archMu   sync.Mutex
	archBins = map[string]string{} // GOARCH → built binary
)

// BinaryFor builds cmd/saguin for goarch (GOOS unchanged; the storage is
// pure Go, so a cross build needs nothing but GOARCH) once per test process
// and returns its path. It is how a test runs a 64-bit and a
// 32-bit broker on the same data (docs/operations.md "32-bit devices": a
// database written at one word size reads at the other).
func BinaryFor(t testing.TB, goarch string) string {
	t.Helper()
	archMu.Lock()
	defer archMu.Unlock()
	if bin, ok := archBins[goarch]; ok {
		return bin
	}
	dir, err := os.MkdirTemp("", "saguin-bin-"+goarch+"-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "saguin")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/saguin")
	cmd.Dir = filepath.Dir(filepath.Dir(file))
	// Later entries win: the test's own GOARCH (make test-386 sets one)
	// does not decide this build's. cgo is left to the go command, which
	// turns it off for a cross build; the host's build then shares the
	// build cache with every other test's.
	cmd.Env = append(os.Environ(), "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOARCH=%s go build ./cmd/saguin: %v\n%s", goarch, err, out)
	}
	archBins[goarch] = bin
	return bin
}

// HostWordSizes names the GOARCH pair this machine runs natively, 64-bit
// first: amd64 runs 386 binaries and arm64 (with 32-bit support) runs arm.
// The pair is the host's, read from the go command, not this test binary's
// GOARCH.
func HostWordSizes(t testing.TB) (wide, narrow string) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOHOSTARCH").Output()
	if err != nil {
		t.Fatalf("go env GOHOSTARCH: %v", err)
	}
	switch host := strings.TrimSpace(string(out)); host {
	case "amd64":
		return "amd64", "386"
	case "arm64":
		return "arm64", "arm"
	default:
		t.Fatalf("a host of GOARCH %s has no 32-bit counterpart this test knows to run; it needs amd64 (runs 386) or arm64 (runs arm)", host)
		return "", ""
	}
}
