package broker

import (
	"testing"
	"time"
)

// docs/operations.md "The routes", the record of refused clients at its bound: a newcomer
// displaces a client refused exactly once, never a repeat offender; when
// every row is a repeat offender the newcomer is dropped; what no row
// keeps is counted in beyond, so the rows' counts and beyond add up to
// every refusal. Strings are cut to limits.max_topic_length on a whole
// character.
func TestRefusedRecordKeepsRepeatOffendersAtItsBound(t *testing.T) {
	r := newRefusedRecord(3, 8)
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	total := 0
	add := func(id string) {
		total++
		at = at.Add(time.Second)
		r.add(id, "user-"+id, "refused "+id, at)
	}
	for _, id := range []string{"a", "b", "c", "c"} {
		add(id)
	}
	add("d") // displaces a or b
	if v := r.view(10); v.Tracked != 3 || v.Beyond != 1 || r.rows["c"] == nil || r.rows["d"] == nil || (r.rows["a"] != nil) == (r.rows["b"] != nil) {
		t.Fatalf("after d: %+v", v)
	}
	add("d")
	for _, id := range []string{"a", "b"} {
		if r.rows[id] != nil {
			add(id) // the survivor of a and b: a repeat offender now
		}
	}
	if len(r.once) != 0 {
		t.Fatalf("every row refused twice, yet %v are once-refused", r.once)
	}
	add("e") // dropped: nobody to displace
	if r.rows["e"] != nil || r.view(10).Beyond != 2 {
		t.Fatalf("a newcomer displaced a repeat offender: %+v", r.view(10))
	}
	v := r.view(2)
	if v.Returned != 2 || v.Tracked != 3 || v.Clients[0].Count != 2 || !time.Time(*v.Clients[0].LastSeen).After(time.Time(*v.Clients[1].LastSeen)) {
		t.Fatalf("worst first, the latest among equals first, capped: %+v", v)
	}
	sum := v.Beyond
	for _, row := range r.rows {
		sum += row.count
	}
	if sum != uint64(total) {
		t.Fatalf("rows and beyond count %d refusals; %d were given", sum, total)
	}

	cut := newRefusedRecord(10, 8)
	cut.add("abcdefghij", "", "", at)
	cut.add("abcdefgé!", "", "", at) // é is bytes 8 and 9: cut before it
	if cut.rows["abcdefgh"] == nil || cut.rows["abcdefg"] == nil || len(cut.rows) != 2 {
		t.Fatalf("ids cut to 8 bytes: %v", cut.rows)
	}
}

// docs/operations.md "The routes", the record of lost positions: one row per (reader,
// channel), every passing aggregated (reported false once any went
// untold); at its bound a newcomer displaces the row that lost the fewest
// records if it lost more, and is dropped otherwise; beyond counts the
// passings no row keeps.
func TestLostRecordDisplacesTheReaderThatLostLeast(t *testing.T) {
	r := newLostRecord(2, 64)
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	pass := func(reader string, missed uint64, told bool) {
		r.add(lostPassing{reader: reader, channel: "events", kind: lostSession, told: told, position: 10, floor: 10 + missed}, at)
	}
	pass("mqtt:big", 5, true)
	pass("mqtt:small", 1, true)
	pass("mqtt:mid", 3, true) // displaces small
	if v := r.view(10); v.Tracked != 2 || v.Beyond != 1 || v.Readers[0].Reader+" "+v.Readers[1].Reader != "mqtt:big mqtt:mid" {
		t.Fatalf("after mid: %+v", v)
	}
	pass("mqtt:tiny", 2, true) // loses to mid: dropped
	if v := r.view(10); v.Beyond != 2 || r.rows[lostKey{"mqtt:tiny", "events"}] != nil {
		t.Fatalf("after tiny: %+v", v)
	}
	pass("mqtt:mid", 4, false)
	row := r.rows[lostKey{"mqtt:mid", "events"}]
	if row.count != 2 || row.missed != 7 || !row.untold || row.floor != 14 {
		t.Fatalf("two passings of mid: %+v", row)
	}
	if v := r.view(1); v.Returned != 1 || v.Readers[0].Reader != "mqtt:mid" || v.Readers[0].Reported {
		t.Fatalf("the most missed first, capped: %+v", v)
	}
}
