package memory

import "sort"

// chunkLen is the length of every chunk of a long log but the last.
const chunkLen = 256

// deque holds a log's records in chunks: appending never moves what is
// already stored (a single slice regrows by copying the whole channel
// under its lock, which dominated the cost of an append on a long
// channel), and removal from the front clears records and drops whole
// chunks, so its cost is proportional to what is removed (docs/channels.md "When retention passes a position").
//
// Every chunk but the last holds exactly chunkLen values; the first may
// start with dead values (head of them). A deque of one chunk grows that
// chunk like a slice, so a short log costs no more than its records, and
// is compacted in place once its dead prefix is half of it.
type deque[T any] struct {
	chunks [][]T
	head   int // dead values at the front of chunks[0]
	n      int // live values
}

func (d *deque[T]) Len() int { return d.n }

// At is the i-th live value, 0 <= i < Len.
func (d *deque[T]) At(i int) *T {
	p := d.head + i
	return &d.chunks[p/chunkLen][p%chunkLen]
}

// Search is the smallest i in [0, Len) for which f is true, or Len; f must
// be false and then true along the deque.
func (d *deque[T]) Search(f func(*T) bool) int {
	return sort.Search(d.n, func(i int) bool { return f(d.At(i)) })
}

func (d *deque[T]) Push(v T) {
	last := len(d.chunks) - 1
	if last < 0 || len(d.chunks[last]) == chunkLen {
		var c []T // the first chunk grows as a slice
		if last >= 0 {
			c = make([]T, 0, chunkLen)
		}
		d.chunks = append(d.chunks, c)
		last++
	}
	d.chunks[last] = append(d.chunks[last], v)
	d.n++
}

// PopBack removes the last value.
func (d *deque[T]) PopBack() {
	last := len(d.chunks) - 1
	c := d.chunks[last]
	var zero T
	c[len(c)-1] = zero
	d.chunks[last] = c[:len(c)-1]
	d.n--
	if d.n == 0 {
		d.chunks, d.head = nil, 0
	} else if len(d.chunks[last]) == 0 {
		d.chunks[last] = nil
		d.chunks = d.chunks[:last]
	}
}

// DropFront removes the first k values, clearing them so what they
// reference can be collected.
func (d *deque[T]) DropFront(k int) {
	var zero T
	for i := range k {
		*d.At(i) = zero
	}
	d.head += k
	d.n -= k
	for len(d.chunks) > 1 && d.head >= chunkLen {
		d.chunks[0] = nil
		d.chunks = d.chunks[1:]
		d.head -= chunkLen
	}
	switch {
	case d.n == 0:
		d.chunks, d.head = nil, 0
	case len(d.chunks) == 1 && 2*d.head >= len(d.chunks[0]):
		c := d.chunks[0]
		if cap(c) > 4*max(d.n, 16) { // far larger than what is held
			fresh := make([]T, d.n, 2*d.n)
			copy(fresh, c[d.head:])
			d.chunks[0] = fresh
		} else {
			copy(c, c[d.head:])
			clear(c[d.n:])
			d.chunks[0] = c[:d.n]
		}
		d.head = 0
	}
}
