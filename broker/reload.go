package broker

import (
	"errors"
	"log/slog"

	"saguin.dev/broker/config"
	"saguin.dev/broker/passwd"
)

// maxReloadLines bounds the error lines one re-read logs for its broken
// files; saguin --check-config shows them all.
const maxReloadLines = 20

// ReloadAuthority is SIGUSR1's part (3) (docs/operations.md "Signals"): every MQTT
// password file, every operator password file (docs/operations.md "Who the caller is") and the ACL
// read again from the paths the broker started with, all or nothing. A file that does not load changes nothing — each
// problem is logged at error naming its file and line, and the broker
// keeps serving on what it had; otherwise the new files are swapped in
// whole, each logs what it now holds, and every delivery a withdrawn grant
// stalled is woken to ask again (a grant that came back resumes it,
// invariant 16). cfg is the configuration the broker started with: which
// files are named is startup-only (docs/operations.md "The command line"); their contents are not.
func (b *Broker) ReloadAuthority() error {
	next, err := loadAuthority(b.cfg, b.authGen.Add(1))
	if err != nil {
		n := 0
		for _, line := range reloadProblems(err) {
			if n == maxReloadLines {
				b.log.Error("SIGUSR1: further problems not logged; run saguin --check-config to see them all")
				break
			}
			b.log.Error("SIGUSR1: password files and ACL not re-read: nothing changed", "problem", line)
			n++
		}
		return err
	}
	b.auth.Store(next)
	b.logAuthority(next, "SIGUSR1: ")
	b.permissionsChanged()
	return nil
}

// reloadProblems flattens a load's error into one line per problem.
func reloadProblems(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		var le *passwd.LoadError
		var fs *config.Findings
		switch {
		case errors.As(e, &le) && le.Err == nil:
			out = append(out, le.Lines()...)
		case errors.As(e, &fs):
			for _, f := range fs.List {
				out = append(out, f.String())
			}
		default:
			if j, ok := e.(interface{ Unwrap() []error }); ok {
				for _, x := range j.Unwrap() {
					walk(x)
				}
				return
			}
			out = append(out, e.Error())
		}
	}
	walk(err)
	return out
}

// logAuthority says what the broker now authenticates against and
// authorizes by (docs/operations.md "A start" item 2, §3.1: each part logs what it
// holds): each password file with its user count, and the ACL with its
// roles and user patterns — or that there is none.
func (b *Broker) logAuthority(a *authority, prefix string) {
	for _, path := range passwordFiles(b.cfg) {
		if t := a.passwords[path]; t != nil {
			b.log.Info(prefix+"password file read", "path", path, "users", t.Len())
		}
	}
	b.logOperators(a, prefix) // ops_auth.go
	if a.rules == nil {
		if prefix == "" && len(a.passwords) > 0 {
			b.log.Info("no acl_file: every authenticated client may do everything")
		}
		return
	}
	st := a.rules.Stats()
	b.log.Log(b.ctx, slog.LevelInfo, prefix+"authorization is on", "path", a.rules.Path(),
		"roles", st.Roles, "rules", st.Rules, "user_patterns", st.Patterns)
}
