package emulate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeEmulator writes a script that answers --version as a qemu of the
// given version would, and otherwise runs its arguments: enough to show
// which emulators the package accepts and how it builds the command.
func fakeEmulator(t *testing.T, version string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qemu-fake")
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'qemu-fake version " + version + " (Debian)'; exit 0; fi\necho \"emulated: $*\"\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// Debian 12's qemu-i386 7.2 crashes Go 386 programs in most runs: it is
// refused with the package that works named, never used and left to fail
// at random; a qemu-arm of the same version is fine.
func TestOldQemuI386IsRefusedNamingBackports(t *testing.T) {
	old := fakeEmulator(t, "7.2.0")
	if _, err := emulatorWay("386", old); err == nil || !strings.Contains(err.Error(), "bookworm-backports") {
		t.Fatalf("qemu-i386 7.2 accepted or refused without naming the package: %v", err)
	}
	w, err := emulatorWay("arm", old)
	if err != nil || w.Version != "7.2.0" || w.Native() {
		t.Fatalf("qemu-arm 7.2: %+v, %v", w, err)
	}
	if w, err := emulatorWay("386", fakeEmulator(t, "10.0.2")); err != nil || w.String() != "386: under qemu-fake 10.0.2" {
		t.Fatalf("qemu-i386 10.0: %+v, %v", w, err)
	}
}

// The run's decision (SAGUIN_RUN_<GOARCH>) wins over a probe, so every
// process of a make test-32 run goes the same way; a forced emulator makes
// even the host's own GOARCH go through it.
func TestTheRunsDecisionIsFollowed(t *testing.T) {
	fake := fakeEmulator(t, "10.0.2")
	t.Setenv(EnvName("arm"), fake)
	w, err := decide("arm")
	if err != nil || w.Emulator != fake {
		t.Fatalf("SAGUIN_RUN_ARM=%s: %+v, %v", fake, w, err)
	}
	t.Setenv(EnvName("arm"), "native")
	if w, err := decide("arm"); err != nil || !w.Native() {
		t.Fatalf("SAGUIN_RUN_ARM=native: %+v, %v", w, err)
	}
	t.Setenv(EnvName("arm"), "")
	t.Setenv(ForceEmulatedEnv, "1")
	t.Setenv("PATH", t.TempDir()) // no emulator to be found
	if _, err := decide("arm"); err == nil || !strings.Contains(err.Error(), "qemu-user") {
		t.Fatalf("no emulator on PATH: %v, want an error naming qemu-user", err)
	}
}

// Command reads the program's ELF header: a program of the host's own
// GOARCH runs as it is, one of another through the decided emulator, and a
// script (no ELF) as it is.
func TestCommandRunsEachProgramItsWay(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	arch, err := ArchOf(self)
	if err != nil {
		t.Fatal(err)
	}
	fake := fakeEmulator(t, "10.0.2")
	t.Setenv(EnvName(arch), fake)
	delete(decided, arch) // this test's decision, not an earlier probe's
	t.Cleanup(func() { delete(decided, arch) })
	cmd, err := Command(self, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Path != fake || len(cmd.Args) < 2 || cmd.Args[1] != self {
		t.Fatalf("a program through an emulator: %q %q", cmd.Path, cmd.Args)
	}
	// The fake emulator reports what it was handed rather than running it:
	// this test binary may itself be a foreign one (GOARCH=386 under
	// qemu-i386 in make test-32), which the host kernel cannot exec.
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	if want := "emulated: " + self + " -test.run=^$"; strings.TrimSpace(string(out)) != want {
		t.Fatalf("the emulator was handed %q, want %q", out, want)
	}
	script := filepath.Join(t.TempDir(), "s.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho plain\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd, err = Command(script)
	if err != nil || cmd.Path != script {
		t.Fatalf("a script: %v %v", cmd, err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("go is not on PATH")
	}
}
