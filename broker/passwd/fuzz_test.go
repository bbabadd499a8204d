package passwd

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParse: the parser never panics on any bytes; a refused file is a
// *LoadError with at most maxProblems listed; and an accepted file is
// written back byte for byte, and every write of its entries — a new file
// built from them, or the file with one user changed and one deleted —
// parses back to the same entries.
func FuzzParse(f *testing.F) {
	h7 := "$7$101$Yc/57gTguXY4OCzU$M//XfTnR9WM0X/CSPQLbX4elT/Y9DBtk8o4XdJ4XN29QH+AqeQdUGBKxp8OUZdHnEfv7qyj75kSAmpbjXZ+k1g=="
	h6 := "$6$ZTRfNTTpt8iW9JOv$AHaaU60Ffhko/Mjx7c10H+NBVSd+EQMgduvleQg7LUTg83dGBAH5j2eIWru5JVpYAWpPIB8M9lJWU7NC3Z8a6g=="
	for _, s := range []string{
		"",
		"alice:" + h7 + "\n",
		"# users\n\nalice:" + h7 + "\r\nbob :" + h6 + "  \n",
		"ops:" + h7 + ":/metrics,/v1/operations\nroot:" + h6,
		"alice:" + h7 + "\nalice:" + h6 + "\n",
		"  # note\n\talice\t:\t" + h7 + "\t:\t/v1/operations/queues \n",
		"alice:$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2g\n",
		"\ufeffalice:" + h7,
		"a\x00b:" + h7 + "\n",
		"alice:secret\nnocolon\n:x:y:z:w\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, operator bool) {
		kind := MQTT
		if operator {
			kind = AnyKind
		}
		file, err := Parse("fuzz", data, kind)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || len(le.Problems) == 0 || len(le.Problems) > maxProblems {
				t.Fatalf("refusal %v is not a *LoadError with 1 to %d problems", err, maxProblems)
			}
			return
		}
		if !bytes.Equal(file.Bytes(), data) {
			t.Fatalf("an unedited file is not written back byte for byte:\n%q\n%q", file.Bytes(), data)
		}
		entries := file.Entries()

		// A new file holding the same entries, written through Set and
		// SetScope as saguin --passwd writes.
		fresh := NewFile("fresh", kind)
		for _, e := range entries {
			if _, err := fresh.Set(e.User, e.Hash); err != nil {
				t.Fatalf("Set(%q) of an entry that parsed: %v", e.User, err)
			}
			if _, err := fresh.SetScope(e.User, e.Scope); err != nil {
				t.Fatalf("SetScope(%q): %v", e.User, err)
			}
		}
		sameEntries(t, "a new file of its entries", fresh.Bytes(), kind, entries)

		// The file edited in place: the first user's line rewritten, the
		// last user's deleted; every other line kept.
		if len(entries) > 0 {
			if _, err := file.Set(entries[0].User, entries[0].Hash); err != nil {
				t.Fatal(err)
			}
			want := entries
			if len(entries) > 1 {
				file.Delete(entries[len(entries)-1].User)
				want = entries[:len(entries)-1]
			}
			sameEntries(t, "the edited file", file.Bytes(), kind, want)
		}
	})
}

// sameEntries parses data and compares its entries (not their lines) with
// want.
func sameEntries(t *testing.T, what string, data []byte, kind Kind, want []Entry) {
	t.Helper()
	back, err := Parse("back", data, kind)
	if err != nil {
		t.Fatalf("%s does not parse: %v\n%q", what, err, data)
	}
	got := back.Entries()
	if len(got) != len(want) {
		t.Fatalf("%s has %d entries, want %d:\n%q", what, len(got), len(want), data)
	}
	for i := range got {
		if got[i].User != want[i].User || !got[i].Hash.equal(want[i].Hash) || !got[i].Scope.equal(want[i].Scope) {
			t.Fatalf("%s: entry %d is %q %s %q, want %q %s %q", what, i,
				got[i].User, got[i].Hash, got[i].Scope, want[i].User, want[i].Hash, want[i].Scope)
		}
	}
}
