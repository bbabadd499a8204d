package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/config"
	"saguin.dev/broker/topic"
)

// aclHeader names --acl's seven TSV columns (docs/operations.md "The command line").
const aclHeader = "# user\trole\tkind\tsubject\tverbs\trate\tbytes"

// aclRequest is what the command line asked of --acl.
type aclRequest struct {
	configPath string
	asJSON     bool
	user       *string // nil: names come from stdin, one per line
	clientID   *string // nil: no client id asked about
}

// explainACL is --acl CONFIG [USER [CLIENT-ID]] [--json] (docs/operations.md "The command line",
// docs/operations.md "The command line"): what a client may do under the configuration's acl_file,
// read and checked as a start would, and nothing started. fs has parsed
// the flags up to the first operand, configPath and asJSON being its
// --acl and --json; the operands and any flags after them are read here.
func explainACL(fs *flag.FlagSet, operands []string, configPath string, asJSON bool, stdin io.Reader, stdout, stderr io.Writer) int {
	usageError := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "saguin: "+format+"\n%s\n", append(a, usageLine)...)
		return 2
	}
	var others []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "acl" && f.Name != "json" {
			others = append(others, "--"+f.Name)
		}
	})
	switch {
	case len(others) > 0:
		return usageError("--acl is given with %s: --acl explains the ACL of the configuration it names, and starts nothing; give one of them", strings.Join(others, " and "))
	case len(operands) > 2:
		return usageError("--acl takes a user and a client id at most, not also %q", operands[2])
	}
	req := aclRequest{configPath: configPath, asJSON: asJSON}
	if len(operands) > 0 {
		req.user = &operands[0]
	}
	if len(operands) > 1 {
		req.clientID = &operands[1]
	}
	for _, s := range []*string{req.user, req.clientID} {
		if s != nil {
			if prob := nameProblem(*s); prob != "" {
				fmt.Fprintf(stderr, "saguin: %q: %s\n", *s, prob)
				return 1
			}
		}
	}

	cfg, err := config.Load(req.configPath, acl.Check)
	if err != nil {
		printInvalid(stderr, err)
		return 1
	}
	var rules *acl.ACL
	if cfg.Broker.ACLFile != "" {
		if rules, err = acl.Load(cfg.Broker.ACLFile, cfg); err != nil {
			printInvalid(stderr, err)
			return 1
		}
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	e := aclExplainer{rules: rules, limits: cfg.Broker.Limits, asJSON: req.asJSON, out: out}
	if !req.asJSON {
		fmt.Fprintln(out, aclHeader)
	}
	if req.user != nil {
		e.explain(*req.user, req.clientID)
		return 0
	}
	return e.explainStdin(stdin, stderr)
}

// aclExplainer writes one name's explanation at a time.
type aclExplainer struct {
	rules  *acl.ACL // nil: no acl_file, everything allowed
	limits config.Limits
	asJSON bool
	out    *bufio.Writer
}

// maxNameLine bounds a line of the stdin list (invariant 13): the longest
// user name MQTT carries, its line end and a CR.
const maxNameLine = topic.MaxLength + 2

// explainStdin explains each name of a list, one per line (LF or CRLF);
// blank lines are skipped (the anonymous identity is asked with an operand ""). A name
// that cannot be one is reported on stderr and the list goes on; the exit
// is then 1.
func (e aclExplainer) explainStdin(stdin io.Reader, stderr io.Writer) int {
	sc := bufio.NewScanner(stdin)
	// invariant 13: a line is read into at most maxNameLine bytes.
	sc.Buffer(make([]byte, 0, 4096), maxNameLine)
	code := 0
	for n := 1; sc.Scan(); n++ {
		name := sc.Text() // ScanLines takes a CRLF's CR off too
		if name == "" {
			continue
		}
		if prob := nameProblem(name); prob != "" {
			fmt.Fprintf(stderr, "saguin: stdin line %d: %s; skipped\n", n, prob)
			code = 1
			continue
		}
		e.explain(name, nil)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("a line is longer than %d bytes, the longest user name MQTT carries", topic.MaxLength)
		}
		fmt.Fprintf(stderr, "saguin: reading names from stdin: %v\n", err)
		return 1
	}
	return code
}

// nameProblem refuses what cannot be a user name or client id: what the
// broker refuses at CONNECT, and what would break a TSV row.
func nameProblem(s string) string {
	switch {
	case len(s) > topic.MaxLength:
		return fmt.Sprintf("is %d bytes; MQTT carries at most %d", len(s), topic.MaxLength)
	case strings.ContainsFunc(s, func(c rune) bool { return c < 0x20 || (c >= 0x7f && c <= 0x9f) }):
		return "holds a control character, which no user name or client id may (the broker refuses it at CONNECT)"
	}
	return ""
}

func (e aclExplainer) explain(user string, clientID *string) {
	x := acl.NoACL(user)
	if e.rules != nil {
		x = e.rules.Explain(user, clientID)
	} else {
		x.Limits = acl.PublishLimits{Rate: e.limits.PublishRate, Bytes: e.limits.PublishBytes}
	}
	if e.asJSON {
		line, _ := json.Marshal(x) // plain strings and lists: cannot fail
		e.out.Write(append(line, '\n'))
		return
	}
	writeACLRows(e.out, x, clientID)
}

// writeACLRows is one name's explanation as TSV rows of seven columns:
// the patterns that matched (verbs "applies" or "shadowed"), whether the
// client id may use the name, each grant, each withheld rule; a name
// granted nothing is one row of "-". rate and bytes are the publish
// figures that apply to the name, "no bound" where there is none.
func writeACLRows(w io.Writer, x acl.Explanation, clientID *string) {
	rate, bytes := "no bound", "no bound"
	if x.Limits.Rate > 0 {
		rate = strconv.Itoa(x.Limits.Rate)
	}
	if x.Limits.Bytes > 0 {
		bytes = config.FormatBytes(x.Limits.Bytes)
	}
	row := func(role, kind, subject, verbs string) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.User, role, kind, subject, verbs, rate, bytes)
	}
	if x.ACLFile == nil {
		row("-", "-", "-", "everything")
		return
	}
	for i, p := range x.PatternsMatched {
		verdict := "shadowed"
		if i == 0 {
			verdict = "applies"
		}
		row("-", "pattern", p, verdict)
	}
	if x.ClientIDAllowed != nil {
		verdict := "allowed"
		if !*x.ClientIDAllowed {
			verdict = "refused"
		}
		row("-", "client_id", *clientID, verdict)
	}
	for _, g := range x.Grants {
		row(g.Role, g.Kind, g.Subject, g.VerbsText())
	}
	for _, g := range x.GrantsWithheld {
		row(g.Role, g.Kind, g.Subject, "withheld: "+g.Reason)
	}
	if len(x.PatternsMatched) == 0 {
		row("-", "-", "-", "-")
	}
}
