package brokertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"saguin.dev/storage/storagetest/emulate"
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
	if goarch == "arm" {
		cmd.Env = append(cmd.Env, "GOARM=7") // the ARMv7 devices the 32-bit sets stand for
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOARCH=%s go build ./cmd/saguin: %v\n%s", goarch, err, out)
	}
	archBins[goarch] = bin
	return bin
}

// HostWordSizes names the GOARCH of this host's kernel (64-bit) and the
// 32-bit GOARCHes a test moves data to and from: 386 and arm (GOARM=7, the
// Raspberry Pi class of device the broker is deployed on). Each narrow one
// runs natively where the kernel runs it, else under qemu-user
// (storagetest/emulate); where neither can, the test fails naming the
// package to install, never skipping. The host is read from the go
// command, not from this test binary's GOARCH (make test-32 runs the tests
// themselves as 32-bit binaries).
func HostWordSizes(t testing.TB) (wide string, narrow []string) {
	t.Helper()
	out, err := exec.Command("go", "env", "GOHOSTARCH").Output()
	if err != nil {
		t.Fatalf("go env GOHOSTARCH: %v", err)
	}
	wide = strings.TrimSpace(string(out))
	if wide != "amd64" && wide != "arm64" {
		t.Fatalf("a host of GOARCH %s is not 64-bit as this test knows it; it needs amd64 or arm64", wide)
	}
	for _, arch := range []string{"386", "arm"} {
		way, err := emulate.For(arch)
		if err != nil {
			t.Fatalf("the %s build cannot run here: %v", arch, err)
		}
		t.Logf("word sizes: %s", way)
		narrow = append(narrow, arch)
	}
	return wide, narrow
}
