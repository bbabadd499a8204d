package broker_test

import (
	"encoding/json"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"saguin.dev/broker/brokertest"
)

// threeTypesConfig has one channel of each type on a sqlite provider.
var threeTypesConfig = appendConfigWith(sqliteProvider, `  state:
    type: latest
    filter: "state/#"
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
`)

// pahoPython finds a python3 with the paho-mqtt client (Debian's
// python3-paho-mqtt, which .ci/run installs): the one on PATH first, then
// the system one. The test fails, not skips, without it.
func pahoPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if err := exec.Command(py, "-c", "import paho.mqtt.client").Run(); err == nil {
			return py
		}
	}
	t.Fatal("no python3 with paho-mqtt: install Debian's python3-paho-mqtt (.ci/run does)")
	return ""
}

// pub311 publishes one QoS 1 message with mosquitto_pub speaking MQTT 3.1.1.
func pub311(t *testing.T, addr, topic, payload string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("mosquitto_pub", "-V", "mqttv311", "-h", host, "-p", port, "-i", "pub311",
		"-q", "1", "-t", topic, "-m", payload).CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub -V mqttv311 %s: %v\n%s", topic, err, out)
	}
}

// session311Script is a Paho (Python, paho-mqtt 1.x) MQTT 3.1.1 client with
// Clean Session 0. argv: host port client-id subscribe(0/1) wanted, where
// wanted is "topic=payload" entries joined by "|". It connects, subscribes
// when asked (the channels, then the queue form in its own SUBSCRIBE), waits
// for every wanted message (20 s at most) and half a second more for
// anything that should not come, disconnects cleanly and prints what
// happened as JSON.
const session311Script = `
import json, sys, time
import paho.mqtt.client as mqtt

host, port, cid, subscribe, wanted = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", sys.argv[5]
want = set(w for w in wanted.split("|") if w)
out = {"rc": None, "session_present": None, "granted": {}, "msgs": []}
mids = {}

def on_connect(c, userdata, flags, rc):
    out["rc"] = rc
    out["session_present"] = flags.get("session present")
    if subscribe and rc == 0:
        mids[c.subscribe([("events/#", 1), ("state/#", 1)])[1]] = "channels"
        mids[c.subscribe("$saguin/queue/jobs", 1)[1]] = "queue"

def on_subscribe(c, userdata, mid, granted):
    out["granted"][mids.get(mid, str(mid))] = list(granted)

def on_message(c, userdata, m):
    out["msgs"].append([m.topic, m.payload.decode(), bool(m.retain)])

c = mqtt.Client(client_id=cid, clean_session=False, protocol=mqtt.MQTTv311)
c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
c.connect(host, port, 30)
c.loop_start()
deadline = time.time() + 20
def have():
    return want <= set(t + "=" + p for t, p, _ in out["msgs"])
while time.time() < deadline and not (have() and (not subscribe or len(out["granted"]) == 2)):
    time.sleep(0.05)
time.sleep(0.5)
c.disconnect()
c.loop_stop()
print(json.dumps(out))
`

type session311 struct {
	RC             *int             `json:"rc"`
	SessionPresent *int             `json:"session_present"`
	Granted        map[string][]int `json:"granted"`
	Msgs           [][]any          `json:"msgs"`
}

func runSession311(t *testing.T, py, addr string, subscribe bool, wanted ...string) session311 {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	sub := "0"
	if subscribe {
		sub = "1"
	}
	cmd := exec.Command(py, "-", host, port, "py311", sub, strings.Join(wanted, "|"))
	cmd.Stdin = strings.NewReader(session311Script)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("paho 3.1.1 client: %v\n%s\n%s", err, out, stderr)
	}
	var s session311
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("paho 3.1.1 client printed %q: %v", out, err)
	}
	if s.RC == nil || *s.RC != 0 {
		t.Fatalf("paho 3.1.1 client: CONNACK %v", s.RC)
	}
	return s
}

// received lists "topic=payload" for each message, in arrival order.
func (s session311) received() []string {
	out := make([]string, 0, len(s.Msgs))
	for _, m := range s.Msgs {
		out = append(out, m[0].(string)+"="+m[1].(string))
	}
	return out
}

// Acceptance (v0.1): a 3.1.1 client — mosquitto_pub -V mqttv311 and Paho —
// publishes into every channel type (append, latest, queue) and reads append
// and latest with a durable position. Paho subscribes with Clean Session 0,
// receives, disconnects; more is published; it reconnects without
// subscribing and receives only the rest of the append channel and only the
// changes of the latest channel (rfcs/latest-channel.md). The
// queue form is refused to 3.1.1 with 0x80 (docs/security.md "Every refusal, and its code": a queue
// worker needs MQTT 5's Response Topic and Correlation Data), so the job a
// 3.1.1 publisher queued is taken by an MQTT 5 worker.
func TestProtocol311_PublishesEveryChannelTypeAndResumesDurably(t *testing.T) {
	py := pahoPython(t)
	if _, err := exec.LookPath("mosquitto_pub"); err != nil {
		t.Fatal("mosquitto_pub is not installed (Debian package mosquitto-clients; .ci/run installs it)")
	}
	b := brokertest.Start(t, brokertest.Config(t, t.TempDir(), threeTypesConfig))
	addr := b.Address()
	pub311(t, addr, "events/a", "e1")
	pub311(t, addr, "state/a", "a1")
	pub311(t, addr, "state/z", "z1")
	pub311(t, addr, "jobs/x", "j1")

	first := runSession311(t, py, addr, true, "events/a=e1", "state/a=a1", "state/z=z1")
	if g := first.Granted["channels"]; !slices.Equal(g, []int{1, 1}) {
		t.Fatalf("3.1.1 SUBSCRIBE to the channels granted %v, want [1 1]", g)
	}
	if g := first.Granted["queue"]; !slices.Equal(g, []int{0x80}) {
		t.Fatalf("3.1.1 SUBSCRIBE to the queue form granted %v, want [128] (0x80)", g)
	}
	if got := first.received(); len(got) != 3 {
		t.Fatalf("first session received %v, want e1, a1, z1 once each", got)
	}
	for _, m := range first.Msgs {
		// 3.1.1 on latest: the state is served with RETAIN.
		if strings.HasPrefix(m[0].(string), "state/") && m[2] != true {
			t.Fatalf("latest value %v served without RETAIN", m)
		}
	}

	pub311(t, addr, "events/a", "e2")
	pub311(t, addr, "events/b", "e3")
	pub311(t, addr, "state/a", "a2")

	second := runSession311(t, py, addr, false, "events/a=e2", "events/b=e3", "state/a=a2")
	if second.SessionPresent == nil || *second.SessionPresent != 1 {
		t.Fatalf("3.1.1 Clean Session 0 reconnect: session present %v, want 1", second.SessionPresent)
	}
	got := second.received()
	slices.Sort(got)
	if want := []string{"events/a=e2", "events/b=e3", "state/a=a2"}; !slices.Equal(got, want) {
		t.Fatalf("resumed 3.1.1 session received %v, want only %v (the rest of append, the changes of latest)", got, want)
	}

	// The job the 3.1.1 publisher queued is a job: an MQTT 5 worker takes it.
	w := brokertest.Connect(t, addr, "worker", brokertest.ClientOptions{CleanStart: true})
	if sa := w.Subscribe("$saguin/queue/jobs", 1); sa.Reasons[0] != 1 {
		t.Fatalf("MQTT 5 queue subscription granted 0x%02x", sa.Reasons[0])
	}
	if p := w.Next(wait); string(p.Payload) != "j1" || p.Properties.ResponseTopic == "" {
		t.Fatalf("job from a 3.1.1 publisher: %q, response topic %q", p.Payload, p.Properties.ResponseTopic)
	}
}
