// Package partition implements client-declared partitioning (rfcs/partition.md): the protocol's topic_hash, the slices
// (partitions, index) it defines, the parser for the saguin-filter User
// Property a subscriber declares its slices with on SUBSCRIBE, and the
// compiled Matcher the delivery paths ask per topic.
//
// Everything here is pure: no broker state, no I/O, and the hash is fixed by
// the RFC, never seeded, so a client can predict its own slice.
package partition

// FNV-1a 64-bit parameters (rfcs/partition.md).
const (
	fnvOffsetBasis uint64 = 14695981039346656037
	fnvPrime       uint64 = 1099511628211
)

// Mixing-step multipliers (rfcs/partition.md; splitmix64's).
const (
	mixMul1 uint64 = 13787848793156543929
	mixMul2 uint64 = 10723151780598845931
)

// FNV1a64 is the first half of topic_hash: FNV-1a, 64-bit, over the topic's
// UTF-8 bytes (not its characters), wrapping at 64 bits. It is exported so a
// disagreement with a client can be located to one half (the RFC's worked
// examples give both columns); a slice is never taken from it.
func FNV1a64(topic string) uint64 {
	h := fnvOffsetBasis
	for i := 0; i < len(topic); i++ {
		h ^= uint64(topic[i])
		h *= fnvPrime
	}
	return h
}

// Mix is the second half of topic_hash, the mixing step. It is not optional:
// FNV-1a barely stirs its low bits, which are the bits a modulus reads, so
// without it a topic carrying an identifier twice sends every identifier to
// the same few slices (rfcs/partition.md).
func Mix(h uint64) uint64 {
	h ^= h >> 30
	h *= mixMul1
	h ^= h >> 27
	h *= mixMul2
	h ^= h >> 31
	return h
}

// TopicHash is the protocol's topic_hash: FNV-1a-64 over the topic followed
// by the mixing step. It is a constant of the protocol, which clients
// reimplement to know where their topics land.
func TopicHash(topic string) uint64 {
	return Mix(FNV1a64(topic))
}

// SliceOf returns the index of the slice holding topic in a space of
// partitions slices: topic_hash(topic) mod partitions. partitions must be at
// least 1.
func SliceOf(topic string, partitions uint32) uint32 {
	return uint32(TopicHash(topic) % uint64(partitions))
}
