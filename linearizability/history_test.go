package linearizability

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestWriterRoundTripConcurrent(t *testing.T) {
	var clock atomic.Int64
	var buf bytes.Buffer
	w := NewWriter(&buf, WriterOptions{Now: func() int64 { return clock.Add(10) }, BufferBytes: 256})
	const clients, each = 8, 50
	binary := []byte{0x00, 0xff, 0xfe, 'x', 0x80} // invalid UTF-8 must survive
	var wg sync.WaitGroup
	errs := make(chan error, clients*each*2)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("c%d-%d", c, i)
				call, err := w.Begin(c, OpAppendPublish, "events", &Input{ID: id, Payload: binary})
				if err != nil {
					errs <- err
					return
				}
				if i%10 == 9 {
					continue // left open: Close writes it pending
				}
				if err := call.End(&Output{Reason: 0}); err != nil {
					errs <- err
				}
				if err := call.End(&Output{}); err == nil {
					errs <- errors.New("second End accepted")
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Op{Op: OpBrokerRestart}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	ops, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != clients*each {
		t.Fatalf("read %d ops, want %d", len(ops), clients*each)
	}
	pending := 0
	for _, op := range ops {
		if !bytes.Equal(op.Input.Payload, binary) {
			t.Fatalf("payload changed in round trip: %x", op.Input.Payload)
		}
		if op.IsPending() {
			pending++
			if op.Output != nil {
				t.Fatalf("pending op has output: %+v", op)
			}
		} else if op.Return <= op.Call {
			t.Fatalf("return %d not after call %d", op.Return, op.Call)
		}
	}
	if pending != clients*each/10 {
		t.Fatalf("%d pending ops, want %d", pending, clients*each/10)
	}
}

func TestWriterBoundsOpenCalls(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, WriterOptions{MaxOpen: 2})
	a, err := w.Begin(1, OpQueuePublish, "jobs", &Input{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Begin(1, OpQueuePublish, "jobs", &Input{ID: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Begin(1, OpQueuePublish, "jobs", &Input{ID: "c"}); !errors.Is(err, ErrTooManyOpen) {
		t.Fatalf("third Begin: %v, want ErrTooManyOpen", err)
	}
	if err := a.Abandon(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Begin(1, OpQueuePublish, "jobs", &Input{ID: "c"}); err != nil {
		t.Fatalf("Begin after Abandon freed a slot: %v", err)
	}
}

func TestWriterRefusesMalformedOp(t *testing.T) {
	w := NewWriter(&bytes.Buffer{}, WriterOptions{})
	if err := w.Write(Op{Op: OpAppendRead, Channel: "c", Call: 1, Return: 2, Output: &Output{}}); !errors.Is(err, ErrBadHistory) {
		t.Fatalf("read without offset accepted: %v", err)
	}
}

func TestReadAbsentReturnIsPending(t *testing.T) {
	ops, err := Read(strings.NewReader(`{"client":1,"op":"queue.publish","channel":"jobs","call":5,"input":{"id":"j"}}` + "\n\n" +
		`{"client":1,"op":"queue.publish","channel":"jobs","call":6,"return":0,"input":{"id":"k"},"output":{"reason":0}}`))
	if err == nil {
		t.Fatalf("return 0 before call 6 accepted: %+v", ops)
	}
	ops, err = Read(strings.NewReader(`{"client":1,"op":"queue.publish","channel":"jobs","call":5,"input":{"id":"j"}}` + "\n\n" +
		`{"client":1,"op":"queue.publish","channel":"jobs","call":6,"return":7,"input":{"id":"k"},"output":{"reason":0}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || !ops[0].IsPending() || ops[1].IsPending() || ops[1].Line != 3 {
		t.Fatalf("got %+v", ops)
	}
}

func TestReadRejectsBadInput(t *testing.T) {
	cases := map[string]string{
		"unknown field":   `{"client":1,"op":"append.head","channel":"c","call":1,"return":1,"output":{"next":1},"extra":1}`,
		"unknown op":      `{"client":1,"op":"append.delete","channel":"c","call":1,"return":1}`,
		"no channel":      `{"client":1,"op":"append.head","call":1,"return":1,"output":{"next":1}}`,
		"no id":           `{"client":1,"op":"append.publish","channel":"c","call":1,"return":2,"input":{},"output":{"reason":0}}`,
		"bad result":      `{"client":1,"op":"queue.answer","channel":"q","call":1,"return":2,"input":{"id":"j","delivery":"AQ==","result":"done"},"output":{"reason":0}}`,
		"no attempt":      `{"client":1,"op":"queue.deliver","channel":"q","call":1,"return":1,"output":{"id":"j","offset":1,"delivery":"AQ=="}}`,
		"not json":        `{"client":1,`,
		"trailing":        `{"client":1,"op":"broker.restart","call":1,"return":2} {}`,
		"negative client": `{"client":-1,"op":"broker.restart","call":1,"return":2}`,
	}
	for name, line := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Read(strings.NewReader(line)); !errors.Is(err, ErrBadHistory) {
				t.Fatalf("accepted or wrong error: %v", err)
			}
		})
	}
}

// invariant 13: a history is file input; its line length and operation
// count are bounded before they are held.
func TestInvariant13_ReadBoundsLinesAndOps(t *testing.T) {
	line := `{"client":1,"op":"broker.restart","call":1,"return":2}` + "\n"
	if _, err := ReadLimited(strings.NewReader(strings.Repeat(line, 3)), Limits{MaxLineBytes: 1024, MaxOps: 2}); !errors.Is(err, ErrBadHistory) {
		t.Fatalf("three ops accepted under MaxOps 2: %v", err)
	}
	if _, err := ReadLimited(strings.NewReader(line), Limits{MaxLineBytes: 16, MaxOps: 2}); !errors.Is(err, ErrBadHistory) {
		t.Fatalf("long line accepted: %v", err)
	}
	if ops, err := ReadLimited(strings.NewReader(strings.Repeat(line, 2)), Limits{MaxLineBytes: 1024, MaxOps: 2}); err != nil || len(ops) != 2 {
		t.Fatalf("within limits: %v %d", err, len(ops))
	}
}
