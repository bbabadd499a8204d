package acl

import "testing"

// benchACL gives a device the shape of grants a fleet has: a few channel
// rules, one narrowed by %u, and a few topic: rules.
const benchACL = `roles:
  devices:
    - channel: iot
      allow: [write]
    - channel: events
      filter: "events/%u/{in,out}/#"
      allow: [read, write]
    - channel: events
      filter: "events/shared/#"
      allow: [read]
    - channel: state
      allow: [read, write]
    - topic: "home/%u/#"
      allow: [read, write]
    - topic: "fleet/+/status"
      allow: [read]
    - topic: "news/#"
      allow: [read]
users:
  "dev-*": [devices]
`

// The read question is asked for every message delivered to every
// subscriber: it must not allocate, and costs a map lookup and a match
// per narrowing rule of the channel (or per topic: read filter).
func BenchmarkMayRead(b *testing.B) {
	g := mustLoad(b, benchACL).For("dev-7", "dev-7-a")
	cases := []struct {
		name, topic, channel string
		want                 bool
	}{
		{"channel-whole", "site/3/state", "state", true},
		{"channel-narrowed", "events/dev-7/out/door", "events", true},
		{"channel-refused", "events/dev-8/out/door", "events", false},
		{"broadcast", "news/world", "", true},
		{"broadcast-refused", "other/x", "", false},
	}
	for _, c := range cases {
		if got := g.MayRead(c.topic, c.channel); got != c.want {
			b.Fatalf("%s: MayRead(%q, %q) = %v, want %v", c.name, c.topic, c.channel, got, c.want)
		}
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.MayRead(c.topic, c.channel)
			}
		})
	}
}

// TestMayReadDoesNotAllocate guards the benchmark's claim in make test.
func TestMayReadDoesNotAllocate(t *testing.T) {
	g := mustLoad(t, benchACL).For("dev-7", "dev-7-a")
	for _, c := range [][2]string{{"site/3/state", "state"}, {"events/dev-8/out/door", "events"}, {"other/x", ""}, {"events/x", "nochannel"}} {
		if n := testing.AllocsPerRun(100, func() { g.MayRead(c[0], c[1]) }); n != 0 {
			t.Errorf("MayRead(%q, %q) allocates %.0f times", c[0], c[1], n)
		}
	}
}

// For runs once per connection, at CONNECT.
func BenchmarkFor(b *testing.B) {
	a := mustLoad(b, benchACL)
	b.ReportAllocs()
	for b.Loop() {
		a.For("dev-7", "dev-7-a")
	}
}

// CheckSubscribe runs once per SUBSCRIBE filter.
func BenchmarkCheckSubscribe(b *testing.B) {
	g := mustLoad(b, benchACL).For("dev-7", "dev-7-a")
	if err := g.CheckSubscribe("events/dev-7/in/#"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = g.CheckSubscribe("events/dev-7/in/#")
	}
}
