package broker_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
)

// MQTT.js (the client browsers and Node.js use) over wss:// with MQTT 5:
// publish and subscribe through a channel and through broadcast. The
// client is testdata/mqttjs (its package-lock.json pins MQTT.js; npm ci
// there installs it, as .ci/run does), run by node --test.
func TestMQTTJSOverWSS(t *testing.T) {
	mod := filepath.Join("testdata", "mqttjs")
	if _, err := os.Stat(filepath.Join(mod, "node_modules", "mqtt")); err != nil {
		t.Fatalf("MQTT.js is not installed: run npm ci in broker/%s (.ci/run does): %v", mod, err)
	}
	dir := t.TempDir()
	pki := brokertest.NewPKI(t, dir, "saguin-test")
	b := brokertest.Start(t, doorsConfig(t, dir, `      ws:
        address: "127.0.0.1:0"
        tls: `+tlsBlock(pki.Server("server"), "")+`
`))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "wss.test.mjs")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "SAGUIN_WSS_URL=wss://localhost:"+doorPort(t, b, "ws")+"/mqtt", "SAGUIN_CA="+pki.CAFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
