package broker_test

import (
	"sort"
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
)

// A shared group over an append channel is split the channel's new records,
// one member each (docs/channels.md "Shared subscriptions").
func TestSharedGroupOnAppendChannelSplitsNewRecords(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	m1, _ := brokertest.DialRaw(t, b.Address(), "cm1", true, 0)
	m1.Subscribe(1, "$share/g/events/#", 1)
	m2, _ := brokertest.DialRaw(t, b.Address(), "cm2", true, 0)
	m2.Subscribe(1, "$share/g/events/#", 1)
	publishBroadcast(t, b.Address(), "events/a", "e", 1, 6, 1)
	var got []string
	for _, m := range []*brokertest.RawClient{m1, m2} {
		for {
			pk, err := m.ReadWithin(500 * time.Millisecond)
			if err != nil {
				break
			}
			got = append(got, string(pk.Payload))
			m.Puback(pk.PacketID)
		}
	}
	sort.Strings(got)
	if w := want("e", 1, 6); !sameStrings(got, w) {
		t.Fatalf("group members got %v together, want each of %v once", got, w)
	}
}

// A group over an append channel with every member away keeps its backlog
// in the broadcast log across a restart; a session's own subscription to
// the channel is served by the channel alone, never the group's copy too.
func TestSharedGroupOnAppendChannelBacklogAcrossRestart(t *testing.T) {
	b := bcastBroker(t, bcastOpts{provider: sqliteProvider})
	m, _ := brokertest.DialRaw(t, b.Address(), "cm", true, 3600)
	m.Subscribe(1, "$share/g/events/#", 1)
	m.Disconnect()
	own, _ := brokertest.DialRaw(t, b.Address(), "own", true, 3600)
	own.Subscribe(1, "events/#", 1)
	own.Disconnect()
	publishBroadcast(t, b.Address(), "events/a", "c", 1, 3, 1)
	b.Restart()
	m, _ = brokertest.DialRaw(t, b.Address(), "cm", false, 3600)
	got := readPublishes(t, m, 3)
	for _, pk := range got {
		m.Puback(pk.PacketID)
	}
	if w := want("c", 1, 3); !sameStrings(payloads(got), w) {
		t.Fatalf("group member back got %v, want %v", payloads(got), w)
	}
	own, _ = brokertest.DialRaw(t, b.Address(), "own", false, 3600)
	var ownGot []string
	for {
		pk, err := own.ReadWithin(500 * time.Millisecond)
		if err != nil {
			break
		}
		ownGot = append(ownGot, string(pk.Payload))
		own.Puback(pk.PacketID)
	}
	if w := want("c", 1, 3); !sameStrings(ownGot, w) {
		t.Fatalf("own subscriber got %v, want %v once each", ownGot, w)
	}
}
