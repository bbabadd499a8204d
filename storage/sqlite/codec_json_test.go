package sqlite

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"pgregory.net/rapid"

	"saguin.dev/storage"
)

// refHeaders and refProps are the decoding the read path did before the
// fast decoders: encoding/json into the shapes encodeRecord marshals.
func refHeaders(s string) ([]storage.Header, error) {
	var pairs [][2]string
	if err := json.Unmarshal([]byte(s), &pairs); err != nil {
		return nil, err
	}
	h := make([]storage.Header, len(pairs))
	for i, p := range pairs {
		h[i] = storage.Header{Name: p[0], Value: p[1]}
	}
	return h, nil
}

func refProps(s string) (propsJSON, error) {
	var p propsJSON
	err := json.Unmarshal([]byte(s), &p)
	return p, err
}

// checkAgainstReference: whatever a fast decoder accepts, encoding/json
// decodes to the same values; and decodeHeaders/decodeProps (fast path
// or fallback) answer exactly what encoding/json answers, error or value.
func checkAgainstReference(t interface {
	Helper()
	Fatalf(format string, args ...any)
}, s string) {
	t.Helper()
	want, wantErr := refHeaders(s)
	if got, ok := fastHeaders(s); ok {
		if wantErr != nil {
			t.Fatalf("fastHeaders accepted %q, encoding/json refuses it: %v", s, wantErr)
		}
		if !slices.Equal(got, want) || (got == nil) != (want == nil) {
			t.Fatalf("fastHeaders(%q) = %q, encoding/json %q", s, got, want)
		}
	}
	got, err := decodeHeaders(s)
	if (err != nil) != (wantErr != nil) || !slices.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("decodeHeaders(%q) = %q, %v; encoding/json %q, %v", s, got, err, want, wantErr)
	}

	wantP, wantPErr := refProps(s)
	if gotP, ok := fastProps(s); ok {
		if wantPErr != nil {
			t.Fatalf("fastProps accepted %q, encoding/json refuses it: %v", s, wantPErr)
		}
		if !reflect.DeepEqual(gotP, wantP) {
			t.Fatalf("fastProps(%q) = %+v, encoding/json %+v", s, gotP, wantP)
		}
	}
}

// propsOf is a record's five publish properties, to compare decodings.
func propsOf(r storage.Record) storage.Record {
	return storage.Record{ContentType: r.ContentType, ResponseTopic: r.ResponseTopic,
		CorrelationData: r.CorrelationData, PayloadFormat: r.PayloadFormat, MessageExpiry: r.MessageExpiry}
}

// TestFastJSONAgreesWithEncodingJSON: every headers and props value
// encodeRecord writes — any valid UTF-8, control characters, the HTML
// characters and U+2028 json.Marshal escapes, every property present or
// absent — is taken by the fast path (so the fast path is what runs) and
// decodes to the record's own values, as encoding/json decodes it.
func TestFastJSONAgreesWithEncodingJSON(t *testing.T) {
	text := rapid.OneOf(
		rapid.String(),
		rapid.StringMatching(`[a-z<>&"\\/\x00-\x1f\x7f\x{2028}\x{2029}\x{fffd}é€😀]{0,12}`),
	)
	rapid.Check(t, func(t *rapid.T) {
		var r storage.Record
		for range rapid.IntRange(0, 5).Draw(t, "headers") {
			r.Headers = append(r.Headers, storage.Header{Name: text.Draw(t, "name"), Value: text.Draw(t, "value")})
		}
		if rapid.Bool().Draw(t, "content type") {
			r.ContentType = text.Draw(t, "content type value")
		}
		if rapid.Bool().Draw(t, "response topic") {
			r.ResponseTopic = text.Draw(t, "response topic value")
		}
		if rapid.Bool().Draw(t, "correlation") {
			r.CorrelationData = []byte(rapid.String().Draw(t, "correlation value"))
		}
		if rapid.Bool().Draw(t, "format") {
			v := rapid.Byte().Draw(t, "format value")
			r.PayloadFormat = &v
		}
		if rapid.Bool().Draw(t, "expiry") {
			v := rapid.Uint32().Draw(t, "expiry value")
			r.MessageExpiry = &v
		}
		e, err := encodeRecord(&r)
		if err != nil {
			t.Fatalf("encodeRecord: %v", err)
		}
		if hs, ok := e.headers.(string); ok {
			h, ok := fastHeaders(hs)
			if !ok {
				t.Fatalf("fastHeaders refused what encodeRecord wrote: %q", hs)
			}
			if !slices.Equal(h, r.Headers) {
				t.Fatalf("headers %q decoded to %q, want %q", hs, h, r.Headers)
			}
			checkAgainstReference(t, hs)
		}
		if ps, ok := e.props.(string); ok {
			if _, ok := fastProps(ps); !ok {
				t.Fatalf("fastProps refused what encodeRecord wrote: %q", ps)
			}
			var got storage.Record
			if err := decodeProps(ps, &got); err != nil {
				t.Fatalf("decodeProps(%q): %v", ps, err)
			}
			if !reflect.DeepEqual(propsOf(got), propsOf(r)) {
				t.Fatalf("props %q decoded to %+v, want %+v", ps, propsOf(got), propsOf(r))
			}
			checkAgainstReference(t, ps)
		}
	})
}

// fallbackCases are columns this provider never writes. The fast decoders
// must leave each to encoding/json (or agree with it), so a foreign or
// damaged row reads exactly as it did before them.
var fallbackCases = []string{
	``, `null`, `[]`, `{}`, `[`, `]`, `[[`, `[[]]`, `[null]`, `[["a"]]`, `[["a","b","c"]]`, `[["a",null]]`,
	`[["a","b"]`, `[["a","b"]]x`, `[["a","b"],]`, `[["a","b"] ]`, ` [["a","b"]]`, `[[ "a","b"]]`,
	`[["a",1]]`, `[["\ud83d\ude00","v"]]`, `[["\udbff\udfff","v"]]`, `[["\udc00","v"]]`, `[["\ud83d","v"]]`, `[["\ude00x","v"]]`, "[[\"\xff\",\"v\"]]",
	"[[\"a\x01\",\"v\"]]", `[["\x","v"]]`, `[["\u12","v"]]`, `[["\u00e9\n\t\"\\\/\b\f\r","v"]]`,
	`[["a\`, `[["a\"`, `[["\u003c\u003e\u0026\u2028","v"]]`, `[["é€😀","v"]]`, `[["\u0000","v"]]`,
	`{"content_type":"a"}`, `{"Content_Type":"a"}`, `{"content_type":"a","content_type":"b"}`,
	`{"response_topic":"r","content_type":"a"}`, `{"content_type":null}`, `{"other":1}`,
	`{"payload_format":1}`, `{"payload_format":255}`, `{"payload_format":256}`, `{"payload_format":-1}`,
	`{"payload_format":01}`, `{"payload_format":1.0}`, `{"payload_format":1e0}`, `{"payload_format":}`,
	`{"message_expiry":4294967295}`, `{"message_expiry":4294967296}`, `{"message_expiry":0}`,
	`{"message_expiry":99999999999999999999999}`, `{"correlation_data":""}`, `{"correlation_data":"3q0="}`,
	`{"content_type":"a",}`, `{"content_type":"a"} `, `{"content_type" :"a"}`, `{"content_\u0074ype":"a"}`,
	`{"content_type":"a","response_topic":"b","correlation_data":"","payload_format":0,"message_expiry":7}`,
	`{"message_expiry":7,"payload_format":0}`, `{"payload_format":1`, `{"payload_format"`,
}

func TestFastJSONFallsBackOnForeignColumns(t *testing.T) {
	for _, s := range fallbackCases {
		checkAgainstReference(t, s)
	}
}

// TestFastJSONNearMisses mutates valid columns one byte at a time — the
// damage most likely to meet a decoder — and checks the fast decoders never
// accept what encoding/json reads differently.
func TestFastJSONNearMisses(t *testing.T) {
	tokens := []string{`[`, `]`, `{`, `}`, `,`, `:`, `"`, `\`, `\u`, `d83d`, `0`, `9`, `-`, `e`, ` `, `null`, "\xff", "\x01", `a`}
	bases := []string{
		`[["source","sensor-7"],["unit","celsius"]]`,
		`[["a\"b","\u003c\u2028"],["",""]]`,
		`{"content_type":"text/plain","response_topic":"r/1","correlation_data":"3q0AvO8=","payload_format":1,"message_expiry":60}`,
	}
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.SampledFrom(bases).Draw(t, "base")
		for range rapid.IntRange(1, 3).Draw(t, "edits") {
			i := rapid.IntRange(0, len(s)).Draw(t, "at")
			switch rapid.IntRange(0, 2).Draw(t, "edit") {
			case 0: // insert
				s = s[:i] + rapid.SampledFrom(tokens).Draw(t, "token") + s[i:]
			case 1: // delete
				if i < len(s) {
					s = s[:i] + s[i+1:]
				}
			case 2: // replace
				if i < len(s) {
					s = s[:i] + rapid.SampledFrom(tokens).Draw(t, "token") + s[i+1:]
				}
			}
		}
		checkAgainstReference(t, s)
	})
}

func FuzzFastJSON(f *testing.F) {
	for _, s := range fallbackCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkAgainstReference(t, s) })
}

// TestFastHeadersShareTheColumn: an unescaped header is a substring of the
// column (no copy per name or value), and the slice is sized to the pairs.
func TestFastHeadersShareTheColumn(t *testing.T) {
	col := `[["source","sensor-7"],["unit","celsius"]]`
	h, ok := fastHeaders(col)
	if !ok || len(h) != 2 || cap(h) != 2 {
		t.Fatalf("fastHeaders(%q) = %q (cap %d), %v", col, h, cap(h), ok)
	}
	if i := strings.Index(col, "sensor-7"); i < 0 || unsafe.StringData(h[0].Value) != unsafe.StringData(col[i:]) {
		t.Fatalf("header value %q is a copy, not the column's bytes", h[0].Value)
	}
	if allocs := testing.AllocsPerRun(100, func() { fastHeaders(col) }); allocs != 1 {
		t.Fatalf("fastHeaders allocates %v times per column, want 1 (the slice)", allocs)
	}
}
