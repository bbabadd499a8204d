package memory

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"saguin.dev/storage"
	"saguin.dev/storage/internal/snapshot"
	"saguin.dev/storage/storagetest"
)

// TestHoldsOfAFileOlderThanTheManifestAreAbandoned: a channel file left
// from an earlier shutdown than the manifest (its replacement failed) comes
// back with its records but without its holds, which are counted — the
// later shutdown may have finished those exchanges (rfcs/storage-memory.md).
func TestHoldsOfAFileOlderThanTheManifestAreAbandoned(t *testing.T) {
	dir := t.TempDir()
	clock := storagetest.NewClock(storagetest.Base)
	p := mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now})
	for _, n := range []string{"a", "b"} {
		l, _ := p.Append(n)
		if _, err := l.Append(job(n, 1)); err != nil {
			t.Fatal(err)
		}
		if err := p.Hold(storage.Held{Channel: n, ClientID: "c", PacketID: 1, HeldAt: clock.Now(), Record: job(n+"-held", 4)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	p = mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now, Faults: &Faults{BeforeSnapshotRename: func(path string) error {
		if strings.HasSuffix(path, "b.snapshot") {
			return errInjected
		}
		return nil
	}}})
	p.Append("a")
	p.Append("b")
	if p.AbandonedAtOpen() != 0 {
		t.Fatalf("a whole shutdown abandoned %d holds", p.AbandonedAtOpen())
	}
	if err := p.Close(); err == nil {
		t.Fatal("Close hid the failed channel file")
	}
	p = mustOpen(t, Options{SnapshotDir: dir, Now: clock.Now})
	defer p.Close()
	la, _ := p.Append("a")
	lb, _ := p.Append("b")
	if p.AbandonedAtOpen() != 1 {
		t.Fatalf("AbandonedAtOpen = %d, want b's one hold", p.AbandonedAtOpen())
	}
	hs, err := p.Holds()
	if err != nil || len(hs) != 1 || hs[0].Channel != "a" {
		t.Fatalf("holds after the start: %+v, %v; want a's only", hs, err)
	}
	if la.Next() != 2 || lb.Next() != 2 {
		t.Fatalf("records not restored: next a %d, b %d", la.Next(), lb.Next())
	}
	if _, err := p.Release("b", "c", 1); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Release of an abandoned hold = %v, want ErrNotFound", err)
	}
	// The abandoned hold's bytes are not charged.
	h := job("a-held", 4)
	j := job("a", 1)
	if want := 2*j.Size() + h.Size(); p.Bytes() != want {
		t.Fatalf("provider bytes %d, want %d (records of a and b, a's hold)", p.Bytes(), want)
	}
}

// TestInvariant14_DamagedHoldRefusesStart: a hold with an offset (a hold
// takes none), packet id 0 or an empty client id, or one repeated, is an
// Open error naming the file — never a start without it.
func TestInvariant14_DamagedHoldRefusesStart(t *testing.T) {
	cases := []struct {
		name  string
		holds []storage.Held
		want  string
	}{
		{"offset", []storage.Held{{ClientID: "c", PacketID: 1, Record: storage.Record{Offset: 3, Topic: "t"}}}, "offset 3"},
		{"packet id zero", []storage.Held{{ClientID: "c", PacketID: 0, Record: storage.Record{Topic: "t"}}}, "packet id 0"},
		{"no client", []storage.Held{{ClientID: "", PacketID: 4, Record: storage.Record{Topic: "t"}}}, `client ""`},
		{"repeated", []storage.Held{{ClientID: "c", PacketID: 4}, {ClientID: "c", PacketID: 4}}, "repeated"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			e := snapshot.NewFile(snapshot.KindChannels, "test-build", storagetest.Base, 0)
			e.Uint8(kindAppend)
			e.String("events")
			e.String("events")
			e.Uint64(1) // next
			e.Uint64(1) // floor
			e.Count(0)  // records
			e.Count(0)  // positions
			e.Count(len(c.holds))
			for i := range c.holds {
				h := c.holds[i]
				e.String(h.ClientID)
				e.Uint32(uint32(h.PacketID))
				e.Time(h.HeldAt)
				e.Record(&h.Record)
			}
			if err := os.WriteFile(filepath.Join(dir, snapshot.FileName("events")), e.Finish(), 0o600); err != nil {
				t.Fatal(err)
			}
			wantIn(t, openErr(t, dir), "events.snapshot", c.want)
		})
	}
}
