package passwd

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The hash types docs/configuration.md "Password files and `saguin --passwd`" reads, as mosquitto_passwd 2.0 writes them
// (checked against Debian's mosquitto_passwd 2.0.11; rfcs/passwords.md):
//
//	$6$<salt>$<SHA-512(password ‖ salt)>
//	$7$<iterations>$<salt>$<PBKDF2-HMAC-SHA512(password, salt, iterations, 64 bytes)>
//
// salt and digest in standard base64 with padding; mosquitto's salts are
// 12 bytes.
type hashType string

const (
	saltedSHA512 hashType = "6"
	pbkdf2SHA512 hashType = "7"
)

const (
	// DefaultIterations is the PBKDF2 count of every hash saguin --passwd
	// writes (docs/configuration.md "Password files and `saguin --passwd`"). mosquitto_passwd 2.0 writes 101.
	DefaultIterations = 1000
	// MaxIterations bounds a $7$ count read from a file: every CONNECT
	// costs the file's largest count (Table.Authenticate), and a million
	// PBKDF2-SHA512 rounds take about two seconds of one CI core.
	MaxIterations = 1_000_000
	// saltBytes is the salt of a new hash, mosquitto_passwd's length.
	saltBytes = 12
	// maxSaltBytes bounds a salt read from a file.
	maxSaltBytes = 64
)

// b64 is the base64 of the format. Writing is canonical; reading is not
// strict about the unused bits of the last character, which Mosquitto
// ignores too (checked: a digest whose last character differs only there
// logs in), so a hand-made or foreign file that Mosquitto reads, Sagüin
// reads.
var b64 = base64.StdEncoding

// decodeBase64 decodes s, refusing anything but the alphabet and padding
// (the standard decoder would skip a stray '\r').
func decodeBase64(s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return nil, errors.New("not base64")
		}
	}
	return b64.DecodeString(s)
}

// Hash is one stored password hash. The zero Hash matches no password.
type Hash struct {
	typ        hashType
	iterations int // $7$ only
	salt       []byte
	digest     []byte // 64 bytes
}

// ParseHash reads the hash field of a line. Its error says what is wrong
// and how to fix it, and never repeats the field (it may be a password
// written in clear).
func ParseHash(s string) (Hash, error) {
	if s == "" {
		return Hash{}, errors.New("the password hash is empty; set the password with saguin --passwd add")
	}
	if s[0] != '$' {
		return Hash{}, errors.New("the password is not hashed (a password in clear?); Sagüin reads only $6$ and $7$ hashes: hash the file with mosquitto_passwd -U, or set the password with saguin --passwd add")
	}
	fields := strings.Split(s, "$")
	switch {
	case strings.HasPrefix(s, "$argon2"):
		return Hash{}, errors.New("argon2id hashes are not read by Sagüin (only $6$ and $7$), so this user could never log in; set the password again with saguin --passwd add, which writes $7$")
	case fields[1] == string(saltedSHA512) && len(fields) == 4:
		return parseHashParts(saltedSHA512, 0, fields[2], fields[3])
	case fields[1] == string(pbkdf2SHA512) && len(fields) == 5:
		n, err := parseIterations(fields[2])
		if err != nil {
			return Hash{}, err
		}
		return parseHashParts(pbkdf2SHA512, n, fields[3], fields[4])
	case fields[1] == string(saltedSHA512) || fields[1] == string(pbkdf2SHA512):
		return Hash{}, fmt.Errorf("a $%s$ hash with %d '$'-separated parts is damaged (a $6$ hash is $6$salt$digest, a $7$ hash $7$iterations$salt$digest); set the password again with saguin --passwd add",
			fields[1], len(fields)-1)
	}
	name := fields[1]
	if len(name) > 16 {
		name = name[:16] + "…"
	}
	return Hash{}, fmt.Errorf("hash type %q is not read by Sagüin (only $6$ and $7$), so this user could never log in; set the password again with saguin --passwd add, which writes $7$", "$"+name+"$")
}

func parseIterations(s string) (int, error) {
	bad := s == "" || len(s) > 10
	for i := 0; i < len(s) && !bad; i++ {
		bad = s[i] < '0' || s[i] > '9'
	}
	if bad {
		return 0, fmt.Errorf("the $7$ iteration count %.16q is not a whole number; the line is damaged: set the password again with saguin --passwd add", s)
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > MaxIterations {
		return 0, fmt.Errorf("the $7$ iteration count %d is outside 1 to %d (every login costs the file's largest count); set the password again with saguin --passwd add, which uses %d", n, MaxIterations, DefaultIterations)
	}
	return n, nil
}

func parseHashParts(typ hashType, iterations int, salt64, digest64 string) (Hash, error) {
	salt, err := decodeBase64(salt64)
	if err != nil || len(salt) == 0 || len(salt) > maxSaltBytes {
		return Hash{}, fmt.Errorf("the $%s$ salt is not base64 of 1 to %d bytes; the line is damaged: set the password again with saguin --passwd add", typ, maxSaltBytes)
	}
	digest, err := decodeBase64(digest64)
	if err != nil || len(digest) != sha512.Size {
		return Hash{}, fmt.Errorf("the $%s$ digest is not base64 of %d bytes; the line is damaged: set the password again with saguin --passwd add", typ, sha512.Size)
	}
	return Hash{typ: typ, iterations: iterations, salt: salt, digest: digest}, nil
}

// MaxPassword is the longest password in bytes: MQTT carries a password
// as binary data of at most 65535 bytes, so a longer one could never log
// in.
const MaxPassword = 65535

// NewHash hashes password as saguin --passwd add stores it: $7$,
// DefaultIterations, a fresh random 12-byte salt. It refuses an empty
// password (docs/operations.md "Operators") and one no client could send.
func NewHash(password []byte) (Hash, error) {
	switch {
	case len(password) == 0:
		return Hash{}, errors.New("an empty password is refused")
	case len(password) > MaxPassword:
		return Hash{}, fmt.Errorf("the password is %d bytes; MQTT carries at most %d", len(password), MaxPassword)
	}
	return newHash(password, DefaultIterations, rand.Reader)
}

func newHash(password []byte, iterations int, random io.Reader) (Hash, error) {
	h := Hash{typ: pbkdf2SHA512, iterations: iterations, salt: make([]byte, saltBytes)}
	if _, err := io.ReadFull(random, h.salt); err != nil {
		return Hash{}, fmt.Errorf("reading a random salt: %w", err)
	}
	digest, err := h.derive(password, nil)
	if err != nil {
		return Hash{}, err
	}
	h.digest = digest
	return h, nil
}

// String is the hash as a file holds it.
func (h Hash) String() string {
	switch h.typ {
	case saltedSHA512:
		return "$6$" + b64.EncodeToString(h.salt) + "$" + b64.EncodeToString(h.digest)
	case pbkdf2SHA512:
		return "$7$" + strconv.Itoa(h.iterations) + "$" + b64.EncodeToString(h.salt) + "$" + b64.EncodeToString(h.digest)
	}
	return ""
}

// Type is "$6$" or "$7$" ("" for the zero Hash).
func (h Hash) Type() string {
	if h.typ == "" {
		return ""
	}
	return "$" + string(h.typ) + "$"
}

// Iterations is a $7$ hash's PBKDF2 count (0 for $6$).
func (h Hash) Iterations() int { return h.iterations }

// derive computes the digest password would have under h's type, salt
// and count, reporting the work to m (nil outside tests).
func (h Hash) derive(password []byte, m *workMeter) ([]byte, error) {
	switch h.typ {
	case saltedSHA512:
		m.sha512()
		d := sha512.New()
		d.Write(password)
		d.Write(h.salt)
		return d.Sum(nil), nil
	case pbkdf2SHA512:
		m.pbkdf2(h.iterations)
		// An error only in a FIPS 140-only process, which refuses
		// mosquitto's 12-byte salts.
		return pbkdf2.Key(sha512.New, string(password), h.salt, h.iterations, sha512.Size)
	}
	return nil, errors.New("no hash")
}

// matches says whether password is the one h was made from, comparing the
// digests in constant time.
func (h Hash) matches(password []byte, m *workMeter) bool {
	d, err := h.derive(password, m)
	return err == nil && subtle.ConstantTimeCompare(d, h.digest) == 1
}

// equal says whether two hashes are the same stored value.
func (h Hash) equal(o Hash) bool { return h.String() == o.String() }

// workMeter counts the derivations a check performs, so a test can show
// that every check does the same work without timing anything. A nil
// meter counts nothing.
type workMeter struct {
	sha512s    int
	iterations int
}

func (m *workMeter) sha512() {
	if m != nil {
		m.sha512s++
	}
}

func (m *workMeter) pbkdf2(n int) {
	if m != nil {
		m.iterations += n
	}
}
