package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// The close line a sqlite provider writes is read into the batch-size
// summary the report prints; output without one gives none.
func TestGroupCommitFromCloseLine(t *testing.T) {
	out := "time=x level=INFO msg=listening address=127.0.0.1:1\n" +
		`time=y level=INFO msg="storage closed" broker=bench provider=main type=sqlite publish_transactions=4 publish_records=10 largest_transaction=7 transactions_by_records="1:2 2-7:2 8-63:0 64-255:0 256+:0"` + "\n"
	got := groupCommit(out)
	want := "4 transactions carried 10 records (2.5 per transaction, largest 7; by records carried 1:2 2-7:2 8-63:0 64-255:0 256+:0)"
	if got != want {
		t.Fatalf("groupCommit = %q, want %q", got, want)
	}
	if got := groupCommit("time=x level=INFO msg=listening\n"); got != "" {
		t.Fatalf("no close line: %q", got)
	}
}

// -deep-windows adds shapes after the -publishers ones, once each.
func TestShapesFromFlags(t *testing.T) {
	o, err := parseFlags([]string{"-publishers", "8,64", "-deep-windows", "8x64, 64x1,2x4,8x64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{o: o}
	if got, want := b.shapes(), []shape{{8, 1}, {64, 1}, {8, 64}, {2, 4}}; !slices.Equal(got, want) {
		t.Fatalf("shapes %v, want %v", got, want)
	}
	o, err = parseFlags([]string{"-deep-windows", ""}, &bytes.Buffer{})
	if err != nil || len(o.deep) != 0 {
		t.Fatalf("-deep-windows \"\": %v %v", o.deep, err)
	}
	if s := (shape{8, 64}).String(); !strings.Contains(s, "8 publishers x 64 in flight") {
		t.Fatalf("String = %q", s)
	}
}
