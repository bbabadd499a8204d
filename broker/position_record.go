package broker

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"saguin.dev/broker/internal/ops"
)

// The record of readers whose stored position the retention floor passed,
// which /v1/operations/position-lost reads (docs/operations.md "The routes"): one row per
// (reader, channel), every passing of it aggregated, fed where the broker
// finds one (floor.go positionPassed). In memory only. While no passing
// was left out (beyond is 0), the counts of a channel's rows add up to
// its saguin_channel_position_lost_total.

// lostTracked bounds the rows held (invariant 13: readers are client ids).
const lostTracked = 1000

// The kinds of reader a passing is filed under.
const (
	lostConsumer = "consumer" // overtaken while connected: never told
	lostSession  = "session"  // found passed at its return or its SUBSCRIBE
)

// lostPassing is one passing as positionPassed reports it.
type lostPassing struct {
	reader, channel, kind string
	told                  bool
	position, floor       uint64
}

type lostKey struct{ reader, channel string }

type lostRow struct {
	kind     string
	untold   bool // some passing aggregated here went untold
	count    uint64
	missed   uint64
	position uint64
	floor    uint64
	last     time.Time
}

// lostRecord holds the rows.
type lostRecord struct {
	max    int
	maxLen int // bytes kept of a reader's name: limits.max_topic_length

	mu   sync.Mutex
	rows map[lostKey]*lostRow // at most max (add)
	// beyond counts the passings no row keeps: a newcomer that lost no
	// more than every row held, or a row it displaced.
	beyond uint64
}

func newLostRecord(max, maxLen int) *lostRecord {
	return &lostRecord{max: max, maxLen: maxLen, rows: make(map[lostKey]*lostRow)}
}

// add files one passing. A newcomer to a full record displaces the row
// that lost the fewest records, if it lost more; otherwise it is dropped.
func (r *lostRecord) add(p lostPassing, at time.Time) {
	k := lostKey{reader: cut(p.reader, r.maxLen), channel: p.channel}
	missed := p.floor - p.position
	r.mu.Lock()
	defer r.mu.Unlock()
	row, ok := r.rows[k]
	if !ok {
		// invariant 13: a full record makes room by displacing a row, or keeps none.
		if len(r.rows) >= r.max {
			var least lostKey
			var leastRow *lostRow
			for key, x := range r.rows {
				if leastRow == nil || x.missed < leastRow.missed {
					least, leastRow = key, x
				}
			}
			if leastRow.missed >= missed {
				r.beyond++
				return
			}
			delete(r.rows, least)
			r.beyond += leastRow.count
		}
		row = &lostRow{}
		r.rows[k] = row
	}
	row.kind = p.kind // the latest passing's: a session's reader may be overtaken later as a consumer
	row.untold = row.untold || !p.told
	row.count++
	row.missed += missed
	row.position, row.floor, row.last = p.position, p.floor, at
}

// view is the rows that lost the most records first, at most max of
// them, copied under the lock and sorted outside it.
func (r *lostRecord) view(max int) ops.PositionLost {
	r.mu.Lock()
	out := ops.PositionLost{Readers: make([]ops.LostReader, 0, len(r.rows)),
		RecordCounts: ops.RecordCounts{Tracked: len(r.rows), Beyond: r.beyond}}
	for k, row := range r.rows {
		out.Readers = append(out.Readers, ops.LostReader{Reader: k.reader, Channel: k.channel, Kind: row.kind,
			Reported: !row.untold, Count: row.count, RecordsMissed: row.missed, LastPosition: row.position,
			LastFloor: row.floor, LastSeen: ops.TimeOf(row.last)})
	}
	r.mu.Unlock()
	slices.SortFunc(out.Readers, func(a, b ops.LostReader) int {
		if c := cmp.Compare(b.RecordsMissed, a.RecordsMissed); c != 0 {
			return c
		}
		if c := strings.Compare(a.Reader, b.Reader); c != 0 {
			return c
		}
		return strings.Compare(a.Channel, b.Channel)
	})
	out.Readers = out.Readers[:min(len(out.Readers), max)]
	out.Returned = len(out.Readers)
	return out
}
