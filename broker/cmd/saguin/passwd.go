package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"saguin.dev/broker/passwd"
)

// passwdUsageLine is saguin --passwd's usage (docs/configuration.md "Password files and `saguin --passwd`", docs/operations.md "Operators").
const passwdUsageLine = "usage: saguin --passwd list FILE | add FILE USER [PASSWORD] | delete FILE USER | scope FILE USER ROUTES|all"

// runPasswd is saguin --passwd: list, add, delete or scope one user of a
// password file. It reads no configuration, so it cannot know whether FILE
// is an MQTT or an operator file: it reads it as either (passwd.AnyKind).
// Exit 0 when done, 1 when the file or a value is wrong (nothing written),
// 2 for a usage mistake. configGiven is whether --config, --check-config
// or --route was given.
func runPasswd(args []string, configGiven bool, stdin *os.File, stdout, stderr io.Writer) int {
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "saguin --passwd: "+format+"\n%s\n", append(a, passwdUsageLine)...)
		return 2
	}
	if configGiven || slices.ContainsFunc(args, isConfigFlag) {
		return usage("--passwd edits a password file and reads no configuration; leave out --config, --check-config and --route")
	}
	if len(args) == 0 {
		return usage("say what to do: list, add, delete or scope")
	}
	want := map[string][2]int{"list": {1, 1}, "add": {2, 3}, "delete": {2, 2}, "scope": {3, 3}}
	n, known := want[args[0]]
	if !known {
		return usage("%q is not one of list, add, delete or scope", args[0])
	}
	rest := args[1:]
	if len(rest) < n[0] || len(rest) > n[1] {
		return usage("%s takes %s", args[0], map[string]string{
			"list": "FILE", "add": "FILE USER [PASSWORD]", "delete": "FILE USER", "scope": "FILE USER ROUTES|all",
		}[args[0]])
	}
	if strings.HasPrefix(rest[0], "-") {
		return usage("%q looks like a flag, not a file; write ./%s for a file of that name", rest[0], rest[0])
	}
	fail := func(err error) int {
		var le *passwd.LoadError
		if errors.As(err, &le) && le.Err == nil {
			unchanged := "; nothing written"
			if args[0] == "list" {
				unchanged = ""
			}
			fmt.Fprintf(stderr, "saguin --passwd: %s does not load%s:\n", le.Path, unchanged)
			for _, l := range le.Lines() {
				fmt.Fprintf(stderr, "  %s\n", l)
			}
			return 1
		}
		fmt.Fprintf(stderr, "saguin --passwd: %v\n", err)
		return 1
	}
	cmd := passwdCommand{path: rest[0], stdin: stdin, stdout: stdout, stderr: stderr}
	var err error
	switch args[0] {
	case "list":
		err = cmd.list()
	case "add":
		err = cmd.add(rest[1], rest[2:])
	case "delete":
		err = cmd.delete(rest[1])
	case "scope":
		err = cmd.scope(rest[1], rest[2])
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// isConfigFlag: --passwd refuses the flags that read a configuration even
// as operands after "--", where the flag package does not look.
func isConfigFlag(arg string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return strings.HasPrefix(arg, "-") && (name == "config" || name == "check-config" || name == "route")
}

type passwdCommand struct {
	path           string
	stdin          *os.File
	stdout, stderr io.Writer
}

func (c passwdCommand) read() (*passwd.File, error) {
	return passwd.ReadFile(c.path, passwd.AnyKind)
}

// list prints the users in file order, with a scope column when any user
// has a scope.
func (c passwdCommand) list() error {
	f, err := c.read()
	if err != nil {
		return err
	}
	entries := f.Entries()
	scoped := false
	for _, e := range entries {
		scoped = scoped || !e.Scope.All()
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	for _, e := range entries {
		if scoped {
			fmt.Fprintf(tw, "%s\t%s\n", e.User, e.Scope.Describe())
		} else {
			fmt.Fprintln(tw, e.User)
		}
	}
	if len(entries) == 0 {
		fmt.Fprintf(c.stderr, "%s names no user\n", c.path)
	}
	return tw.Flush()
}

// add sets user's password, creating the file (mode 0600) when missing.
// The name and the file are checked before the password is asked for.
func (c passwdCommand) add(user string, password []string) error {
	if err := passwd.CheckFileUserName(user); err != nil {
		return fmt.Errorf("user %q refused: %w", user, err)
	}
	f, err := c.read()
	if errors.Is(err, fs.ErrNotExist) {
		f, err = passwd.NewFile(c.path, passwd.AnyKind), nil
	}
	if err != nil {
		return err
	}
	var pw []byte
	if len(password) == 1 {
		pw = []byte(password[0])
	} else if pw, err = readPassword(c.stdin, c.stderr); err != nil {
		return err
	}
	h, err := passwd.NewHash(pw)
	if err != nil {
		return fmt.Errorf("%v; nothing written", err)
	}
	added, err := f.Set(user, h)
	if err != nil {
		return err
	}
	if err := f.Write(); err != nil {
		return err
	}
	if added {
		fmt.Fprintf(c.stdout, "%s: added user %s\n", c.path, user)
	} else {
		fmt.Fprintf(c.stdout, "%s: changed the password of %s\n", c.path, user)
	}
	return nil
}

// delete removes user; a user who is not there is not an error (the file
// is then left as it is).
func (c passwdCommand) delete(user string) error {
	f, err := c.read()
	if err != nil {
		return err
	}
	if !f.Delete(user) {
		fmt.Fprintf(c.stdout, "%s: no user %s; nothing changed\n", c.path, user)
		return nil
	}
	if err := f.Write(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s: deleted user %s\n", c.path, user)
	if f.Len() == 0 {
		fmt.Fprintf(c.stderr, "warning: %s now names no user; as an operator password file it no longer loads\n", c.path)
	}
	return nil
}

// scope replaces user's whole route list ("all": every route, the field
// removed) and prints the new scope and the one it replaced.
func (c passwdCommand) scope(user, routes string) error {
	var s passwd.Scope
	if routes != "all" {
		var err error
		if s, err = passwd.ParseScope(routes); err != nil {
			return fmt.Errorf("scope %q refused: %w", routes, err)
		}
	}
	f, err := c.read()
	if err != nil {
		return err
	}
	prev, err := f.SetScope(user, s)
	if err != nil {
		return err
	}
	if err := f.Write(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "%s: %s now reaches %s (before: %s)\n", c.path, user, s.Describe(), prev.Describe())
	if !s.All() {
		fmt.Fprintf(c.stderr, "note: a scope makes %s an operator password file; an MQTT password file with one does not load\n", c.path)
	}
	return nil
}

// readPassword asks for the password: twice, echo off, on a terminal; one
// line otherwise (a pipe, a file), so a script can give it without it
// showing in the process list.
func readPassword(stdin *os.File, stderr io.Writer) ([]byte, error) {
	if terminal(stdin) {
		first, err := readHidden(stdin, "Password: ", stderr)
		if err != nil {
			return nil, err
		}
		again, err := readHidden(stdin, "Reenter password: ", stderr)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(first, again) {
			return nil, errors.New("the passwords do not match; nothing written")
		}
		return first, nil
	}
	return readLine(bufio.NewReaderSize(stdin, 4096))
}

// readLine reads one password line, without its "\n" or "\r\n", at most
// passwd.MaxPassword bytes of it (invariant 13: bounded before it is
// held).
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		// invariant 13: a line longer than any password is refused before it is held.
		if len(line)+len(chunk) > passwd.MaxPassword+2 {
			return nil, fmt.Errorf("the password is longer than %d bytes, the most MQTT carries; nothing written", passwd.MaxPassword)
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF && len(line) == 0 {
			return nil, errors.New("no password on standard input; nothing written")
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("reading the password: %w", err)
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		return bytes.TrimSuffix(line, []byte("\r")), nil
	}
}
