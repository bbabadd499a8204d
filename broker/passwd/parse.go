package passwd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"
)

// Kind is what a password file is for; it decides what a file may hold.
type Kind uint8

const (
	// MQTT is a client password file (docs/configuration.md "Password files and `saguin --passwd`"): no scope field.
	MQTT Kind = iota + 1
	// Operator is an operator credential file (docs/operations.md "Operators"): a scope
	// field is allowed, and a file naming nobody does not load.
	Operator
	// AnyKind is the view of saguin --passwd, which reads no configuration
	// and so cannot know which kind a file is: a scope field is read as an
	// operator file reads it, and a file naming nobody is accepted.
	AnyKind
)

func (k Kind) String() string {
	switch k {
	case MQTT:
		return "MQTT password file"
	case Operator:
		return "operator password file"
	}
	return "password file"
}

// Bounds on what a file may make the reader hold (invariant 13), checked
// before the bytes are held.
const (
	// MaxFileBytes is the largest password file read.
	MaxFileBytes = 16 << 20
	// MaxLineBytes is the longest line: a name of MaxUserName bytes, a
	// hash and a scope fit with room to spare.
	MaxLineBytes = MaxUserName + 8<<10
	// maxProblems is how many problems one load reports; the rest are
	// counted.
	maxProblems = 100
)

// blanks are what a reader trims around each field; mosquitto reads
// "alice :hash", a trailing blank and a CRLF line ending as if they were
// not there.
const blanks = " \t\r\v\f"

// Entry is one user's line.
type Entry struct {
	User  string
	Hash  Hash
	Scope Scope
	// Line is the line's number in the file as read (1-based).
	Line int
}

// line is one user's line as written, terminator included, with its
// entry; or, with a nil entry, a run of consecutive other lines (blank,
// comment, refused) kept as one piece, so that what a file costs to hold
// grows with its users, not its line count (invariant 13: 16 MiB of
// newlines is one piece, not sixteen million).
type line struct {
	raw   []byte
	entry *Entry
}

// Parse reads data, the contents of the file at path, as a file of kind.
// path is only named in errors. The error is a *LoadError listing every
// problem with its line (at most 100, then a count). The File keeps a copy
// of data.
func Parse(path string, data []byte, kind Kind) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, &LoadError{Path: path, Problems: []Problem{{Text: fmt.Sprintf(
			"the file is %d bytes; a password file is at most %d (16 MiB)", len(data), MaxFileBytes)}}}
	}
	data = bytes.Clone(data)
	f := &File{path: path, kind: kind, byUser: map[string]int{}}
	p := &problems{path: path}
	if bytes.HasPrefix(data, []byte("\xef\xbb\xbf")) {
		// Mosquitto would read the byte-order mark as part of the first
		// user's name, and that user could never log in.
		p.add(1, "the file begins with a UTF-8 byte-order mark, which would become part of the first user name; save the file without it")
	}
	for n := 1; len(data) > 0; n++ {
		raw := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			raw = data[:i+1]
		}
		data = data[len(raw):]
		e, ok := parseLine(n, raw, kind, p)
		if first, dup := f.byUser[e.User]; ok && dup {
			p.add(n, fmt.Sprintf("user %s is on lines %d and %d; a user has one line: delete one of them", quoteName(e.User), f.lines[first].entry.Line, n))
			ok = false
		}
		if ok {
			f.byUser[e.User] = len(f.lines)
			f.lines = append(f.lines, line{raw: raw, entry: &e})
			continue
		}
		if last := len(f.lines) - 1; last >= 0 && f.lines[last].entry == nil {
			// invariant 13: a line that is no user's joins the run before
			// it (raw begins where the run ends, in the same array).
			f.lines[last].raw = f.lines[last].raw[:len(f.lines[last].raw)+len(raw)]
			continue
		}
		f.lines = append(f.lines, line{raw: raw})
	}
	if kind == Operator && len(f.byUser) == 0 && p.count == 0 {
		p.add(0, "the file names no user, so no operator could authenticate; add one with saguin --passwd add FILE USER")
	}
	if p.count > 0 {
		return nil, p.err()
	}
	return f, nil
}

// parseLine reads one line; ok is false for a blank line, a comment or a
// line with a problem (added to p).
func parseLine(n int, raw []byte, kind Kind, p *problems) (Entry, bool) {
	text := raw
	if len(text) > 0 && text[len(text)-1] == '\n' {
		text = text[:len(text)-1]
	}
	if len(text) > MaxLineBytes {
		p.add(n, fmt.Sprintf("the line is %d bytes; a line is at most %d", len(text), MaxLineBytes))
		return Entry{}, false
	}
	s := strings.Trim(string(text), blanks)
	switch {
	case s == "":
		return Entry{}, false
	case text[0] == '#':
		// A comment exactly where mosquitto reads one: '#' first on the line.
		return Entry{}, false
	case s[0] == '#' && !strings.Contains(s, ":"):
		// An indented comment: mosquitto skips it as a line without ':'.
		return Entry{}, false
	case !strings.Contains(s, ":"):
		// Mosquitto skips such a line; a user meant there would be
		// locked out without a word.
		p.add(n, "the line has no ':', so it names no password; write user:hash (saguin --passwd add FILE USER), or put '#' first to make it a comment")
		return Entry{}, false
	}
	fields := strings.Split(s, ":")
	if len(fields) > 3 {
		p.add(n, fmt.Sprintf("the line has %d ':'-separated fields; a line is user:hash, or user:hash:routes in an operator file (a user name may not hold ':')", len(fields)))
		return Entry{}, false
	}
	e := Entry{User: strings.Trim(fields[0], blanks), Line: n}
	if prob := storableNameProblem(e.User); prob != "" {
		p.add(n, prob)
		return Entry{}, false
	}
	h, err := ParseHash(strings.Trim(fields[1], blanks))
	if err != nil {
		p.add(n, fmt.Sprintf("user %s: %v", quoteName(e.User), err))
		return Entry{}, false
	}
	e.Hash = h
	if len(fields) == 3 {
		if kind == MQTT {
			p.add(n, fmt.Sprintf("user %s has a third field (a route scope), which only an operator password file takes; remove it and its ':'", quoteName(e.User)))
			return Entry{}, false
		}
		sc, err := ParseScope(fields[2])
		if err != nil {
			p.add(n, fmt.Sprintf("user %s: %v", quoteName(e.User), err))
			return Entry{}, false
		}
		e.Scope = sc
	}
	return e, true
}

// Problem is one thing wrong with a file: its line (0 when it is about
// the whole file) and what is wrong with the fix.
type Problem struct {
	Line int
	Text string
}

// LoadError is a file that does not load: it could not be read (Err), or
// it has Problems (at most 100; More counts the rest).
type LoadError struct {
	Path     string
	Problems []Problem
	More     int
	Err      error
}

// Error is the first problem as FILE:LINE: what is wrong; the fix — and
// the count of any others — or why the file could not be read.
func (e *LoadError) Error() string {
	if e.Err != nil {
		cause := e.Err
		var pe *fs.PathError
		if errors.As(cause, &pe) && pe.Path == e.Path {
			cause = fmt.Errorf("%s: %w", pe.Op, pe.Err) // the path once, not twice
		}
		return fmt.Sprintf("password file %s: %v", e.Path, cause)
	}
	if len(e.Problems) == 0 {
		return fmt.Sprintf("password file %s does not load", e.Path)
	}
	s := e.Lines()[0]
	if n := len(e.Problems) - 1 + e.More; n > 0 {
		s += fmt.Sprintf(" (and %d more problems in %s; saguin --passwd list %s shows them all)", n, e.Path, e.Path)
	}
	return s
}

func (e *LoadError) Unwrap() error { return e.Err }

// Lines are the problems, one line each: FILE:LINE: text (FILE: text for
// a problem about the whole file), and a last line counting those not
// listed.
func (e *LoadError) Lines() []string {
	out := make([]string, 0, len(e.Problems)+1)
	for _, p := range e.Problems {
		if p.Line > 0 {
			out = append(out, fmt.Sprintf("%s:%d: %s", e.Path, p.Line, p.Text))
		} else {
			out = append(out, fmt.Sprintf("%s: %s", e.Path, p.Text))
		}
	}
	if e.More > 0 {
		out = append(out, fmt.Sprintf("%s: %d further problems not listed", e.Path, e.More))
	}
	if e.Err != nil {
		out = append(out, e.Error())
	}
	return out
}

// problems gathers a file's problems, keeping at most maxProblems.
type problems struct {
	path  string
	list  []Problem
	count int
}

func (p *problems) add(line int, text string) {
	p.count++
	if len(p.list) < maxProblems {
		p.list = append(p.list, Problem{Line: line, Text: text})
	}
}

func (p *problems) err() *LoadError {
	return &LoadError{Path: p.path, Problems: p.list, More: p.count - len(p.list)}
}

// quoteName is a user name for a message: quoted, and cut at 64 bytes so
// that a long name does not make a long log line.
func quoteName(name string) string {
	const most = 64
	if len(name) <= most {
		return fmt.Sprintf("%q", name)
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…", name[:cut])
}
