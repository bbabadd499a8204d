//go:build !(linux && (386 || arm || mips || mipsle))

package faultfs

import (
	"os"
	"testing"
)

// A new file's name is durable only after its directory is fsynced, and its data only after the
// file is fsynced.
func TestNewFileDurability(t *testing.T) {
	r := newRig(t)
	data := []byte("hello")
	r.write("dir-only", data, 0, false) // name made durable below, data never synced
	r.write("both", data, 0, true)
	r.syncDir("")
	r.write("file-only", data, 0, true) // data synced, name never
	r.write("neither", data, 0, false)

	r.cut(false, nil)
	r.mustEqual("dir-only", nil)
	r.mustEqual("both", data)
	r.mustNotExist("file-only")
	r.mustNotExist("neither")
}

func TestNewFileNeverFsyncedVanishes(t *testing.T) {
	r := newRig(t)
	r.durable("keep", []byte("k"))
	r.write("new", []byte("data"), 0, true)
	r.cut(false, nil)
	r.mustNotExist("new")
	r.mustEqual("keep", []byte("k"))
}

// The durable replace: write a temporary file, fsync it, rename it over the old one, fsync the
// directory. Until that last fsync a cut brings the old file back (how a snapshot writer is
// tested against invariant 14).
func TestRenameIsDurableOnlyAfterDirFsync(t *testing.T) {
	old, next := []byte("snapshot 1"), []byte("snapshot 2")
	for _, dirSync := range []bool{false, true} {
		r := newRig(t)
		r.durable("snap", old)
		r.write("snap.tmp", next, 0, true)
		if err := os.Rename(r.path("snap.tmp"), r.path("snap")); err != nil {
			t.Fatal(err)
		}
		if dirSync {
			r.syncDir("")
		}
		r.cut(false, nil)
		r.mustNotExist("snap.tmp")
		if dirSync {
			r.mustEqual("snap", next)
		} else {
			r.mustEqual("snap", old)
		}
	}
}

// A rename changes two directories, and each is durable on its own fsync.
func TestCrossDirectoryRename(t *testing.T) {
	r := newRig(t)
	for _, d := range []string{"d1", "d2"} {
		if err := os.Mkdir(r.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.syncDir("")
	r.durable("d1/a", []byte("A"))
	if err := os.Rename(r.path("d1/a"), r.path("d2/b")); err != nil {
		t.Fatal(err)
	}
	r.syncDir("d2") // the target directory only
	r.cut(false, nil)
	// d1 rolls back (a is back), d2 keeps b: the same inode under both names.
	r.mustEqual("d1/a", []byte("A"))
	r.mustEqual("d2/b", []byte("A"))
}

func TestUnlinkRolledBackWithSyncedContents(t *testing.T) {
	r := newRig(t)
	a := pattern(30, 3*pageSize)
	r.durable("a", a)
	r.durable("gone", []byte("bye"))
	// Unsynced writes, then the unlink, all unsynced: the file returns as it was synced.
	r.write("a", pattern(31, pageSize), 0, false)
	if err := os.Remove(r.path("a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(r.path("gone")); err != nil {
		t.Fatal(err)
	}
	r.write("a", []byte("a new file under the old name"), 0, true)
	r.cut(false, nil)
	r.mustEqual("a", a)
	r.mustEqual("gone", []byte("bye"))

	if err := os.Remove(r.path("gone")); err != nil {
		t.Fatal(err)
	}
	r.syncDir("")
	r.cut(false, nil)
	r.mustNotExist("gone")
	r.mustEqual("a", a)
}

func TestMkdirDurableOnlyAfterParentFsync(t *testing.T) {
	r := newRig(t)
	for _, parentSync := range []bool{false, true} {
		if err := os.Mkdir(r.path("sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		r.write("sub/f", []byte("in sub"), 0, true)
		r.syncDir("sub")
		if parentSync {
			r.syncDir("")
		}
		r.cut(false, nil)
		if parentSync {
			r.mustEqual("sub/f", []byte("in sub"))
		} else {
			r.mustNotExist("sub")
		}
	}
}

// Removing a durable directory is the one namespace change the model makes durable at once.
func TestRmdirOfDurableDirectoryIsImmediate(t *testing.T) {
	r := newRig(t)
	if err := os.Mkdir(r.path("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	r.syncDir("")
	if err := os.Remove(r.path("x")); err != nil {
		t.Fatal(err)
	}
	r.cut(false, nil)
	r.mustNotExist("x")
}

func TestHardLinkAndSymlinkRollBack(t *testing.T) {
	r := newRig(t)
	r.durable("f", []byte("F"))
	if err := os.Link(r.path("f"), r.path("hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", r.path("soft")); err != nil {
		t.Fatal(err)
	}
	r.cut(false, nil)
	r.mustNotExist("hard")
	r.mustNotExist("soft")

	if err := os.Symlink("f", r.path("soft")); err != nil {
		t.Fatal(err)
	}
	r.syncDir("")
	if err := os.Remove(r.path("soft")); err != nil {
		t.Fatal(err)
	}
	r.cut(false, nil)
	target, err := os.Readlink(r.path("soft"))
	if err != nil || target != "f" {
		t.Fatalf("durable symlink after unsynced unlink: %q, %v", target, err)
	}
}
