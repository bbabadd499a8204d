package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/chaos/harness"
	L "saguin.dev/linearizability"
)

func TestFlagsAreChecked(t *testing.T) {
	for _, args := range [][]string{
		{},                                   // neither -duration nor -cycles
		{"-cycles", "1", "-nemeses", "nuke"}, // unknown nemesis
		{"-cycles", "1", "extra"},            // stray argument
		{"-bogus"},
		{"-cycles", "1", "-control", "nope"}, // unknown control
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("chaos %q: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}

// writeRun writes a history of one acknowledged record and a final read, and
// its notes; lose drops the record from the final read.
func writeRun(t *testing.T, lose bool) string {
	t.Helper()
	dir := t.TempDir()
	hf, err := os.Create(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	clock := int64(1_000_000)
	now := func() int64 { clock += 1000; return clock }
	w := L.NewWriter(hf, L.WriterOptions{Now: now})
	c, err := w.Begin(1, L.OpAppendPublish, "events", &L.Input{ID: "r1", Payload: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.End(&L.Output{Reason: 0}); err != nil {
		t.Fatal(err)
	}
	next := int64(2)
	if !lose {
		tr := now()
		if err := w.Write(L.Op{Client: 2, Op: L.OpAppendRead, Channel: "events", Call: tr, Return: tr,
			Output: &L.Output{ID: "r1", Offset: 1, Payload: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
	} else {
		next = 1
	}
	h, err := w.Begin(3, L.OpAppendHead, "events", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.End(&L.Output{Next: next}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	hf.Close()
	notes := []harness.Note{
		{Kind: harness.NoteConnack, T: now(), Conn: 2, ClientID: "final-events", Channel: "events"},
		{Kind: harness.NoteFinalRead, T: now(), ClientID: "final-events", Channel: "events", Value: next, Detail: "complete"},
	}
	nf, err := os.Create(filepath.Join(dir, "notes.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.WriteNotes(nf, notes); err != nil {
		t.Fatal(err)
	}
	nf.Close()
	return filepath.Join(dir, "history.jsonl")
}

func TestCheckAnExistingHistory(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-check", writeRun(t, false)}, &out, &errb); code != 0 {
		t.Fatalf("honest history: exit %d\n%s%s", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"-check", writeRun(t, true)}, &out, &errb); code != 1 {
		t.Fatalf("history with an acknowledged record lost: exit %d\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "acked-lost") {
		t.Fatalf("the loss is not named:\n%s", out.String())
	}
}
