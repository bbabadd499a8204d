package sqlite

import (
	"saguin.dev/storage/storagetest/emulate"

	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"saguin.dev/storage"
)

// The child side of TestInvariant14_KillNineMidReleaseLeavesHoldOrRecord:
// it holds and releases QoS 2 publishes in a loop, printing each step once
// it is stored, until the parent kills it. It does nothing in a normal run.
func TestHelperKilledReleaser(t *testing.T) {
	dir := os.Getenv("SAGUIN_SQLITE_HOLD_CHILD")
	if dir == "" {
		return
	}
	p, err := Open(testOptions(filepath.Join(dir, "saguin.db")))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	if _, err := p.Append("events"); err != nil {
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	for i := 1; ; i++ {
		pid := uint16(i%60000 + 1)
		id := fmt.Sprint("m", i)
		if err := p.Hold(storage.Held{Channel: "events", ClientID: "c", PacketID: pid, HeldAt: time.Now(), Record: record(id, 32)}); err != nil {
			os.Exit(3)
		}
		fmt.Fprintf(out, "held %d %s\n", pid, id)
		out.Flush()
		r, err := p.Release("events", "c", pid)
		if err != nil {
			os.Exit(4)
		}
		fmt.Fprintf(out, "released %d %s\n", r.Offset, id)
		out.Flush()
	}
}

// TestInvariant14_KillNineMidReleaseLeavesHoldOrRecord: a provider killed
// with SIGKILL in the middle of holds and releases comes back with every
// exchange either still held (no record) or released (a record, no hold) —
// never both, never neither — and every acknowledged release is a record
// exactly once (rfcs/qos2-holds.md: restart mid-exchange stores nothing twice).
func TestInvariant14_KillNineMidReleaseLeavesHoldOrRecord(t *testing.T) {
	dir := t.TempDir()
	// Through emulate: under make test-32 this test binary may be running
	// under qemu-user, and so must the child it re-executes.
	cmd, err := emulate.Command(os.Args[0], "-test.run=^TestHelperKilledReleaser$", "-test.count=1")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "SAGUIN_SQLITE_HOLD_CHILD="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	heldIDs := map[string]bool{}
	released := map[string]uint64{}
	sc := bufio.NewScanner(stdout)
	n, killed := 0, false
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue // a line cut by the kill
		}
		switch f[0] {
		case "held":
			heldIDs[f[2]] = true
		case "released":
			off, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			released[f[2]] = off
		default:
			t.Fatalf("child said %q", sc.Text())
		}
		if n++; n == 400 && !killed {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	cmd.Wait()
	if !killed {
		t.Fatalf("the child stopped on its own after %d lines", n)
	}
	p := openAt(t, filepath.Join(dir, "saguin.db"), nil)
	l := mustLog(t, p, "events")
	recs, _, err := l.Read(1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	inLog := map[string]uint64{}
	for _, r := range recs {
		if _, dup := inLog[r.MessageID]; dup {
			t.Fatalf("%s written twice", r.MessageID)
		}
		inLog[r.MessageID] = r.Offset
	}
	holds, err := p.Holds()
	if err != nil {
		t.Fatal(err)
	}
	if len(holds) > 1 {
		t.Fatalf("%d holds survived; the child had at most one exchange open", len(holds))
	}
	for _, h := range holds {
		if _, both := inLog[h.Record.MessageID]; both {
			t.Fatalf("%s is both held and written", h.Record.MessageID)
		}
	}
	for id, off := range released {
		if inLog[id] != off {
			t.Fatalf("acknowledged release %s at offset %d: log has it at %d", id, off, inLog[id])
		}
	}
	for id := range heldIDs {
		_, written := inLog[id]
		stillHeld := len(holds) == 1 && holds[0].Record.MessageID == id
		if !written && !stillHeld {
			t.Fatalf("%s was held and is now neither held nor written", id)
		}
	}
	if len(released) == 0 {
		t.Fatal("the child released nothing before the kill")
	}
}

// TestHoldsOfAnUnopenedChannelAreListedAndDropped: a channel removed from
// the configuration is not opened, but its hold rows are still in the
// file; Holds lists them and DropHold deletes them by name, so the
// broker's start can drop and count them (rfcs/qos2-holds.md). Release refuses a
// channel not open.
func TestHoldsOfAnUnopenedChannelAreListedAndDropped(t *testing.T) {
	path := newDB(t)
	p := openAt(t, path, nil)
	mustLog(t, p, "gone")
	mustLog(t, p, "kept")
	for _, ch := range []string{"gone", "kept"} {
		if err := p.Hold(storage.Held{Channel: ch, ClientID: "c", PacketID: 9, Record: record(ch, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = openAt(t, path, nil)
	mustLog(t, p, "kept")
	hs, err := p.Holds()
	if err != nil || len(hs) != 2 || hs[0].Channel != "gone" || hs[1].Channel != "kept" {
		t.Fatalf("Holds = %+v, %v; want gone's and kept's", hs, err)
	}
	if _, err := p.Release("gone", "c", 9); err == nil {
		t.Fatal("Release into a channel nobody opened succeeded")
	}
	if ok, err := p.DropHold("gone", "c", 9); err != nil || !ok {
		t.Fatalf("DropHold(gone) = %v, %v", ok, err)
	}
	if _, err := p.Release("kept", "c", 9); err != nil {
		t.Fatalf("Release(kept): %v", err)
	}
	if hs, err := p.Holds(); err != nil || len(hs) != 0 {
		t.Fatalf("Holds after = %+v, %v", hs, err)
	}
	if err := p.Hold(storage.Held{Channel: "kept", ClientID: "c", PacketID: 9, Record: record("again", 8)}); err != nil {
		t.Fatalf("the exchange's packet id is free after release: %v", err)
	}
	if err := p.Hold(storage.Held{Channel: "kept", ClientID: "c", PacketID: 9, Record: record("dup", 8)}); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("duplicate Hold = %v, want ErrExists", err)
	}
}
