package passwd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// File is a password file as saguin --passwd edits it: every line kept as
// written, so that changing one user rewrites that user's line and leaves
// every other line — comments, blank lines, line endings — byte for byte.
type File struct {
	path   string
	kind   Kind
	lines  []line
	byUser map[string]int // user → index in lines
	// read is the file as it was read; nil for a file that did not exist.
	// Write refuses to replace a file that changed since.
	read os.FileInfo
}

// NewFile is an empty file of kind at path, which does not exist yet:
// Write creates it, mode 0600.
func NewFile(path string, kind Kind) *File {
	return &File{path: path, kind: kind, byUser: map[string]int{}}
}

// ReadFile reads the file at path as a file of kind, at most MaxFileBytes
// of it. The error is a *LoadError: its Err is set when the file could not
// be read (errors.Is(err, fs.ErrNotExist) for a missing file), its
// Problems when what was read is not a valid file.
func ReadFile(path string, kind Kind) (*File, error) {
	data, info, err := readBounded(path)
	if err != nil {
		return nil, &LoadError{Path: path, Err: err}
	}
	f, err := Parse(path, data, kind)
	if err != nil {
		return nil, err
	}
	f.read = info
	return f, nil
}

// readBounded reads a regular file, at most one byte more than
// MaxFileBytes, so that Parse can refuse a larger one without the reader
// ever holding it whole.
func readBounded(path string) ([]byte, os.FileInfo, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	info, err := fh.Stat()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case info.IsDir():
		return nil, nil, errors.New("is a directory; name the password file itself")
	case !info.Mode().IsRegular():
		return nil, nil, fmt.Errorf("is not a regular file (%v); name the password file itself", info.Mode().Type())
	}
	// invariant 13: at most one byte past the bound is ever read.
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, nil, err
	}
	return data, info, nil
}

// Path is the file's path as given.
func (f *File) Path() string { return f.path }

// Kind is the kind the file was read as.
func (f *File) Kind() Kind { return f.kind }

// Len is the number of users.
func (f *File) Len() int { return len(f.byUser) }

// Entries are the users in file order.
func (f *File) Entries() []Entry {
	out := make([]Entry, 0, len(f.byUser))
	for _, l := range f.lines {
		if l.entry != nil {
			out = append(out, *l.entry)
		}
	}
	return out
}

// Lookup is user's entry.
func (f *File) Lookup(user string) (Entry, bool) {
	i, ok := f.byUser[user]
	if !ok {
		return Entry{}, false
	}
	return *f.lines[i].entry, true
}

// Set gives user the hash h: the user's line is rewritten (its scope kept)
// or, for a new user, a line is added at the end. It refuses a name that
// could not be read back as itself (empty, ':', control characters, a
// leading '#' or blank; docs/configuration.md "Password files and `saguin --passwd`", docs/operations.md "Operators").
func (f *File) Set(user string, h Hash) (added bool, err error) {
	if err := CheckFileUserName(user); err != nil {
		return false, err
	}
	if h.typ == "" {
		return false, errors.New("no hash to store")
	}
	if i, ok := f.byUser[user]; ok {
		e := *f.lines[i].entry
		e.Hash = h
		f.replace(i, e)
		return false, nil
	}
	f.append(Entry{User: user, Hash: h})
	return true, nil
}

// SetScope replaces user's whole scope with s (the zero Scope: every
// route, and no third field) and returns the scope it had.
func (f *File) SetScope(user string, s Scope) (previous Scope, err error) {
	i, ok := f.byUser[user]
	if !ok {
		return Scope{}, fmt.Errorf("%s has no user %s; add the user first (saguin --passwd add)", f.path, quoteName(user))
	}
	if f.kind == MQTT && !s.All() {
		return Scope{}, errors.New("an MQTT password file takes no scope")
	}
	e := *f.lines[i].entry
	previous, e.Scope = e.Scope, s
	f.replace(i, e)
	return previous, nil
}

// Delete removes user's line; false when there was no such user.
func (f *File) Delete(user string) bool {
	i, ok := f.byUser[user]
	if !ok {
		return false
	}
	f.lines = append(f.lines[:i], f.lines[i+1:]...)
	delete(f.byUser, user)
	for u, j := range f.byUser {
		if j > i {
			f.byUser[u] = j - 1
		}
	}
	return true
}

// Bytes is the file's contents as Write would write them.
func (f *File) Bytes() []byte {
	var b bytes.Buffer
	for _, l := range f.lines {
		b.Write(l.raw)
	}
	return b.Bytes()
}

// format is an entry's line without its terminator: user:hash, and
// :routes when it has a scope.
func format(e Entry) []byte {
	s := e.User + ":" + e.Hash.String()
	if !e.Scope.All() {
		s += ":" + e.Scope.String()
	}
	return []byte(s)
}

// replace rewrites line i as e, keeping the line's own terminator.
func (f *File) replace(i int, e Entry) {
	old := f.lines[i].raw
	term := old[len(bytes.TrimRight(old, "\r\n")):]
	f.lines[i] = line{raw: append(format(e), term...), entry: &e}
}

// append adds e as the last line, ending it as the file's lines end (as
// the last line that has an ending: "\r\n" or "\n"), and first ends a last
// line that had none.
func (f *File) append(e Entry) {
	nl := []byte("\n")
	for i := len(f.lines) - 1; i >= 0; i-- {
		if raw := f.lines[i].raw; bytes.HasSuffix(raw, nl) {
			if bytes.HasSuffix(raw, []byte("\r\n")) {
				nl = []byte("\r\n")
			}
			break
		}
	}
	if n := len(f.lines); n > 0 && !bytes.HasSuffix(f.lines[n-1].raw, []byte("\n")) {
		f.lines[n-1].raw = append(bytes.Clone(f.lines[n-1].raw), nl...)
	}
	f.byUser[e.User] = len(f.lines)
	f.lines = append(f.lines, line{raw: append(format(e), nl...), entry: &e})
}
