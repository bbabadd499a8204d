package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"saguin.dev/linearizability"
)

func writeHistory(t *testing.T, ops []linearizability.Op) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := linearizability.NewWriter(f, linearizability.WriterOptions{})
	for _, op := range ops {
		if err := w.Write(op); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func pub(id string, call, ret int64) linearizability.Op {
	return linearizability.Op{Client: 1, Op: linearizability.OpAppendPublish, Channel: "ev", Call: call, Return: ret,
		Input: &linearizability.Input{ID: id, Payload: []byte(id)}, Output: &linearizability.Output{}}
}

func read(off int64, id string, t int64) linearizability.Op {
	return linearizability.Op{Client: 2, Op: linearizability.OpAppendRead, Channel: "ev", Call: t, Return: t,
		Output: &linearizability.Output{Offset: off, ID: id, Payload: []byte(id)}}
}

func TestLincheckPassesLegalHistory(t *testing.T) {
	path := writeHistory(t, []linearizability.Op{pub("a", 1, 2), pub("b", 3, 4), read(1, "a", 5), read(2, "b", 6)})
	var out, errOut bytes.Buffer
	if code := run([]string{path}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d, want 0\n%s%s", code, out.String(), errOut.String())
	}
	if _, err := os.Stat(strings.TrimSuffix(path, ".jsonl") + ".html"); !os.IsNotExist(err) {
		t.Fatalf("a passing check wrote a visualisation: %v", err)
	}
}

// A reused offset: lincheck exits 1 and writes porcupine's visualisation.
func TestInvariant09_LincheckWritesHTMLOnFailure(t *testing.T) {
	path := writeHistory(t, []linearizability.Op{pub("a", 1, 2), pub("b", 3, 4), read(1, "a", 5), read(1, "b", 6)})
	html := filepath.Join(t.TempDir(), "out.html")
	var out, errOut bytes.Buffer
	if code := run([]string{"-model", "append", "-html", html, path}, &out, &errOut); code != exitViolation {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	b, err := os.ReadFile(html)
	if err != nil {
		t.Fatalf("no visualisation: %v", err)
	}
	if !bytes.Contains(b, []byte("<html")) || !bytes.Contains(b, []byte("append.read")) {
		t.Fatalf("visualisation does not look like porcupine's for this history (%d bytes)", len(b))
	}
	if !strings.Contains(out.String(), "not linearizable") {
		t.Fatalf("output does not say what failed:\n%s", out.String())
	}
}

// A whole-history violation (a skipped offset) also fails, with a picture.
func TestInvariant01_LincheckReportsSkippedOffset(t *testing.T) {
	path := writeHistory(t, []linearizability.Op{pub("a", 1, 2), pub("b", 3, 4), pub("c", 5, 6), read(1, "a", 7), read(3, "c", 8)})
	var out, errOut bytes.Buffer
	if code := run([]string{path}, &out, &errOut); code != exitViolation {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	if _, err := os.Stat(strings.TrimSuffix(path, ".jsonl") + ".html"); err != nil {
		t.Fatalf("no visualisation at the default path: %v", err)
	}
	var out2 bytes.Buffer
	if code := run([]string{"-dense=false", path}, &out2, &errOut); code != exitOK {
		t.Fatalf("-dense=false: exit %d\n%s", code, out2.String())
	}
}

func TestLincheckBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"client":1,"op":"append.teleport","channel":"ev","call":1,"return":2}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := writeHistory(t, []linearizability.Op{pub("a", 1, 2)})
	for name, args := range map[string][]string{
		"malformed":     {bad},
		"missing file":  {filepath.Join(dir, "nope.jsonl")},
		"no file":       {},
		"unknown model": {"-model", "kafka", good},
		"no such ops":   {"-model", "queue", good}, // a check of nothing must not pass
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(args, &out, &errOut)
			if code != exitBadInput {
				t.Fatalf("exit %d, want 2\n%s%s", code, out.String(), errOut.String())
			}
		})
	}
}
