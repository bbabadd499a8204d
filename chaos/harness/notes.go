package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Notes are what the harness saw that the linearizability history format has
// no operation for: a CONNACK's Session Present, how far a reader acknowledged
// on a connection, a channel's floor told by a seek reply, and the campaign's
// own events. They sit in a JSON-lines file next to the history, stamped with
// the history's clock, and the harness's own checks read both.
type Note struct {
	Kind           string `json:"kind"`
	T              int64  `json:"t"`
	Conn           int    `json:"conn,omitempty"`
	ClientID       string `json:"client_id,omitempty"`
	Channel        string `json:"channel,omitempty"`
	SessionPresent bool   `json:"session_present,omitempty"`
	Value          int64  `json:"value,omitempty"`
	Detail         string `json:"detail,omitempty"`
	// The session-takeover and Will workloads' notes carry more times
	// (takeover.go, wills.go say what each means for their kinds).
	Peer     int   `json:"peer,omitempty"`
	Sent     int64 `json:"sent,omitempty"`
	End      int64 `json:"end,omitempty"`
	Resumed  int64 `json:"resumed,omitempty"`
	Closed   int64 `json:"closed,omitempty"`
	Delay    int64 `json:"delay_ns,omitempty"`
	Received int64 `json:"received,omitempty"`
}

// Note kinds.
const (
	// NoteConnack: a durable reader's connection Conn (client id ClientID)
	// was accepted with SessionPresent.
	NoteConnack = "connack"
	// NoteAcked: on connection Conn the reader acknowledged every record of
	// Channel up to offset Value (written when the connection ends): each
	// record's PUBACK was handed to paho, which writes it as the handler
	// returns. It is what the client sent, or was writing when the
	// connection ended; the broker may have received less, never more.
	NoteAcked = "acked"
	// NoteFloor: a seek to 0 on Channel was answered with floor Value.
	NoteFloor = "floor"
	// NoteNemesis: the campaign applied nemesis Detail at T.
	NoteNemesis = "nemesis"
	// NoteFinalRead: connection Conn read Channel from its floor up to,
	// not including, head Value, after every nemesis had ended. Detail is
	// "complete" when it got there.
	NoteFinalRead = "final_read"
	// NoteDrained: the queue drained (nothing offered for longer than the
	// visibility timeout plus a tick, every worker acknowledging).
	NoteDrained = "drained"
	// NoteTakeover: connection Conn of ClientID was accepted at T while
	// connection Peer still owned the id; its CONNECT was sent at Sent,
	// when Peer had received offsets of events up to Received (at End).
	// Conn 0: the CONNECT got no CONNACK, and may have taken Peer over.
	NoteTakeover = "takeover"
	// NoteConnEnd: a takeover client's connection Conn ended at T; Value
	// is the reason code of a DISCONNECT it was sent, or -1 for none.
	NoteConnEnd = "conn_end"
	// NoteRefused: a CONNECT for ClientID, sent at Sent while connection
	// Peer owned it, was refused at T with reason code Value.
	NoteRefused = "connect_refused"
	// NoteWillEpisode: one Will client's life (wills.go): client id and
	// Will payload ClientID, Will Delay Delay; its CONNECT sent at Sent and
	// accepted at T; its connection ended at End the way Detail says;
	// resumed at Resumed (0: not), DISCONNECT 0x00 sent at Closed.
	NoteWillEpisode = "will_episode"
	// NoteWillSeen: the watcher (connection Conn) was sent the Will of
	// ClientID, payload Detail, at offset Value of the wills channel.
	NoteWillSeen = "will_seen"
	// NoteWillsDone: the final wait for the Wills due ended at T.
	NoteWillsDone = "wills_done"
	// NoteAbort: the campaign stopped early (Detail says why); the checks
	// that need the end of a run are skipped.
	NoteAbort = "abort"
)

// noteWriter appends notes; safe for concurrent use, bounded in count.
type noteWriter struct {
	mu  sync.Mutex
	bw  *bufio.Writer
	n   int
	max int
	err error
}

func newNoteWriter(w io.Writer, max int) *noteWriter {
	return &noteWriter{bw: bufio.NewWriterSize(w, 32<<10), max: max}
}

var errTooManyNotes = errors.New("too many notes")

func (w *noteWriter) write(n Note) error {
	b, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode note: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.n >= w.max {
		w.err = fmt.Errorf("%w (%d)", errTooManyNotes, w.max)
		return w.err
	}
	w.n++
	b = append(b, '\n')
	if _, err := w.bw.Write(b); err != nil {
		w.err = fmt.Errorf("write notes: %w", err)
	}
	return w.err
}

func (w *noteWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("flush notes: %w", err)
	}
	return w.err
}

// ReadNotes parses a notes file, refusing lines over 64 KiB and more than
// maxNotes notes (invariant 13: file input is bounded before it is held).
func ReadNotes(r io.Reader, maxNotes int) ([]Note, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	var out []Note
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(out) >= maxNotes {
			return nil, fmt.Errorf("notes line %d: more than %d notes", line, maxNotes)
		}
		var n Note
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&n); err != nil {
			return nil, fmt.Errorf("notes line %d: %w", line, err)
		}
		out = append(out, n)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read notes: %w", err)
	}
	return out, nil
}

// WriteNotes writes notes as JSON lines (used to keep a doctored copy).
func WriteNotes(w io.Writer, notes []Note) error {
	enc := json.NewEncoder(w)
	for _, n := range notes {
		if err := enc.Encode(n); err != nil {
			return fmt.Errorf("write notes: %w", err)
		}
	}
	return nil
}
