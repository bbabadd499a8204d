package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"saguin.dev/broker"
)

// routeHeader names the four columns of saguin --route (docs/operations.md "The command line").
const routeHeader = "# topic-or-filter\tchannel\ttype\twhy"

// maxRouteLine bounds one line of the list read from stdin: a topic is at
// most a few KiB (limits.max_topic_length), and a longer line is not one.
const maxRouteLine = 64 << 10

// routeCommand is saguin --route CONFIG [TOPIC|FILTER]: where a topic
// lands, or how a subscription filter is served, decided by the broker's
// own routing code from the configuration alone. With an operand it prints
// that subject's rows and then the routing table, most exact first; with
// none it reads one subject per line from stdin and prints only the rows
// (four tab-separated columns; "-" where nothing applies). asJSON writes
// each row as one JSON object per line instead, "-" as null.
func routeCommand(cfgPath string, operands []string, asJSON bool, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(operands) > 1 {
		fmt.Fprintf(stderr, "saguin: --route takes one topic or filter (or a list on stdin), not %d\n%s\n", len(operands), usageLine)
		return 2
	}
	cfg, err := load(cfgPath)
	if err != nil {
		printInvalid(stderr, err)
		return 1
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	emit := func(row broker.RouteRow) {
		if asJSON {
			writeRouteJSON(w, row)
			return
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", tsvField(row.Subject), dash(row.Channel), dash(row.Type), dash(row.Why))
	}
	if len(operands) == 1 {
		if !asJSON {
			fmt.Fprintln(w, routeHeader)
		}
		for _, row := range broker.Route(cfg, operands[0]) {
			emit(row)
			if row.Reason != "" && !asJSON {
				fmt.Fprintf(w, "#   %s\n", row.Reason)
			}
		}
		if asJSON {
			return 0
		}
		fmt.Fprintln(w, "\n# routing table, most exact filter first: a topic goes to the first filter that matches it")
		fmt.Fprintln(w, "# filter\tchannel\ttype")
		for _, row := range broker.RoutingTable(cfg) {
			fmt.Fprintf(w, "%s\t%s\t%s\n", row.Subject, row.Channel, row.Type)
		}
		return 0
	}
	if !asJSON {
		fmt.Fprintln(w, routeHeader)
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 0, 4096), maxRouteLine)
	for sc.Scan() {
		subject := strings.TrimRight(sc.Text(), "\r")
		if subject == "" || strings.HasPrefix(subject, "# ") {
			// Blank lines and comments (a "# " line is never a topic or a
			// filter: # is a whole level), so this command's own output
			// can be fed back.
			continue
		}
		for _, row := range broker.Route(cfg, subject) {
			emit(row)
		}
	}
	if err := sc.Err(); err != nil {
		w.Flush()
		fmt.Fprintf(stderr, "saguin: --route: reading the list on stdin: %v (a line is at most %d bytes)\n", err, maxRouteLine)
		return 1
	}
	return 0
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tsvField keeps a subject on its one line and in its one column: a topic
// may hold a tab (MQTT forbids only U+0000 and a few others), which would
// shift the columns.
func tsvField(s string) string {
	return strings.NewReplacer("\t", `\t`, "\n", `\n`).Replace(s)
}

// routeJSON is one --route --json line. A column with nothing is null.
type routeJSON struct {
	Subject string  `json:"topic_or_filter"`
	Channel *string `json:"channel"`
	Type    *string `json:"type"`
	Why     *string `json:"why"`
	Reason  *string `json:"reason,omitempty"`
}

func writeRouteJSON(w io.Writer, row broker.RouteRow) {
	opt := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	b, _ := json.Marshal(routeJSON{Subject: row.Subject, Channel: opt(row.Channel), Type: opt(row.Type), Why: opt(row.Why), Reason: opt(row.Reason)})
	w.Write(append(b, '\n'))
}
