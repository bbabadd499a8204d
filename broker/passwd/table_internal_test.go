package passwd

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"
)

// tableOf builds a Table from text, its meter on.
func tableOf(t *testing.T, text string, kind Kind) *Table {
	t.Helper()
	f, err := Parse("test", []byte(text), kind)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := newTable(f)
	if err != nil {
		t.Fatal(err)
	}
	tab.meter = &workMeter{}
	return tab
}

func mustHash(t *testing.T, typ hashType, iterations int, password string) Hash {
	t.Helper()
	var h Hash
	var err error
	if typ == saltedSHA512 {
		h, err = newSaltedSHA512([]byte(password))
	} else {
		h, err = newHash([]byte(password), iterations, rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Checking a name costs the same work whether the name exists or not and
// whatever its hash — $6$, $7$ at mosquitto_passwd's 101 rounds, $7$ at
// our 1000 — and whether the password is right: one SHA-512 derivation
// and the file's largest PBKDF2 count. So the time a refusal takes does
// not tell an attacker which names exist. (Counted, not timed: the
// machine is shared and noisy.)
func TestEveryCheckDoesTheSameWork(t *testing.T) {
	text := "six:" + mustHash(t, saltedSHA512, 0, "pw6").String() + "\n" +
		"mosq:" + mustHash(t, pbkdf2SHA512, 101, "pw101").String() + "\n" +
		"ours:" + mustHash(t, pbkdf2SHA512, DefaultIterations, "pw1000").String() + "\n"
	tab := tableOf(t, text, MQTT)
	want := workMeter{sha512s: 1, iterations: DefaultIterations}
	for _, c := range []struct {
		user, password string
		ok             bool
	}{
		{"six", "pw6", true}, {"six", "wrong", false},
		{"mosq", "pw101", true}, {"mosq", "wrong", false},
		{"ours", "pw1000", true}, {"ours", "wrong", false},
		{"nobody", "pw1000", false}, {"", "", false},
	} {
		*tab.meter = workMeter{}
		if _, ok := tab.Authenticate(c.user, []byte(c.password)); ok != c.ok {
			t.Errorf("%s/%s: ok=%v, want %v", c.user, c.password, ok, c.ok)
		}
		if *tab.meter != want {
			t.Errorf("%s/%s: %+v of work, want %+v like every other check", c.user, c.password, *tab.meter, want)
		}
	}

	// A file of $6$ hashes only: one SHA-512 each, known or not.
	tab = tableOf(t, "six:"+mustHash(t, saltedSHA512, 0, "pw6").String()+"\n", MQTT)
	for _, user := range []string{"six", "nobody"} {
		*tab.meter = workMeter{}
		tab.Authenticate(user, []byte("pw6"))
		if *tab.meter != (workMeter{sha512s: 1}) {
			t.Errorf("%s in a $6$-only file: %+v of work, want one SHA-512", user, *tab.meter)
		}
	}
}

// The decoy an unknown name is checked against never admits anyone, not
// even with the password it was made from (which no one knows anyway).
func TestUnknownNamesAreNeverAdmitted(t *testing.T) {
	tab := tableOf(t, "", MQTT)
	if _, ok := tab.Authenticate("anyone", nil); ok {
		t.Fatal("an empty file admits anyone")
	}
	if tab.decoy.typ == "" || len(tab.decoy.digest) != 64 {
		t.Fatalf("no real decoy: %+v", tab.decoy)
	}
}

// An operator's scope comes back with a successful check, and a wrong
// password returns no scope.
func TestAuthenticateReturnsTheScope(t *testing.T) {
	h := mustHash(t, pbkdf2SHA512, 101, "pw")
	tab := tableOf(t, "ops:"+h.String()+":/metrics,/v1/operations/queues\nroot:"+h.String()+"\n", Operator)
	sc, ok := tab.Authenticate("ops", []byte("pw"))
	if !ok || sc.All() || !sc.Reaches("/v1/operations/queues/jobs") || sc.Reaches("/v1/operations/users") {
		t.Errorf("ops: ok=%v scope %v", ok, sc)
	}
	if sc, ok := tab.Authenticate("root", []byte("pw")); !ok || !sc.All() || !sc.Reaches("/v1/operations/users") {
		t.Errorf("root: ok=%v scope %v", ok, sc)
	}
	if sc, ok := tab.Authenticate("ops", []byte("wrong")); ok || !sc.All() || len(sc.Routes()) != 0 {
		t.Errorf("a wrong password returns ok=%v scope %v", ok, sc)
	}
}

// NewHash writes what docs/configuration.md "Password files and `saguin --passwd`" says: $7$, 1000 rounds, a 12-byte
// salt that differs between two hashes of one password.
func TestNewHashIsPBKDF2WithAThousandRounds(t *testing.T) {
	a, err := NewHash([]byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewHash([]byte("pw"))
	if a.Type() != "$7$" || a.Iterations() != 1000 || len(a.salt) != 12 || bytes.Equal(a.salt, b.salt) {
		t.Fatalf("NewHash: %s (salt %d bytes), a second salt equal: %v", a, len(a.salt), bytes.Equal(a.salt, b.salt))
	}
	p, err := ParseHash(a.String())
	if err != nil || !p.equal(a) || !p.matches([]byte("pw"), nil) || p.matches([]byte("pw "), nil) {
		t.Fatalf("the hash does not read back as itself or does not verify: %v", err)
	}
}

// BenchmarkAuthenticate is the cost of one check at our 1000 rounds, the
// figure docs/configuration.md quotes per login.
func BenchmarkAuthenticate(b *testing.B) {
	h, err := newHash([]byte("pw"), DefaultIterations, rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	f, err := Parse("bench", []byte("alice:"+h.String()+"\n"), MQTT)
	if err != nil {
		b.Fatal(err)
	}
	tab, err := newTable(f)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		tab.Authenticate("alice", []byte("pw"))
	}
}

// Invariant 13: what a file costs to hold grows with its users, not with
// its lines — a megabyte of comment and blank lines each side of one user
// is held as three pieces, not 1.4 million.
func TestLinesAreHeldPerUserNotPerLine(t *testing.T) {
	h := mustHash(t, pbkdf2SHA512, 101, "pw").String()
	filler := strings.Repeat("#\n\n", 1<<20/3)
	text := filler + "alice:" + h + "\n" + filler
	f, err := Parse("big", []byte(text), MQTT)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.lines) != 3 || f.Len() != 1 || !bytes.Equal(f.Bytes(), []byte(text)) {
		t.Fatalf("%d pieces held for one user between two runs of %d lines, want 3 (and the bytes kept)", len(f.lines), strings.Count(filler, "\n"))
	}
	if e, _ := f.Lookup("alice"); e.Line != strings.Count(filler, "\n")+1 {
		t.Errorf("alice on line %d, want %d", e.Line, strings.Count(filler, "\n")+1)
	}
}
