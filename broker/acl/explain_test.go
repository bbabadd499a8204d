package acl

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"saguin.dev/broker/config"
)

const explainACL = `roles:
  devices:
    - channel: iot
      allow: [write]
    - channel: events
      filter: "events/%u/{in,out}/#"
      allow: [read]
    - topic: "home/%c/#"
      allow: [read, write]
  guard:
    - broker: features
      deny: [will, qos2]
users:
  "dev-*":
    roles: [devices, guard]
    client_ids: "%u-*"
    limits: {publish_rate: 10}
  "*": [guard]
`

// The explanation lists the applying pattern, the shadowed ones, every
// pattern of the file, and each rule of each role as it applies, in the
// object docs/operations.md gives /v1/operations/acl.
func TestExplanationJSON(t *testing.T) {
	a := mustLoad(t, explainACL)
	id := "dev-7-a"
	out, err := json.Marshal(a.Explain("dev-7", &id))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"user":"dev-7","acl_file":"` + a.Path() + `","pattern_applied":"dev-*","patterns_matched":["dev-*","*"],"patterns_in_file":["dev-*","*"],"client_id_allowed":true,` +
		`"grants":[{"role":"devices","kind":"channel","subject":"iot (iot/+/events/+)","verbs":["write"],"denies":[]},` +
		`{"role":"devices","kind":"channel","subject":"events (events/dev-7/{in,out}/#)","verbs":["read"],"denies":[]},` +
		`{"role":"devices","kind":"topic","subject":"home/dev-7-a/#","verbs":["write","read"],"denies":[]},` +
		`{"role":"guard","kind":"broker","subject":"features","verbs":[],"denies":["will","qos2"]}],"grants_withheld":[]}`
	if string(out) != want {
		t.Errorf("explanation:\n got %s\nwant %s", out, want)
	}
}

// Without a client id, %c stays as written and client_id_allowed is null;
// a client id with '/' withholds the rule using %c; a name matching
// nothing has no pattern and no grants.
func TestExplanationWithoutClientIDWithheldAndUnmatched(t *testing.T) {
	a := mustLoad(t, explainACL)
	x := a.Explain("dev-7", nil)
	if x.ClientIDAllowed != nil {
		t.Errorf("client_id_allowed %v without a client id", *x.ClientIDAllowed)
	}
	if x.Grants[2].Subject != "home/%c/#" {
		t.Errorf("without a client id the topic rule reads %q, want home/%%c/#", x.Grants[2].Subject)
	}
	if x.Limits != (PublishLimits{Rate: 10, FromEntry: true}) {
		t.Errorf("limits %+v", x.Limits)
	}

	id := "a/b"
	x = a.Explain("dev-7", &id)
	if *x.ClientIDAllowed || len(x.Grants) != 3 || len(x.GrantsWithheld) != 1 {
		t.Fatalf("client id a/b: allowed %v, %d grants, withheld %+v", *x.ClientIDAllowed, len(x.Grants), x.GrantsWithheld)
	}
	wh := x.GrantsWithheld[0]
	if wh.Role != "devices" || wh.Kind != "topic" || wh.Subject != "home/%c/#" || wh.Reason != `%c is the client id, which holds "/"` {
		t.Errorf("withheld %+v", wh)
	}

	b := mustLoad(t, strings.Replace(explainACL, `  "*": [guard]`+"\n", "", 1))
	out, _ := json.Marshal(b.Explain("visitor", nil))
	want := `{"user":"visitor","acl_file":"` + b.Path() + `","pattern_applied":null,"patterns_matched":[],"patterns_in_file":["dev-*"],"client_id_allowed":null,"grants":[],"grants_withheld":[]}`
	if string(out) != want {
		t.Errorf("unmatched:\n got %s\nwant %s", out, want)
	}
	if out, _ := json.Marshal(NoACL("anyone")); string(out) != `{"acl_file":null,"everything_allowed":true}` {
		t.Errorf("no ACL: %s", out)
	}
}

// Check reports the ACL file's findings in the configuration loader's own
// pass, placed in the ACL file, after the configuration's; a file that
// cannot be read is a finding on broker.mqtt.acl_file.
func TestCheckRunsInTheLoadersPass(t *testing.T) {
	dir := t.TempDir()
	testConfig(t, dir) // writes saguin.yaml and the password file
	cfgPath := dir + "/saguin.yaml"
	aclPath := write(t, dir, "acl.yaml", "roles:\n  r:\n    - channel: jobs\n      allow: [read]\nusers:\n  alice: [r]\n")
	_, err := config.Load(cfgPath, Check)
	var fs *config.Findings
	if !errors.As(err, &fs) || len(fs.List) != 1 {
		t.Fatalf("want the one ACL finding, got %v", err)
	}
	if f := fs.List[0]; f.File != aclPath || f.Line != 4 || f.Key != "roles.r[0].allow[0]" {
		t.Errorf("finding %s", f)
	}

	// A configuration finding as well: the channel checks wait for it,
	// the file's own findings do not, and the configuration's come first.
	text := strings.ReplaceAll(testConfigText, "{{dir}}", dir)
	write(t, dir, "saguin.yaml", strings.Replace(text, "publish_rate: 50", "publish_rate: fast", 1))
	write(t, dir, "acl.yaml", "roles:\n  r:\n    - channel: jobs\n      allow: [read, fly]\nusers:\n  alice: [r]\n")
	_, err = config.Load(cfgPath, Check)
	if !errors.As(err, &fs) || len(fs.List) != 2 {
		t.Fatalf("want two findings, got %v", err)
	}
	if fs.List[0].File != cfgPath || fs.List[1].File != aclPath || !strings.Contains(fs.List[1].Problem, "unknown verb") {
		t.Errorf("findings:\n%s", render(fs.List))
	}

	write(t, dir, "saguin.yaml", text)
	if err := os.Remove(aclPath); err != nil {
		t.Fatal(err)
	}
	_, err = config.Load(cfgPath, Check)
	if !errors.As(err, &fs) || len(fs.List) != 1 || fs.List[0].Key != "broker.mqtt.acl_file" ||
		fs.List[0].File != cfgPath || fs.List[0].Line != 5 || !strings.Contains(fs.List[0].Problem, "no such file") {
		t.Errorf("a missing ACL file: %v", err)
	}
}
