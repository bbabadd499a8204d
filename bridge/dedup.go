package bridge

import (
	"crypto/sha256"
	"encoding/binary"
)

// recentlyStored remembers the last n inbound QoS 1/2 records stored, by
// packet identifier and a digest of topic and payload, so a DUP
// redelivery of one (the peer resending after a reconnect what we had
// stored but not yet acknowledged) is acknowledged again, not stored
// twice. It is memory only, bounded by the link's receive_maximum — the
// most the peer can have unacknowledged — (invariant 13), and forgets in
// the order it learnt.
type recentlyStored struct {
	ring []dedupKey
	next int
	set  map[dedupKey]int // key → how many times it is in ring
}

type dedupKey struct {
	pid    uint16
	digest [16]byte
}

func newRecentlyStored(n int) *recentlyStored {
	if n < 1 {
		n = 1
	}
	return &recentlyStored{ring: make([]dedupKey, 0, n), set: make(map[dedupKey]int, n)}
}

func keyOf(pid uint16, topic string, payload []byte) dedupKey {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(topic)))
	h.Write(n[:])
	h.Write([]byte(topic))
	h.Write(payload)
	var k dedupKey
	k.pid = pid
	copy(k.digest[:], h.Sum(nil))
	return k
}

func (r *recentlyStored) has(k dedupKey) bool { return r.set[k] > 0 }

// add remembers k, forgetting the oldest once n are held.
func (r *recentlyStored) add(k dedupKey) {
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, k)
	} else {
		old := r.ring[r.next]
		if r.set[old]--; r.set[old] <= 0 {
			delete(r.set, old)
		}
		r.ring[r.next] = k
		r.next = (r.next + 1) % len(r.ring)
	}
	r.set[k]++
}
