package passwd_test

import (
	"slices"
	"testing"

	"saguin.dev/broker/passwd"
)

// docs/operations.md "Operators": a scope reaches by path segment — /v1/operations grants
// /v1/operations/consumers but not /v1/operationsXYZ — and a path that
// is not clean is reached by nothing, so "/metrics/../v1/operations/users"
// does not pass as under /metrics.
func TestRouteReachesBySegment(t *testing.T) {
	for _, c := range []struct {
		route, path string
		want        bool
	}{
		{"/v1/operations", "/v1/operations", true},
		{"/v1/operations", "/v1/operations/", true},
		{"/v1/operations", "/v1/operations/consumers", true},
		{"/v1/operations", "/v1/operations/queues/jobs", true},
		{"/v1/operations", "/v1/operationsXYZ", false},
		{"/v1/operations", "/v1/operations-old/x", false},
		{"/v1/operations", "/v1", false},
		{"/v1/operations/queues", "/v1/operations/queues/jobs", true},
		{"/v1/operations/queues", "/v1/operations/queuesX", false},
		{"/v1/operations/queues", "/v1/operations/consumers", false},
		{"/metrics", "/metrics", true},
		{"/metrics", "/metricsx", false},
		{"/metrics", "/metrics/../v1/operations/users", false},
		{"/metrics", "/metrics/./x", false},
		{"/metrics", "/metrics//x", false},
		{"/metrics", "metrics", false},
		{"/metrics", "", false},
	} {
		if got := passwd.RouteReaches(c.route, c.path); got != c.want {
			t.Errorf("RouteReaches(%q, %q) = %v, want %v", c.route, c.path, got, c.want)
		}
	}
}

// The served routes are exported once, and a copy: a caller cannot change
// what the next caller reads.
func TestOperatorRoutes(t *testing.T) {
	r := passwd.OperatorRoutes()
	want := []string{"/metrics", "/v1/operations", "/v1/operations/acl", "/v1/operations/config",
		"/v1/operations/consumers", "/v1/operations/queues", "/v1/operations/position-lost",
		"/v1/operations/refused", "/v1/operations/sessions", "/v1/operations/users"}
	if !slices.Equal(r, want) {
		t.Fatalf("OperatorRoutes() = %v", r)
	}
	r[0] = "/changed"
	if passwd.OperatorRoutes()[0] != "/metrics" {
		t.Error("OperatorRoutes returns the package's own slice")
	}
	if slices.Contains(r, "/health") {
		t.Error("/health never asks for credentials, so no scope names it")
	}
}

// A scope is a whole list, each route served, blanks allowed; every route
// of OperatorRoutes may be named.
func TestParseScope(t *testing.T) {
	s, err := passwd.ParseScope(" /metrics , /v1/operations/consumers")
	if err != nil || s.String() != "/metrics,/v1/operations/consumers" || s.All() {
		t.Fatalf("ParseScope: %v %v", s, err)
	}
	if !s.Reaches("/metrics") || !s.Reaches("/v1/operations/consumers/x") || s.Reaches("/v1/operations") || s.Reaches("/v1/operations/users") {
		t.Errorf("scope %v reaches the wrong paths", s)
	}
	for _, r := range passwd.OperatorRoutes() {
		if _, err := passwd.ParseScope(r); err != nil {
			t.Errorf("served route %s refused: %v", r, err)
		}
	}
	var all passwd.Scope
	if !all.All() || !all.Reaches("/v1/operations/users") || all.Describe() != "all routes" {
		t.Error("the zero Scope does not reach every route")
	}
}
