package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// tableRow is one printed row: the key its cells are stored under and the
// label shown.
type tableRow struct {
	key, label string
	peersNA    bool   // no peer has this (channels, queues, start-up over records)
	peersFrom  string // the peers' cells come from this row (append rows: their broadcast)
}

func (b *bench) tableRows() []tableRow {
	fan := func(k string) tableRow {
		return tableRow{key: k, label: strings.Replace(k, "N", strconv.Itoa(b.o.fanSubs), 1)}
	}
	deaf := func(k string) tableRow {
		return tableRow{key: k, label: commas(float64(b.o.deafMessages)) + " " + k}
	}
	rows := []tableRow{
		{key: rowBroadcast, label: fmt.Sprintf("QoS 1 publish, %d in flight, broadcast, msgs/s", b.o.inFlight)},
		{key: rowAppendMem, label: fmt.Sprintf("QoS 1 publish, %d in flight, append on memory, msgs/s", b.o.inFlight), peersFrom: rowBroadcast},
		{key: rowAppendSql, label: fmt.Sprintf("QoS 1 publish, %d in flight, append on sqlite, msgs/s", b.o.inFlight), peersFrom: rowBroadcast},
		{key: rowBroadcastDeep, label: fmt.Sprintf("QoS 1 publish, %s, broadcast, msgs/s", b.tableDeep())},
		{key: rowAppendSqlDeep, label: fmt.Sprintf("QoS 1 publish, %s, append on sqlite, msgs/s", b.tableDeep()), peersFrom: rowBroadcastDeep},
		{key: rowQoS0, label: fmt.Sprintf("QoS 0 publish, %d publishers, delivered msgs/s", b.o.inFlight)},
		fan(rowFanRate), fan(rowFanP50), fan(rowFanP99),
		deaf(rowDeafLive), deaf(rowDeafAck), {key: rowDeafGone0, label: rowDeafGone0}, {key: rowDeafGone1, label: rowDeafGone1},
	}
	for _, n := range b.o.storms {
		ns := commas(float64(n))
		rows = append(rows, tableRow{key: fmt.Sprintf(rowStormTime, ns), label: fmt.Sprintf(rowStormTime, ns)},
			tableRow{key: fmt.Sprintf(rowStormBytes, ns), label: fmt.Sprintf(rowStormBytes, ns)})
	}
	rows = append(rows,
		tableRow{key: rowQueueMem, label: rowQueueMem, peersNA: true},
		tableRow{key: rowQueueSql, label: rowQueueSql, peersNA: true},
		tableRow{key: rowReplayMem, label: strings.Replace(rowReplayMem, "replay", "replay of "+commas(float64(b.o.replayRecords)), 1), peersNA: true},
		tableRow{key: rowReplaySql, label: strings.Replace(rowReplaySql, "replay", "replay of "+commas(float64(b.o.replayRecords)), 1), peersNA: true},
		tableRow{key: rowStartup, label: fmt.Sprintf("start-up over %s sqlite records (median), s", commas(float64(b.o.startupRecords))), peersNA: true},
	)
	return rows
}

// fillChannelCells copies the replay and start-up figures (measured by
// their own groups) into the table.
func (b *bench) fillChannelCells() {
	r := b.results
	t := r.table
	for st, row := range map[string]string{"memory": rowReplayMem, "sqlite": rowReplaySql} {
		if c, ok := r.replay[st]; ok {
			t.set(row, "saguin", tcell{v: c.rate, ok: c.ok, err: c.err})
		}
	}
	if st := r.startup; st != nil {
		if len(st.runs) > 0 {
			t.set(rowStartup, "saguin", tcell{v: median(st.runs).Seconds(), ok: true})
		} else {
			t.set(rowStartup, "saguin", tcell{err: st.err})
		}
	}
}

// reportTable prints the one table.
func (b *bench) reportTable() {
	b.fillChannelCells()
	w := b.out
	t := b.results.table
	fmt.Fprintln(w)
	fmt.Fprintln(w, "== the table: Sagüin beside its peers, every figure from this run")
	for _, col := range tableCols[1:] {
		if v, ok := t.vers[col]; ok {
			fmt.Fprintf(w, "%s: %s\n", col, v)
		}
	}
	fmt.Fprintf(w, "Load: %d-byte payloads; %d publishers with one QoS 1 (or QoS 0) publish each in flight and one subscriber at the same QoS,\n", b.o.payload, b.o.inFlight)
	fmt.Fprintf(w, "publishers held back while it is %d behind; fan-out: one QoS 1 publisher (8 in flight) to %d QoS 1 subscribers, held\n", b.o.maxLag, b.o.fanSubs)
	fmt.Fprintf(w, "while the slowest is %d behind; every message accounted for exactly once, in order. %s per run. MQTT 5, except NATS: 3.1.1.\n", b.o.maxLag, b.o.duration)
	fmt.Fprintln(w, "Ratios are saguin/peer: above 1 is better for rates, below 1 for times (s, ms) and memory (KiB). n/a: the peer has no such thing.")
	fmt.Fprintln(w, "Sagüin's broadcast, QoS 0, fan-out, deaf-subscriber and storm figures are on the memory provider.")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\t")
	for _, col := range tableCols {
		fmt.Fprintf(tw, "%s\t", col)
	}
	for _, col := range tableCols[1:] {
		fmt.Fprintf(tw, "saguin/%s\t", col)
	}
	fmt.Fprintln(tw)
	var notes []string
	mark := func(text, note string) string {
		if note == "" {
			return text
		}
		i := slices.Index(notes, note)
		if i < 0 {
			notes = append(notes, note)
			i = len(notes) - 1
		}
		return text + " [" + strconv.Itoa(i+1) + "]"
	}
	for _, row := range b.tableRows() {
		cells := make([]tcell, len(tableCols))
		present := make([]bool, len(tableCols))
		for i, col := range tableCols {
			key := row.key
			if i > 0 && row.peersFrom != "" {
				key = row.peersFrom
			}
			cells[i], present[i] = t.cells[key][col]
			if i > 0 && row.peersNA {
				cells[i], present[i] = tcell{na: true}, true
			}
		}
		fmt.Fprintf(tw, "%s\t", row.label)
		for i := range tableCols {
			text := b.cellText(row.key, cells[i], present[i])
			if i > 0 && row.peersFrom != "" && cells[i].ok {
				text = mark(text, "a peer's figure beside an append row is its QoS 1 broadcast: it has no channels")
			}
			if cells[i].note != "" {
				text = mark(text, cells[i].note)
			}
			fmt.Fprintf(tw, "%s\t", text)
		}
		for i := 1; i < len(tableCols); i++ {
			fmt.Fprintf(tw, "%s\t", tratio(cells[0], cells[i]))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for i, n := range notes {
		fmt.Fprintf(w, "[%d] %s\n", i+1, n)
	}
}

func (b *bench) cellText(row string, c tcell, present bool) string {
	switch {
	case !present:
		return "-"
	case c.na:
		return "n/a"
	case !c.ok:
		return "FAILED"
	case c.text != "":
		return c.text
	case strings.HasSuffix(row, ", ms"):
		return strconv.FormatFloat(c.v, 'f', 2, 64)
	case strings.HasSuffix(row, ", s"):
		return strconv.FormatFloat(c.v, 'f', 3, 64)
	case strings.HasSuffix(row, ", KiB"):
		return strconv.FormatFloat(c.v, 'f', 1, 64)
	default:
		return commas(c.v)
	}
}

func tratio(s, p tcell) string {
	if !s.ok || !p.ok || s.text != "" || p.text != "" || p.v <= 0 {
		return "-"
	}
	return strconv.FormatFloat(s.v/p.v, 'f', 2, 64)
}

// tableTargets prints the targets against the table.
func (b *bench) tableTargets() {
	w := b.out
	t := b.results.table
	get := func(row, col string) (float64, bool) {
		c, ok := t.cells[row][col]
		return c.v, ok && c.ok && c.text == ""
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	vs := func(what, row, col, peerRow string, factor float64, atMost bool) {
		s, sok := get(row, "saguin")
		p, pok := get(peerRow, col)
		if !sok || !pok {
			fmt.Fprintf(w, "%s: no figure\n", what)
			return
		}
		r := s / p
		met := r >= factor
		if atMost {
			met = r <= factor
		}
		fmt.Fprintf(w, "%s: %.2fx, %s\n", what, r, verdict(met))
	}
	vs("QoS 1 broadcast publish >= 1.0x mosquitto", rowBroadcast, "mosquitto", rowBroadcast, 1.0, false)
	vs("QoS 0 publish >= 1.0x mosquitto", rowQoS0, "mosquitto", rowQoS0, 1.0, false)
	vs("QoS 1 broadcast publish >= 1.0x bare mochi", rowBroadcast, "mochi", rowBroadcast, 1.0, false)
	vs(fmt.Sprintf("QoS 1 publish into append on sqlite, %d publishers, >= 0.8x bare mochi's broadcast", b.o.inFlight),
		rowAppendSql, "mochi", rowBroadcast, 0.8, false)
	vs(fmt.Sprintf("QoS 1 publish into append on sqlite, %s, >= 0.8x bare mochi's broadcast", b.tableDeep()),
		rowAppendSqlDeep, "mochi", rowBroadcastDeep, 0.8, false)
	vs(fmt.Sprintf("fan-out 1 -> %d p99 <= 1.5x mosquitto's", b.o.fanSubs), rowFanP99, "mosquitto", rowFanP99, 1.5, true)
	for _, n := range b.o.storms {
		row := fmt.Sprintf(rowStormBytes, commas(float64(n)))
		if v, ok := get(row, "saguin"); ok {
			fmt.Fprintf(w, "idle connection <= 16 KiB RSS (storm of %s): %.1f KiB, %s\n", commas(float64(n)), v, verdict(v <= 16))
		} else {
			fmt.Fprintf(w, "idle connection <= 16 KiB RSS (storm of %s): no figure\n", commas(float64(n)))
		}
	}
	if c, ok := t.cells[rowDeafGone0]["saguin"]; ok {
		fmt.Fprintf(w, "a QoS 0 subscriber that stops reading is disconnected after write_timeout: %s, %s\n", c.text, verdict(c.text == "yes"))
	}
	if c, ok := t.cells[rowDeafGone1]["saguin"]; ok {
		fmt.Fprintf(w, "a QoS 1 subscriber that stops reading: disconnected %s (its window of unacknowledged deliveries bounds what is written to it)\n", c.text)
	}
	s, sok := get(rowDeafAck, "saguin")
	l, lok := get(rowDeafLive, "saguin")
	if sok && lok && l > 0 {
		fmt.Fprintf(w, "publisher beside deaf subscribers / beside one keeping up: %.2fx (not held back: %s at <= 1.5x)\n", s/l, verdict(s/l <= 1.5))
	}
}
