package sqlite

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"saguin.dev/storage"
)

// How a storage.Record becomes a row (rfcs/storage-sqlite.md "Schema"): headers as an
// ordered JSON array of [name, value] pairs (duplicates kept, NULL when
// none), the five publish properties as one JSON object (NULL when none,
// correlation data base64), the timestamp as Unix nanoseconds with the zero
// time stored as 0, and the record's Size kept in its own column so that
// trimming and queue sums never re-derive it in SQL (docs/channels.md "When retention passes a position").

// recordColumns are the record columns in scan order, shared by records and
// queue_items.
const recordColumns = `"offset", message_id, topic, timestamp, headers, payload, props, retain, qos, publisher, bridge`

// readColumns are the columns Read scans (pageScan). A replay reads every
// column of every record, and each column costs the driver two or three
// calls into SQLite, each taking the connection's mutex — dear in modernc's
// pthread emulation, the largest cost of a page once the JSON decoding
// was made cheap. So Read asks for fewer: retain and qos come as one
// integer (-1 for a qos no publish has), and the publisher and bridge,
// empty on most records, come as NULL when empty, which the driver reads
// in one call instead of three.
const readColumns = `"offset", message_id, topic, timestamp, headers, payload, props,
	CASE WHEN qos BETWEEN 0 AND 2 THEN qos * 2 + (retain != 0) ELSE -1 END,
	nullif(publisher, ''), nullif(bridge, '')`

// itemColumns adds what survives a restart about a queue item's deliveries.
const itemColumns = recordColumns + `, attempts, first_delivered, last_delivered`

// encoded is a record prepared for binding. It is built on the caller's
// goroutine so the single writer spends its time on SQLite alone.
type encoded struct {
	ts      int64
	headers any // nil or string
	props   any // nil or string
	payload []byte
	size    int64
}

type propsJSON struct {
	ContentType     string  `json:"content_type,omitempty"`
	ResponseTopic   string  `json:"response_topic,omitempty"`
	CorrelationData *string `json:"correlation_data,omitempty"` // base64; present-but-empty kept
	PayloadFormat   *byte   `json:"payload_format,omitempty"`
	MessageExpiry   *uint32 `json:"message_expiry,omitempty"`
}

// errNotUTF8 refuses text JSON could not keep: encoding/json would replace
// invalid bytes with U+FFFD and store a header nobody sent.
var errNotUTF8 = errors.New("not valid UTF-8")

func encodeRecord(r *storage.Record) (encoded, error) {
	e := encoded{ts: timeToDB(r.Timestamp), payload: r.Payload, size: r.Size()}
	if e.payload == nil {
		// The payload column is NOT NULL; the driver binds a nil slice as NULL.
		e.payload = []byte{}
	}
	if len(r.Headers) > 0 {
		pairs := make([][2]string, len(r.Headers))
		for i, h := range r.Headers {
			if !utf8.ValidString(h.Name) || !utf8.ValidString(h.Value) {
				return e, fmt.Errorf("header %d: %w", i, errNotUTF8)
			}
			pairs[i] = [2]string{h.Name, h.Value}
		}
		b, err := json.Marshal(pairs)
		if err != nil {
			return e, fmt.Errorf("encode headers: %w", err)
		}
		e.headers = string(b)
	}
	if r.ContentType != "" || r.ResponseTopic != "" || r.CorrelationData != nil ||
		r.PayloadFormat != nil || r.MessageExpiry != nil {
		if !utf8.ValidString(r.ContentType) || !utf8.ValidString(r.ResponseTopic) {
			return e, fmt.Errorf("content type or response topic: %w", errNotUTF8)
		}
		p := propsJSON{
			ContentType:   r.ContentType,
			ResponseTopic: r.ResponseTopic,
			PayloadFormat: r.PayloadFormat,
			MessageExpiry: r.MessageExpiry,
		}
		if r.CorrelationData != nil {
			s := base64.StdEncoding.EncodeToString(r.CorrelationData)
			p.CorrelationData = &s
		}
		b, err := json.Marshal(p)
		if err != nil {
			return e, fmt.Errorf("encode publish properties: %w", err)
		}
		e.props = string(b)
	}
	return e, nil
}

// timeToDB stores the zero time as 0, so a record without a timestamp never
// reads back as a date in 1754 (docs/operations.md "Storage files").
func timeToDB(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeFromDB(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// recordScan receives one row of recordColumns (and, for items, the three
// delivery columns).
type recordScan struct {
	offset, ts, retain, qos int64
	headers, props          sql.NullString
	attempts                int64
	first, last             int64
	rec                     storage.Record
}

func (s *recordScan) recordDest() []any {
	return []any{&s.offset, &s.rec.MessageID, &s.rec.Topic, &s.ts, &s.headers,
		&s.rec.Payload, &s.props, &s.retain, &s.qos, &s.rec.PublisherID, &s.rec.Bridge}
}

// pageScan receives the rows of a Read page (readColumns). One serves a
// whole page: Scan assigns every destination on every row (a NULL too), and
// record copies out what it keeps, so no row inherits another's values.
type pageScan struct {
	recordScan
	flags             int64 // qos*2 + retain, -1 for an impossible qos
	publisher, bridge sql.NullString
	dest              []any
}

func newPageScan() *pageScan {
	s := &pageScan{}
	s.dest = []any{&s.offset, &s.rec.MessageID, &s.rec.Topic, &s.ts, &s.headers,
		&s.rec.Payload, &s.props, &s.flags, &s.publisher, &s.bridge}
	return s
}

func (s *pageScan) record() (storage.Record, error) {
	if s.flags < 0 || s.flags > 5 {
		return storage.Record{}, fmt.Errorf("row at offset %d: qos outside 0–2", s.offset)
	}
	s.qos, s.retain = s.flags>>1, s.flags&1
	s.rec.PublisherID, s.rec.Bridge = s.publisher.String, s.bridge.String
	return s.recordScan.record()
}

func (s *recordScan) itemDest() []any {
	return append(s.recordDest(), &s.attempts, &s.first, &s.last)
}

// record finishes a scanned row. A row this provider did not write in this
// shape is reported, never half-decoded.
func (s *recordScan) record() (storage.Record, error) {
	r := s.rec
	if s.offset < 1 || s.qos < 0 || s.qos > 2 {
		return r, fmt.Errorf("row at offset %d: impossible offset or qos %d", s.offset, s.qos)
	}
	r.Offset = uint64(s.offset)
	r.Timestamp = timeFromDB(s.ts)
	r.Retain = s.retain != 0
	r.QoS = byte(s.qos)
	if s.headers.Valid {
		h, err := decodeHeaders(s.headers.String)
		if err != nil {
			return r, fmt.Errorf("row at offset %d: headers: %w", s.offset, err)
		}
		r.Headers = h
	}
	if s.props.Valid {
		if err := decodeProps(s.props.String, &r); err != nil {
			return r, fmt.Errorf("row at offset %d: publish properties: %w", s.offset, err)
		}
	}
	return r, nil
}

func (s *recordScan) item() (storage.QueueItem, error) {
	r, err := s.record()
	if err != nil {
		return storage.QueueItem{}, err
	}
	if s.attempts < 0 || s.attempts > math.MaxUint32 {
		return storage.QueueItem{}, fmt.Errorf("row at offset %d: attempts %d out of range", s.offset, s.attempts)
	}
	return storage.QueueItem{
		Record:         r,
		Attempts:       uint32(s.attempts),
		FirstDelivered: timeFromDB(s.first),
		LastDelivered:  timeFromDB(s.last),
	}, nil
}

// cloneRecord is a deep copy: the record a store answers with shares no
// memory with the caller's, who may reuse its buffers once a call returns.
func cloneRecord(r storage.Record) storage.Record {
	r.Headers = slices.Clone(r.Headers)
	r.Payload = bytes.Clone(r.Payload)
	r.CorrelationData = bytes.Clone(r.CorrelationData)
	if r.PayloadFormat != nil {
		v := *r.PayloadFormat
		r.PayloadFormat = &v
	}
	if r.MessageExpiry != nil {
		v := *r.MessageExpiry
		r.MessageExpiry = &v
	}
	return r
}
