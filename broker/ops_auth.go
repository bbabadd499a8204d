package broker

import (
	"fmt"
	"sort"

	"saguin.dev/broker/config"
	"saguin.dev/broker/passwd"
)

// The operations listener's password files (docs/operations.md "Operators"): operators,
// kept apart from MQTT clients, read at start and by SIGUSR1 with the MQTT
// files and the ACL, all or nothing (auth.go authority).

// operatorFiles are the operator password files: the block's and every
// door's own, each once, sorted.
func operatorFiles(cfg *config.Config) []string {
	o := cfg.Broker.Operations
	if o == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range append([]string{o.PasswordFile}, doorFiles(o.Listeners)...) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

func doorFiles(ls []config.Listener) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.PasswordFile
	}
	return out
}

// loadOperators reads every operator file, adding what fails to errs.
func loadOperators(cfg *config.Config, errs []error) (map[string]*passwd.Table, []error) {
	out := make(map[string]*passwd.Table)
	for _, path := range operatorFiles(cfg) {
		t, err := passwd.Load(path, passwd.Operator)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[path] = t
	}
	return out, errs
}

// OperatorPasswordCheck is the operator files' part of a start's checks,
// as a config.Check: each read as the broker reads it (passwd.Operator: a
// file naming nobody, or a scope naming a route the listener does not
// serve, does not load), each problem placed on its line; and a file
// that is also an MQTT door's is refused — operator credentials are kept
// apart from clients' (docs/operations.md "Operators"), so a client's password never opens
// the operations routes.
func OperatorPasswordCheck(cfg *config.Config) []config.Finding {
	var out []config.Finding
	mqtt := map[string]string{}
	for _, path := range passwordFiles(cfg) {
		mqtt[path] = passwordFileKey(cfg, path)
	}
	for _, path := range operatorFiles(cfg) {
		key := operatorFileKey(cfg, path)
		if other, shared := mqtt[path]; shared {
			out = append(out, cfg.At(key, fmt.Sprintf(
				"is also the MQTT password file of %s; operator credentials are kept apart from MQTT clients': give the operators a file of their own (saguin --passwd add FILE USER)", other)))
			continue
		}
		if _, err := passwd.Load(path, passwd.Operator); err != nil {
			out = append(out, passwordFindings(path, key, err)...)
		}
	}
	return out
}

// operatorFileKey is the key that names the operator file at path: the
// block's, else the first door's.
func operatorFileKey(cfg *config.Config, path string) string {
	o := cfg.Broker.Operations
	if o.PasswordFile == path {
		return "broker.operations.password_file"
	}
	for _, l := range o.Listeners {
		if l.PasswordFile == path {
			return l.ID + ".password_file"
		}
	}
	return "broker.operations.password_file"
}

// logOperators says which operator files the broker now holds, and how
// many operators each names.
func (b *Broker) logOperators(a *authority, prefix string) {
	for _, path := range operatorFiles(b.cfg) {
		if t := a.operators[path]; t != nil {
			b.log.Info(prefix+"operator password file read", "path", path, "operators", t.Len())
		}
	}
}
