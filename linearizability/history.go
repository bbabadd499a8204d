// Package linearizability holds porcupine models of what a Sagüin client may
// observe, and the JSON-lines history format the chaos harness records them in.
//
// It knows nothing of the broker (design.md: "porcupine only"): every field of
// the format is something a stock MQTT client sees on the wire — a PUBACK and
// its reason code, a delivery's topic, payload and saguin-* user properties,
// a seek reply. That is the point of a black-box check: a bug the broker hides
// from itself cannot hide from what its clients were told.
package linearizability

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"
)

// Operation names. The prefix before the dot selects the model that checks
// the operation; "broker." operations are seen by every model that cares.
const (
	// OpAppendPublish: a publish to an append channel.
	// input {id, payload}; output {reason} = the PUBACK (or PUBCOMP) reason code.
	OpAppendPublish = "append.publish"
	// OpAppendRead: one record delivered to a reader of an append channel.
	// output {offset, id, payload} from saguin-offset, saguin-id and the payload.
	OpAppendRead = "append.read"
	// OpAppendHead: the channel's next offset, as told by a seek reply
	// (payload of a seek to -1, or saguin-next on a beyond-end refusal).
	// output {next}.
	OpAppendHead = "append.head"

	// OpQueuePublish: a publish to a queue channel. input {id, payload};
	// output {reason}.
	OpQueuePublish = "queue.publish"
	// OpQueueDeliver: a job offered to the worker connection `client`.
	// input {dup} (the MQTT DUP flag); output {id, offset, attempt, delivery,
	// payload} from saguin-id, saguin-offset, saguin-attempt, the Correlation
	// Data (the Delivery ID) and the payload.
	OpQueueDeliver = "queue.deliver"
	// OpQueueAnswer: the worker connection `client` answers a delivery.
	// input {id, delivery, result: "ack"|"return"}; output {reason} = PUBACK.
	// The worker is never told whether the answer applied (docs/channels.md), so the
	// model decides that from the lease it names, not from the reason code.
	OpQueueAnswer = "queue.answer"
	// OpQueueLeaseEnd: the earliest moment a lease could have ended without an
	// answer — the worker's connection dropped ("disconnect"), or its PUBACK
	// was sent one visibility timeout ago ("timeout"). input {id, delivery,
	// cause}. call = that earliest moment; return is normally pending (-1),
	// because no client sees the broker take a lease back.
	OpQueueLeaseEnd = "queue.lease_end"
	// OpQueueDeadLetter: a record read from the queue's dead-letter channel.
	// channel = the source queue; output {id, offset, attempt} with offset the
	// dead-letter channel's and attempt from saguin-dlq-attempts.
	OpQueueDeadLetter = "queue.dead_letter"

	// OpLatestPublish: a publish to a latest channel. input {key, id, payload};
	// an empty payload is a delete. output {reason}.
	OpLatestPublish = "latest.publish"
	// OpLatestRead: a value seen for a key, by a point read ($saguin/kv/get)
	// or a subscription. input {key}; output {id, payload}, empty payload =
	// no value. For a subscription, call = when the SUBSCRIBE was sent.
	OpLatestRead = "latest.read"

	// OpBrokerRestart: the broker process was killed or stopped and started
	// again. call = when the stop began, return = when the new process
	// accepted connections. channel is empty: it touches every channel.
	// Every lease ends (invariant 15).
	OpBrokerRestart = "broker.restart"
	// OpBrokerPowerCut: a power cut, then a restart. call = the moment the cut
	// took effect, return = when the new process accepted connections.
	// input {loss_ns}: how far before the cut an acknowledged write may still
	// be lost (invariant 14: sqlite synchronous=NORMAL loses about the last
	// flush interval plus one fsync; memory storage loses everything since the
	// last snapshot — give a loss_ns reaching back to it). Every lease ends.
	OpBrokerPowerCut = "broker.power_cut"
)

// Pending is the Return of an operation whose response never came: a publish
// whose PUBACK was lost to a crash, a lease nobody saw end. A pending write may
// take effect at any point after its call and before the next crash
// (broker.restart / broker.power_cut) completes, or not at all.
const Pending int64 = -1

// Answer results, the two payloads docs/channels.md defines for a queue response.
const (
	ResultAck    = "ack"
	ResultReturn = "return"
)

// Lease-end causes.
const (
	CauseDisconnect = "disconnect"
	CauseTimeout    = "timeout"
)

// Op is one line of a history. Client identifies the MQTT connection that
// performed it — one number per connection, not per client id, because a queue
// lease belongs to a connection (docs/channels.md "`queue`", invariant 15).
type Op struct {
	Line    int     `json:"-"` // 1-based line in the file Read parsed; 0 otherwise
	Client  int     `json:"client"`
	Op      string  `json:"op"`
	Channel string  `json:"channel,omitempty"`
	Call    int64   `json:"call"`
	Return  int64   `json:"return"`
	Input   *Input  `json:"input,omitempty"`
	Output  *Output `json:"output,omitempty"`
}

// IsPending reports whether the operation's response never came.
func (o Op) IsPending() bool { return o.Return < 0 }

// Input is what the client sent. Only the fields an operation names are used.
// Byte fields are base64 in JSON, so binary payloads and Delivery IDs survive
// exactly (a JSON string would silently replace invalid UTF-8).
type Input struct {
	ID       string `json:"id,omitempty"`       // saguin-id the publisher set
	Key      string `json:"key,omitempty"`      // latest: the topic
	Payload  []byte `json:"payload,omitempty"`  // publish payload
	Delivery []byte `json:"delivery,omitempty"` // queue: Correlation Data echoed
	Result   string `json:"result,omitempty"`   // queue.answer: ack | return
	Cause    string `json:"cause,omitempty"`    // queue.lease_end: disconnect | timeout
	Dup      bool   `json:"dup,omitempty"`      // queue.deliver: MQTT DUP flag
	LossNs   int64  `json:"loss_ns,omitempty"`  // broker.power_cut: loss window
}

// Output is what the client was told.
type Output struct {
	Reason   int    `json:"reason"`             // PUBACK/PUBCOMP reason code; < 0x80 = success
	ID       string `json:"id,omitempty"`       // saguin-id on a delivery
	Offset   int64  `json:"offset,omitempty"`   // saguin-offset
	Attempt  int    `json:"attempt,omitempty"`  // saguin-attempt / saguin-dlq-attempts
	Delivery []byte `json:"delivery,omitempty"` // queue: Correlation Data = Delivery ID
	Payload  []byte `json:"payload,omitempty"`  // delivered payload
	Next     int64  `json:"next,omitempty"`     // append.head: next offset
}

// Succeeded reports whether a reason code means success (MQTT 5 §2.4: codes
// below 0x80 are success, e.g. 0x10 No matching subscribers).
func Succeeded(reason int) bool { return reason >= 0 && reason < 0x80 }

// Limits bound what Read accepts (invariant 13: a history is file input, so
// its size is checked before it is held).
type Limits struct {
	MaxLineBytes int // longest line accepted
	MaxOps       int // most operations accepted
}

// DefaultLimits fit a long chaos run: a 1 MiB record payload base64-encoded
// fits a line, and ten million operations is hours of workload.
var DefaultLimits = Limits{MaxLineBytes: 4 << 20, MaxOps: 10_000_000}

// ErrBadHistory wraps every error about the content of a history (as opposed
// to an I/O error), so lincheck can tell bad input from a failed check.
var ErrBadHistory = errors.New("bad history")

// Read parses a JSON-lines history with DefaultLimits. Blank lines are
// skipped. An absent "return" means Pending.
func Read(r io.Reader) ([]Op, error) { return ReadLimited(r, DefaultLimits) }

// ReadLimited parses a JSON-lines history, refusing a line or an operation
// count beyond lim.
func ReadLimited(r io.Reader, lim Limits) ([]Op, error) {
	sc := bufio.NewScanner(r)
	// The scanner's bound is the larger of max and the initial buffer, so
	// the initial buffer must not exceed the limit.
	sc.Buffer(make([]byte, 0, min(64<<10, lim.MaxLineBytes)), lim.MaxLineBytes)
	var ops []Op
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(ops) >= lim.MaxOps {
			return nil, fmt.Errorf("%w: line %d: more than %d operations", ErrBadHistory, line, lim.MaxOps)
		}
		op, err := decodeLine(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrBadHistory, line, err)
		}
		op.Line = line
		ops = append(ops, op)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrBadHistory, line+1, lim.MaxLineBytes)
		}
		return nil, fmt.Errorf("read history: %w", err)
	}
	return ops, nil
}

func decodeLine(b []byte) (Op, error) {
	// A pointer for return tells "absent" (pending) from 0.
	var raw struct {
		Op
		Return *int64 `json:"return"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Op{}, err
	}
	if dec.More() {
		return Op{}, errors.New("trailing data after the operation")
	}
	op := raw.Op
	op.Return = Pending
	if raw.Return != nil && *raw.Return >= 0 {
		op.Return = *raw.Return
	}
	return op, Validate(op)
}

// Validate checks one operation's shape: a known op, the fields it needs, and
// times that make sense.
func Validate(op Op) error {
	if op.Client < 0 {
		return fmt.Errorf("op %q: negative client %d", op.Op, op.Client)
	}
	if op.Call < 0 {
		return fmt.Errorf("op %q: negative call time", op.Op)
	}
	if !op.IsPending() && op.Return < op.Call {
		return fmt.Errorf("op %q: return %d before call %d", op.Op, op.Return, op.Call)
	}
	in, out := op.Input, op.Output
	needChannel := op.Op != OpBrokerRestart && op.Op != OpBrokerPowerCut
	if needChannel && op.Channel == "" {
		return fmt.Errorf("op %q: no channel", op.Op)
	}
	needIn := func(what string, ok bool) error {
		if in == nil || !ok {
			return fmt.Errorf("op %q: input needs %s", op.Op, what)
		}
		return nil
	}
	needOut := func(what string, ok bool) error {
		if op.IsPending() {
			return nil // nothing was told, so nothing is required
		}
		if out == nil || !ok {
			return fmt.Errorf("op %q: output needs %s", op.Op, what)
		}
		return nil
	}
	switch op.Op {
	case OpAppendPublish, OpQueuePublish:
		if err := needIn("id", in != nil && in.ID != ""); err != nil {
			return err
		}
		return needOut("reason", out != nil)
	case OpAppendRead:
		return needOut("offset >= 1 and id", out != nil && out.Offset >= 1 && out.ID != "")
	case OpAppendHead:
		return needOut("next >= 1", out != nil && out.Next >= 1)
	case OpQueueDeliver:
		return needOut("id, offset >= 1, attempt >= 1 and delivery",
			out != nil && out.ID != "" && out.Offset >= 1 && out.Attempt >= 1 && len(out.Delivery) > 0)
	case OpQueueAnswer:
		if err := needIn("id, delivery and result ack|return",
			in != nil && in.ID != "" && len(in.Delivery) > 0 && (in.Result == ResultAck || in.Result == ResultReturn)); err != nil {
			return err
		}
		return needOut("reason", out != nil)
	case OpQueueLeaseEnd:
		return needIn("id, delivery and cause disconnect|timeout",
			in != nil && in.ID != "" && len(in.Delivery) > 0 && (in.Cause == CauseDisconnect || in.Cause == CauseTimeout))
	case OpQueueDeadLetter:
		return needOut("id, offset >= 1", out != nil && out.ID != "" && out.Offset >= 1)
	case OpLatestPublish:
		if err := needIn("key and id", in != nil && in.Key != "" && in.ID != ""); err != nil {
			return err
		}
		return needOut("reason", out != nil)
	case OpLatestRead:
		return needIn("key", in != nil && in.Key != "")
	case OpBrokerRestart:
		return nil
	case OpBrokerPowerCut:
		return needIn("loss_ns >= 0", in != nil && in.LossNs >= 0)
	default:
		return fmt.Errorf("unknown op %q", op.Op)
	}
}

// Writer appends operations to a history. It is safe for concurrent use; its
// buffer is bounded (a bufio.Writer flushes when full), and so is the number of
// calls begun and not yet ended.
type Writer struct {
	mu          sync.Mutex
	bw          *bufio.Writer
	now         func() int64
	err         error // sticky: the first write error
	open        map[*Call]struct{}
	maxOpen     int
	closed      bool
	lineScratch bytes.Buffer
}

// WriterOptions configure a Writer. Zero values take defaults.
type WriterOptions struct {
	// Now returns the current time in Unix nanoseconds. Default: wall clock
	// anchored at NewWriter and advanced by the monotonic clock, so a wall
	// clock step cannot reorder a history.
	Now func() int64
	// BufferBytes bounds the output buffer (default 64 KiB).
	BufferBytes int
	// MaxOpen bounds calls begun and not yet ended (default 65536).
	MaxOpen int
}

// ErrTooManyOpen is returned by Begin when MaxOpen calls are outstanding.
var ErrTooManyOpen = errors.New("too many operations in progress")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("history writer closed")

// NewWriter returns a Writer appending to w.
func NewWriter(w io.Writer, opt WriterOptions) *Writer {
	if opt.Now == nil {
		base := time.Now()
		baseNs := base.UnixNano()
		opt.Now = func() int64 { return baseNs + int64(time.Since(base)) }
	}
	if opt.BufferBytes <= 0 {
		opt.BufferBytes = 64 << 10
	}
	if opt.MaxOpen <= 0 {
		opt.MaxOpen = 1 << 16
	}
	return &Writer{bw: bufio.NewWriterSize(w, opt.BufferBytes), now: opt.Now, open: make(map[*Call]struct{}), maxOpen: opt.MaxOpen}
}

// Now returns the writer's clock, for operations whose times the caller
// records itself (e.g. an append.read with call = return = receipt time).
func (w *Writer) Now() int64 { return w.now() }

// Write records a complete operation (Return may be Pending).
func (w *Writer) Write(op Op) error {
	if op.Return < 0 {
		op.Return = Pending
	}
	if err := Validate(op); err != nil {
		return fmt.Errorf("%w: %v", ErrBadHistory, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(op)
}

func (w *Writer) writeLocked(op Op) error {
	if w.closed {
		return ErrClosed
	}
	if w.err != nil {
		return w.err
	}
	w.lineScratch.Reset()
	enc := json.NewEncoder(&w.lineScratch) // Encode appends the newline
	if err := enc.Encode(op); err != nil {
		return fmt.Errorf("encode %s: %w", op.Op, err)
	}
	if _, err := w.bw.Write(w.lineScratch.Bytes()); err != nil {
		w.err = fmt.Errorf("write history: %w", err)
		return w.err
	}
	return nil
}

// Call is an operation begun and not yet ended.
type Call struct {
	w  *Writer
	op Op
}

// Begin stamps the call time of an operation and returns the handle that ends
// it. A Call never ended is written as pending by Close — which is exactly
// what a publish cut off by a crash is.
func (w *Writer) Begin(client int, op, channel string, in *Input) (*Call, error) {
	c := &Call{w: w, op: Op{Client: client, Op: op, Channel: channel, Input: in}}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrClosed
	}
	if len(w.open) >= w.maxOpen {
		return nil, fmt.Errorf("begin %s: %w (%d)", op, ErrTooManyOpen, w.maxOpen)
	}
	c.op.Call = w.now()
	w.open[c] = struct{}{}
	return c, nil
}

// End stamps the return time, attaches the output and writes the operation.
// Ending a Call twice is an error.
func (c *Call) End(out *Output) error {
	w := c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.open[c]; !ok {
		return fmt.Errorf("end %s: call already ended or writer closed", c.op.Op)
	}
	delete(w.open, c)
	op := c.op
	op.Return = w.now()
	if op.Return < op.Call {
		op.Return = op.Call
	}
	op.Output = out
	if err := Validate(op); err != nil {
		return fmt.Errorf("%w: %v", ErrBadHistory, err)
	}
	return w.writeLocked(op)
}

// Abandon writes the operation now as pending: its response will never come
// (e.g. the connection it was sent on has closed).
func (c *Call) Abandon() error {
	w := c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.open[c]; !ok {
		return fmt.Errorf("abandon %s: call already ended or writer closed", c.op.Op)
	}
	delete(w.open, c)
	op := c.op
	op.Return = Pending
	return w.writeLocked(op)
}

// Flush writes buffered operations to the underlying writer.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("flush history: %w", err)
	}
	return w.err
}

// Close writes every call still open as pending, flushes, and refuses further
// writes. It does not close the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	// Deterministic order: by call time, so the file reads in time order.
	pending := make([]*Call, 0, len(w.open))
	for c := range w.open {
		pending = append(pending, c)
	}
	sortCalls(pending)
	for _, c := range pending {
		op := c.op
		op.Return = Pending
		if err := w.writeLocked(op); err != nil {
			break
		}
	}
	clear(w.open)
	w.closed = true
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("flush history: %w", err)
	}
	return w.err
}

func sortCalls(cs []*Call) {
	slices.SortFunc(cs, func(a, b *Call) int { return cmp.Compare(a.op.Call, b.op.Call) })
}
