package broker_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"saguin.dev/broker/brokertest"
)

// Invariant 1 for a write run the floor lands inside. A pump writes what it
// read in runs (at most 64 deliveries a write); the floor is checked before
// each run, and a run that holds one record below the floor is not written
// at all, whatever follows that record in it.
//
// Here the pump reads the whole channel at once — 64 large records, then
// 35 small ones retention is about to remove, then 11 small ones it keeps —
// and stops inside its first write, because a consumer that reads nothing
// cannot take 64 large records (twice what the broker's socket and the
// consumer's can hold). Retention then raises the floor to 100: the next run
// the pump has in memory, 65..110, starts below the floor and ends above it.
// Once the consumer reads again it gets the run in progress when the floor
// moved (large records only), then the floor, and never 65..99. A check on
// a run's last offset instead of its first lets those 35 through; the
// QoS 0 guard (floor_test.go) bounds only bytes, which 35 small records never reach.
func TestInvariant01_WriteRunStraddlingTheNewFloorIsNotWritten(t *testing.T) {
	const (
		bigRecords   = 64  // the first run: the pump is inside its write when the floor moves
		lastRemoved  = 99  // 65..99 small, as old as the large ones
		lastRecord   = 110 // 100..110 small, inside retention
		smallPayload = "small"
	)
	// Twice what the broker's send buffer (tcp_wmem's maximum) and the
	// consumer's receive buffer can hold between them: the first write
	// cannot finish while the consumer reads nothing.
	big := 2 * (socketSendBufferMax() + 1<<20) / bigRecords
	keys := "  limits:\n    write_timeout: none\n"
	if big+4096 > 1<<20 {
		keys += fmt.Sprintf("    max_message_size: %d\n", big+4096)
	}
	for _, p := range floorProviders {
		t.Run(p.name, func(t *testing.T) {
			b, clk := floorBroker(t, p.provider, keys, floorChannels)
			pub := brokertest.Connect(t, b.Address(), "pub", brokertest.ClientOptions{CleanStart: true})
			publish := func(payload []byte) {
				t.Helper()
				if r, err := pub.Publish(&paho.Publish{Topic: "events/a", QoS: 1, Payload: payload}); err != nil || r.ReasonCode != 0 {
					t.Fatalf("publish: %v %v", err, r)
				}
			}
			payload := bytes.Repeat([]byte("x"), big)
			for i := 1; i <= bigRecords; i++ {
				publish(payload)
			}
			for i := bigRecords + 1; i <= lastRemoved; i++ {
				publish([]byte(smallPayload))
			}
			clk.Advance(40 * time.Minute)
			for i := lastRemoved + 1; i <= lastRecord; i++ {
				publish([]byte(smallPayload))
			}

			// A stock client's receive buffer: it stays at its default
			// (well under the slack counted above) while nothing is read,
			// and grows once the consumer reads at full speed.
			deaf, _ := brokertest.DialRaw(t, b.Address(), "deaf", true, 0)
			if ack := deaf.Subscribe(1, "events/#", 0); ack.ReasonCodes[0] != 0 {
				t.Fatalf("SUBACK %v", ack.ReasonCodes)
			}
			// The first delivery: the pump has read the channel (1..110,
			// one read) and is writing its first run.
			first := deaf.Read()
			if first.FixedHeader.Type != packets.Publish || rawOffset(t, first) != 1 {
				t.Fatalf("first delivery: %+v", first.FixedHeader)
			}

			// 70 minutes after 1..99 were published, 30 after 100..110:
			// retention (one hour) removes 1..99 and the floor is 100.
			clk.Advance(30 * time.Minute)
			waitLog(t, b, fmt.Sprintf(`msg="retention removed records" broker=test channel=events records=%d`, lastRemoved))

			last := uint64(1)
			for last < lastRecord {
				pk, err := deaf.ReadWithin(wait)
				if err != nil {
					t.Fatalf("after offset %d: %v", last, err)
				}
				if pk.FixedHeader.Type != packets.Publish {
					continue
				}
				off := rawOffset(t, pk)
				if off > lastRemoved {
					want := max(last+1, lastRemoved+1)
					if off != want {
						t.Fatalf("offset %d after %d, want %d: the floor comes next, then the records above it in order", off, last, want)
					}
				} else if off != last+1 {
					t.Fatalf("offset %d after %d: a gap below the floor", off, last)
				} else if len(pk.Payload) != big {
					t.Fatalf("offset %d (%q) was written after the floor passed it: the pump had read it into a run "+
						"that starts below the floor, %d, and ends above it, and wrote that run", off, pk.Payload, lastRemoved+1)
				}
				last = off
			}
			// Told as for any consumer the floor overtakes: from where the
			// refused run began.
			waitLog(t, b, fmt.Sprintf(`msg="consumer overtaken by retention: restarting at the floor" broker=test client=deaf channel=events position=%d floor=%d lost_records=%d`,
				bigRecords+1, lastRemoved+1, lastRemoved-bigRecords))
		})
	}
}
