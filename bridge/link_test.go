package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"saguin.dev/bridge/bridgetest"
)

// runLink starts a link to peer with rules, stopped at the test's end.
func runLink(t *testing.T, peer *bridgetest.Mosquitto, local Local, id string, rm uint16, ackInterval time.Duration, rules ...*Rule) *Link {
	t.Helper()
	return runLinkTo(t, peer.URL(), local, id, rm, ackInterval, rules...)
}

// runLinkTo is runLink to any address (a proxy before the peer).
func runLinkTo(t *testing.T, peer *url.URL, local Local, id string, rm uint16, ackInterval time.Duration, rules ...*Rule) *Link {
	t.Helper()
	return runLinkWith(t, Config{Peer: peer, ClientID: id, ReceiveMaximum: rm, AckInterval: ackInterval, Rules: rules}, local)
}

// runLinkWith starts a link of cfg (name, session expiry and a quick
// backoff filled in), stopped at the test's end.
func runLinkWith(t *testing.T, cfg Config, local Local) *Link {
	t.Helper()
	l, err := New(Config{
		Name: "up", Peer: cfg.Peer, ClientID: cfg.ClientID, SessionExpiry: time.Hour, KeepAlive: cfg.KeepAlive,
		ReceiveMaximum: cfg.ReceiveMaximum, AckInterval: cfg.AckInterval, Rules: cfg.Rules, Log: cfg.Log,
		Backoff: func(n int) time.Duration { return time.Duration(min(n, 5)) * 20 * time.Millisecond },
	}, local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("the link did not stop within 15s")
		}
	})
	return l
}

func rule(t *testing.T, filter string, dir Direction, tmpl string) *Rule {
	t.Helper()
	r, _, err := NewRule(filter, dir, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// subscribed waits until the peer has answered the link's SUBSCRIBE n
// times in all (mosquitto -v logs each SUBACK it sends).
func subscribed(t *testing.T, peer *bridgetest.Mosquitto, id string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("SUBACK %d to %s", n, id), func() bool { return peer.Count("Sending SUBACK to "+id) >= n })
}

// Records published at the peer under an in rule are stored here under
// the rule's name, in the order published, properties and all.
func TestInboundStoresInOrderUnderTheRulesName(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	local := newMemLocal()
	l := runLink(t, peer, local, "edge-in", 20, 5*time.Millisecond,
		rule(t, "fleet/+/#", In, "local/$1/$#"), rule(t, "cmd/#", In, "commands/$#"))
	subscribed(t, peer, "edge-in", 1)
	pub := newPublisher(t, peer, "hub-pub")
	var want []string
	for i := range 50 {
		pub.publish(fmt.Sprintf("fleet/v%d/engine/rpm", i%3), strconvI(i), byte(1+i%2))
		want = append(want, fmt.Sprintf("local/v%d/engine/rpm %d", i%3, i))
	}
	pub.publish("cmd/valve", "open", 1)
	want = append(want, "commands/valve open")
	waitFor(t, "51 records stored", func() bool { return len(local.topics()) >= len(want) })
	if got := local.topics(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stored:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if s := l.Stats(); s.Stored != 51 || !s.Connected || s.Duplicates != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A full channel here is backpressure: nothing is acknowledged while the
// broker cannot hold records, so the peer has exactly receive_maximum out
// with us and sends no more; once room comes, every record is stored, in
// order, none dropped.
func TestInvariant13_InboundFullChannelHoldsThePeerAtReceiveMaximum(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	local := newMemLocal()
	local.hold(true)
	const rm = 5
	l := runLink(t, peer, local, "edge-full", rm, 5*time.Millisecond, rule(t, "jobs/#", In, "local/$#"))
	subscribed(t, peer, "edge-full", 1)
	pub := newPublisher(t, peer, "hub-pub")
	for i := range 30 {
		pub.publish("jobs/j", strconvI(i), 1)
	}
	waitFor(t, "the peer to send a receive_maximum", func() bool { return l.Stats().Received >= rm })
	// The peer has all 30 and would send more if it may: it may not.
	time.Sleep(300 * time.Millisecond)
	if got := l.Stats().Received; got != rm {
		t.Fatalf("the peer sent %d records with none acknowledged; want exactly receive_maximum (%d)", got, rm)
	}
	if l.Stats().Retries == 0 {
		t.Fatal("the held record was not retried")
	}
	local.hold(false)
	waitFor(t, "30 records stored", func() bool { return len(local.topics()) >= 30 })
	got := local.topics()
	for i, g := range got {
		if g != "local/j "+strconvI(i) {
			t.Fatalf("record %d stored as %q; want local/j %d (order kept, none lost)", i, g, i)
		}
	}
	if len(got) != 30 {
		t.Fatalf("%d stored, want 30", len(got))
	}
}

// A record that can never be stored is acknowledged, dropped and counted
// with its cause, and the records after it flow; so are records no rule
// maps.
func TestInboundNeverAcceptedIsCountedAndTheLinkFlows(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	local := newMemLocal()
	local.never["local/poison"] = "too_large"
	l := runLink(t, peer, local, "edge-poison", 3, 5*time.Millisecond,
		rule(t, "in/#", In, "local/$#"), rule(t, "empty/#", In, "$#"))
	subscribed(t, peer, "edge-poison", 1)
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("in/a", "1", 1)
	pub.publish("in/poison", "x", 1)
	pub.publish("empty", "nothing to name it", 1) // "#" matched no level: the name is empty
	for i := 2; i <= 10; i++ {
		pub.publish("in/a", strconvI(i), 1)
	}
	waitFor(t, "10 records stored", func() bool { return len(local.topics()) >= 10 })
	s := l.Stats()
	if s.Unstored[CauseNeverAccepted] != 1 || s.Unstored[CauseUnmappable] != 1 || s.Stored != 10 || len(s.Unstored) != 2 {
		t.Fatalf("stats %+v; want 10 stored, 1 never_accepted (a cause outside the closed set counts as that), 1 unmappable", s)
	}
}

// A record stored here whose acknowledgement the link lost (the connection
// dropped before ack_interval sent it) comes again from the peer with DUP
// on the next connection: it is recognised, acknowledged, and not stored a
// second time; the session was kept, so nothing is subscribed again.
func TestInboundRedeliveryAfterALostAckIsStoredOnce(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("QoS%d", qos), func(t *testing.T) {
			peer := bridgetest.StartMosquitto(t, "")
			local := newMemLocal()
			// One second of batching: the records are stored well before
			// their acknowledgements (PUBACK, or PUBREC at QoS 2) would leave.
			id := fmt.Sprintf("edge-dup-%d", qos)
			l := runLink(t, peer, local, id, 20, time.Second, rule(t, "d/#", In, "local/$#"))
			subscribed(t, peer, id, 1)
			pub := newPublisher(t, peer, "hub-pub")
			for i := range 8 {
				pub.publish("d/x", strconvI(i), qos)
			}
			waitFor(t, "8 records stored", func() bool { return len(local.topics()) >= 8 })
			l.rebuild()
			waitFor(t, "8 redeliveries recognised", func() bool { return l.Stats().Duplicates >= 8 })
			pub.publish("d/x", "after", qos)
			waitFor(t, "the record after the reconnection", func() bool { return len(local.topics()) >= 9 })
			if got := local.topics(); len(got) != 9 || got[8] != "local/x after" {
				t.Fatalf("stored %q; want each of the 8 once, then the one after", got)
			}
			if n := peer.Count("Sending SUBACK to " + id); n != 1 {
				t.Fatalf("%d SUBACKs to the link; a kept session is not subscribed again", n)
			}
			if s := l.Stats(); s.Connects != 2 || s.SessionsLost != 0 {
				t.Fatalf("stats %+v; want 2 connections, no session lost", s)
			}
			// No exchange is left open at the peer: every record was
			// acknowledged (QoS 2: PUBREC, PUBREL, PUBCOMP) after all.
			if qos == 2 {
				waitFor(t, "9 PUBCOMPs from the link", func() bool { return peer.Count("Received PUBCOMP from "+id) >= 9 })
			}
		})
	}
}

// While the link is down, the peer keeps our session and queues what is
// published for us; it all arrives, in order, when the link is back, and
// the kept session is not subscribed again.
func TestInboundOutageIsQueuedAtThePeer(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	proxy := bridgetest.Start(t, peer.Addr())
	local := newMemLocal()
	l := runLinkTo(t, proxy.URL(), local, "edge-outage", 20, 5*time.Millisecond, rule(t, "o/#", In, "local/$#"))
	subscribed(t, peer, "edge-outage", 1)
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("o/x", "before", 1)
	waitFor(t, "the first record", func() bool { return len(local.topics()) >= 1 })
	proxy.Cut(true)
	waitFor(t, "the link down", func() bool { return !l.Stats().Connected })
	for i := range 20 {
		pub.publish("o/x", strconvI(i), 1)
	}
	if n := len(local.topics()); n != 1 {
		t.Fatalf("%d records stored with the link cut", n)
	}
	proxy.Cut(false)
	waitFor(t, "21 records", func() bool { return len(local.topics()) >= 21 })
	got := local.topics()
	for i := range 20 {
		if got[i+1] != "local/x "+strconvI(i) {
			t.Fatalf("record %d is %q", i+1, got[i+1])
		}
	}
	if n := peer.Count("Sending SUBACK to edge-outage"); n != 1 {
		t.Fatalf("%d SUBACKs; a kept session is not subscribed again", n)
	}
}

// The peer restarted without its state (Session Present 0 on a dial that
// resumes): the loss is counted and the in rules subscribed again, so
// records published after it still cross.
func TestInboundLostSessionIsCountedAndResubscribed(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "persistence false")
	local := newMemLocal()
	l := runLink(t, peer, local, "edge-lost", 20, 5*time.Millisecond, rule(t, "s/#", In, "local/$#"))
	subscribed(t, peer, "edge-lost", 1)
	peer.Restart()
	subscribed(t, peer, "edge-lost", 1) // the new process's log
	pub := newPublisher(t, peer, "hub-pub-2")
	pub.publish("s/after-restart", "x", 1)
	waitFor(t, "the record after the peer's restart", func() bool { return len(local.topics()) >= 1 })
	if s := l.Stats(); s.SessionsLost != 1 {
		t.Fatalf("stats %+v; want one session lost", s)
	}
}

func strconvI(i int) string { return fmt.Sprint(i) }

// The age of the oldest record not yet acknowledged grows while the broker
// cannot store it, and is back to 0 once it could: progress, not just
// "connected".
func TestInboundOldestUnacknowledgedAge(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	local := newMemLocal()
	local.hold(true)
	l := runLink(t, peer, local, "edge-age", 5, 5*time.Millisecond, rule(t, "a/#", In, "local/$#"))
	subscribed(t, peer, "edge-age", 1)
	if age := l.Stats().OldestUnacknowledged; age != 0 {
		t.Fatalf("age %v with nothing received", age)
	}
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("a/x", "1", 1)
	waitFor(t, "an age of 200ms", func() bool { return l.Stats().OldestUnacknowledged >= 200*time.Millisecond })
	local.hold(false)
	waitFor(t, "the record stored", func() bool { return len(local.topics()) == 1 })
	waitFor(t, "the age back to 0", func() bool { return l.Stats().OldestUnacknowledged == 0 })
}

// A link whose far end vanished without closing (every byte dropped, no
// FIN) is found dead by the keep-alive within 1.5× its period: the link is
// reported down and, once the path works again, comes back by itself with
// its session, and what was published meanwhile arrives.
func TestLinkBlackholedIsDetectedWithinOneAndAHalfKeepAlives(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	proxy := bridgetest.Start(t, peer.Addr())
	local := newMemLocal()
	const keepAlive = 4 * time.Second
	l := runLinkWith(t, Config{Peer: proxy.URL(), ClientID: "edge-bh", ReceiveMaximum: 20, AckInterval: 5 * time.Millisecond,
		KeepAlive: keepAlive, Rules: []*Rule{rule(t, "b/#", In, "local/$#")}}, local)
	subscribed(t, peer, "edge-bh", 1)
	waitFor(t, "the link up", func() bool { return l.Stats().Connected })
	proxy.Blackhole.Store(true)
	start := time.Now()
	waitFor(t, "the link found down", func() bool { return !l.Stats().Connected })
	took := time.Since(start)
	t.Logf("found down after %v (keep-alive %v)", took, keepAlive)
	if took > keepAlive*3/2 {
		t.Fatalf("a blackholed link was found down after %v; keep-alive %v allows 1.5x, %v", took, keepAlive, keepAlive*3/2)
	}
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("b/x", "while-dark", 1)
	proxy.Blackhole.Store(false)
	proxy.Cut(true) // the dead connections go; new ones pass
	proxy.Cut(false)
	waitFor(t, "the record published while the link was dark", func() bool { return len(local.topics()) >= 1 })
	if got := local.topics()[0]; got != "local/x while-dark" {
		t.Fatalf("stored %q", got)
	}
}

// logBuffer is a link's log, written by its goroutines and read by a test.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A peer that grants a lower QoS than asked (mosquitto's max_qos 1) is
// surfaced: one warning naming the rule's filter and what it now
// guarantees; its records still cross.
func TestLinkSurfacesAGrantedQoSDowngrade(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "max_qos 1")
	var logs logBuffer
	local := newMemLocal()
	runLinkWith(t, Config{Peer: peer.URL(), ClientID: "edge-qos", ReceiveMaximum: 20, AckInterval: 5 * time.Millisecond,
		Rules: []*Rule{rule(t, "q/#", In, "local/$#")}, Log: slog.New(slog.NewTextHandler(&logs, nil))}, local)
	subscribed(t, peer, "edge-qos", 1)
	waitFor(t, "the downgrade warned", func() bool { return strings.Contains(logs.String(), "granted a lower QoS") })
	line := logs.String()
	if !strings.Contains(line, "filter=q/#") || !strings.Contains(line, "granted_qos=1") || !strings.Contains(line, "at least once") {
		t.Fatalf("the warning does not name the rule and its guarantee:\n%s", line)
	}
	if n := strings.Count(line, "granted a lower QoS"); n != 1 {
		t.Fatalf("warned %d times", n)
	}
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("q/x", "still crosses", 1)
	waitFor(t, "the record", func() bool { return len(local.topics()) == 1 })
}

// The peer restarts with its state (persistence, a graceful stop): the
// link finds its session (Session Present 1), subscribes nothing again, and
// records published after the restart cross; no session is counted lost.
func TestLinkPeerRestartWithItsState(t *testing.T) {
	dir := t.TempDir()
	peer := bridgetest.StartMosquitto(t, "persistence true\npersistence_location "+dir+"/")
	local := newMemLocal()
	l := runLink(t, peer, local, "edge-kept", 20, 5*time.Millisecond, rule(t, "k/#", In, "local/$#"))
	subscribed(t, peer, "edge-kept", 1)
	pub := newPublisher(t, peer, "hub-pub")
	pub.publish("k/x", "before", 1)
	waitFor(t, "the first record", func() bool { return len(local.topics()) == 1 })
	peer.RestartGracefully()
	waitFor(t, "the link back", func() bool { return l.Stats().Connects >= 2 && l.Stats().Connected })
	pub2 := newPublisher(t, peer, "hub-pub-2")
	pub2.publish("k/x", "after", 1)
	waitFor(t, "the record after the restart", func() bool { return len(local.topics()) == 2 })
	if n := peer.Count("Sending SUBACK to edge-kept"); n != 0 {
		t.Fatalf("%d SUBACKs after the peer came back with our session; want none", n)
	}
	if s := l.Stats(); s.SessionsLost != 0 {
		t.Fatalf("stats %+v: a kept session counted lost", s)
	}
}

// Two links with one client_id at one peer (two brokers configured alike):
// mosquitto hands the session from one to the other by closing the older
// connection, with no DISCONNECT to say why. The link sees connections end
// right after being accepted, warns naming its client_id, and waits longer
// after each such flap instead of dialling again at once: a storm of
// reconnections is damped, not fed.
func TestLinkTakeoverStormIsWarnedAndDamped(t *testing.T) {
	peer := bridgetest.StartMosquitto(t, "")
	var logs logBuffer
	quick := func(n int) time.Duration { return time.Duration(n) * 50 * time.Millisecond }
	mk := func(log *slog.Logger) *Link {
		l, err := New(Config{Name: "twin", Peer: peer.URL(), ClientID: "edge-twin", SessionExpiry: time.Hour, ReceiveMaximum: 20,
			AckInterval: 5 * time.Millisecond, Rules: []*Rule{rule(t, "tw/#", In, "local/$#")}, Log: log, Backoff: quick}, newMemLocal())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = l.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return l
	}
	first := mk(slog.New(slog.NewTextHandler(&logs, nil)))
	waitFor(t, "the first link up", func() bool { return first.Stats().Connected })
	second := mk(nil)
	waitFor(t, "the flapping warned", func() bool { return strings.Contains(logs.String(), "keeps closing the link") })
	if !strings.Contains(logs.String(), "client_id=edge-twin") {
		t.Fatalf("the warning does not name the client_id:\n%s", logs.String())
	}
	// Damped: without it, the two re-dialled at once after each loss
	// (9,245 connections in 3 s when measured); with it, each waits at
	// least a second from the third flap on.
	before := peer.Count("as edge-twin")
	time.Sleep(3 * time.Second)
	if n := peer.Count("as edge-twin") - before; n > 30 {
		t.Fatalf("%d connections in 3 s: the storm is not damped (flaps %d and %d)", n, first.Stats().Flaps, second.Stats().Flaps)
	}
}

// A peer that refuses our CONNECT as not authorised is reported so: the
// attempt's failure is classified not_authorised, and no link is up.
func TestLinkNotAuthorisedIsClassified(t *testing.T) {
	dir := t.TempDir()
	pw := dir + "/passwd"
	if err := os.WriteFile(pw, []byte("someone:$7$101$abcdefghijklmnop$abcdefghijklmnopabcdefghijklmnop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	peer := bridgetest.StartMosquitto(t, "password_file "+pw+"\nallow_anonymous false")
	var logs logBuffer
	l := runLinkWith(t, Config{Peer: peer.URL(), ClientID: "edge-anon", ReceiveMaximum: 20, AckInterval: 5 * time.Millisecond,
		Rules: []*Rule{rule(t, "a/#", In, "local/$#")}, Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, newMemLocal())
	waitFor(t, "the refusal classified", func() bool { return strings.Contains(logs.String(), "why=not_authorised") })
	if l.Stats().Connected {
		t.Fatal("connected to a peer that refused us")
	}
}
