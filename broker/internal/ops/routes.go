package ops

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"

	doorpkg "saguin.dev/broker/internal/door"
)

// queuesPrefix is the route of one queue: /v1/operations/queues/<channel>.
const queuesPrefix = "/v1/operations/queues/"

var (
	getOnly    = []string{http.MethodGet}
	getAndHead = []string{http.MethodGet, http.MethodHead}
)

// handler serves one door: /health to anyone, every other route to the
// callers authorize admits and whose scope reaches it.
func (s *Server) handler(d *door) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Counted under the lock Close takes, so Close never waits while a
		// request it did not see begins.
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusServiceUnavailable, "the broker is shutting down")
			return
		}
		s.handling.Add(1)
		s.mu.Unlock()
		defer s.handling.Done()
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		s.route(d, w, r)
	})
}

// route finds the request's route (404), checks its method (405), then
// its caller (401, 403), then serves it. The path is matched exactly as
// sent, after decoding: no redirect, no trailing '/', no "..".
func (s *Server) route(d *door, w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	if p == "/health" {
		// docs/operations.md "The routes": never authenticated.
		if allowed(w, r, getAndHead) {
			s.health(w)
		}
		return
	}
	methods := getOnly
	var serve func(w http.ResponseWriter, r *http.Request)
	switch p {
	case "/metrics":
		methods, serve = getAndHead, s.metrics.ServeHTTP
	case "/v1/operations/acl":
		serve = s.acl
	case "/v1/operations/config":
		serve = s.config
	case "/v1/operations/consumers":
		serve = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.src.Consumers(MaxRows)) }
	case "/v1/operations/position-lost":
		serve = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.src.PositionLost(MaxRows)) }
	case "/v1/operations/refused":
		serve = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.src.Refused(MaxRows)) }
	case "/v1/operations/sessions":
		serve = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.src.Sessions(MaxRows)) }
	case "/v1/operations/users":
		serve = func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.src.Users(MaxRows)) }
	default:
		if name, ok := strings.CutPrefix(p, queuesPrefix); ok && name != "" && !strings.Contains(name, "/") {
			serve = func(w http.ResponseWriter, _ *http.Request) { s.queue(w, name) }
			break
		}
		writeError(w, http.StatusNotFound, "no such route; the routes are /health, /metrics and /v1/operations/{acl,config,consumers,position-lost,queues/<channel>,refused,sessions,users}")
		return
	}
	if !allowed(w, r, methods) {
		return
	}
	a, ref := s.authorize(d, r, peerOf(r))
	if ref == nil && !a.reaches(p) {
		ref = &refusal{http.StatusForbidden, refuseScope, beyondScope(a, p)}
	}
	if ref != nil {
		s.refuse(d, w, r, ref)
		return
	}
	s.log.Debug("operations request", "listener", d.cfg.Name, "path", p, "caller", a.who, "remote", remoteOf(r))
	serve(w, r)
}

// beyondScope says why a known caller does not reach p.
func beyondScope(a access, p string) string {
	if a.stranger {
		if a.name == "" {
			return "the verified certificate names nobody: it reaches /metrics only"
		}
		return "the " + a.who + " name is not in the operator password file: it reaches /metrics only"
	}
	return "this operator's scope (" + a.scope.Describe() + ") does not reach " + cutString(p, 128)
}

// refuse answers a refused request and logs it, rate-limited per remote
// host: the status and why, never the credential.
func (s *Server) refuse(d *door, w http.ResponseWriter, r *http.Request, ref *refusal) {
	if ref.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="saguin operations", charset="UTF-8"`)
	}
	s.refused(d, remoteOf(r), ref.kind, "operations request refused",
		"status", ref.status, "path", cutString(r.URL.Path, 128), "reason", ref.reason)
	writeError(w, ref.status, ref.reason)
}

// allowed answers 405, naming the methods the route takes, for any other.
func allowed(w http.ResponseWriter, r *http.Request, methods []string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, "this route takes "+strings.Join(methods, " and ")+" only")
	return false
}

// health is /health: 200 when the broker's publish path can be entered
// within healthWithin, else 503. A HEAD gets the status alone (net/http
// writes no body for it).
func (s *Server) health(w http.ResponseWriter) {
	status, body := http.StatusOK, `{"status":"ok"}`
	if !s.src.PublishPathOpen(healthWithin) {
		status, body = http.StatusServiceUnavailable, `{"status":"unavailable"}`
	}
	writeBody(w, status, "application/json", []byte(body+"\n"))
}

// acl is /v1/operations/acl?user=<name>[&client_id=<id>].
func (s *Server) acl(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	users, ids := q["user"], q["client_id"]
	if len(users) != 1 {
		writeError(w, http.StatusBadRequest, "give the user once: /v1/operations/acl?user=<name>[&client_id=<id>]")
		return
	}
	var clientID *string
	switch len(ids) {
	case 0:
	case 1:
		clientID = &ids[0]
	default:
		writeError(w, http.StatusBadRequest, "give client_id at most once")
		return
	}
	writeJSON(w, s.src.ExplainACL(users[0], clientID))
}

// config is /v1/operations/config[?section=…]: the document rendered at
// start, narrowed to the sections named (docs/operations.md "The routes").
func (s *Server) config(w http.ResponseWriter, r *http.Request) {
	body, err := s.doc.render(r.URL.Query()["section"])
	if err != nil {
		writeErrorWith(w, http.StatusBadRequest, map[string]any{"error": err.Error(), "sections": Sections})
		return
	}
	writeBody(w, http.StatusOK, "application/json", body)
}

// queue is /v1/operations/queues/<channel>. An unknown name is a 404 that
// names no queue: which queues exist is for callers the route admits.
func (s *Server) queue(w http.ResponseWriter, name string) {
	q, ok, err := s.src.Queue(name, MaxRows)
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, "no queue channel has this name")
		return
	case err != nil:
		s.log.Error("operations: reading a queue", "channel", name, "error", err)
		writeError(w, http.StatusInternalServerError, "the queue's store could not be read: "+err.Error())
		return
	}
	writeJSON(w, q)
}

// remoteOf is the request's client: the address a PROXY header gave, else
// the socket's (r.RemoteAddr is taken before the header is read).
func remoteOf(r *http.Request) string {
	if sc, ok := r.Context().Value(connKey{}).(*slotConn); ok {
		if dc, ok := sc.Conn.(*doorpkg.Conn); ok {
			if a := dc.RemoteAddr(); a != nil {
				if s := a.String(); s != "" && s != "@" {
					return s
				}
			}
		}
	}
	if _, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return r.RemoteAddr
	}
	return "unix"
}

// writeJSON answers v as JSON. What a route builds always marshals; a
// value that does not is the broker's fault, a 500.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "the answer could not be written as JSON: "+err.Error())
		return
	}
	writeBody(w, http.StatusOK, "application/json", append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeErrorWith(w, status, map[string]any{"error": msg})
}

// writeErrorWith answers an error whose body says more than its message.
func writeErrorWith(w http.ResponseWriter, status int, body map[string]any) {
	b, _ := json.Marshal(body) // strings and string lists: always marshal
	writeBody(w, status, "application/json", append(b, '\n'))
}

func writeBody(w http.ResponseWriter, status int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
