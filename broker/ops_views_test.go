package broker_test

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/clock"
	"saguin.dev/broker/internal/ops"
)

// awaitOps asks path until ok accepts the answer, and returns it; the
// broker's state moves on its own goroutines (an acknowledgement stored, a
// job handed over), so the test polls for it rather than sleeping.
func awaitOps(t *testing.T, c *opsHTTP, path string, ok func(opsReply) bool) opsReply {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		r := c.must(http.StatusOK, path)
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became what the test waits for; last answer:\n%s", path, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// /v1/operations/sessions (docs/operations.md "The routes"): held sessions with no
// connection first, then the connected ones; every field of the contract,
// null where only a connection knows it; partitions only on a session
// that declared a slice; the counts beside.
func TestOperationsSessionsShowsConnectedAndHeldSessions(t *testing.T) {
	b, c := startWithPasswords(t, "allow_anonymous: true")

	live, _ := dialMx(t, b.Address(), "live-a", mxConnect{clean: true, user: "dev-1", password: "pw-dev-1"})
	live.subscribe(1, "state/#", 1)
	live.subscribe(2, "news/#", 0)
	held, _ := dialMx(t, b.Address(), "held-b", mxConnect{clean: true, expiry: 3600})
	held.subscribe(1, "events/#", 1)
	held.disconnect()
	part := brokertest.Connect(t, b.Address(), "part-c", brokertest.ClientOptions{CleanStart: true})
	if _, err := part.SubscribeWith(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "events/#", QoS: 1}},
		Properties: &paho.SubscribeProperties{User: paho.UserProperties{
			{Key: "saguin-filter", Value: "topic_hash(4, 3)"}, {Key: "saguin-filter", Value: "topic_hash(4, 1)"}}}}); err != nil {
		t.Fatal(err)
	}

	r := awaitOps(t, c, "/v1/operations/sessions", func(r opsReply) bool { return bytes.Contains(r.body, []byte(`"offline":1`)) })
	whole := r.object(t)
	sameKeys(t, "the sessions answer", whole, "sessions", "total", "connected", "offline", "returned")
	var got ops.Sessions
	r.decode(t, &got)
	if got.Total != 3 || got.Connected != 2 || got.Offline != 1 || got.Returned != 3 || len(got.Sessions) != 3 {
		t.Fatalf("counts: %s", r.body)
	}
	if ids := []string{got.Sessions[0].ClientID, got.Sessions[1].ClientID, got.Sessions[2].ClientID}; fmt.Sprint(ids) != "[held-b live-a part-c]" {
		t.Fatalf("order %v, want the held session first", ids)
	}
	rows := whole["sessions"].([]any)
	sameKeys(t, "a held session", rows[0].(map[string]any), "client_id", "connected", "user", "protocol", "listener", "remote",
		"keepalive", "expires_after", "clean_start", "subscriptions", "last_seen")
	sameKeys(t, "a connected session", rows[1].(map[string]any), "client_id", "connected", "user", "protocol", "listener", "remote",
		"keepalive", "expires_after", "clean_start", "subscriptions")
	h := got.Sessions[0]
	if h.Connected || h.User != nil || h.Listener != nil || h.Remote != nil || h.Keepalive != nil || h.CleanStart != nil ||
		h.ExpiresAfter != 3600 || h.Protocol != "5" || h.Subscriptions != 1 || h.LastSeen == nil {
		t.Errorf("the held session: %s", rows[0])
	}
	l := got.Sessions[1]
	if !l.Connected || l.User == nil || *l.User != "dev-1" || *l.Listener != "tcp" || !strings.HasPrefix(*l.Remote, "127.0.0.1:") ||
		*l.Keepalive != 60 || l.ExpiresAfter != 0 || !*l.CleanStart || l.Subscriptions != 2 || l.Partitions != nil {
		t.Errorf("the connected session: %+v", rows[1])
	}
	p := got.Sessions[2]
	if p.User == nil || *p.User != "" || len(p.Partitions) != 1 || p.Partitions[0].Filter != "events/#" || p.Partitions[0].Count != 4 ||
		fmt.Sprint(p.Partitions[0].Indices) != "[1 3]" {
		t.Errorf("the partitioned session: %+v", rows[2])
	}
}

// /v1/operations/consumers (docs/operations.md "The routes"): a durable reader that
// acknowledged two of five records and left is behind by three — the
// channel's next offset less its position — and comes first; a connected
// reader that acknowledged everything is behind by none; readers are
// named mqtt:<client id>.
func TestOperationsConsumersShowsHowFarEachReaderIsBehind(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, opsConfig(t, dir, "", loopbackOps))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
	pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
	for i := 1; i <= 5; i++ {
		pub.publish1(uint16(i), "events/door", fmt.Sprintf("e%d", i), packets.Properties{})
	}
	slow, _ := dialMx(t, b.Address(), "slow", mxConnect{clean: true, expiry: 3600})
	slow.subscribe(1, "events/#", 1)
	for i := 1; i <= 5; i++ {
		pk := slow.nextPublish("a record")
		if i <= 2 {
			slow.puback(pk.PacketID)
		}
	}
	slow.disconnect()
	fast, _ := dialMx(t, b.Address(), "fast", mxConnect{clean: true, expiry: 3600})
	fast.subscribe(1, "events/#", 1)
	for i := 1; i <= 5; i++ {
		fast.puback(fast.nextPublish("a record").PacketID)
	}

	r := awaitOps(t, c, "/v1/operations/consumers", func(r opsReply) bool {
		return bytes.Contains(r.body, []byte(`{"reader":"mqtt:fast","offset":6,"behind":0`))
	})
	whole := r.object(t)
	sameKeys(t, "the consumers answer", whole, "channels", "total", "returned")
	var got ops.Consumers
	r.decode(t, &got)
	if got.Total != 2 || got.Returned != 2 || got.Channels[0].Channel != "events" || got.Channels[1].Channel != "jobs__dlq" {
		t.Fatalf("the channels, worst first: %s", r.body)
	}
	ch := whole["channels"].([]any)[0].(map[string]any)
	sameKeys(t, "a channel", ch, "channel", "next_offset", "consumers", "returned", "positions")
	sameKeys(t, "a position", ch["positions"].([]any)[0].(map[string]any), "reader", "offset", "behind", "last_seen")
	ev := got.Channels[0]
	if ev.NextOffset != 6 || ev.Consumers != 2 || ev.Returned != 2 || len(ev.Positions) != 2 {
		t.Fatalf("events: %+v", ev)
	}
	if s := ev.Positions[0]; s.Reader != "mqtt:slow" || s.Offset != 3 || s.Behind != 3 || s.LastSeen == nil {
		t.Errorf("the reader furthest behind: %+v", s)
	}
	if f := ev.Positions[1]; f.Reader != "mqtt:fast" || f.Offset != 6 || f.Behind != 0 || f.LastSeen == nil {
		t.Errorf("the caught-up reader: %+v", f)
	}
	if dlq := got.Channels[1]; dlq.Consumers != 0 || dlq.Positions == nil {
		t.Errorf("the dead-letter channel: %+v", dlq)
	}
}

// /v1/operations/queues/<channel> (docs/operations.md "The routes"): each unresolved job,
// oldest first, with its state — leased (PUBACK received: holder and
// lease_until written), delivering (handed out, no PUBACK yet) or waiting
// — and never its payload. An unknown name is 404 that does not list the
// queues; an append channel is not a queue.
func TestOperationsQueueShowsEachJobsState(t *testing.T) {
	dir := t.TempDir()
	b := brokertest.Start(t, opsConfig(t, dir, "", loopbackOps))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
	pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
	for i := 1; i <= 3; i++ {
		pub.publish1(uint16(i), "jobs/resize", fmt.Sprintf("payload-never-shown-%d", i), packets.Properties{})
	}
	w1, _ := dialMx(t, b.Address(), "w1", mxConnect{clean: true})
	w1.subscribe(1, "$saguin/queue/jobs", 1)
	job1 := w1.nextPublish("job 1")
	acked := time.Now()
	w1.puback(job1.PacketID)
	w2, _ := dialMx(t, b.Address(), "w2", mxConnect{clean: true})
	w2.subscribe(1, "$saguin/queue/jobs", 1)
	w2.nextPublish("job 2") // not acknowledged: delivering

	r := awaitOps(t, c, "/v1/operations/queues/jobs", func(r opsReply) bool {
		return bytes.Contains(r.body, []byte(`"state":"leased"`)) && bytes.Contains(r.body, []byte(`"state":"delivering"`))
	})
	whole := r.object(t)
	sameKeys(t, "the queue answer", whole, "channel", "unresolved", "returned", "records")
	recs := whole["records"].([]any)
	sameKeys(t, "a leased job", recs[0].(map[string]any), "offset", "topic", "attempts", "state", "holder", "lease_until", "first_seen", "last_seen")
	sameKeys(t, "a delivering job", recs[1].(map[string]any), "offset", "topic", "attempts", "state", "first_seen", "last_seen")
	sameKeys(t, "a waiting job", recs[2].(map[string]any), "offset", "topic", "attempts", "state", "first_seen", "last_seen")
	var q ops.Queue
	r.decode(t, &q)
	if q.Channel != "jobs" || q.Unresolved != 3 || q.Returned != 3 {
		t.Fatalf("the queue: %s", r.body)
	}
	seen := time.Now()
	// The lease runs visibility_timeout (30s) from the PUBACK.
	if j := q.Records[0]; j.Offset != 1 || j.State != "leased" || *j.Holder != "w1" || j.Attempts != 1 || j.LastSeen == nil ||
		j.LeaseUntil == nil || time.Time(*j.LeaseUntil).Before(acked.Add(30*time.Second).Truncate(time.Millisecond)) ||
		time.Time(*j.LeaseUntil).After(seen.Add(30*time.Second)) || j.Topic != "jobs/resize" {
		t.Errorf("job 1: %s (PUBACK at %s)", recs[0], acked)
	}
	if j := q.Records[1]; j.Offset != 2 || j.State != "delivering" || j.Holder != nil || j.LeaseUntil != nil {
		t.Errorf("job 2: %s", recs[1])
	}
	if j := q.Records[2]; j.Offset != 3 || j.State != "waiting" || j.Attempts != 0 || j.LastSeen != nil || j.FirstSeen == nil {
		t.Errorf("job 3: %s", recs[2])
	}
	if bytes.Contains(r.body, []byte("payload-never-shown")) {
		t.Errorf("the queue answer holds a payload: %s", r.body)
	}
	for _, name := range []string{"nojobs", "events", "jobs__dlq", "JOBS"} {
		r := c.must(http.StatusNotFound, "/v1/operations/queues/"+name)
		if bytes.Contains(r.body, []byte(`jobs"`)) || bytes.Contains(r.body, []byte("jobs,")) || bytes.Contains(r.body, []byte(" jobs")) {
			t.Errorf("the 404 for %s names the queues: %s", name, r.body)
		}
	}
}

// /v1/operations/position-lost (docs/operations.md "The routes"): a durable session whose
// stored position retention passed while it was away is filed as kind
// session, reported (it was answered Session Present 0), with how many
// records it missed and the position and floor of the passing; a reader
// overtaken while connected is kind consumer, not reported. Per channel,
// the counts add up to saguin_channel_position_lost_total (beyond is 0).
func TestOperationsPositionLostFilesEveryPassing(t *testing.T) {
	dir := t.TempDir()
	clk := clock.NewFake(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	b := brokertest.Start(t, opsConfig(t, dir, "", loopbackOps), brokertest.WithClock(clk))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
	pub, _ := dialMx(t, b.Address(), "pub", mxConnect{clean: true})
	dev, _ := dialMx(t, b.Address(), "dev", mxConnect{clean: true, expiry: 86400})
	dev.subscribe(1, "events/#", 1)
	for i := 1; i <= 2; i++ {
		pub.publish1(uint16(i), "events/a", fmt.Sprint(i), packets.Properties{})
		dev.puback(dev.nextPublish("a record").PacketID)
	}
	dev.disconnect()
	// A connected reader with room for one delivery, which it never
	// acknowledges: retention overtakes it.
	stuck, _ := dialMx(t, b.Address(), "stuck", mxConnect{clean: true, receiveMaximum: 1})
	stuck.subscribe(1, "events/#", 1)
	stuck.nextPublish("the first record, left unacknowledged")
	for i := 3; i <= 5; i++ {
		pub.publish1(uint16(i), "events/a", fmt.Sprint(i), packets.Properties{})
	}
	clk.Advance(2 * time.Hour)
	waitLog(t, b, `msg="retention removed records" broker=test channel=events records=5`)
	waitLog(t, b, `msg="consumer overtaken by retention: restarting at the floor" broker=test client=stuck channel=events position=2 floor=6 lost_records=4`)
	back, ack := dialMx(t, b.Address(), "dev", mxConnect{expiry: 86400})
	if ack.SessionPresent {
		t.Fatal("a session whose position retention passed was answered Session Present 1")
	}
	_ = back

	r := c.must(http.StatusOK, "/v1/operations/position-lost")
	whole := r.object(t)
	sameKeys(t, "the position-lost answer", whole, "readers", "returned", "tracked", "beyond")
	sameKeys(t, "a reader", whole["readers"].([]any)[0].(map[string]any), "reader", "channel", "kind", "reported", "count",
		"records_missed", "last_position", "last_floor", "last_seen")
	var got ops.PositionLost
	r.decode(t, &got)
	if got.Returned != 2 || got.Tracked != 2 || got.Beyond != 0 {
		t.Fatalf("counts: %s", r.body)
	}
	now := `"last_seen":"` + clk.Now().UTC().Format("2006-01-02T15:04:05.000Z") + `"`
	if s := got.Readers[0]; s.Reader != "mqtt:stuck" || s.Channel != "events" || s.Kind != "consumer" || s.Reported ||
		s.Count != 1 || s.RecordsMissed != 4 || s.LastPosition != 2 || s.LastFloor != 6 {
		t.Errorf("the overtaken consumer, who missed the most: %+v", s)
	}
	if s := got.Readers[1]; s.Reader != "mqtt:dev" || s.Channel != "events" || s.Kind != "session" || !s.Reported ||
		s.Count != 1 || s.RecordsMissed != 3 || s.LastPosition != 3 || s.LastFloor != 6 {
		t.Errorf("the returning session: %+v", s)
	}
	if strings.Count(string(r.body), now) != 2 {
		t.Errorf("last_seen is not the broker's clock (%s): %s", now, r.body)
	}
	var sum uint64
	for _, x := range got.Readers {
		if x.Channel == "events" {
			sum += x.Count
		}
	}
	if want := b.PositionLost()["events"].Passings; int64(sum) != want {
		t.Errorf("the rows of events count %d passings; the metric counts %d", sum, want)
	}
}

// /v1/operations/refused (docs/operations.md "The routes"): a client refused at CONNECT
// for a wrong password (twice: its row counts both, and names the user it
// gave) and one refused for its protocol version under
// min_protocol_version "5" each have a row, worst first; 101 more refused
// client ids make 100 rows returned of every one tracked, none beyond the
// record's bound.
func TestOperationsRefusedListsRefusedClientsWorstFirst(t *testing.T) {
	b, c := startWithPasswords(t, `min_protocol_version: "5"`)

	for i := 0; i < 2; i++ {
		if _, ack := connectMx(t, b.Address(), "bad-pw", mxConnect{clean: true, user: "dev-1", password: "not-the-password"}); ack.ReasonCode != 0x86 {
			t.Fatalf("a wrong password: CONNACK 0x%02X", ack.ReasonCode)
		}
	}
	if _, ack := connectMx(t, b.Address(), "old-one", mxConnect{clean: true, v311: true}); ack.ReasonCode != 0x01 {
		t.Fatalf("a 3.1.1 client under min_protocol_version 5: CONNACK 0x%02X", ack.ReasonCode)
	}
	dialMx(t, b.Address(), "fine", mxConnect{clean: true, user: "dev-1", password: "pw-dev-1"})

	r := awaitOps(t, c, "/v1/operations/refused", func(r opsReply) bool { return bytes.Contains(r.body, []byte(`"tracked":2`)) })
	whole := r.object(t)
	sameKeys(t, "the refused answer", whole, "clients", "returned", "tracked", "beyond")
	sameKeys(t, "a refused client", whole["clients"].([]any)[0].(map[string]any), "client_id", "user", "reason", "count", "last_seen")
	var got ops.Refused
	r.decode(t, &got)
	if got.Returned != 2 || got.Beyond != 0 {
		t.Fatalf("counts: %s", r.body)
	}
	if x := got.Clients[0]; x.ClientID != "bad-pw" || x.User != "dev-1" || x.Count != 2 || !strings.Contains(x.Reason, "authentication") ||
		!strings.Contains(x.Reason, "(0x86)") || x.LastSeen == nil {
		t.Errorf("the wrong password: %+v", x)
	}
	if x := got.Clients[1]; x.ClientID != "old-one" || x.User != "" || x.Count != 1 || !strings.Contains(x.Reason, "min_protocol_version") {
		t.Errorf("the version refused: %+v", x)
	}
	if bytes.Contains(r.body, []byte("not-the-password")) || b.Log.Contains("not-the-password") {
		t.Error("the refused password is shown or logged")
	}

	for i := 0; i < 101; i++ {
		if _, ack := connectMx(t, b.Address(), fmt.Sprintf("v311-%03d", i), mxConnect{clean: true, v311: true}); ack.ReasonCode != 0x01 {
			t.Fatalf("CONNACK 0x%02X", ack.ReasonCode)
		}
	}
	r = awaitOps(t, c, "/v1/operations/refused", func(r opsReply) bool { return bytes.Contains(r.body, []byte(`"tracked":103`)) })
	r.decode(t, &got)
	if got.Returned != 100 || len(got.Clients) != 100 || got.Tracked != 103 || got.Beyond != 0 || got.Clients[0].ClientID != "bad-pw" {
		t.Fatalf("103 refused clients: returned %d tracked %d beyond %d, first %q", got.Returned, got.Tracked, got.Beyond, got.Clients[0].ClientID)
	}
}

// /v1/operations/users (docs/operations.md "The routes"): every MQTT door with the users of
// its password file, whether it admits anonymous clients and what it does
// with certificates (a unix door: none); the users of every door once;
// operators never.
func TestOperationsUsersListsEachDoorsClients(t *testing.T) {
	dir, sock := t.TempDir(), opsSocket(t, "mqtt.sock")
	pki := brokertest.NewPKI(t, dir, "fleet-ca")
	srv := pki.Server("broker")
	lan, fleet, operators := filepath.Join(dir, "lan"), filepath.Join(dir, "fleet"), filepath.Join(dir, "operators")
	writePasswordFile(t, lan, "u2", "u1")
	writePasswordFile(t, fleet, "u3", "u1")
	writeOperators(t, operators, operator{"opsadmin", ""})
	mqtt := `    listen:
      tcp:
        - name: lan
          address: "127.0.0.1:0"
          password_file: "` + lan + `"
        - name: fleet
          address: "127.0.0.1:0"
          password_file: "` + fleet + `"
          tls: ` + tlsBlock(srv, `, client_ca_file: "`+pki.CAFile+`"`) + `
      unix:
        path: "` + sock + `"
`
	b := brokertest.Start(t, opsConfig(t, dir, mqtt, "    password_file: \""+operators+"\"\n"+loopbackOps))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)
	r := c.must(http.StatusOK, "/v1/operations/users", basic("opsadmin", "pw-opsadmin"))
	whole := r.object(t)
	sameKeys(t, "the users answer", whole, "users", "total", "returned", "anonymous_allowed", "listeners")
	var got ops.Users
	r.decode(t, &got)
	if fmt.Sprint(got.Users) != "[u1 u2 u3]" || got.Total != 3 || !got.AnonymousAllowed || len(got.Listeners) != 3 {
		t.Fatalf("users: %s", r.body)
	}
	want := map[string]ops.Door{
		"lan":   {Users: []string{"u1", "u2"}, Total: 2, Returned: 2, Certificate: "none"},
		"fleet": {Users: []string{"u1", "u3"}, Total: 2, Returned: 2, Certificate: "required"},
		"unix":  {Users: []string{}, AnonymousAllowed: true, Certificate: "none"},
	}
	for name, w := range want {
		if g, ok := got.Listeners[name]; !ok || fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("door %s: %+v, want %+v", name, g, w)
		}
	}
	if bytes.Contains(r.body, []byte("opsadmin")) {
		t.Errorf("an operator is listed: %s", r.body)
	}
}

// /v1/operations/acl (docs/operations.md "The routes"): acl.Explain against the ACL in
// force — what a user may do and which pattern decided, whether a client
// id may use the name — following a reload; a name the file does not
// match has no grants (not 404); without an acl_file, everything is
// allowed. The user is asked for exactly once.
func TestOperationsACLExplainsTheACLInForce(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "passwd")
	writePasswordFile(t, pw, authPasswords...)
	aclPath := filepath.Join(dir, "acl.yaml")
	writeFileT(t, aclPath, authACL)
	mqtt := "    password_file: \"" + pw + "\"\n    acl_file: \"" + aclPath + "\"\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"
	b := brokertest.Start(t, opsConfig(t, dir, mqtt, loopbackOps))
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)

	r := c.must(http.StatusOK, "/v1/operations/acl?user=sensor-1&client_id=sensor-2")
	whole := r.object(t)
	sameKeys(t, "an explanation", whole, "user", "acl_file", "pattern_applied", "patterns_matched", "patterns_in_file",
		"client_id_allowed", "grants", "grants_withheld")
	if whole["user"] != "sensor-1" || whole["acl_file"] != aclPath || whole["pattern_applied"] != "sensor-*" || whole["client_id_allowed"] != false {
		t.Errorf("sensor-1 as sensor-2: %s", r.body)
	}
	grant := whole["grants"].([]any)[0].(map[string]any)
	sameKeys(t, "a grant", grant, "role", "kind", "subject", "verbs", "denies")
	if grant["subject"] != "events (events/sensor-1/#)" {
		t.Errorf("the first grant: %v", grant)
	}
	r = c.must(http.StatusOK, "/v1/operations/acl?user=stranger")
	if whole := r.object(t); whole["pattern_applied"] != nil || len(whole["grants"].([]any)) != 0 || whole["client_id_allowed"] != nil {
		t.Errorf("a name nothing matches: %s", r.body)
	}
	for _, q := range []string{"", "?client_id=x", "?user=a&user=b", "?user=a&client_id=x&client_id=y"} {
		c.must(http.StatusBadRequest, "/v1/operations/acl"+q)
	}

	writeFileT(t, aclPath, strings.Replace(authACL, `  "worker-*": [worker]`, `  "worker-*": [worker]
  stranger: [reader]`, 1))
	if err := b.ReloadAuthority(); err != nil {
		t.Fatal(err)
	}
	r = c.must(http.StatusOK, "/v1/operations/acl?user=stranger")
	if whole := r.object(t); whole["pattern_applied"] != "stranger" {
		t.Errorf("after the reload: %s", r.body)
	}

	plain := brokertest.Start(t, opsConfig(t, t.TempDir(), "", loopbackOps))
	r = opsOverTCP(t, plain.OperationsAddr("tcp").String(), nil).must(http.StatusOK, "/v1/operations/acl?user=anyone")
	if string(r.body) != "{\"acl_file\":null,\"everything_allowed\":true}\n" {
		t.Errorf("without an acl_file: %s", r.body)
	}
}

// /v1/operations/config (docs/operations.md "The routes"): the configuration as resolved at
// start — every !include read, defaults filled (a channel with no filter
// shows <name>/#), each channel with the file it is configured in —
// rendered once: an edit of the file since is not shown. ?section= narrows
// to the sections named, repeats compose, an unused section is an empty
// object, and an unknown one is 400 listing the sections.
func TestOperationsConfigIsTheResolvedConfigurationAsStarted(t *testing.T) {
	dir := t.TempDir()
	extra := filepath.Join(dir, "channels-extra.yaml")
	writeFileT(t, extra, "orders:\n  type: append\n")
	path := opsConfigWith(t, dir, "", loopbackOps,
		"  - !include channels-extra.yaml\n  - events:\n      type: append\n      filter: \"events/#\"\n      retention_period: 1h\n")
	b := brokertest.Start(t, path)
	c := opsOverTCP(t, b.OperationsAddr("tcp").String(), nil)

	r := c.must(http.StatusOK, "/v1/operations/config")
	whole := r.object(t)
	sameKeys(t, "the configuration", whole, "broker", "bridges", "channels", "limits", "listeners", "operations", "providers", "storage")
	chans := whole["channels"].(map[string]any)
	orders := chans["orders"].(map[string]any)
	if orders["filter"] != "orders/#" || orders["configured_in"] != extra || orders["type"] != "append" {
		t.Errorf("the included channel: %v", orders)
	}
	if ev := chans["events"].(map[string]any); ev["configured_in"] != path || ev["retention_period"] != "1h" {
		t.Errorf("the main file's channel: %v", ev)
	}
	if ops := whole["operations"].(map[string]any); ops["min_scrape_interval"] != "60s" || ops["password_file"] != nil {
		t.Errorf("the operations section: %v", ops)
	}
	if lim := whole["limits"].(map[string]any); lim["max_message_size"] != "1MiB" || lim["write_timeout"] != "5s" {
		t.Errorf("the limits, defaults filled: %v", lim)
	}

	one := c.must(http.StatusOK, "/v1/operations/config?section=limits").object(t)
	sameKeys(t, "?section=limits", one, "limits")
	two := c.must(http.StatusOK, "/v1/operations/config?section=limits&section=channels&section=limits").object(t)
	sameKeys(t, "two sections, one repeated", two, "limits", "channels")
	if br := c.must(http.StatusOK, "/v1/operations/config?section=bridges").object(t); len(br["bridges"].(map[string]any)) != 0 {
		t.Errorf("the unused bridges section: %v", br)
	}
	bad := c.must(http.StatusBadRequest, "/v1/operations/config?section=limits&section=secrets")
	var e struct {
		Error    string   `json:"error"`
		Sections []string `json:"sections"`
	}
	bad.decode(t, &e)
	if !strings.Contains(e.Error, `"secrets"`) || fmt.Sprint(e.Sections) != "[bridges channels limits listeners operations providers storage]" {
		t.Errorf("an unknown section: %s", bad.body)
	}

	writeFileT(t, extra, "orders:\n  type: append\n  filter: \"changed/#\"\n")
	if again := c.must(http.StatusOK, "/v1/operations/config"); !bytes.Equal(again.body, r.body) {
		t.Errorf("the document changed with the file:\n%s\n%s", r.body, again.body)
	}
}
