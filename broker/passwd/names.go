package passwd

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxUserName is the longest user name in bytes: an MQTT UTF-8 string
// carries at most 65535, so a longer name in a file could never log in.
const MaxUserName = 65535

// CheckUserName says why name can never be a user name, or nil. docs/configuration.md "Password files and `saguin --passwd`": a name holding U+0000 or a control character (U+0001–U+001F,
// U+007F–U+009F) is never valid — the broker refuses such a CONNECT with
// 0x86, a file naming one does not load, and saguin --passwd add refuses
// it. A name that is not UTF-8 is refused too: MQTT carries user names as
// UTF-8 strings, so no client could ever send it.
func CheckUserName(name string) error {
	if !utf8.ValidString(name) {
		return errors.New("the user name is not valid UTF-8")
	}
	for i, r := range name {
		if isControl(r) {
			return fmt.Errorf("the user name holds the control character U+%04X at byte %d", r, i)
		}
	}
	return nil
}

// isControl is the set docs/configuration.md "Password files and `saguin --passwd`" refuses in a user name: the C0
// controls with NUL, DEL, and the C1 controls.
func isControl(r rune) bool {
	return r <= 0x1F || (r >= 0x7F && r <= 0x9F)
}

// CheckFileUserName says why name cannot be written as a user of a file
// and read back as itself (storableNameProblem), or nil: saguin --passwd
// add asks before it asks for a password.
func CheckFileUserName(name string) error {
	if prob := storableNameProblem(name); prob != "" {
		return errors.New(prob)
	}
	return nil
}

// storableNameProblem adds to CheckUserName what a name must also be to be
// written on a line of a file and read back as itself: not empty, not too
// long, no ':' (the field separator, docs/operations.md "Operators"), not beginning with '#'
// (mosquitto reads a line beginning with '#' as a comment) and no blank at
// either end (readers trim the blanks around each field). It returns the
// problem and its fix, or "".
func storableNameProblem(name string) string {
	switch {
	case name == "":
		return "the user name is empty; write user:hash with a name before the ':'"
	case len(name) > MaxUserName:
		return fmt.Sprintf("the user name is %d bytes; MQTT carries at most %d", len(name), MaxUserName)
	}
	if err := CheckUserName(name); err != nil {
		return err.Error() + "; user names may not hold control characters"
	}
	switch {
	case strings.ContainsRune(name, ':'):
		return "the user name holds ':', which separates the fields of a line; choose a name without it"
	case name[0] == '#':
		return "the user name begins with '#', which begins a comment in a password file (mosquitto reads an indented one as a user, so the line means two things); choose another name, or put the '#' first on the line to comment it out"
	case name[0] == ' ' || name[len(name)-1] == ' ':
		return "the user name begins or ends with a blank, which readers trim; choose a name without it"
	}
	return ""
}
