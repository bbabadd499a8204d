package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
)

// reportSessions prints the sessions table.
func (b *bench) reportSessions() {
	w := b.out
	sr := b.results.sessions
	fmt.Fprintln(w)
	fmt.Fprintf(w, "sessions: %s durable MQTT 5 sessions (Session Expiry 1h, one QoS 1 subscription each on its own topic), created %d at a time,\n",
		commas(float64(b.o.sessions)), b.o.createConcurrency)
	fmt.Fprintf(w, "idle, then all reconnected (Clean Start 0, %d dialling at a time; every CONNACK Session Present 1) and held. Memory is the\n", b.o.dialers)
	fmt.Fprintf(w, "broker's VmRSS %s after each stage, over its RSS at start, per session (a Go broker's includes its GC headroom).\n", b.o.rssSettle)
	fmt.Fprintf(w, "Backlog: %s away sessions subscribed at QoS 1 to one topic; %d QoS 1 messages of %d bytes published to it (%d in flight);\n",
		commas(float64(b.o.backlogSessions)), b.o.backlogMessages, b.o.payload, b.o.window)
	fmt.Fprintln(w, "then all reconnect and each receives all, in order, exactly once (DUP-flagged redeliveries aside). Times in s;")
	fmt.Fprintf(w, "ratios saguin/reference (below 1: Sagüin used less). Sagüin ran with max_connect_rate %s.\n", b.o.connectRate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tstorage\tsaguin\tmochi\tmosquitto\tsaguin/mochi\tsaguin/mosquitto\t")
	type fig func(col string) (string, float64, bool)
	ratioOf := func(a float64, aok bool, r float64, rok bool) string {
		if !aok || !rok || r <= 0 || a < 0 {
			return "-"
		}
		return strconv.FormatFloat(a/r, 'f', 2, 64)
	}
	row := func(name string, f fig) {
		mo, mov, mook := f("mochi")
		mq, mqv, mqok := f("mosquitto")
		if !b.o.has("saguin") {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t%s\t-\t-\t\n", name, mo, mq)
			return
		}
		for _, st := range b.o.storages {
			s, sv, sok := f("saguin " + st)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, st, s, mo, mq, ratioOf(sv, sok, mov, mook), ratioOf(sv, sok, mqv, mqok))
		}
	}
	memFig := func(pick func(*memCell) float64) fig {
		return func(col string) (string, float64, bool) {
			c, present := sr.mem[col]
			switch {
			case !present:
				return "-", 0, false
			case !c.memOK:
				return "FAILED", 0, false
			}
			v := pick(c)
			return strconv.FormatFloat(v, 'f', 1, 64), v, true
		}
	}
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) }
	row("KiB per idle persistent session", memFig((*memCell).perIdle))
	row("KiB per connected client (with its session)", memFig((*memCell).perConnected))
	row(fmt.Sprintf("reconnect storm of %s, s", commas(float64(b.o.sessions))), func(col string) (string, float64, bool) {
		c, present := sr.mem[col]
		switch {
		case !present:
			return "-", 0, false
		case !c.stormOK:
			return "FAILED", 0, false
		}
		return secs(c.storm), c.storm.Seconds(), true
	})
	backlogFig := func(pick func(*backlogCell) time.Duration) fig {
		return func(col string) (string, float64, bool) {
			c, present := sr.backlog[col]
			switch {
			case !present:
				return "-", 0, false
			case !c.ok:
				return "FAILED", 0, false
			}
			return secs(pick(c)), pick(c).Seconds(), true
		}
	}
	backlogName := fmt.Sprintf("backlog %s x %d", commas(float64(b.o.backlogSessions)), b.o.backlogMessages)
	row(backlogName+": stored, s", backlogFig(func(c *backlogCell) time.Duration { return c.store }))
	row(backlogName+": delivered, s", backlogFig(func(c *backlogCell) time.Duration { return c.deliver }))
	_ = tw.Flush()
	var cols []string
	for _, st := range b.o.storages {
		cols = append(cols, "saguin "+st)
	}
	cols = append(cols, "mochi", "mosquitto")
	for _, col := range cols {
		c, ok := sr.mem[col]
		if !ok || !c.memOK {
			continue
		}
		fmt.Fprintf(w, "RSS %s: %s MiB at start, %s idle, %s connected, %s after all left; sessions created in %ss\n",
			col, mib(c.base), mib(c.idle), mib(c.connected), mib(c.after), secs(c.create))
	}
	for _, col := range cols {
		if c, ok := sr.backlog[col]; ok && c.ok && c.dups > 0 {
			fmt.Fprintf(w, "backlog %s: %d DUP-flagged redeliveries\n", col, c.dups)
		}
	}
	if b.o.has("mochi") {
		fmt.Fprintln(w, "mochi runs no backlog: v2.7.9 resends an away session's messages sorted by a timestamp in whole seconds, so a backlog")
		fmt.Fprintln(w, "published within a second comes back out of order (and its QoS 1 delivery deadlocks under load).")
	}
	fmt.Fprintln(w, "Reference (Raspberry Pi 4, 1,000 x 100): stored 3.5s / delivered 2.0s on memory, 16.4s / 31.3s on sqlite.")
}

// sessionsHeader is the header's line for the sessions scenarios.
func (b *bench) sessionsHeader() string {
	return fmt.Sprintf("sessions: %s durable sessions (memory, reconnect storm, %d dialling), backlog of %d messages for %s away sessions; %s per scenario at most",
		commas(float64(b.o.sessions)), b.o.dialers, b.o.backlogMessages, commas(float64(b.o.backlogSessions)), b.o.sessionsTimeout)
}
