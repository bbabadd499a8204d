package main

import (
	"encoding/json"
	"strings"
	"testing"
)

const routeConfig = `channels:
  events:
    type: append
    filter: "iot/+/events/#"
  state:
    type: latest
    filter: "iot/+/state/{temp,door}"
  jobs:
    type: queue
  alarms:
    type: append
    filter: "iot/site1/events/alarm/#"
broker:
  id: test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: memory
        snapshot_dir: none
`

func routeRows(t *testing.T, args ...string) []string {
	t.Helper()
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", routeConfig)
	code, out, errOut := runCLI(t, append([]string{"--route", path}, args...)...)
	if code != 0 {
		t.Fatalf("--route %v: exit %d, stderr %q", args, code, errOut)
	}
	return strings.Split(strings.TrimRight(out, "\n"), "\n")
}

// docs/operations.md "The command line": a topic's row names the channel that holds it and the
// filter that claims it (the most exact), or broadcast; a filter's rows say
// how each channel it reaches serves it.
func TestRouteExplainsTopicsAndFilters(t *testing.T) {
	cases := []struct {
		subject string
		want    []string
	}{
		{"iot/site1/events/alarm/fire", []string{"iot/site1/events/alarm/fire\talarms\tappend\tiot/site1/events/alarm/#"}},
		{"iot/site2/events/door", []string{"iot/site2/events/door\tevents\tappend\tiot/+/events/#"}},
		{"iot/site2/state/temp", []string{"iot/site2/state/temp\tstate\tlatest\tiot/+/state/temp"}},
		{"iot/site2/state/humidity", []string{"iot/site2/state/humidity\t-\tbroadcast\t-"}},
		{"jobs/resize/1", []string{"jobs/resize/1\tjobs\tqueue\tjobs/#"}},
		// A filter: every channel it reaches, and broadcast where it may
		// match a topic no channel holds.
		{"iot/#", []string{
			"iot/#\talarms\tappend\treplayed",
			"iot/#\tevents\tappend\treplayed",
			"iot/#\tstate\tlatest\tcurrent",
			"iot/#\t-\tbroadcast\tlive",
		}},
		{"$share/g/iot/+/events/#", []string{
			"$share/g/iot/+/events/#\talarms\tappend\tlive-shared",
			"$share/g/iot/+/events/#\tevents\tappend\tlive-shared",
		}},
		// A plain filter crossing a queue is served everything but the
		// queue's records; one inside a queue is refused as a SUBSCRIBE is.
		{"+/resize/#", []string{
			"+/resize/#\tevents\tappend\treplayed", // iot/resize/events/...
			"+/resize/#\tjobs\tqueue\texcluded",
			"+/resize/#\tstate\tlatest\tcurrent", // iot/resize/state/temp
			"+/resize/#\t-\tbroadcast\tlive",
		}},
		{"jobs/+/1", []string{"jobs/+/1\t-\t-\trefused-0x8F"}},
		{"$saguin/queue/jobs", []string{"$saguin/queue/jobs\tjobs\tqueue\tworker"}},
		{"$saguin/queue/events", []string{"$saguin/queue/events\t-\t-\trefused-0x8F"}},
		{"$saguin/consumer/events/seek/reply", []string{"$saguin/consumer/events/seek/reply\tevents\tappend\tseek-reply"}},
		{"$SYS/#", []string{"$SYS/#\t-\t-\trefused-0x87"}},
		{"a/#/b", []string{"a/#/b\t-\t-\trefused-0x8F"}},
	}
	for _, tc := range cases {
		lines := routeRows(t, tc.subject)
		if lines[0] != "# topic-or-filter\tchannel\ttype\twhy" {
			t.Fatalf("%s: first line %q, want the header", tc.subject, lines[0])
		}
		var rows []string
		for _, l := range lines[1:] {
			if l == "" {
				break // the routing table follows
			}
			if !strings.HasPrefix(l, "#") {
				rows = append(rows, l)
			}
		}
		if strings.Join(rows, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("--route %s:\n%s\nwant\n%s", tc.subject, strings.Join(rows, "\n"), strings.Join(tc.want, "\n"))
		}
	}
}

// The routing table lists the filters in the order they claim topics: the
// most exact first, braces expanded, the dead-letter channel's derived
// filter included.
func TestRouteTableIsMostExactFirst(t *testing.T) {
	lines := routeRows(t, "x")
	var table []string
	in := false
	for _, l := range lines {
		if l == "# filter\tchannel\ttype" {
			in = true
			continue
		}
		if in {
			table = append(table, l)
		}
	}
	// Ordered as the resolver ranks filters, level by level: a literal
	// before +, + before #, ending before continuing with #. A topic goes
	// to the first filter of this list that matches it.
	want := []string{
		"iot/site1/events/alarm/#\talarms\tappend",
		"jobs/__dlq/#\tjobs__dlq\tappend",
		"iot/+/state/door\tstate\tlatest",
		"iot/+/state/temp\tstate\tlatest",
		"iot/+/events/#\tevents\tappend",
		"jobs/#\tjobs\tqueue",
	}
	if strings.Join(table, "\n") != strings.Join(want, "\n") {
		t.Errorf("routing table:\n%s\nwant\n%s", strings.Join(table, "\n"), strings.Join(want, "\n"))
	}
}

// With no operand the subjects come from stdin, one per line, and only the
// four columns are printed; --json writes one object per row, null for "-".
func TestRouteReadsAListFromStdinAndWritesJSON(t *testing.T) {
	old := stdin
	t.Cleanup(func() { stdin = old })
	stdin = strings.NewReader("iot/a/events/x\n\n# a comment\nnowhere/x\r\n")
	lines := routeRows(t)
	want := []string{"# topic-or-filter\tchannel\ttype\twhy", "iot/a/events/x\tevents\tappend\tiot/+/events/#", "nowhere/x\t-\tbroadcast\t-"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("stdin list:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	stdin = strings.NewReader("nowhere/x\n")
	lines = routeRows(t, "--json")
	if len(lines) != 1 {
		t.Fatalf("--json: %d lines, want 1: %q", len(lines), lines)
	}
	var row map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &row); err != nil {
		t.Fatalf("--json line %q: %v", lines[0], err)
	}
	if row["topic_or_filter"] != "nowhere/x" || row["channel"] != nil || row["type"] != "broadcast" || row["why"] != nil {
		t.Errorf("--json row = %v", row)
	}
	// A flag after the operand is still a flag (docs/operations.md "The command line").
	lines = routeRows(t, "iot/a/events/x", "--json")
	if len(lines) != 1 || !strings.Contains(lines[0], `"channel":"events"`) {
		t.Errorf("--route FILE TOPIC --json: %q", lines)
	}
}

func TestRouteUsageErrors(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", routeConfig)
	for _, args := range [][]string{
		{"--json"},
		{"--route", path, "a", "b"},
		{"--route", path, "--config", path, "a"},
	} {
		if code, _, errOut := runCLI(t, args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d (stderr %q), want a usage error (2)", args, code, errOut)
		}
	}
}

// docs/bridge.md: --route also says how a topic published at a bridge's
// peer crosses to us — the first in rule that matches it, the name it
// takes and the channel that name lands in — or why it cannot.
func TestRouteExplainsWhatCrossesABridge(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", routeConfig+`bridges:
  hub:
    peer: tcp://hub.example.net:1883
    client_id: edge-1
    topics:
      - {filter: "fleet/+/events/#", direction: in, topic: "iot/$1/events/$#"}
      - {filter: "fleet/+/live", direction: in, topic: "live/$1"}
      - {filter: "fleet/raw/#", direction: in, topic: "$#"}
`)
	for _, c := range []struct {
		subject string
		want    []string
	}{
		{"fleet/site1/events/alarm/fire", []string{
			"fleet/site1/events/alarm/fire\t-\tbroadcast\t-",
			"fleet/site1/events/alarm/fire\talarms\tappend\tfrom bridge hub, rule 0 (fleet/+/events/# -> iot/$1/events/$#) as iot/site1/events/alarm/fire",
		}},
		{"fleet/v7/live", []string{
			"fleet/v7/live\t-\tbroadcast\t-",
			"fleet/v7/live\t-\tbroadcast\tfrom bridge hub, rule 1 (fleet/+/live -> live/$1) as live/v7",
			"#   no channel claims live/v7: acknowledged to the peer once handed to the broadcast fan-out",
		}},
		{"fleet/raw", []string{
			"fleet/raw\t-\tbroadcast\t-",
			"fleet/raw\t-\t-\trefused-unmappable",
			"#   from bridge hub, rule 2 (fleet/raw/# -> $#): the mapped topic is empty or starts with $",
		}},
	} {
		code, out, errOut := runCLI(t, "--route", path, c.subject)
		if code != 0 {
			t.Fatalf("--route %s: exit %d, %s", c.subject, code, errOut)
		}
		rows := strings.Split(out, "\n\n")[0]
		got := strings.Split(strings.TrimRight(rows, "\n"), "\n")[1:]
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("--route %s:\n%s\nwant:\n%s", c.subject, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}

// docs/bridge.md: --check-config lists each bridge rule and where its
// records land here — a channel and its type, or broadcast.
func TestCheckConfigListsWhereBridgeRulesLand(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "saguin.yaml", routeConfig+`bridges:
  hub:
    peer: tcp://hub.example.net:1883
    client_id: edge-1
    topics:
      - {filter: "fleet/+/events/#", direction: in, topic: "iot/$1/events/$#"}
      - {filter: "fleet/+/live", direction: in, topic: "live/$1"}
`)
	code, out, errOut := runCLI(t, "--check-config", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"bridges:",
		"hub  in from tcp://hub.example.net:1883  fleet/+/events/# -> iot/$1/events/$#  lands in alarms (append), events (append)",
		"hub  in from tcp://hub.example.net:1883  fleet/+/live -> live/$1",
		"lands in broadcast",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--check-config does not say %q:\n%s", want, out)
		}
	}
}
