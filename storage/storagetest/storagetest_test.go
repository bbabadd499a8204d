package storagetest

import (
	"testing"
	"time"

	"saguin.dev/storage"
)

// TestRecordDiffSeesEveryField: the suite is only as strict as its
// comparison, so each field a record keeps must register when it differs.
func TestRecordDiffSeesEveryField(t *testing.T) {
	base := SampleRecords()[0]
	base.Offset = 1
	if d := RecordDiff(base, base); d != "" {
		t.Fatalf("a record differs from itself: %s", d)
	}
	edits := map[string]func(r *storage.Record){
		"Offset":          func(r *storage.Record) { r.Offset++ },
		"MessageID":       func(r *storage.Record) { r.MessageID += "x" },
		"Topic":           func(r *storage.Record) { r.Topic += "x" },
		"Timestamp":       func(r *storage.Record) { r.Timestamp = r.Timestamp.Add(1) },
		"zero Timestamp":  func(r *storage.Record) { r.Timestamp = time.Time{} },
		"header order":    func(r *storage.Record) { r.Headers[0], r.Headers[1] = r.Headers[1], r.Headers[0] },
		"header dropped":  func(r *storage.Record) { r.Headers = r.Headers[:3] },
		"header value":    func(r *storage.Record) { r.Headers[2].Value = "x" },
		"Payload":         func(r *storage.Record) { r.Payload[5] = 'y' },
		"ContentType":     func(r *storage.Record) { r.ContentType = "" },
		"ResponseTopic":   func(r *storage.Record) { r.ResponseTopic = "" },
		"CorrelationData": func(r *storage.Record) { r.CorrelationData = nil },
		"PayloadFormat":   func(r *storage.Record) { r.PayloadFormat = nil },
		"PayloadFormat 0": func(r *storage.Record) { r.PayloadFormat = ptr[byte](0) },
		"MessageExpiry":   func(r *storage.Record) { r.MessageExpiry = nil },
		"Retain":          func(r *storage.Record) { r.Retain = false },
		"QoS":             func(r *storage.Record) { r.QoS = 1 },
		"PublisherID":     func(r *storage.Record) { r.PublisherID = "" },
		"Bridge":          func(r *storage.Record) { r.Bridge = "" },
	}
	for name, edit := range edits {
		r := SampleRecords()[0]
		r.Offset = 1
		edit(&r)
		if RecordDiff(base, r) == "" {
			t.Errorf("RecordDiff misses a change to %s", name)
		}
	}
	// The distinctions that are deliberately not differences.
	a, b := storage.Record{Payload: nil, Headers: nil}, storage.Record{Payload: []byte{}, Headers: []storage.Header{}}
	if d := RecordDiff(a, b); d != "" {
		t.Errorf("nil and empty differ: %s", d)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 5, time.UTC)
	if d := RecordDiff(storage.Record{Timestamp: at}, storage.Record{Timestamp: at.In(time.FixedZone("x", 3600))}); d != "" {
		t.Errorf("one instant in two zones differs: %s", d)
	}
	it := storage.QueueItem{Record: base, Attempts: 2, FirstDelivered: at, LastDelivered: at}
	for _, edit := range []func(*storage.QueueItem){
		func(i *storage.QueueItem) { i.Attempts = 3 },
		func(i *storage.QueueItem) { i.FirstDelivered = time.Time{} },
		func(i *storage.QueueItem) { i.LastDelivered = at.Add(1) },
	} {
		other := it
		edit(&other)
		if ItemDiff(it, other) == "" {
			t.Error("ItemDiff misses a change to the delivery history")
		}
	}
}
