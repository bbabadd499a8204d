package broker

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"saguin.dev/broker/config"
	"saguin.dev/storage"
)

const bcastInternalConfig = `
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
channels:
  events:
    type: append
    filter: "events/#"
`

// deliverLogged serves a record already in the broadcast log (a QoS 2 hold
// released there) to the sessions owed it, without writing it again, and
// the session's cursor covers it until it is acknowledged.
func TestDeliverLoggedServesWithoutWritingAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "saguin.yaml")
	if err := os.WriteFile(path, []byte(bcastInternalConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.restoreSession("away", storedSession{Format: sessionFormat, Protocol: 5, Expiry: 3600,
		Subscriptions: []storedSubscribe{{Filter: "news/#", QoS: 1, LogFrom: 1}}}, time.Hour, time.Hour)
	s := b.sessionOf("away")

	done := b.BroadcastReserve()
	rec, err := b.fan.log.log.Append(storage.Record{Topic: "news/a", Payload: []byte("released"), QoS: 2,
		Timestamp: time.Now(), MessageID: "m1", PublisherID: "pub"})
	if err != nil {
		t.Fatal(err)
	}
	b.deliverLogged(b.mqtt.NewClient(nil, "local", "pub", true), rec)
	done()

	o := b.outboxOf(s)
	e, ok := o.peek()
	if !ok || e.m.off != rec.Offset || e.qos != 1 || string(e.m.payload) != "released" {
		t.Fatalf("outbox head %+v (held %v); want offset %d at QoS 1", e, ok, rec.Offset)
	}
	if next, _, written := b.BroadcastLog(); next != rec.Offset+1 || written != 0 {
		t.Fatalf("log next %d, %d written by fan-out: the released record was written again", next, written)
	}
	b.flushBroadcast(s, true)
	if cur, ok := b.BroadcastCursor("away"); !ok || cur != rec.Offset {
		t.Fatalf("stored cursor %d (%v), want %d: the record is owed until acknowledged", cur, ok, rec.Offset)
	}
}
