package sqlite

import (
	"flag"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/storagetest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testOptions are the options every test starts from.
func testOptions(path string) Options {
	return Options{
		Name:            "test",
		FilePath:        path,
		ReadConnections: DefaultReadConnections,
		Writer:          "test-build",
		Logger:          quiet,
		Now:             func() time.Time { return storagetest.Base },
	}
}

// openAt opens a provider on path and closes it when the test ends.
func openAt(t testing.TB, path string, mod func(*Options)) *Provider {
	t.Helper()
	o := testOptions(path)
	if mod != nil {
		mod(&o)
	}
	p, err := Open(o)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newDB(t testing.TB) string { return filepath.Join(t.TempDir(), "saguin.db") }

func mustLog(t testing.TB, p *Provider, name string) storage.AppendLog {
	t.Helper()
	l, err := p.Append(name)
	if err != nil {
		t.Fatalf("Append(%q): %v", name, err)
	}
	return l
}

func mustQueue(t testing.TB, p *Provider, name string) storage.QueueStore {
	t.Helper()
	q, err := p.Queue(name, name+"__dlq")
	if err != nil {
		t.Fatalf("Queue(%q): %v", name, err)
	}
	return q
}

func record(id string, n int) storage.Record {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i)
	}
	return storage.Record{MessageID: id, Topic: "t/" + id, Timestamp: storagetest.Base, Payload: payload, QoS: 1}
}

// TestConformance runs the provider conformance suite against each way the
// provider commits and reads: collecting without waiting with a read pool,
// one transaction per publish with every read on the writer, and waiting
// for company with one read connection.
func TestConformance(t *testing.T) {
	variants := []struct {
		name string
		mod  func(*Options)
	}{
		{"collect/read_connections=2", func(o *Options) {}},
		{"none/read_connections=0", func(o *Options) { o.PublishCommitNone = true; o.ReadConnections = 0 }},
		{"interval/read_connections=1", func(o *Options) {
			o.PublishCommitInterval = time.Millisecond
			o.PublishCommitMaxRecords = 4
			o.ReadConnections = 1
		}},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			storagetest.Run(t, func(t *testing.T, dir string, so storagetest.Opts) storage.Provider {
				t.Helper()
				o := testOptions(filepath.Join(dir, "saguin.db"))
				o.MaxBytes, o.Reserve, o.Now = so.MaxBytes, so.Reserve, so.Now
				if so.BetweenReleaseHalves != nil {
					o.Faults = &Faults{BetweenReleaseHalves: so.BetweenReleaseHalves}
				}
				v.mod(&o)
				p, err := Open(o)
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				return p
			})
		})
	}
}

// TestConformanceProperty runs the suite's model-based random test.
// Under the race detector it runs fewer random sequences (unless
// -rapid.checks says otherwise) so the package stays fast; the full count
// runs without it.
func TestConformanceProperty(t *testing.T) {
	if raceDetector {
		explicit := false
		flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
		if !explicit {
			if err := flag.Set("rapid.checks", "15"); err != nil {
				t.Fatal(err)
			}
		}
	}
	storagetest.Property(t, func(t *testing.T, dir string, so storagetest.Opts) storage.Provider {
		t.Helper()
		o := testOptions(filepath.Join(dir, "saguin.db"))
		o.MaxBytes, o.Reserve, o.Now = so.MaxBytes, so.Reserve, so.Now
		p, err := Open(o)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return p
	})
}

func TestOptionsRefused(t *testing.T) {
	base := testOptions("/nonexistent/x.db")
	cases := []struct {
		name string
		mod  func(*Options)
	}{
		{"no name", func(o *Options) { o.Name = "" }},
		{"no file path", func(o *Options) { o.FilePath = "" }},
		{"max_bytes under twice the reserve", func(o *Options) { o.MaxBytes, o.Reserve = 100<<10, 51<<10 }},
		{"bound rounds to zero pages", func(o *Options) { o.MaxBytes, o.Reserve = 6000, 3000 }},
		{"negative max_bytes", func(o *Options) { o.MaxBytes = -1 }},
		{"flush interval too short", func(o *Options) { o.FlushInterval = 5 * time.Millisecond }},
		{"flush interval too long", func(o *Options) { o.FlushInterval = 2 * time.Second }},
		{"commit interval too long", func(o *Options) { o.PublishCommitInterval = 2 * time.Second; o.PublishCommitMaxRecords = 8 }},
		{"interval without max records", func(o *Options) { o.PublishCommitInterval = time.Millisecond }},
		{"max records of one", func(o *Options) { o.PublishCommitInterval = time.Millisecond; o.PublishCommitMaxRecords = 1 }},
		{"max records without interval", func(o *Options) { o.PublishCommitMaxRecords = 8 }},
		{"none with an interval", func(o *Options) { o.PublishCommitNone = true; o.PublishCommitInterval = time.Millisecond }},
		{"too many read connections", func(o *Options) { o.ReadConnections = 9 }},
		{"negative read connections", func(o *Options) { o.ReadConnections = -1 }},
	}
	for _, c := range cases {
		o := base
		c.mod(&o)
		if _, err := Open(o); err == nil {
			t.Errorf("%s: Open accepted %+v", c.name, o)
		}
	}
	// And the defaults resolve as the spec says.
	r, err := base.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if r.FlushInterval != DefaultFlushInterval || r.batchMax != DefaultBatchRecords || r.commitInterval != 0 {
		t.Fatalf("defaults: flush %v, batch %d, interval %v", r.FlushInterval, r.batchMax, r.commitInterval)
	}
	o := base
	o.MaxBytes, o.Reserve = 1<<20, 64<<10
	if r, err = o.resolve(); err != nil || r.ordinaryPages != (1<<20-64<<10)/PageSize || r.reliefPages != (1<<20)/PageSize {
		t.Fatalf("page ceilings: %d / %d, %v", r.ordinaryPages, r.reliefPages, err)
	}
}
