package acl

import (
	"encoding/json"
	"testing"

	"saguin.dev/broker/config"
)

// maxFindings is the loader's bound on findings kept.
const maxFindings = 500

// FuzzParse feeds arbitrary bytes to the ACL reader beside the test
// configuration: it never panics, keeps its findings bounded, and either
// refuses the file with findings or builds an ACL whose every question can
// be asked (For, Explain, the per-topic questions, CheckSubscribe).
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		explainACL,
		benchACL,
		"roles:\n  r:\n    - channel: events\n      filter: \"events/%u/#\"\n      allow: [read, seek]\nusers:\n  \"*\": [r]\n",
		"users:\n  \"a*\": [r]\n  \"*b\": [r]\nroles:\n  r: &x\n    - broker: features\n      deny: [retain]\n  s: *x\n",
		"roles: {r: [{topic: \"#\", allow: [read]}]}\nusers: {\"\": {roles: [r], client_ids: [\"%u-*\"], limits: {publish_rate: 0}}}\n",
		"clients: {}\n---\nx: 1\n",
		"<<: {users: {a: [r]}}\n",
	} {
		f.Add([]byte(seed))
	}
	cfg := testConfig(f, f.TempDir())
	e := envOf(cfg)
	f.Fuzz(func(t *testing.T, data []byte) {
		var a *ACL
		var findings []config.Finding
		if d, root, ok := config.ParseDocument("fuzz.yaml", data, fileName); ok {
			a, findings = parse(d, root, e)
		} else {
			findings = d.Findings()
		}
		if len(findings) > maxFindings+2 { // the kept ones, the budget's, "(more)"
			t.Fatalf("%d findings, more than the bound", len(findings))
		}
		if a == nil {
			if len(findings) == 0 {
				t.Fatal("no ACL and no finding")
			}
			return
		}
		if len(findings) != 0 {
			t.Fatalf("an ACL beside %d findings", len(findings))
		}
		for _, user := range append(a.Patterns(), "", "alice", "dev-7", "a/b", "+") {
			g := a.For(user, "c/1")
			g.MayRead("events/x", "events")
			g.MayWrite("x", "")
			g.MayDelete("site/a/state", "state")
			_ = g.CheckSubscribe("#")
			id := "id"
			if _, err := json.Marshal(a.Explain(user, &id)); err != nil {
				t.Fatal(err)
			}
		}
	})
}
