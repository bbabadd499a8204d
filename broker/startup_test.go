package broker_test

import (
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/broker/brokertest"
)

// docs/operations.md "A start": a start says what this broker keeps and who may reach
// it — inert and bounded providers, the retained store, exactly-once, where
// sessions live and what survives a stop, one summary once every door
// serves (protocols, each door's client authentication, the channels), and
// how each queue is consumed. Read from the real binary's stdout.
func TestStartupStatements(t *testing.T) {
	dir := t.TempDir()
	writePasswordFile(t, filepath.Join(dir, "passwd"), "alice")
	cfg := `
broker:
  id: startup-test
  mqtt:
    listen:
      tcp:
        - name: plain
          address: "127.0.0.1:0"
        - name: named
          address: "127.0.0.1:0"
          password_file: "{{.Dir}}/passwd"
  retained:
    retention_period: 7d
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
        max_bytes: 64MiB
      spare:
        type: memory
        snapshot_dir: none
channels:
  events:
    type: append
  jobs:
    type: queue
    visibility_timeout: 45s
    retry:
      max_attempts: 4
      backoff: linear
      backoff_base: 10s
`
	p := brokertest.StartProcess(t, brokertest.Config(t, dir, cfg))
	// The summary follows the doors' own lines, once every door serves.
	if !p.WaitOutput(`msg="queue ready"`, wait) {
		t.Fatalf("no queue ready line:\n%s", p.Output())
	}
	out := p.Output()
	for _, want := range []string{
		`msg="storage declared and unused: nothing is created for it" broker=startup-test provider=spare type=memory`,
		`msg="storage bounded" broker=startup-test provider=main type=sqlite max_bytes=67108864`,
		`msg="retained messages on broadcast topics are kept until their topic goes quiet" broker=startup-test provider=main retention_period=168h0m0s`,
		`msg="exactly-once publishing is offered" broker=startup-test max_inflight_per_client=20 expires_after=5m0s`,
		`msg="sessions are kept" broker=startup-test provider=main durability="a crash and kill -9`,
		`protocols="3.1.1, 5" client_authentication="plain: anonymous; named: password" channels="events (append), jobs (queue), jobs__dlq (append)"`,
		`msg="queue ready" broker=startup-test channel=jobs subscribe=$saguin/queue/jobs respond=$saguin/queue/jobs/response visibility_timeout_s=45 max_attempts=4 backoff=linear backoff_base_s=10`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the start does not say %s\n--- stdout:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no storage provider keeps anything") {
		t.Error("a sqlite provider keeps everything, but the start said nothing is kept")
	}
}
