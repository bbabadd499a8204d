package passwd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker/internal/mosquittotest"
	"saguin.dev/broker/passwd"
)

// docs/configuration.md "Password files and `saguin --passwd`": a file Debian's mosquitto_passwd writes — its default
// $7$ (101 iterations), $6$ with -H sha512, $7$ with -I, several users, a
// password holding ':' and a non-ASCII letter — loads unchanged as an MQTT
// and as an operator file, and verifies exactly the right passwords.
func TestMosquittoPasswdFilesLoadAndVerify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	users := []struct {
		name, password, typ string
		iterations          int
	}{
		{"alice", "first secret", "$7$", 101},
		{"bob", "p@ss:wörd", "$7$", 101},
		{"carol@example.com", "sha512 one", "$6$", 0},
		{"dave", "pbkdf2 with more rounds", "$7$", 1000},
	}
	mosquittotest.Passwd(t, "-c", "-b", path, users[0].name, users[0].password)
	mosquittotest.Passwd(t, "-b", path, users[1].name, users[1].password)
	mosquittotest.Passwd(t, "-H", "sha512", "-b", path, users[2].name, users[2].password)
	mosquittotest.Passwd(t, "-H", "sha512-pbkdf2", "-I", "1000", "-b", path, users[3].name, users[3].password)
	written, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	f, err := passwd.ReadFile(path, passwd.MQTT)
	if err != nil {
		t.Fatalf("a file mosquitto_passwd wrote does not load: %v", err)
	}
	if !bytes.Equal(f.Bytes(), written) {
		t.Errorf("the file read and written back differs from what mosquitto_passwd wrote:\n%s\nwant:\n%s", f.Bytes(), written)
	}
	for i, e := range f.Entries() {
		u := users[i]
		if e.User != u.name || e.Hash.Type() != u.typ || e.Hash.Iterations() != u.iterations || e.Line != i+1 {
			t.Errorf("entry %d: %s %s %d on line %d, want %s %s %d on line %d", i, e.User, e.Hash.Type(), e.Hash.Iterations(), e.Line, u.name, u.typ, u.iterations, i+1)
		}
	}
	for _, kind := range []passwd.Kind{passwd.MQTT, passwd.Operator} {
		tab, err := passwd.Load(path, kind)
		if err != nil {
			t.Fatalf("%v: %v", kind, err)
		}
		if tab.Len() != len(users) {
			t.Errorf("%v: %d users, want %d", kind, tab.Len(), len(users))
		}
		checkLogins(t, tab, users[0].name, users[0].password, users[1].name, users[1].password,
			users[2].name, users[2].password, users[3].name, users[3].password)
	}
}

// mosquitto_passwd -U hashes a file of passwords in clear; the result
// loads and verifies. (The file in clear itself is refused: see
// TestLoadErrorsNameFileLineAndFix.)
func TestMosquittoPasswdUpgradedFileLoads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwords")
	if err := os.WriteFile(path, []byte("u1:plain one\nu2:plain two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := passwd.Load(path, passwd.MQTT); err == nil || !strings.Contains(err.Error(), "mosquitto_passwd -U") {
		t.Fatalf("a file of passwords in clear loaded, or its error does not say how to hash it: %v", err)
	}
	mosquittotest.Passwd(t, "-U", path)
	tab, err := passwd.Load(path, passwd.MQTT)
	if err != nil {
		t.Fatalf("the file mosquitto_passwd -U wrote does not load: %v", err)
	}
	checkLogins(t, tab, "u1", "plain one", "u2", "plain two")
}

// checkLogins checks that each (user, password) pair authenticates and
// that every other combination, a wrong password, an empty one and an
// unknown name, does not.
func checkLogins(t *testing.T, tab *passwd.Table, pairs ...string) {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		user, pw := pairs[i], pairs[i+1]
		if _, ok := tab.Authenticate(user, []byte(pw)); !ok {
			t.Errorf("%s with the right password is refused", user)
		}
		for _, wrong := range []string{pw + "x", strings.ToUpper(pw), ""} {
			if _, ok := tab.Authenticate(user, []byte(wrong)); ok {
				t.Errorf("%s with the wrong password %q is admitted", user, wrong)
			}
		}
		for j := 0; j < len(pairs); j += 2 {
			if j != i && pairs[j+1] != pw {
				if _, ok := tab.Authenticate(user, []byte(pairs[j+1])); ok {
					t.Errorf("%s is admitted with %s's password", user, pairs[j])
				}
			}
		}
		if _, ok := tab.Authenticate(user+"-nobody", []byte(pw)); ok {
			t.Errorf("the unknown name %s-nobody is admitted", user)
		}
	}
}
