package passwd

import (
	"fmt"
	"slices"
	"strings"
)

// operatorRoutes are the operations listener's routes that ask for
// credentials (docs/operations.md "Operators"; /health never does). queues is one route
// with a channel under it: /v1/operations/queues/<channel>.
var operatorRoutes = [...]string{
	"/metrics",
	"/v1/operations",
	"/v1/operations/acl",
	"/v1/operations/config",
	"/v1/operations/consumers",
	"/v1/operations/queues",
	"/v1/operations/position-lost",
	"/v1/operations/refused",
	"/v1/operations/sessions",
	"/v1/operations/users",
}

// OperatorRoutes returns the routes a scope may name: the one list the
// operator file's loader and the operations listener share, so that a
// scope can name exactly what is served.
func OperatorRoutes() []string { return slices.Clone(operatorRoutes[:]) }

// RouteReaches says whether a scope naming route reaches a request for
// path, by path-segment boundary (docs/operations.md "Operators"): /v1/operations reaches
// /v1/operations and /v1/operations/consumers, never /v1/operationsXYZ.
// path is the request's decoded URL path; one that is not clean — not
// absolute, or holding an empty, "." or ".." segment — is reached by no
// route, so a path the router would resolve elsewhere never slips past a
// prefix.
func RouteReaches(route, path string) bool {
	if !cleanPath(path) {
		return false
	}
	return path == route || strings.HasPrefix(path, route) && path[len(route)] == '/'
}

// cleanPath: absolute, and no empty, "." or ".." segment (a trailing '/'
// is allowed).
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i != len(segs)-1) {
			return false
		}
	}
	return true
}

// Scope is the routes an operator may reach: the third field of its line.
// The zero Scope (no third field) reaches every route.
type Scope struct {
	routes []string
}

// ParseScope reads a scope field: comma-separated routes, each one of
// OperatorRoutes, none twice. Blanks around a route are allowed. Its error
// says what is wrong and what to write.
func ParseScope(field string) (Scope, error) {
	if strings.TrimSpace(field) == "" {
		return Scope{}, fmt.Errorf("the scope field is empty; remove the trailing ':' to reach every route, or name routes (%s)", strings.Join(operatorRoutes[:], ", "))
	}
	var s Scope
	for part := range strings.SplitSeq(field, ",") {
		r := strings.Trim(part, blanks)
		if prob := routeProblem(r); prob != "" {
			return Scope{}, fmt.Errorf("%s", prob)
		}
		if slices.Contains(s.routes, r) {
			return Scope{}, fmt.Errorf("the scope names %s twice; name each route once", r)
		}
		s.routes = append(s.routes, r)
	}
	return s, nil
}

// routeProblem says why r is not a route a scope may name, and the fix.
func routeProblem(r string) string {
	const q = "/v1/operations/queues/"
	switch {
	case slices.Contains(operatorRoutes[:], r):
		return ""
	case r == "":
		return "the scope has an empty route between commas; remove the extra ','"
	case r == "all":
		return "\"all\" is not written in a file; leave out the third field (and its ':') to reach every route"
	case len(r) > 1 && strings.HasSuffix(r, "/") && slices.Contains(operatorRoutes[:], strings.TrimSuffix(r, "/")):
		return fmt.Sprintf("write the route %s without the trailing '/'", strings.TrimSuffix(r, "/"))
	case strings.HasPrefix(r, q):
		return fmt.Sprintf("a scope names routes, not one queue: write %s, which reaches every queue", strings.TrimSuffix(q, "/"))
	}
	if len(r) > 64 {
		r = r[:64] + "…"
	}
	return fmt.Sprintf("%q is not a route the broker serves; a scope names routes among %s", r, strings.Join(operatorRoutes[:], ", "))
}

// All says whether s reaches every route (no third field).
func (s Scope) All() bool { return len(s.routes) == 0 }

// Routes returns the routes s names (none when it reaches every route).
func (s Scope) Routes() []string { return slices.Clone(s.routes) }

// Reaches says whether s reaches a request for path (RouteReaches of any
// of its routes; every clean path when s reaches every route).
func (s Scope) Reaches(path string) bool {
	if s.All() {
		return cleanPath(path)
	}
	for _, r := range s.routes {
		if RouteReaches(r, path) {
			return true
		}
	}
	return false
}

// String is the scope as the third field writes it ("" for every route).
func (s Scope) String() string { return strings.Join(s.routes, ",") }

// Describe is the scope for a person: "all routes" or the routes.
func (s Scope) Describe() string {
	if s.All() {
		return "all routes"
	}
	return s.String()
}

func (s Scope) equal(o Scope) bool { return slices.Equal(s.routes, o.routes) }
