package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CheckInfo names one check a campaign runs and the invariants whose
// failure it would see. `make invariants` lists these beside the tests named
// TestInvariantNN_* (rfcs/chaos-harness.md has the same table in prose).
type CheckInfo struct {
	Name       string // a Finding's Check; a trailing * stands for a channel
	Invariants []int
	Fails      string // what makes it fail
}

// Catalog is every check a campaign runs. A check added to the harness
// without an entry here fails TestCatalogNamesEveryCheck.
var Catalog = []CheckInfo{
	{"linearizable/append-*", []int{9, 14}, "an offset holding two records, a record at two offsets, a refused record stored, an acknowledged one lost, a head that disagrees"},
	{"linearizable/queue-jobs", []int{3, 4, 5, 15}, "two live leases, a delivery after an applied ack or a dead letter, a reused Delivery ID"},
	{"linearizable/latest-state", []int{14, 18}, "a point read or a subscriber sent a value older than one acknowledged or read before it began, a deleted value, one never written or refused, or an acknowledged value lost outside every loss window"},
	{"append-order", []int{9}, "offsets on one reader's connection going back"},
	{"append-dense", []int{1}, "a reader silently moved past records"},
	{"queue-offered", []int{5}, "an acknowledged job neither offered nor dead-lettered"},
	{"queue-resolved", []int{3, 15}, "an acknowledged job whose last holder never acked and that never came back"},
	{"queue-offset-unique", []int{9}, "two jobs at one offset"},
	{"queue-offset-order", []int{9}, "a later job at a lower offset"},
	{"acked-lost", []int{14}, "a record acknowledged outside every loss window missing from the final read"},
	{"refused-stored", []int{18}, "a publish the broker refused found stored"},
	{"offset-reused", []int{9}, "an offset read as two records"},
	{"offset-moved", []int{8}, "a record read at two offsets"},
	{"offset-order", []int{9}, "a later publish given a lower offset (retention emptied the channel, then a restart)"},
	{"floor-back", []int{1}, "the floor going back, across restarts too"},
	{"floor-moved", []int{1}, "the floor leaving 1 where nothing was removed"},
	{"resume-skip", []int{1}, "a reconnecting consumer first served past what it acknowledged"},
	{"resume-new-session", []int{18}, "a consumer told Session Present 0 served its old position"},
	{"dead-letter-twice", []int{5}, "a job in the dead-letter channel twice"},
	{"dead-letter-lost", []int{5}, "a dead letter read and then gone"},
	{"final-read", []int{1}, "the channel not readable from its floor to the head the broker reports"},
	{"integrity", []int{14}, "sqlite's integrity_check failing after a power cut"},
	{"restart", []int{14}, "the broker not starting again"},
	{"graceful-shutdown", []int{14}, "SIGTERM not ending the broker cleanly"},
	{"broker-exit", []int{14}, "the broker exiting with no nemesis"},
	{"drain", []int{2}, "the queue never going quiet"},
	{"subscribe-refused", []int{4}, "a worker's or reader's SUBSCRIBE refused"},
	{"seek-refused", []int{1}, "a seek to the head or the floor refused"},
	{"delivery-headers", []int{3, 8}, "a delivery missing saguin-id, saguin-offset or the Delivery ID"},
	// Session takeover (takeover.go, takeover_check.go) and Wills (wills.go,
	// will_check.go).
	{"takeover-replay", []int{17}, "the connection that took a session over served an offset the broker had certainly been acknowledged by the old one (by its Receive Maximum), the broker running"},
	{"takeover-reason", []int{17}, "a taken-over connection sent a DISCONNECT reason other than 0x8E, with no stop of the broker"},
	{"takeover-old-open", []int{17}, "a taken-over connection still open an operation timeout after the new one's CONNACK"},
	{"taken-over-unasked", []int{17}, "a connection sent DISCONNECT 0x8E when no CONNECT for its id was accepted (a refused one took it over)"},
	{"session-present", []int{18, 17}, "Session Present 0 for a Clean Start 0 CONNECT of a durable session a CONNACK had said existed, outside every loss window (a refused CONNECT or a takeover ended it, or a restart lost it)"},
	{"will-withdrawn-published", []int{18}, "a Will published after its client's DISCONNECT 0x00 was answered by the broker's close"},
	{"will-missing", []int{14}, "a Will owed (DISCONNECT 0x04, a reset socket, a cut link) never published by the end, across kills and SIGTERMs too, outside every loss window"},
	// rfcs/wills.md, not one of the eighteen.
	{"will-early", nil, "a Will published before its connection ended plus its Will Delay Interval"},
	{"will-cancelled-published", nil, "a Will published although its client resumed its session within the delay and then withdrew it"},
	{"will-topic-accepted", nil, "a CONNECT whose Will topic holds a wildcard accepted (docs/protocol.md: refused 0x90, a Will topic is a topic name)"},
	// docs/channels.md "`latest`", not one of the eighteen: a latest consumer never sent an
	// older value after a newer one; a point read of a key a latest channel
	// holds is answered, on the asker's Response Topic, before its PUBACK.
	{"latest-order", nil, "a latest consumer sent an older value after a newer one, on one connection"},
	{"point-read-refused", nil, "a point read of a key the latest channel holds refused on its PUBACK"},
	{"point-read-unanswered", nil, "a point read acknowledged with success and no answer on its Response Topic, the connection still up"},
}

// ruleOnly are the catalog entries no invariant covers: the broker's own
// promises (docs/channels.md, rfcs/wills.md) about latest channels, point reads and Wills.
var ruleOnly = []string{"latest-order", "point-read-refused", "point-read-unanswered",
	"will-early", "will-cancelled-published", "will-topic-accepted"}

// CatalogEntry returns the catalog entry a Finding's check belongs to.
func CatalogEntry(check string) (CheckInfo, bool) {
	for _, c := range Catalog {
		if c.Name == check || (strings.HasSuffix(c.Name, "*") && strings.HasPrefix(check, strings.TrimSuffix(c.Name, "*"))) {
			return c, true
		}
	}
	return CheckInfo{}, false
}

// reportJSON is what a campaign leaves beside report.txt for tools (make
// invariants): which checks ran and which found something.
type reportJSON struct {
	Seed       uint64         `json:"seed"`
	Provider   string         `json:"provider"`
	Control    string         `json:"control,omitempty"`
	OK         bool           `json:"ok"`
	Cycles     int            `json:"cycles"`
	Applied    map[string]int `json:"applied"`
	Operations int            `json:"operations"`
	Checks     []string       `json:"checks"`
	Violations []string       `json:"violations"` // catalog names of the checks that found something
	Waived     []string       `json:"waived"`
}

func writeReportJSON(dir string, rep *Report) error {
	out := reportJSON{Seed: rep.Seed, Provider: rep.Provider, Control: rep.Control, OK: rep.OK(),
		Cycles: rep.Cycles, Applied: rep.Applied, Operations: rep.Stats.Operations,
		Violations: []string{}, Waived: []string{}}
	for _, c := range Catalog {
		out.Checks = append(out.Checks, c.Name)
	}
	name := func(f Finding) string {
		if c, ok := CatalogEntry(f.Check); ok {
			return c.Name
		}
		return f.Check
	}
	for _, f := range rep.Violations {
		out.Violations = append(out.Violations, name(f))
	}
	for _, f := range rep.Waived {
		out.Waived = append(out.Waived, name(f))
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), data, 0o644); err != nil {
		return fmt.Errorf("write report.json: %w", err)
	}
	return nil
}
