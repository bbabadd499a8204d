// Package emulate runs a program built for another GOARCH on this host:
// natively where the kernel runs it, else under Debian's user-mode
// emulator (qemu-user). The 32-bit test sets (make test-32) run for 386 and
// for arm (GOARM=7, the Raspberry Pi class of device the broker is
// deployed on), and a test binary running under the emulator starts
// brokers and re-executes itself through the same way.
//
// Why not assume an amd64 kernel runs 386 binaries: many hosted and
// hardened kernels have IA-32 emulation turned off (exec format error), and
// an amd64 kernel never runs arm. Why not binfmt_misc: registering it
// changes the host for every program, needs systemd or a mount the
// machine may not have, and hides which way a test ran.
//
// The way for each GOARCH is decided once (make test-32 runs `go run
// saguin.dev/storage/storagetest/emulate/cmd/archway` and exports the
// answer as SAGUIN_RUN_<GOARCH>: "native" or the emulator's path), so
// every process of a run agrees; a process that finds no such variable
// probes for itself. Where nothing can run a GOARCH the error names the
// package to install: a 32-bit set is never skipped silently.
package emulate

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Way is how this host runs programs of one GOARCH.
type Way struct {
	GOARCH   string
	Emulator string // "" runs natively; else the emulator's path (qemu-i386, qemu-arm)
	Version  string // the emulator's version, for the test output
}

// Native reports whether the kernel runs the GOARCH itself.
func (w Way) Native() bool { return w.Emulator == "" }

// String is how the test output says which way a set ran.
func (w Way) String() string {
	if w.Native() {
		return w.GOARCH + ": native"
	}
	return fmt.Sprintf("%s: under %s %s", w.GOARCH, filepath.Base(w.Emulator), w.Version)
}

// EnvName is the variable that carries the decided way for goarch to
// every process of a run ("native" or an emulator's path).
func EnvName(goarch string) string { return "SAGUIN_RUN_" + strings.ToUpper(goarch) }

// ForceEmulatedEnv, set to 1, makes the probe ignore native support, so a
// machine whose kernel runs 386 can prove the path of one that does not.
const ForceEmulatedEnv = "SAGUIN_FORCE_EMULATED"

// emulators names qemu-user's program for each GOARCH the project's
// 32-bit sets use, and the oldest version known to run Go binaries of it:
// Debian 12's qemu-i386 7.2 crashes a Go 1.26 386 hello-world in most runs
// (futex and signal handling), bookworm-backports' 10.0 runs it every
// time; qemu-arm 7.2 runs arm ones.
var emulators = map[string]struct {
	program  string
	minMajor int
}{
	"386":   {"qemu-i386", 8},
	"arm":   {"qemu-arm", 7},
	"arm64": {"qemu-aarch64", 7},
	"amd64": {"qemu-x86_64", 7},
}

// InstallHint names what to install where no way runs goarch.
func InstallHint(goarch string) string {
	e, ok := emulators[goarch]
	if !ok {
		return "no emulator is known for GOARCH " + goarch
	}
	if e.minMajor > 7 {
		return fmt.Sprintf("install %s %d or newer: on Debian 12, apt-get install -t bookworm-backports qemu-user (Debian 12's own qemu-user 7.2 crashes Go %s binaries)", e.program, e.minMajor, goarch)
	}
	return fmt.Sprintf("install %s: apt-get install qemu-user", e.program)
}

var (
	decidedMu sync.Mutex
	decided   = map[string]Way{}
)

// For returns the way this host runs goarch: the run's decision when
// SAGUIN_RUN_<GOARCH> is set, else a probe (once per process).
func For(goarch string) (Way, error) {
	decidedMu.Lock()
	defer decidedMu.Unlock()
	if w, ok := decided[goarch]; ok {
		return w, nil
	}
	w, err := decide(goarch)
	if err != nil {
		return Way{}, err
	}
	decided[goarch] = w
	return w, nil
}

func decide(goarch string) (Way, error) {
	switch v := os.Getenv(EnvName(goarch)); v {
	case "":
	case "native":
		return Way{GOARCH: goarch}, nil
	default:
		return emulatorWay(goarch, v)
	}
	if goarch == hostArch() && os.Getenv(ForceEmulatedEnv) != "1" {
		return Way{GOARCH: goarch}, nil
	}
	if goarch != hostArch() && os.Getenv(ForceEmulatedEnv) != "1" {
		ok, err := runsNatively(goarch)
		if err != nil {
			return Way{}, err
		}
		if ok {
			return Way{GOARCH: goarch}, nil
		}
	}
	e, known := emulators[goarch]
	if !known {
		return Way{}, fmt.Errorf("this %s kernel does not run %s binaries and %s", hostArch(), goarch, InstallHint(goarch))
	}
	path, err := exec.LookPath(e.program)
	if err != nil {
		return Way{}, fmt.Errorf("this %s kernel does not run %s binaries and %s is not on PATH: %s", hostArch(), goarch, e.program, InstallHint(goarch))
	}
	return emulatorWay(goarch, path)
}

var versionRE = regexp.MustCompile(`version (\d+)\.(\d+)(\.\d+)?`)

func emulatorWay(goarch, path string) (Way, error) {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return Way{}, fmt.Errorf("%s --version: %v: %s", path, err, InstallHint(goarch))
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		return Way{}, fmt.Errorf("%s --version printed no version: %q", path, firstLine(out))
	}
	major, _ := strconv.Atoi(m[1])
	if e, ok := emulators[goarch]; ok && major < e.minMajor {
		return Way{}, fmt.Errorf("%s is version %s: %s", path, m[0][len("version "):], InstallHint(goarch))
	}
	return Way{GOARCH: goarch, Emulator: path, Version: m[0][len("version "):]}, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// hostArch is the kernel's own architecture as a GOARCH, read from uname:
// under the emulator runtime.GOARCH is the guest's, not the host's.
func hostArch() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return runtime.GOARCH
	}
	var b strings.Builder
	for _, c := range u.Machine {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	switch m := b.String(); m {
	case "x86_64":
		return "amd64"
	case "aarch64", "arm64":
		return "arm64"
	case "i386", "i486", "i586", "i686":
		return "386"
	case "armv7l", "armv6l", "armv8l":
		return "arm"
	default:
		return m
	}
}

// runsNatively builds a program that prints a word for goarch and runs
// it: the only sure way to know whether this kernel runs that GOARCH (an
// amd64 kernel may have IA-32 emulation compiled in and turned off).
func runsNatively(goarch string) (bool, error) {
	dir, err := os.MkdirTemp("", "saguin-probe-"+goarch+"-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"runs\") }\n"), 0o600); err != nil {
		return false, err
	}
	bin := filepath.Join(dir, "probe")
	build := exec.Command("go", "build", "-o", bin, src)
	build.Dir = dir
	build.Env = append(os.Environ(), "GOARCH="+goarch, "GOWORK=off", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		return false, fmt.Errorf("GOARCH=%s go build of the probe: %v\n%s", goarch, err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	var pathErr *os.PathError
	switch {
	case err == nil && strings.TrimSpace(string(out)) == "runs":
		return true, nil
	case errors.As(err, &pathErr) && errors.Is(pathErr.Err, syscall.ENOEXEC):
		return false, nil
	case err != nil:
		// Anything else (a crash) is as good as not running.
		return false, nil
	}
	return false, nil
}

// ArchOf reads the GOARCH a program was built for from its ELF header.
func ArchOf(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_386:
		return "386", nil
	case elf.EM_ARM:
		return "arm", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("%s: ELF machine %v is not one the tests run", path, f.Machine)
	}
}

// Command is exec.Command for a program of any GOARCH: the program itself
// where the kernel runs it, else the emulator with the program as its
// argument. Programs that are not ELF files (scripts) run as they are.
func Command(name string, args ...string) (*exec.Cmd, error) {
	return CommandContext(context.Background(), name, args...)
}

// CommandContext is Command with the context exec.CommandContext takes.
func CommandContext(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	path := name
	if !strings.Contains(name, "/") {
		p, err := exec.LookPath(name)
		if err != nil {
			return nil, err
		}
		path = p
	}
	arch, err := ArchOf(path)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return exec.CommandContext(ctx, name, args...), nil
		}
		return nil, err
	}
	w, err := For(arch)
	if err != nil {
		return nil, err
	}
	if w.Native() {
		return exec.CommandContext(ctx, name, args...), nil
	}
	return exec.CommandContext(ctx, w.Emulator, append([]string{path}, args...)...), nil
}
