package passwd

import (
	"crypto/rand"
	"fmt"
	"slices"
)

// Table is a loaded password file as the broker authenticates against it.
// It never changes once built and is safe for concurrent use; a re-read
// builds a new one (Load), and the broker swaps it in whole.
type Table struct {
	path  string
	kind  Kind
	users map[string]account
	names []string // sorted
	// work is the PBKDF2 count every check performs: the file's largest
	// $7$ count (0 when it has none).
	work int
	// decoy is the hash an unknown name is checked against.
	decoy Hash
	// meter counts each check's work in tests; nil otherwise.
	meter *workMeter
}

type account struct {
	hash  Hash
	scope Scope
}

// Load reads the password file at path as kind and returns the whole new
// Table, or an error and nothing: a *LoadError naming the file and each
// problem's line (docs/configuration.md "Password files and `saguin --passwd`": a re-read applies nothing unless every
// file loads). An MQTT file naming nobody loads, with Len 0: whether that
// is a mistake depends on the listener it serves (docs/configuration.md: a door whose
// only way in is an empty file admits nobody), which the broker knows and
// this package does not.
func Load(path string, kind Kind) (*Table, error) {
	if kind != MQTT && kind != Operator {
		return nil, fmt.Errorf("passwd.Load %s: kind is MQTT or Operator", path)
	}
	f, err := ReadFile(path, kind)
	if err != nil {
		return nil, err
	}
	return newTable(f)
}

func newTable(f *File) (*Table, error) {
	t := &Table{path: f.path, kind: f.kind, users: make(map[string]account, f.Len())}
	for _, e := range f.Entries() {
		t.users[e.User] = account{hash: e.Hash, scope: e.Scope}
		t.names = append(t.names, e.User)
		t.work = max(t.work, e.Hash.iterations)
	}
	slices.Sort(t.names)
	// The decoy is a real hash of a random password, so checking it is a
	// genuine derivation; making it also proves this process can derive
	// (a FIPS 140-only process refuses mosquitto's salts) before any
	// client is told "wrong password".
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	var err error
	if t.work > 0 {
		t.decoy, err = newHash(secret, t.work, rand.Reader)
	} else {
		t.decoy, err = newSaltedSHA512(secret)
	}
	if err != nil {
		return nil, &LoadError{Path: f.path, Err: fmt.Errorf("this process cannot derive password hashes: %w", err)}
	}
	return t, nil
}

// newSaltedSHA512 is a $6$ hash of password with a random salt: only
// ever a decoy, since new entries are written $7$.
func newSaltedSHA512(password []byte) (Hash, error) {
	h := Hash{typ: saltedSHA512, salt: make([]byte, saltBytes)}
	_, _ = rand.Read(h.salt)
	d, err := h.derive(password, nil)
	h.digest = d
	return h, err
}

// Path is the file the table was read from.
func (t *Table) Path() string { return t.path }

// Kind is the kind the file was read as.
func (t *Table) Kind() Kind { return t.kind }

// Len is the number of users; the broker refuses a door whose only way in
// is a file with none (docs/configuration.md).
func (t *Table) Len() int { return len(t.users) }

// Users are the names, sorted.
func (t *Table) Users() []string { return slices.Clone(t.names) }

// Authenticate says whether password is user's, and the routes the user
// reaches (every route for an MQTT file). The answer takes the same work
// for every name, known or not, and whatever its hash: one SHA-512 of the
// password and salt, and the file's largest PBKDF2 count — the user's own
// derivation, the rest made up on the decoy — so the time a refusal takes
// does not tell whether the name exists. Digests are compared in constant
// time. Nothing is cached: each call derives.
func (t *Table) Authenticate(user string, password []byte) (Scope, bool) {
	a, known := t.users[user]
	h := t.decoy
	if known {
		h = a.hash
	}
	ok := h.matches(password, t.meter)
	t.pad(h, password)
	if !known || !ok {
		return Scope{}, false
	}
	return a.scope, true
}

// pad does the work a check against h left undone, against the decoy's
// salt, so every check totals one SHA-512 derivation and t.work PBKDF2
// iterations (to within one HMAC setup).
func (t *Table) pad(h Hash, password []byte) {
	if h.typ != saltedSHA512 {
		_, _ = Hash{typ: saltedSHA512, salt: t.decoy.salt}.derive(password, t.meter)
	}
	if rest := t.work - h.iterations; rest > 0 {
		_, _ = Hash{typ: pbkdf2SHA512, iterations: rest, salt: t.decoy.salt}.derive(password, t.meter)
	}
}
