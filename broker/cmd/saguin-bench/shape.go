package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// shape is one throughput load: how many publishers, each keeping how many
// QoS 1 publishes in flight. Many publishers one in flight each and a few
// publishers with deep windows stress a broker differently: a broker that
// takes a connection's next publish only once the previous one is stored
// commits at most one record per connection at a time (issue 13).
type shape struct {
	pubs, window int
}

func (s shape) String() string {
	if s.window == 1 {
		return publishers(s.pubs)
	}
	return fmt.Sprintf("%s x %d in flight", publishers(s.pubs), s.window)
}

// tag names the shape in topics and client ids; a window of 1 keeps the
// names the throughput runs always had.
func (s shape) tag() string {
	if s.window == 1 {
		return fmt.Sprintf("p%d", s.pubs)
	}
	return fmt.Sprintf("p%dw%d", s.pubs, s.window)
}

// shapes are the throughput runs in order: every -publishers count at
// -window, then the -deep-windows shapes not already among them.
func (b *bench) shapes() []shape {
	out := make([]shape, 0, len(b.o.publishers)+len(b.o.deep))
	for _, n := range b.o.publishers {
		out = append(out, shape{n, b.o.window})
	}
	for _, s := range b.o.deep {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// parseShapes reads "8x64,4x16" (publishers x window); "" is none.
func parseShapes(s string) ([]shape, error) {
	var out []shape
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, w, ok := strings.Cut(f, "x")
		pubs, err1 := strconv.Atoi(p)
		window, err2 := strconv.Atoi(w)
		if !ok || err1 != nil || err2 != nil || pubs < 1 || pubs > maxPublishers || window < 1 || window > 65535 {
			return nil, fmt.Errorf("%q: want publishers x window, like 8x64 (publishers 1..%d, window 1..65535)", f, maxPublishers)
		}
		if sh := (shape{pubs, window}); !slices.Contains(out, sh) {
			out = append(out, sh)
		}
	}
	return out, nil
}

func shapeList(ss []shape) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = fmt.Sprintf("%dx%d", s.pubs, s.window)
	}
	return strings.Join(parts, ", ")
}
