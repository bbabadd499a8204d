package metrics

import "strconv"

// The closed label sets (docs/operations.md "Metrics"): every value a cause or closed_by
// label can take is one of these, so a family's series are bounded by
// the code, never by what clients send.

// labelOf is the label value of the i-th cause of a set, named in its
// constants' order.
func labelOf(i int, names ...string) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return "cause " + strconv.Itoa(i)
}

// WillCause is why a Will was published (saguin_wills_published_total).
type WillCause int

const (
	// WillImmediate: its connection ended with no Will Delay, or a new
	// connection replaced a live one that asked for none.
	WillImmediate WillCause = iota
	// WillDelayed: its Will Delay Interval ran out while the broker ran.
	WillDelayed
	// WillSessionEnded: its session ended (expired, or ended by a
	// CONNECT) before the delay did.
	WillSessionEnded
	// WillAtStart: it fell due while the broker was stopped and was
	// published at the start; a restart never counts as immediate.
	WillAtStart
	willCauses
)

func (c WillCause) String() string {
	return labelOf(int(c), "immediate", "delayed", "session_ended", "start")
}

// SessionDropCause is why the session store could not keep a session
// (saguin_sessions_dropped_total).
type SessionDropCause int

const (
	// SessionStorageFull: no room for the session's record; it ended
	// with its connection.
	SessionStorageFull SessionDropCause = iota
	// SessionExpiredWhileStopped: its expiry passed while the broker was
	// stopped; ended at the start.
	SessionExpiredWhileStopped
	// SessionSubscriptionRefused: it held a subscription this
	// configuration refuses; ended at the start.
	SessionSubscriptionRefused
	sessionDropCauses
)

func (c SessionDropCause) String() string {
	return labelOf(int(c), "storage_full", "expired_while_stopped", "subscription_refused")
}

// ShareDropCause is why a shared group dropped a message
// (saguin_shares_dropped_total).
type ShareDropCause int

const (
	// ShareBacklogFull: the group's backlog passed
	// limits.session_queue_bytes; the oldest went.
	ShareBacklogFull ShareDropCause = iota
	// ShareNoMemberLeft: the group's last member session ended (or none
	// came back at a start) with a backlog held.
	ShareNoMemberLeft
	// ShareExpired: broker.share.expires_after passed with no member
	// connected.
	ShareExpired
	// ShareStorageFull: the broadcast log gave up a logged message the
	// group still held to make room at a full provider (still delivered
	// while the broker runs, not after a restart).
	ShareStorageFull
	// ShareMemberEnded: a QoS 2 message handed to a member whose session
	// ended before its PUBREC (never handed to another member).
	ShareMemberEnded
	// ShareNotAuthorized: the member it was handed to may no longer read
	// its topic when its sender came to write it.
	ShareNotAuthorized
	shareDropCauses
)

func (c ShareDropCause) String() string {
	return labelOf(int(c), "backlog_full", "no_member_left", "expired", "storage_full", "member_ended", "not_authorized")
}

// SessionDeliveryDropCause is why a delivery owed to a session was dropped
// (saguin_session_deliveries_dropped_total).
type SessionDeliveryDropCause int

const (
	// DeliveryStorageFull: the durable copy of a message owed to a session
	// that outlives its connection could not be kept (the broadcast log
	// refused it, or gave it up to a full provider): still delivered
	// while the broker runs, not after a restart.
	DeliveryStorageFull SessionDeliveryDropCause = iota
	// DeliverySessionQueueFull: limits.session_queue_bytes reached; the
	// oldest waiting QoS 1/2 delivery went.
	DeliverySessionQueueFull
	// DeliveryNoSharedMember: a shared group had no member to take it and
	// none whose session outlives its connection.
	DeliveryNoSharedMember
	// DeliveryPacketIDsExhausted: no packet identifier was free.
	DeliveryPacketIDsExhausted
	// DeliveryTooLarge: over the subscriber's Maximum Packet Size.
	DeliveryTooLarge
	sessionDeliveryDropCauses
)

func (c SessionDeliveryDropCause) String() string {
	return labelOf(int(c), "storage_full", "session_queue_full", "no_shared_member", "packet_ids_exhausted", "too_large")
}

// What closed a provider's publish transaction (saguin_storage_commits_total).
const (
	closedByRecords   = "records"
	closedByInterval  = "interval"
	closedByCommit    = "commit"
	closedByUnbatched = "unbatched"
)

// The protocol label of saguin_connections_by_protocol.
const (
	protocolV5   = "5"
	protocolV311 = "3.1.1"
)
