package passwd

// ScopeOf is the routes user reaches, with no password checked: for an
// operator whose name something else verified — a client certificate the
// door checked, or a proxy in front of a unix door (docs/operations.md "Who the caller is"). ok is
// false when the file does not name user. Unlike Authenticate it returns
// at once: the name was proven already, so whether it is listed is no
// secret from the caller.
func (t *Table) ScopeOf(user string) (s Scope, ok bool) {
	a, ok := t.users[user]
	return a.scope, ok
}
