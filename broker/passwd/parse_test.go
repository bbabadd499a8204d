package passwd_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker/internal/mosquittotest"
	"saguin.dev/broker/passwd"
)

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// hashOf is a hash mosquitto_passwd writes for password.
func hashOf(t *testing.T, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "one")
	mosquittotest.Passwd(t, "-c", "-b", path, "someone", password)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(strings.TrimPrefix(string(data), "someone:"), "\n")
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "passwords")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// What a real mosquitto accepts and means one thing by — comments, blank
// and blank-only lines, CRLF endings, blanks around the fields, no final
// newline — Sagüin reads the same way: the same user logs in with the
// same password on both.
func TestLinesMosquittoAcceptsAreReadAlike(t *testing.T) {
	h := hashOf(t, "s3cret")
	// The digest's last character before "==" carries 4 unused bits;
	// setting them changes the spelling and not the bytes.
	last := strings.Index(base64Alphabet, h[len(h)-3:len(h)-2])
	loose := h[:len(h)-3] + base64Alphabet[last|0b0101:last|0b0101+1] + "=="
	for name, text := range map[string]string{
		"comments and blank lines": "# users of gw-7\n\n   \n\t\nalice:" + h + "\n# end\n",
		"unused base64 bits set":   "alice:" + loose + "\n",
		"CRLF line endings":        "# c\r\nalice:" + h + "\r\n\r\n",
		"blanks around the fields": "  alice \t:  " + h + "  \n",
		"no final newline":         "alice:" + h,
		"an indented comment":      "   # alice's line follows\nalice:" + h + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, text)
			m := mosquittotest.Start(t, path)
			if code, out := m.Pub(t, "alice", "s3cret"); code != 0 {
				t.Fatalf("mosquitto refuses alice on this file (exit %d): %s\n%s", code, out, m.Log())
			}
			tab, err := passwd.Load(path, passwd.MQTT)
			if err != nil {
				t.Fatalf("mosquitto reads this file and Sagüin does not: %v", err)
			}
			if _, ok := tab.Authenticate("alice", []byte("s3cret")); !ok || tab.Len() != 1 {
				t.Errorf("alice is refused, or the file holds %d users, not 1", tab.Len())
			}
		})
	}
}

// Lines mosquitto takes without complaint at start but which lock a user
// out — it drops a password in clear or an argon2id hash with a log line,
// skips a line with no ':', and lets a second line of one user replace
// the first — are load errors in Sagüin, naming the line, so the operator
// hears of them before a user does. The mosquitto half shows what the
// user would have met.
func TestLinesMosquittoSilentlyLosesAreRefused(t *testing.T) {
	h := hashOf(t, "s3cret")
	other := hashOf(t, "another")
	for _, c := range []struct {
		name, text string
		line       int
		want       string
	}{
		{"password in clear", "alice:s3cret\n", 1, "mosquitto_passwd -U"},
		{"argon2id hash", "# c\nalice:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2g\n", 2, "argon2id"},
		{"no ':'", "alice\n", 1, "no ':'"},
		{"the same user twice", "alice:" + h + "\nbob:" + other + "\nalice:" + other + "\n", 3, "lines 1 and 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, c.text)
			m := mosquittotest.Start(t, path)
			if code, _ := m.Pub(t, "alice", "s3cret"); code == 0 {
				t.Fatalf("mosquitto admits alice with her password: this line does not lose anything\n%s", m.Log())
			}
			_, err := passwd.Load(path, passwd.MQTT)
			if err == nil {
				t.Fatal("loads")
			}
			if want := fmt.Sprintf("%s:%d: ", path, c.line); !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q; want it to begin %q and say %q", err, want, c.want)
			}
		})
	}
}

// docs/configuration.md "Password files and `saguin --passwd`", docs/operations.md "Operators": each of these is a load error whose text
// names the file and the line and says how to fix it.
func TestLoadErrorsNameFileLineAndFix(t *testing.T) {
	h := hashOf(t, "pw")
	for _, c := range []struct {
		name string
		text string
		kind passwd.Kind
		line int // 0: about the whole file
		want []string
	}{
		{"argon2id", "alice:" + h + "\nbob:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2g\n", passwd.MQTT, 2,
			[]string{`user "bob"`, "argon2id", "only $6$ and $7$", "saguin --passwd add"}},
		{"duplicate user", "alice:" + h + "\n\n# x\nalice:" + h + "\n", passwd.MQTT, 4,
			[]string{`user "alice" is on lines 1 and 4`, "delete one of them"}},
		{"control character in a name", "ok:" + h + "\nev\x01il:" + h + "\n", passwd.MQTT, 2,
			[]string{"U+0001", "control characters"}},
		{"C1 control character in a name", "ev\u0085il:" + h + "\n", passwd.Operator, 1, []string{"U+0085"}},
		{"DEL in a name", "ev\x7fil:" + h + "\n", passwd.MQTT, 1, []string{"U+007F"}},
		{"NUL in a name", "ev\x00il:" + h + "\n", passwd.MQTT, 1, []string{"U+0000"}},
		{"a name that is not UTF-8", "ev\xffil:" + h + "\n", passwd.MQTT, 1, []string{"not valid UTF-8"}},
		{"scope field in an MQTT file", "# mqtt\nalice:" + h + ":/metrics\n", passwd.MQTT, 2,
			[]string{"third field", "only an operator password file", "remove it"}},
		{"unserved route in an operator file", "ops:" + h + ":/metrics,/v1/operations/bogus\n", passwd.Operator, 1,
			[]string{`"/v1/operations/bogus" is not a route the broker serves`, "/v1/operations/consumers"}},
		{"route with a trailing slash", "ops:" + h + ":/metrics/\n", passwd.Operator, 1, []string{"write the route /metrics without the trailing '/'"}},
		{"one queue as a scope", "ops:" + h + ":/v1/operations/queues/jobs\n", passwd.Operator, 1, []string{"write /v1/operations/queues"}},
		{"a route twice", "ops:" + h + ":/metrics, /metrics\n", passwd.Operator, 1, []string{"names /metrics twice"}},
		{"empty scope field", "ops:" + h + ":\n", passwd.Operator, 1, []string{"remove the trailing ':'"}},
		{"all written in the file", "ops:" + h + ":all\n", passwd.Operator, 1, []string{"leave out the third field"}},
		{"empty operator file", "# nobody yet\n\n", passwd.Operator, 0, []string{"names no user", "saguin --passwd add"}},
		{"empty user name", ":alice:" + h + "\n", passwd.MQTT, 1, []string{"user name is empty"}},
		{"empty hash", "alice::" + h + "\n", passwd.Operator, 1, []string{"hash is empty"}},
		{"four fields", "alice:" + h + ":/metrics:x\n", passwd.Operator, 1, []string{"4 ':'-separated fields"}},
		{"indented # before a user", "  #alice:" + h + "\n", passwd.MQTT, 1, []string{"begins with '#'", "put the '#' first"}},
		{"byte-order mark", "\ufeffalice:" + h + "\n", passwd.MQTT, 1, []string{"byte-order mark", "save the file without it"}},
		{"iterations beyond the bound", "alice:$7$2000000$" + strings.SplitN(h, "$", 4)[3] + "\n", passwd.MQTT, 1,
			[]string{"iteration count 2000000 is outside 1 to 1000000"}},
		{"unknown hash type", "alice:$5$abc$def\n", passwd.MQTT, 1, []string{`hash type "$5$"`}},
		{"damaged digest", "alice:" + h[:len(h)-4] + "\n", passwd.MQTT, 1, []string{"digest is not base64 of 64 bytes"}},
		{"damaged $7$", "alice:$7$101$abc\n", passwd.MQTT, 1, []string{"damaged"}},
		{"line too long", "alice:" + h + ":" + strings.Repeat("/metrics,", passwd.MaxLineBytes/9+1) + "\n", passwd.Operator, 1,
			[]string{"a line is at most"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, c.text)
			_, err := passwd.Load(path, c.kind)
			var le *passwd.LoadError
			if !errors.As(err, &le) {
				t.Fatalf("Load: %v, want a *LoadError", err)
			}
			prefix := path + ": "
			if c.line > 0 {
				prefix = fmt.Sprintf("%s:%d: ", path, c.line)
			}
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("error %q does not begin %q", err, prefix)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// Every problem of a file is listed, each with its line, up to a bound;
// Error() gives the first and the count of the rest.
func TestLoadListsEveryProblemBounded(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= 150; i++ {
		fmt.Fprintf(&b, "user%d:plain\n", i)
	}
	path := writeFile(t, b.String())
	_, err := passwd.Load(path, passwd.MQTT)
	var le *passwd.LoadError
	if !errors.As(err, &le) {
		t.Fatalf("Load: %v", err)
	}
	lines := le.Lines()
	if len(le.Problems) != 100 || le.More != 50 || len(lines) != 101 {
		t.Fatalf("%d problems listed, %d more, %d lines; want 100, 50, 101", len(le.Problems), le.More, len(lines))
	}
	if !strings.HasPrefix(lines[99], path+":100: ") || !strings.Contains(lines[100], "50 further problems") {
		t.Errorf("lines end %q, %q", lines[99], lines[100])
	}
	if !strings.Contains(err.Error(), "and 149 more problems") {
		t.Errorf("Error() %q does not count the rest", err)
	}
}

// Invariant 13: a file over 16 MiB is refused with the bound named,
// without being read whole.
func TestLoadRefusesAFileOverTheBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(passwd.MaxFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	_, err = passwd.Load(path, passwd.MQTT)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "at most 16777216 (16 MiB)") {
		t.Fatalf("Load of a %d-byte file: %v", passwd.MaxFileBytes+1, err)
	}
}

// A missing file, or a directory, is an error naming it that wraps the
// cause (the command line tells a missing file from a broken one).
func TestLoadOfWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	_, err := passwd.Load(filepath.Join(dir, "absent"), passwd.MQTT)
	if !errors.Is(err, os.ErrNotExist) || err.Error() != "password file "+filepath.Join(dir, "absent")+": open: no such file or directory" {
		t.Errorf("missing file: %v", err)
	}
	_, err = passwd.Load(dir, passwd.MQTT)
	if err == nil || err.Error() != "password file "+dir+": is a directory; name the password file itself" {
		t.Errorf("directory: %v", err)
	}
}

// docs/configuration.md "Password files and `saguin --passwd`": an MQTT file that names nobody loads with Len 0 — the
// broker decides, knowing the door, whether that admits nobody.
func TestEmptyMQTTFileLoadsWithNoUsers(t *testing.T) {
	tab, err := passwd.Load(writeFile(t, "# nobody\n"), passwd.MQTT)
	if err != nil || tab.Len() != 0 {
		t.Fatalf("Load: %v, %v", tab, err)
	}
	if _, ok := tab.Authenticate("", nil); ok {
		t.Error("an empty file admits the empty name")
	}
}

// The control-character rule is the one the broker applies at CONNECT.
func TestCheckUserName(t *testing.T) {
	for _, ok := range []string{"alice", "alice@example.com", "Zoë", "a b", "日本", "#x", ""} {
		if err := passwd.CheckUserName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"a\x00b", "a\x1fb", "\x7f", "a\u0080", "a\u009fb", "a\nb", "\xc3"} {
		if err := passwd.CheckUserName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
