package sqlite

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"saguin.dev/storage"
)

// Decoding the headers and props columns on the read path. A replay decodes
// them for every record, and encoding/json (reflection, a validating pass,
// a string per header name and value) was the largest cost of Read. The
// fast decoders here accept exactly the shape encodeRecord writes with
// json.Marshal — no whitespace, keys in field order, integers without
// sign, exponent or leading zero — and hand anything else to encoding/json,
// so a row they do not recognise decodes (or fails) exactly as before.
// Whatever they accept, encoding/json decodes to the same values
// (TestFastJSONAgreesWithEncodingJSON).

// decodeHeaders decodes the headers column: an ordered array of [name,
// value] pairs, duplicates kept (rfcs/storage-sqlite.md).
func decodeHeaders(s string) ([]storage.Header, error) {
	if h, ok := fastHeaders(s); ok {
		return h, nil
	}
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

// decodeProps decodes the props column into r's five publish properties.
func decodeProps(s string, r *storage.Record) error {
	p, ok := fastProps(s)
	if !ok {
		p = propsJSON{}
		if err := json.Unmarshal([]byte(s), &p); err != nil {
			return err
		}
	}
	r.ContentType = p.ContentType
	r.ResponseTopic = p.ResponseTopic
	r.PayloadFormat = p.PayloadFormat
	r.MessageExpiry = p.MessageExpiry
	if p.CorrelationData != nil {
		b, err := base64.StdEncoding.DecodeString(*p.CorrelationData)
		if err != nil {
			return fmt.Errorf("correlation data: %w", err)
		}
		r.CorrelationData = b
	}
	return nil
}

// fastHeaders decodes `[["n","v"],...]`. The names and values share the
// column's string wherever they hold no escape: one allocation for the
// slice, none per header.
func fastHeaders(s string) ([]storage.Header, bool) {
	if len(s) < 2 || s[0] != '[' {
		return nil, false
	}
	if s == "[]" {
		return []storage.Header{}, true
	}
	// Capacity from the separators between pairs. A value that happens to
	// contain one only over-sizes the slice, and never past what the
	// column could hold (invariant 13): a pair takes at least 7 bytes,
	// `["",""]`, and a separating comma.
	h := make([]storage.Header, 0, min(strings.Count(s, `"],["`)+1, (len(s)+1)/8))
	i := 1
	for {
		if i+1 >= len(s) || s[i] != '[' {
			return nil, false
		}
		name, j, ok := jsonString(s, i+1)
		if !ok || j >= len(s) || s[j] != ',' {
			return nil, false
		}
		value, k, ok := jsonString(s, j+1)
		if !ok || k >= len(s) || s[k] != ']' {
			return nil, false
		}
		h = append(h, storage.Header{Name: name, Value: value})
		i = k + 1
		if i >= len(s) {
			return nil, false
		}
		switch s[i] {
		case ',':
			i++
		case ']':
			if i != len(s)-1 {
				return nil, false
			}
			return h, true
		default:
			return nil, false
		}
	}
}

// propsKeys are propsJSON's keys in the order json.Marshal writes them.
var propsKeys = [...]string{"content_type", "response_topic", "correlation_data", "payload_format", "message_expiry"}

// fastProps decodes the props object when its keys appear in propsJSON's
// field order, each at most once; a repeated, unknown, reordered or
// differently cased key goes to encoding/json, which has its own rules for
// those.
func fastProps(s string) (propsJSON, bool) {
	var p propsJSON
	if len(s) < 2 || s[0] != '{' {
		return p, false
	}
	if s == "{}" {
		return p, true
	}
	i, next := 1, 0 // next: the first key still allowed
	for {
		key, j, ok := jsonString(s, i)
		if !ok || j >= len(s) || s[j] != ':' {
			return p, false
		}
		field := -1
		for f := next; f < len(propsKeys); f++ {
			if key == propsKeys[f] {
				field = f
				break
			}
		}
		if field < 0 {
			return p, false
		}
		next = field + 1
		i = j + 1
		switch field {
		case 0, 1, 2:
			v, k, ok := jsonString(s, i)
			if !ok {
				return p, false
			}
			switch field {
			case 0:
				p.ContentType = v
			case 1:
				p.ResponseTopic = v
			case 2:
				p.CorrelationData = &v
			}
			i = k
		case 3:
			n, k, ok := jsonUint(s, i, 0xff)
			if !ok {
				return p, false
			}
			b := byte(n)
			p.PayloadFormat = &b
			i = k
		case 4:
			n, k, ok := jsonUint(s, i, 0xffffffff)
			if !ok {
				return p, false
			}
			u := uint32(n)
			p.MessageExpiry = &u
			i = k
		}
		if i >= len(s) {
			return p, false
		}
		switch s[i] {
		case ',':
			i++
		case '}':
			if i != len(s)-1 {
				return p, false
			}
			return p, true
		default:
			return p, false
		}
	}
}

// jsonUint reads a non-negative integer at s[i:] as json.Marshal writes
// one: "0" or digits without a leading zero, at most limit. Anything else
// (a sign, fraction, exponent, overflow) is not ours to judge.
func jsonUint(s string, i int, limit uint64) (uint64, int, bool) {
	start := i
	var n uint64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		n = n*10 + uint64(s[i]-'0')
		if n > limit {
			return 0, 0, false
		}
		i++
	}
	if i == start || (s[start] == '0' && i-start > 1) {
		return 0, 0, false
	}
	return n, i, true
}

// jsonString reads the JSON string whose opening quote is s[i] and returns
// its value and the index after the closing quote. Without escapes the
// value is a substring of s (no copy). It refuses — leaving the decision
// to encoding/json — a control character, invalid UTF-8 (which
// encoding/json would replace with U+FFFD) and \u escapes of surrogates
// (which it pairs or replaces).
func jsonString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	i++
	start := i
	escaped, ascii := false, true
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			raw := s[start:i]
			if !ascii && !utf8.ValidString(raw) {
				return "", 0, false
			}
			if !escaped {
				return raw, i + 1, true
			}
			v, ok := unescape(raw)
			return v, i + 1, ok
		case c == '\\':
			escaped = true
			i++ // the escaped byte is never the closing quote
		case c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

// unescape decodes the escapes of a JSON string body whose bytes are valid
// UTF-8.
func unescape(raw string) (string, bool) {
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", false
		}
		switch raw[i] {
		case '"', '\\', '/':
			b = append(b, raw[i])
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			if i+4 >= len(raw) {
				return "", false
			}
			var r rune
			for _, h := range []byte(raw[i+1 : i+5]) {
				var d byte
				switch {
				case h >= '0' && h <= '9':
					d = h - '0'
				case h >= 'a' && h <= 'f':
					d = h - 'a' + 10
				case h >= 'A' && h <= 'F':
					d = h - 'A' + 10
				default:
					return "", false
				}
				r = r<<4 | rune(d)
			}
			if r >= 0xd800 && r < 0xe000 {
				return "", false
			}
			b = utf8.AppendRune(b, r)
			i += 4
		default:
			return "", false
		}
	}
	return string(b), true
}
