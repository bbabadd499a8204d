package broker

import (
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/internal/clock"
)

// invariant 8: one rule for the Message ID a publisher gives its message,
// whether it lands in a channel (recordOf) or in the broadcast log
// (recordOfMsg): the first non-empty saguin-id. The two once disagreed
// when a publish carried two (the log kept the last), so a message read
// back from the log and redriven into a channel changed identity.
func TestInvariant08_OneMessageIDRuleForChannelAndBroadcastLog(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	b := &Broker{clock: clock.NewFake(now)}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "plain/x",
		Properties: packets.Properties{User: []packets.UserProperty{
			{Key: "saguin-id", Val: ""}, {Key: "saguin-id", Val: "first"}, {Key: "saguin-id", Val: "second"}}}}
	channel := b.recordOf(&mqtt.Client{ID: "pub"}, pk)
	logged := recordOfMsg(newBroadcastMsg("pub", pk, now), now, "generated")
	if channel.MessageID != "first" || logged.MessageID != "first" {
		t.Fatalf("Message ID: channel record %q, broadcast log %q; want the first non-empty saguin-id, \"first\", for both",
			channel.MessageID, logged.MessageID)
	}
	none := recordOfMsg(newBroadcastMsg("pub", packets.Packet{TopicName: "plain/x"}, now), now, "generated")
	if none.MessageID != "generated" {
		t.Fatalf("a broadcast message without saguin-id got Message ID %q, want the one generated for it", none.MessageID)
	}
}
