package passwd_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"saguin.dev/broker/passwd"
)

func newHash(t *testing.T, password string) passwd.Hash {
	t.Helper()
	h, err := passwd.NewHash([]byte(password))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Editing one user rewrites that user's line alone: comments, blank
// lines, CRLF endings, odd spacing and the other users stay byte for byte;
// a new user goes at the end in the file's own line ending, after ending
// a last line that had none.
func TestEditsKeepEveryOtherLineByteForByte(t *testing.T) {
	h1, h2 := newHash(t, "one"), newHash(t, "two")
	head := "# gw-7 operators\r\n\r\n  root :" + h1.String() + "  \r\n"
	text := head + "ops:" + h1.String() + ":/metrics\r\n# keep me\r\nlast:" + h1.String()
	f, err := passwd.Parse("p", []byte(text), passwd.AnyKind)
	if err != nil {
		t.Fatal(err)
	}
	if added, err := f.Set("ops", h2); added || err != nil {
		t.Fatalf("Set of an existing user: added=%v %v", added, err)
	}
	if added, err := f.Set("new@example.com", h2); !added || err != nil {
		t.Fatalf("Set of a new user: added=%v %v", added, err)
	}
	want := head + "ops:" + h2.String() + ":/metrics\r\n# keep me\r\nlast:" + h1.String() + "\r\nnew@example.com:" + h2.String() + "\r\n"
	if got := string(f.Bytes()); got != want {
		t.Fatalf("after Set:\n%q\nwant\n%q", got, want)
	}

	sc, _ := passwd.ParseScope("/v1/operations")
	prev, err := f.SetScope("root", sc)
	if err != nil || !prev.All() {
		t.Fatalf("SetScope: previous %v, %v", prev, err)
	}
	if prev, _ := f.SetScope("ops", passwd.Scope{}); prev.String() != "/metrics" {
		t.Errorf("SetScope(all) returned previous %q, want /metrics", prev)
	}
	if !f.Delete("last") || f.Delete("last") {
		t.Error("Delete: the first should remove, the second find nothing")
	}
	want = "# gw-7 operators\r\n\r\nroot:" + h1.String() + ":/v1/operations\r\nops:" + h2.String() + "\r\n# keep me\r\nnew@example.com:" + h2.String() + "\r\n"
	if got := string(f.Bytes()); got != want {
		t.Fatalf("after SetScope and Delete:\n%q\nwant\n%q", got, want)
	}
	if _, err := f.SetScope("nobody", sc); err == nil || !strings.Contains(err.Error(), `no user "nobody"`) {
		t.Errorf("SetScope of an absent user: %v", err)
	}
}

// readAndAddAlice reads the MQTT file at path and adds alice to it,
// unwritten.
func readAndAddAlice(t *testing.T, path string) *passwd.File {
	t.Helper()
	f, err := passwd.ReadFile(path, passwd.MQTT)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Set("alice", newHash(t, "pw")); err != nil {
		t.Fatal(err)
	}
	return f
}

// saguin --passwd add refuses a name that could not be read back as
// itself: docs/configuration.md "Password files and `saguin --passwd`"'s control characters, docs/operations.md "Operators"'s ':', and
// what readers trim or take as a comment.
func TestSetRefusesNamesThatCannotBeStored(t *testing.T) {
	f := passwd.NewFile("p", passwd.AnyKind)
	h := newHash(t, "pw")
	for _, name := range []string{"", "a:b", "a\nb", "a\x00b", "a\x7f", "a\u0085", "#x", " x", "x ", "\xff", strings.Repeat("n", passwd.MaxUserName+1)} {
		if _, err := f.Set(name, h); err == nil {
			t.Errorf("Set(%q) accepted", name)
		}
	}
	if f.Len() != 0 || len(f.Bytes()) != 0 {
		t.Errorf("a refused name left something: %q", f.Bytes())
	}
}

// A new file is created mode 0600 whatever the umask, atomically: no
// temporary file is left beside it.
func TestWriteCreatesANewFileMode0600(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "passwords")
	f := passwd.NewFile(path, passwd.MQTT)
	if _, err := f.Set("alice", newHash(t, "pw")); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("new file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries: a temporary file was left", len(entries))
	}
	tab, err := passwd.Load(path, passwd.MQTT)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tab.Authenticate("alice", []byte("pw")); !ok {
		t.Error("the written file does not verify alice")
	}
}

// docs/configuration.md "Password files and `saguin --passwd`": an existing file keeps its mode and its owner and group
// (the owner half needs root, as CI runs, to give the file another owner).
func TestWriteKeepsModeAndOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	if err := os.WriteFile(path, []byte("# mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	if os.Getuid() == 0 {
		uid, gid = 4321, 8765
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := readAndAddAlice(t, path).Write(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o640 || int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("after Write: mode %v owner %d:%d; want 0640 %d:%d", fi.Mode().Perm(), st.Uid, st.Gid, uid, gid)
	}
	if data, _ := os.ReadFile(path); !strings.HasPrefix(string(data), "# mine\nalice:$7$1000$") {
		t.Errorf("contents %q", data)
	}
}

// A password file reached through a symbolic link (a common layout:
// /etc/saguin/passwords -> /srv/...) is written at the link's target; the
// link stays a link.
func TestWriteFollowsASymbolicLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real")
	link := filepath.Join(dir, "link")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := readAndAddAlice(t, link).Write(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", fi.Mode(), err)
	}
	if data, _ := os.ReadFile(target); !strings.HasPrefix(string(data), "alice:") {
		t.Errorf("the target holds %q", data)
	}
}

// A file changed by someone else between the read and the write is not
// overwritten: the other change would be lost without a word.
func TestWriteRefusesAFileChangedSinceItWasRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	if err := os.WriteFile(path, []byte("# v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := readAndAddAlice(t, path)
	if err := os.WriteFile(path, []byte("# v1\n# v2 by someone else\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(); err == nil || !strings.Contains(err.Error(), "changed while it was being edited") {
		t.Fatalf("Write over a changed file: %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "# v1\n# v2 by someone else\n" {
		t.Errorf("the other change was lost: %q", data)
	}

	created := filepath.Join(t.TempDir(), "new")
	g := passwd.NewFile(created, passwd.MQTT)
	if err := os.WriteFile(created, []byte("# first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.Write(); err == nil || !strings.Contains(err.Error(), "appeared") {
		t.Fatalf("Write of a new file over one that appeared: %v", err)
	}
}
