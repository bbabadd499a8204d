package config

import (
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxUnixPath is the longest socket path the kernel's sun_path holds (108
// bytes with the terminating NUL); a longer one fails at bind, so it is
// refused at load.
const maxUnixPath = 107

// doorSet is one of the two door name spaces (docs/configuration.md "`broker.mqtt`": names are
// checked within MQTT doors and within operations doors, never across).
type doorSet struct {
	prefix string // "broker.mqtt.listen" or "broker.operations.listen"
	ops    bool
}

func (l *loader) mqtt(v val, present bool, p *parsed) {
	var anon *bool
	var listen val
	hasListen := false
	if present {
		m, ok := l.mapOf(v)
		if ok {
			if kv, has := m.get("password_file"); has {
				if s, good := l.absPath(kv, "a Mosquitto-format password file"); good {
					p.PasswordFile = s
				}
			}
			if kv, has := m.get("allow_anonymous"); has {
				if b, good := l.boolean(kv); good {
					anon = &b
					if b {
						l.anonExplicit = append(l.anonExplicit, kv)
					}
				}
			}
			if kv, has := m.get("acl_file"); has {
				if s, good := l.absPath(kv, "the ACL file"); good {
					p.ACLFile = s
				}
			}
			if kv, has := m.get("min_protocol_version"); has {
				if ver, good := l.protocolVersion(kv); good {
					p.MinProtocolVersion = ver
				}
			}
			listen, hasListen = m.get("listen")
			m.finish("listen", "password_file", "allow_anonymous", "acl_file", "min_protocol_version")
		}
	}
	if hasListen {
		p.Listeners = l.doors(listen, doorSet{prefix: "broker.mqtt.listen"}, p.PasswordFile, anon)
	}
	if len(p.Listeners) == 0 && !(hasListen && l.doorsHadEntries(listen)) {
		// docs/configuration.md "`broker.mqtt`": with no MQTT door named, one tcp door on :1883.
		allow := p.PasswordFile == ""
		if anon != nil {
			allow = *anon
		}
		p.Listeners = []Listener{{
			ID: "broker.mqtt.listen.tcp", Name: "tcp", Kind: "tcp", Address: DefaultDefaultListenAddress,
			PasswordFile: p.PasswordFile, AllowAnonymous: allow, Default: true,
		}}
		if !allow && p.PasswordFile == "" {
			l.addKey(v.file, v.line(), "broker.mqtt.allow_anonymous",
				"false with no broker.mqtt.password_file admits nobody at the default door; name a password file, or allow anonymous clients")
		}
	}
	l.checkAuth(p)
}

// doorsHadEntries reports whether a listen block named any door at all, so
// that a block whose every door was a finding does not also get the default.
func (l *loader) doorsHadEntries(v val) bool {
	return v.n != nil && v.n.Kind == yaml.MappingNode && len(v.n.Content) > 0
}

func (l *loader) protocolVersion(v val) (byte, bool) {
	s, ok := l.scalar(v, `"3.1.1" or "5"`)
	if !ok {
		return 0, false
	}
	switch s {
	case "3.1.1":
		return 4, true
	case "5":
		return 5, true
	case "3.1", "3":
		l.add(v, `MQTT 3.1 (protocol level 3) is never admitted; write "3.1.1" or "5"`)
	default:
		l.add(v, `it is "3.1.1" (the default) or "5"`)
	}
	return 0, false
}

// checkAuth applies the rules tying doors, password files and the ACL
// together (docs/configuration.md "`broker.mqtt`"; docs/configuration.md "The ACL file").
func (l *loader) checkAuth(p *parsed) {
	if p.ACLFile == "" {
		return
	}
	authenticator := p.PasswordFile != ""
	for _, d := range p.Listeners {
		if d.PasswordFile != "" || (d.TLS != nil && d.TLS.ClientCAFile != "") {
			authenticator = true
		}
	}
	if !authenticator {
		l.addKey(l.source, 0, "broker.mqtt.acl_file",
			"an ACL needs someone to name: set broker.mqtt.password_file, or a door's password_file or tls.client_ca_file")
	}
	for _, kv := range l.anonExplicit {
		l.add(kv, "true beside broker.mqtt.acl_file is refused: the ACL grants by user name and an anonymous client has none; remove it (a door with no password file and no required certificate admits anonymous clients anyway)")
	}
	if !authenticator {
		return
	}
	for _, d := range p.Listeners {
		if d.PasswordFile == "" && (d.TLS == nil || !d.TLS.RequireCertificate) {
			l.warn(d.File, d.Line, d.ID, "identifies nobody beside an acl_file: its clients are anonymous (user name \"\"), which only a \"*\" pattern matches")
		}
	}
}

func (l *loader) operations(v val, p *parsed) *Operations {
	ops := &Operations{MinScrapeInterval: DefaultMinScrapeInterval}
	m, ok := l.mapOf(v)
	if !ok {
		return ops
	}
	if kv, has := m.get("password_file"); has {
		if s, good := l.absPath(kv, "a Mosquitto-format operator password file"); good {
			ops.PasswordFile = s
		}
	}
	if kv, has := m.get("min_scrape_interval"); has {
		d, _, good := l.duration(kv, durKey{
			noneFix:  "it is 60s or more",
			min:      DefaultMinScrapeInterval,
			rangeFix: "it is 60s or more; scrapes sooner than this are answered from the previous one",
			zeroFix:  "it is 60s or more; scrapes sooner than this are answered from the previous one",
		})
		if good {
			ops.MinScrapeInterval = d
		}
	}
	m.refuse("allow_anonymous", "the operations listener never admits anonymous callers; remove the key (on a loopback address no credential is asked)")
	if lv, has := m.get("listen"); has {
		ops.Listeners = l.doors(lv, doorSet{prefix: "broker.operations.listen", ops: true}, ops.PasswordFile, nil)
		if len(ops.Listeners) == 0 && !l.doorsHadEntries(lv) {
			l.add(lv, "names no door; add tcp: {address: 127.0.0.1:9090} or unix: {path: ...}, or remove broker.operations")
		}
	} else {
		m.missing("listen", "an operations block needs at least one door, such as listen: {tcp: {address: 127.0.0.1:9090}}; or remove broker.operations")
	}
	m.finish("listen", "password_file", "min_scrape_interval")
	for _, d := range ops.Listeners {
		if d.Kind != "tcp" {
			continue
		}
		// docs/configuration.md "`broker.operations`": off loopback, someone must be asked who they are.
		if loopbackAddress(d.Address) {
			continue
		}
		if d.PasswordFile != "" || (d.TLS != nil && d.TLS.ClientCAFile != "" && d.TLS.RequireCertificate) {
			continue
		}
		l.addKey(d.File, d.Line, d.ID+".address",
			"%q is not a loopback address, so callers must authenticate: set a password_file (here or on broker.operations) or tls.client_ca_file with certificates required; or listen on 127.0.0.1", d.Address)
	}
	return ops
}

var doorKeys = map[string][]string{
	"tcp":  {"address", "tls", "password_file", "allow_anonymous", "name"},
	"ws":   {"address", "tls", "same_origin", "allowed_origins", "password_file", "allow_anonymous", "name"},
	"unix": {"path", "mode", "proxy_protocol", "password_file", "allow_anonymous", "name"},
}

// doors reads a listen block: per kind a single mapping (named after the
// kind) or a list of doors each carrying a name.
func (l *loader) doors(v val, set doorSet, blockPassword string, blockAnon *bool) []Listener {
	m, ok := l.mapOf(v)
	if !ok {
		return nil
	}
	kinds := []string{"tcp", "ws", "unix"}
	if set.ops {
		kinds = []string{"tcp", "unix"}
		m.refuse("ws", "the operations listener has tcp and unix doors only; use tcp")
	}
	var out []Listener
	for _, kind := range kinds {
		kv, has := m.get(kind)
		if !has {
			continue
		}
		base := set.prefix + "." + kind
		switch {
		case kv.n.Kind == yaml.SequenceNode:
			entries, _ := l.items(kv)
			for i, e := range entries {
				name, id := kind, base
				if s, named := peekName(e.n); named {
					name, id = s, base+"["+s+"]"
				} else if len(entries) > 1 {
					id = fmt.Sprintf("%s[%d]", base, i)
				}
				e.key = id
				em, isMap := l.mapOf(e)
				if !isMap {
					continue
				}
				if nv, hasName := em.get("name"); hasName {
					if s, good := l.str(nv, "the door's name"); good {
						if prob := nameProblem(s, 128); prob != "" {
							l.add(nv, "%s", prob)
						}
					}
				} else if len(entries) > 1 {
					l.add(e, "a list of %s doors needs a name on every entry (it names the door in logs and errors); add name:", kind)
				}
				if d, good := l.door(em, e, kind, id, name, set, blockPassword, blockAnon); good {
					out = append(out, d)
				}
			}
		default:
			em, isMap := l.mapOf(kv)
			if !isMap {
				continue
			}
			if nv, hasName := em.get("name"); hasName {
				l.add(nv, "a single door is named after its kind (%s); to name doors, write %s: as a list of entries each with a name", kind, kind)
			}
			if d, good := l.door(em, kv, kind, base, kind, set, blockPassword, blockAnon); good {
				out = append(out, d)
			}
		}
	}
	m.finish(kinds...)
	return out
}

func (l *loader) door(m *mapping, v val, kind, id, name string, set doorSet, blockPassword string, blockAnon *bool) (Listener, bool) {
	d := Listener{ID: id, Name: name, Kind: kind, File: v.file, Line: v.line(), PasswordFile: blockPassword, SameOrigin: kind == "ws"}
	good := true
	switch kind {
	case "tcp", "ws":
		if av, has := m.get("address"); has {
			if s, ok := l.str(av, "host:port, like 0.0.0.0:1883"); ok {
				if _, _, err := parseAddress(s); err != nil {
					l.add(av, "%v", err)
					good = false
				}
				d.Address = s
			} else {
				good = false
			}
		} else {
			m.missing("address", "write host:port, like 0.0.0.0:1883 (an empty host listens on every interface)")
			good = false
		}
		if tv, has := m.get("tls"); has {
			d.TLS = l.tlsBlock(tv, id)
		}
		m.refuse("proxy_protocol", "proxy_protocol is read on unix doors only; put the proxy in front of a unix: door")
		m.refuse("mode", "mode is the permission of a unix socket; a %s door has none", kind)
		m.refuse("path", "a %s door listens on an address, not a path; write address: host:port, or use a unix: door", kind)
	case "unix":
		d.Mode = 0o660
		if pv, has := m.get("path"); has {
			if s, ok := l.str(pv, "an absolute socket path"); ok {
				if prob := unixPathProblem(s); prob != "" {
					l.add(pv, "%s", prob)
					good = false
				} else if fi, err := os.Lstat(s); err == nil && fi.Mode()&fs.ModeSocket == 0 {
					// docs/operations.md "A start": a path occupied by a non-socket is refused;
					// the broker only ever replaces a stale socket of its own.
					what := "a regular file"
					if fi.IsDir() {
						what = "a directory"
					} else if !fi.Mode().IsRegular() {
						what = "a " + fi.Mode().Type().String() + " file"
					}
					l.add(pv, "is taken by %s, not a socket; remove it or choose another path", what)
					good = false
				}
				d.Path = s
			} else {
				good = false
			}
		} else {
			m.missing("path", "write an absolute socket path, like /run/saguin/mqtt.sock")
			good = false
		}
		if mv, has := m.get("mode"); has {
			if mode, ok := l.fileMode(mv); ok {
				d.Mode = mode
			}
		}
		if pv, has := m.get("proxy_protocol"); has {
			if b, ok := l.boolean(pv); ok {
				d.ProxyProtocol = b
			}
		}
		m.refuse("tls", "a unix door takes no tls; terminate TLS in a proxy in front of it (with proxy_protocol: true to pass the client certificate name), or use a tcp door")
		m.refuse("address", "a unix door listens on a path; write path: /absolute/socket/path")
	}
	if kind != "ws" {
		for _, k := range []string{"same_origin", "allowed_origins"} {
			m.refuse(k, "only ws doors check the page origin; remove it")
		}
	} else {
		if sv, has := m.get("same_origin"); has {
			if b, ok := l.boolean(sv); ok {
				d.SameOrigin = b
			}
		}
		if ov, has := m.get("allowed_origins"); has {
			d.AllowedOrigins = l.origins(ov)
		}
	}
	if pv, has := m.get("password_file"); has {
		if s, ok := l.absPath(pv, "a Mosquitto-format password file"); ok {
			d.PasswordFile = s
		}
	}
	if set.ops {
		m.refuse("allow_anonymous", "the operations listener never admits anonymous callers; remove the key (on a loopback address no credential is asked)")
	} else {
		d.AllowAnonymous = d.PasswordFile == ""
		if blockAnon != nil {
			d.AllowAnonymous = *blockAnon
		}
		if av, has := m.get("allow_anonymous"); has {
			if b, ok := l.boolean(av); ok {
				d.AllowAnonymous = b
				if b {
					l.anonExplicit = append(l.anonExplicit, av)
				}
			}
		}
		// docs/configuration.md "`broker.mqtt`": false with no password file admits nobody. A door
		// asking for client certificates still has someone to admit.
		if !d.AllowAnonymous && d.PasswordFile == "" && (d.TLS == nil || d.TLS.ClientCAFile == "") {
			l.addKey(v.file, v.line(), id+".allow_anonymous",
				"false with no password file (on the door or broker.mqtt) and no tls.client_ca_file admits nobody; add a password_file, or allow anonymous clients")
		}
	}
	known := append([]string(nil), doorKeys[kind]...)
	if set.ops {
		known = removeWord(known, "allow_anonymous")
	}
	m.finish(known...)
	return d, good
}

// peekName reads a door entry's name: before the entry is opened, so that
// every finding inside it can carry the door's id.
func peekName(n *yaml.Node) (string, bool) {
	if n.Kind != yaml.MappingNode {
		return "", false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "name" && v.Kind == yaml.ScalarNode && v.Value != "" {
			return v.Value, true
		}
	}
	return "", false
}

func removeWord(words []string, w string) []string {
	out := words[:0]
	for _, x := range words {
		if x != w {
			out = append(out, x)
		}
	}
	return out
}

// fileMode reads a unix socket mode written in octal: "0660", 0660 or 660.
func (l *loader) fileMode(v val) (fs.FileMode, bool) {
	s, ok := l.scalar(v, `an octal mode like "0660"`)
	if !ok {
		return 0, false
	}
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0")
	n, err := strconv.ParseUint(t, 8, 32)
	if t == "" || err != nil || n > 0o777 {
		l.add(v, `it is an octal permission from 0000 to 0777, like "0660"`)
		return 0, false
	}
	return fs.FileMode(n), true
}

// origins reads ws allowed_origins: each scheme://host[:port] exactly.
func (l *loader) origins(v val) []string {
	items, ok := l.items(v)
	if !ok {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	for _, it := range items {
		s, good := l.str(it, "an origin like https://example.com")
		if !good {
			continue
		}
		o, err := parseOrigin(s)
		if err != nil {
			l.add(it, "%v", err)
			continue
		}
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

func parseOrigin(s string) (string, error) {
	if s == "null" {
		return "", fmt.Errorf(`"Origin: null" cannot be listed (any sandboxed page sends it); serve the page from a real origin`)
	}
	if strings.Contains(s, "*") {
		return "", fmt.Errorf("an origin is listed exactly, without wildcards; list each origin")
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" {
		return "", fmt.Errorf("an origin is scheme://host[:port], like https://example.com")
	}
	switch {
	case u.User != nil:
		return "", fmt.Errorf("an origin carries no user name; write %s://%s", u.Scheme, u.Host)
	case u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		return "", fmt.Errorf("an origin is scheme://host[:port] only, no path, query or fragment; write %s://%s", u.Scheme, u.Host)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("the port %q is not a port number", p)
		}
	}
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host), nil
}

// parseAddress checks a tcp/ws address the way docs/configuration.md "`broker.mqtt`" describes
// it: net.Listen syntax, port 0-65535 or a service name, host empty, an IP
// literal or an RFC 1123 name.
func parseAddress(s string) (host string, port int, err error) {
	h, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("it is host:port, like 0.0.0.0:1883, [::1]:1883 or :1883 (IPv6 in brackets)")
	}
	port, err = parsePort(ps)
	if err != nil {
		return "", 0, err
	}
	if h == "" {
		return "", port, nil
	}
	if strings.ContainsAny(h, ":%") || (h[0] >= '0' && h[0] <= '9' && strings.Count(h, ".") == 3) {
		a, err := netip.ParseAddr(h)
		if err != nil {
			return "", 0, fmt.Errorf("%q is not an IP address (%v)", h, trimParseErr(err))
		}
		switch {
		case strings.HasSuffix(h, "%"):
			return "", 0, fmt.Errorf("the zone after %% is empty; name the interface, like fe80::1%%eth0")
		case a.IsMulticast():
			return "", 0, fmt.Errorf("%s is a multicast address; a listener binds a unicast address", h)
		case a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() && a.Zone() == "":
			return "", 0, fmt.Errorf("%s is link-local and needs its interface; write it with a zone, like %s%%eth0", h, h)
		}
		return h, port, nil
	}
	if !validHostname(h) {
		return "", 0, fmt.Errorf("%q is neither an IP address nor a host name (letters, digits and hyphens, dot-separated)", h)
	}
	return h, port, nil
}

func trimParseErr(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

func parsePort(ps string) (int, error) {
	if ps == "" {
		return 0, fmt.Errorf("the port is missing; write host:port, like :1883")
	}
	digits := strings.TrimPrefix(ps, "+")
	if leadingDigits(digits) == len(digits) && digits != "" {
		n, err := strconv.ParseUint(digits, 10, 32)
		if err != nil || n > 65535 {
			return 0, fmt.Errorf("port %s is out of range; a port is 0 to 65535", ps)
		}
		return int(n), nil
	}
	n, err := net.LookupPort("tcp", ps)
	if err != nil {
		return 0, fmt.Errorf("%q is neither a port number nor a service name in /etc/services", ps)
	}
	return n, nil
}

// validHostname is RFC 1123: dot-separated labels of letters, digits and
// hyphens, 1 to 63 bytes, not beginning or ending with a hyphen.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func unixPathProblem(p string) string {
	switch {
	case p == "":
		return "the path is empty; write an absolute socket path"
	case strings.IndexByte(p, 0) >= 0:
		return "the path contains a NUL character"
	case len(p) > maxUnixPath:
		return fmt.Sprintf("the path is %d bytes; a unix socket path holds at most %d; choose a shorter one", len(p), maxUnixPath)
	case p[0] == '@':
		if len(p) == 1 {
			return "an abstract socket needs a name after @"
		}
		return ""
	case !filepath.IsAbs(p):
		return "the path is relative; write an absolute socket path (paths are never read relative to the working directory)"
	}
	base := p[strings.LastIndexByte(p, '/')+1:]
	if base == "" || base == "." || base == ".." {
		return "the path's last element must be a file name, not empty, . or .."
	}
	return ""
}

func loopbackAddress(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// checkDoors applies the clash checks across every door (docs/configuration.md "`broker.mqtt`"):
// names within each set, tcp ports across MQTT tcp, ws and operations tcp,
// unix paths across both sets.
func (l *loader) checkDoors(p *parsed) {
	all := append([]Listener(nil), p.Listeners...)
	var opsDoors []Listener
	if p.Operations != nil {
		opsDoors = p.Operations.Listeners
	}
	for _, set := range [][]Listener{p.Listeners, opsDoors} {
		byName := map[string]Listener{}
		for _, d := range set {
			if prev, dup := byName[d.Name]; dup {
				l.addKey(d.File, d.Line, d.ID, "the door name %q is also %s (%s); door names are unique (a single %s: door is named %q)",
					d.Name, prev.ID, where(prev.File, prev.Line), prev.Kind, prev.Kind)
				continue
			}
			byName[d.Name] = d
		}
	}
	all = append(all, opsDoors...)
	for i, a := range all {
		for _, b := range all[:i] {
			if a.Kind == "unix" || b.Kind == "unix" {
				if a.Kind == "unix" && b.Kind == "unix" && a.Path != "" && cleanSocket(a.Path) == cleanSocket(b.Path) {
					l.addKey(a.File, a.Line, a.ID+".path", "%q is also the socket of %s (%s); give each door its own path",
						a.Path, b.ID, where(b.File, b.Line))
				}
				continue
			}
			if clash, why := addressesClash(a.Address, b.Address); clash {
				l.addKey(a.File, a.Line, a.ID+".address", "%q would bind the port of %s %q (%s)%s; change one of the ports",
					a.Address, b.ID, b.Address, where(b.File, b.Line), why)
			}
		}
	}
}

func cleanSocket(p string) string {
	if strings.HasPrefix(p, "@") {
		return p
	}
	return filepath.Clean(p)
}

func where(file string, line int) string {
	if file == "" {
		return "the default"
	}
	if line == 0 {
		return file
	}
	return fmt.Sprintf("%s:%d", file, line)
}

// addressesClash: same port, and hosts equal or either a wildcard. Port 0
// never clashes; host names are compared as written, never resolved.
func addressesClash(a, b string) (bool, string) {
	ha, pa, errA := parseAddress(a)
	hb, pb, errB := parseAddress(b)
	if errA != nil || errB != nil || pa != pb || pa == 0 {
		return false, ""
	}
	wa, wb := wildcardHost(ha), wildcardHost(hb)
	if wa || wb {
		return true, " (a wildcard host listens on every address)"
	}
	ia, errA := netip.ParseAddr(ha)
	ib, errB := netip.ParseAddr(hb)
	switch {
	case errA == nil && errB == nil:
		ua, ub := ia.Unmap(), ib.Unmap()
		if ua.WithZone("") != ub.WithZone("") {
			return false, ""
		}
		if ua.IsLinkLocalUnicast() && ua.Zone() != ub.Zone() {
			return false, "" // the same link-local address on two interfaces
		}
		return true, ""
	case errA != nil && errB != nil:
		return strings.EqualFold(strings.TrimSuffix(ha, "."), strings.TrimSuffix(hb, ".")), ""
	}
	return false, ""
}

func wildcardHost(h string) bool {
	if h == "" {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsUnspecified()
}
