package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/acl"
	"saguin.dev/broker/config"
	"saguin.dev/broker/passwd"
)

// authority is what the files naming who may connect and what they may do
// say (docs/configuration.md "Password files and `saguin --passwd`"; docs/configuration.md "The ACL file"): the MQTT password file of every door, and the
// ACL. It is loaded whole and never changed: a SIGUSR1 re-read builds a
// new one and swaps it in only when every file loads (docs/operations.md "Signals"),
// so a connection never sees half of a reload.
type authority struct {
	// gen numbers the loads: a connection's grants are computed again when
	// it meets a newer authority (connAuth.grants).
	gen       uint64
	passwords map[string]*passwd.Table // by path: a door's effective password file
	// rules is the ACL; nil when there is no acl_file: every client may do
	// everything, and nothing is asked.
	rules *acl.ACL
	// operators are the operations listener's password files, by path
	// (ops_auth.go): re-read with the rest, all or nothing.
	operators map[string]*passwd.Table
}

// loadAuthority reads every password file the doors name and the ACL.
// Every file is read even when one fails, so a re-read logs every broken
// file at once.
func loadAuthority(cfg *config.Config, gen uint64) (*authority, error) {
	a := &authority{gen: gen, passwords: make(map[string]*passwd.Table)}
	var errs []error
	for _, path := range passwordFiles(cfg) {
		t, err := passwd.Load(path, passwd.MQTT)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.passwords[path] = t
	}
	if err := emptyDoorFiles(cfg, a.passwords); err != nil {
		errs = append(errs, err...)
	}
	a.operators, errs = loadOperators(cfg, errs)
	if cfg.Broker.ACLFile != "" {
		rules, err := acl.Load(cfg.Broker.ACLFile, cfg)
		if err != nil {
			errs = append(errs, err)
		} else {
			a.rules = rules
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return a, nil
}

// passwordFiles are the MQTT doors' password files, each once, sorted.
func passwordFiles(cfg *config.Config) []string {
	seen := make(map[string]bool)
	var out []string
	for _, l := range cfg.Broker.Listeners {
		if l.PasswordFile != "" && !seen[l.PasswordFile] {
			seen[l.PasswordFile] = true
			out = append(out, l.PasswordFile)
		}
	}
	sort.Strings(out)
	return out
}

// emptyDoorFiles refuses a door whose only way in is a password file naming
// nobody (docs/configuration.md "Password files and `saguin --passwd`": "names nobody on a listener admitting nobody
// else" is a failure, at start and at a re-read): such a door would refuse
// every client while looking configured.
func emptyDoorFiles(cfg *config.Config, tables map[string]*passwd.Table) []error {
	var errs []error
	for _, l := range cfg.Broker.Listeners {
		t := tables[l.PasswordFile]
		if t == nil || t.Len() > 0 || l.AllowAnonymous || certificateRequired(l) {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: password file %s names nobody, and the door admits nobody else (allow_anonymous is false, no client certificate is required); add users with saguin --passwd add, or allow anonymous clients on it", l.ID, l.PasswordFile))
	}
	return errs
}

func certificateRequired(l config.Listener) bool {
	return l.TLS != nil && l.TLS.ClientCAFile != "" && l.TLS.RequireCertificate
}

// PasswordCheck is the password files' part of a start's checks, as a
// config.Check: each file read as the broker reads it, its problems placed
// on their lines, so --check-config and a start report the same findings.
func PasswordCheck(cfg *config.Config) []config.Finding {
	var out []config.Finding
	tables := make(map[string]*passwd.Table)
	for _, path := range passwordFiles(cfg) {
		t, err := passwd.Load(path, passwd.MQTT)
		if err == nil {
			tables[path] = t
			continue
		}
		out = append(out, passwordFindings(path, passwordFileKey(cfg, path), err)...)
	}
	for _, l := range cfg.Broker.Listeners {
		t := tables[l.PasswordFile]
		if t == nil || t.Len() > 0 || l.AllowAnonymous || certificateRequired(l) {
			continue
		}
		f := cfg.At(l.ID+".password_file", "")
		if f.Line == 0 {
			f = cfg.At("broker.mqtt.password_file", "")
		}
		f.Problem = fmt.Sprintf("%s names nobody, and door %s admits nobody else (allow_anonymous is false, no client certificate is required): every client would be refused; add users with saguin --passwd add, or allow anonymous clients on the door", l.PasswordFile, l.ID)
		out = append(out, f)
	}
	return out
}

// passwordFindings places a password file's load error: each problem on
// its line of the file, under the configuration key that names it.
func passwordFindings(path, key string, err error) []config.Finding {
	var le *passwd.LoadError
	if !errors.As(err, &le) || le.Err != nil {
		return []config.Finding{{File: path, Key: key, Problem: err.Error()}}
	}
	var out []config.Finding
	for _, p := range le.Problems {
		out = append(out, config.Finding{File: path, Line: p.Line, Key: key, Problem: p.Text})
	}
	if le.More > 0 {
		out = append(out, config.Finding{File: path, Key: key,
			Problem: fmt.Sprintf("%d further problems not listed; fix these and check again", le.More)})
	}
	return out
}

// passwordFileKey is the configuration key that names the password file at
// path: the broker-wide one, else the first door's.
func passwordFileKey(cfg *config.Config, path string) string {
	if cfg.Broker.PasswordFile == path {
		return "broker.mqtt.password_file"
	}
	for _, l := range cfg.Broker.Listeners {
		if l.PasswordFile == path {
			return l.ID + ".password_file"
		}
	}
	return "password_file"
}

// ConfigChecks are the checks a start runs beside the configuration
// loader's own, in its pass: the MQTT password files, the operator
// password files, the ACL file. --check-config runs the same list.
func ConfigChecks() []config.Check {
	return []config.Check{PasswordCheck, OperatorPasswordCheck, acl.Check}
}

// connAuth is who a connection authenticated as, decided at its CONNECT,
// and the grants that identity has under the ACL in force.
type connAuth struct {
	// user is the identity the ACL knows the client by: the password
	// file's user, the certificate's or proxy's name; "" for anonymous.
	user     string
	from     string // "password", "certificate", "proxy" or "anonymous"
	clientID string
	// notPersistent: the ACL denies persistent, so the session ends with
	// the connection (docs/security.md "A feature the ACL denies"), decided at CONNECT.
	notPersistent bool
	grants        atomic.Pointer[grantsAt]
}

type grantsAt struct {
	gen uint64
	g   *acl.Grants
}

// authOf is a connection's identity, or nil for a connection of the
// broker's own (a Will's publisher) or one that has not authenticated.
func authOf(cl *mqtt.Client) *connAuth {
	if cl == nil {
		return nil
	}
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		return cc.auth.Load()
	}
	return nil
}

// grantsOf returns what the connection may do under the ACL in force:
// all is true when no ACL is configured (everything is allowed, nothing is
// asked) or the connection is the broker's own (a Will's publisher: a Will
// is judged as the identity that armed it, willStillAllowed). Otherwise g is the connection's
// grants, computed once per connection and again after a reload, so a
// withdrawn grant reaches a live connection at its next packet or delivery
// (invariant 16), not at its next CONNECT; g is nil — nothing allowed —
// for a connection that never authenticated.
func (b *Broker) grantsOf(cl *mqtt.Client) (g *acl.Grants, all bool) {
	a := b.auth.Load()
	if a == nil || a.rules == nil || cl == nil || cl.Net.Inline || cl.Net.Listener == willListener {
		return nil, true
	}
	if cl.Net.Listener == bridgeListener {
		// A bridge's records come from a stand-in with no connection: its
		// grants are those of its user, bridge:<name> (docs/bridge.md
		// "What crosses, inbound"), asked as for an identity not connected.
		return b.grantsFor(string(cl.Properties.Username), cl.ID), false
	}
	ca := authOf(cl)
	if ca == nil {
		return nil, false
	}
	return ca.grantsUnder(a), false
}

func (ca *connAuth) grantsUnder(a *authority) *acl.Grants {
	if at := ca.grants.Load(); at != nil && at.gen == a.gen {
		return at.g
	}
	// Two goroutines may compute it at once after a reload; both store
	// the same grants, and either is right.
	g := a.rules.For(ca.user, ca.clientID)
	ca.grants.Store(&grantsAt{gen: a.gen, g: g})
	return g
}

// grantsFor are the grants of an identity that is not connected — a Will
// fired after its connection ended, or at a start (rfcs/wills.md: the ACL
// is asked again when the Will fires, as the client).
func (b *Broker) grantsFor(user, clientID string) *acl.Grants {
	a := b.auth.Load()
	if a == nil || a.rules == nil {
		return nil
	}
	return a.rules.For(user, clientID)
}

// authRefusal is why a CONNECT is refused authentication: the code, the
// reason for the log (never the credential), and whether the address's
// penalty applies (a wrong password does; a malformed name does too, so a
// client cannot probe without paying).
type authRefusal struct {
	code   packets.Code
	reason string
}

// authenticate decides who a CONNECT is (docs/configuration.md "`broker.mqtt`"; docs/configuration.md "Password files and `saguin --passwd`"; docs/security.md "1. Certificates"):
//   - a certificate's verified name (the door's mutual TLS, or a PROXY
//     header's verified CN) is the identity, and such a client is never
//     looked up in a password file;
//   - else a user name and password checked against the door's password
//     file;
//   - else anonymous, where the door admits it.
//
// A name holding a control character is refused 0x86 whatever its source.
// A user name given on a door with no password file is not an identity:
// nothing vouched for it, so the client is anonymous there.
func (b *Broker) authenticate(cl *mqtt.Client, pk packets.Packet, a *authority) (*connAuth, *authRefusal) {
	cc, _ := cl.Net.Conn.(*clientConn)
	if cc == nil {
		return &connAuth{from: "anonymous", clientID: cl.ID}, nil
	}
	p := cc.peer()
	door := p.door
	ca := &connAuth{clientID: cl.ID}
	if p.name != "" {
		if err := passwd.CheckUserName(p.name); err != nil {
			return nil, &authRefusal{code: packets.ErrBadUsernameOrPassword,
				reason: fmt.Sprintf("from the %s: %v", p.from, err)}
		}
		ca.user, ca.from = p.name, p.from
		return ca, nil
	}
	if p.certificate {
		// A certificate that names nobody (no Common Name, no DNS name),
		// or one the proxy did not verify: the client falls to the
		// password file or anonymous (docs/security.md "1. Certificates"; docs/configuration.md "`broker.mqtt`").
		attrs := []any{"listener", door.ID}
		if p.proxied && p.verifyResult != 0 {
			attrs = append(attrs, "verify_result", p.verifyResult)
		}
		b.log.Debug("client certificate names nobody; the client is judged by its password or as anonymous", attrs...)
	}
	if pk.Connect.UsernameFlag && door.PasswordFile != "" {
		user := string(pk.Connect.Username)
		if err := passwd.CheckUserName(user); err != nil {
			return nil, &authRefusal{code: packets.ErrBadUsernameOrPassword, reason: "user name " + err.Error()}
		}
		t := a.passwords[door.PasswordFile]
		if t == nil {
			return nil, &authRefusal{code: packets.ErrBadUsernameOrPassword, reason: "the door's password file is not loaded"}
		}
		if _, ok := t.Authenticate(user, pk.Connect.Password); !ok {
			return nil, &authRefusal{code: packets.ErrBadUsernameOrPassword, reason: "wrong user name or password"}
		}
		ca.user, ca.from = user, "password"
		return ca, nil
	}
	if !door.AllowAnonymous {
		why := "the door admits named users only; send a user name and password"
		if certificateRequired(*door) || (door.TLS != nil && door.TLS.ClientCAFile != "" && door.PasswordFile == "") {
			why = "the door admits clients with a certificate naming them only"
		}
		return nil, &authRefusal{code: packets.ErrBadUsernameOrPassword, reason: why}
	}
	ca.from = "anonymous"
	return ca, nil
}

// codeV3BadCredentials is MQTT 3.1.1's CONNACK return code 0x04.
var codeV3BadCredentials = packets.Code{Code: 0x04, Reason: "bad user name or password"}

// refuseAuthentication answers a CONNECT that failed authentication:
// 0x86 (3.1.1: 0x04), after the wait its address has earned
// (authpenalty.go) — or no answer at all when that wait would be too long.
// The log line names the client and the reason, never the credential.
func (b *Broker) refuseAuthentication(cl *mqtt.Client, r *authRefusal) error {
	door := ""
	remote := remoteOf(cl)
	if cc, ok := cl.Net.Conn.(*clientConn); ok {
		p := cc.peer()
		door = p.door.ID
		if p.client != nil {
			remote = p.client
		}
	}
	wait, answer := b.penalties.failed(penaltyKey(remote, door), b.clock.Now())
	b.refused(slog.LevelWarn, cl, refuseConnect, r.code.Code, "CONNECT refused: authentication", "reason", r.reason)
	if !answer {
		return r.code // closed unanswered: the address is past its turn
	}
	if wait > 0 && !b.sleepCtx(wait) {
		return packets.ErrServerShuttingDown
	}
	if cl.Properties.ProtocolVersion < 5 {
		// docs/security.md "Every refusal, and its code": 0x86 is 3.1.1's 0x04, "bad user name or
		// password" (the substrate's own mapping says 0x05).
		_ = b.mqtt.SendConnack(cl, codeV3BadCredentials, false, nil)
		return r.code
	}
	_ = b.mqtt.SendConnack(cl, withReason(r.code, "bad user name or password"), false, nil)
	return r.code
}

// sleepCtx waits d, or until the broker closes (false).
func (b *Broker) sleepCtx(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.ctx.Done():
		return false
	}
}

func remoteOf(cl *mqtt.Client) net.Addr {
	if cl.Net.Conn == nil {
		return nil
	}
	return cl.Net.Conn.RemoteAddr()
}
