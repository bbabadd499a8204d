package broker

// fanoutCounts are fan-out's drop counters (fanout.go), copied: what the
// metric catalogue reads of broadcast delivery, as a plain value the
// snapshot formats with nothing of fan-out's held (rfcs/metrics.md "Where
// each number comes from"; rfcs/delivery-seam.md "The session behind
// methods").
type fanoutCounts struct {
	droppedQoS0, queueFull, noMember, expired, tooLarge, memberEnded int64
	shareFull, shareExpire, logFailed, logStorageFull, noneLeft      int64
	shareNotAuthorized, shareStorageFull                             int64
}

// counts loads each drop counter once. They are atomics, so it takes no
// lock, fanout.mu included.
func (f *fanout) counts() fanoutCounts {
	return fanoutCounts{
		droppedQoS0:        f.droppedQoS0.Load(),
		queueFull:          f.queueFull.Load(),
		noMember:           f.noMember.Load(),
		expired:            f.expired.Load(),
		tooLarge:           f.tooLarge.Load(),
		memberEnded:        f.memberEnded.Load(),
		shareFull:          f.shareFull.Load(),
		shareExpire:        f.shareExpire.Load(),
		logFailed:          f.logFailed.Load(),
		logStorageFull:     f.logStorageFull.Load(),
		noneLeft:           f.noneLeft.Load(),
		shareNotAuthorized: f.shareNotAuthorized.Load(),
		shareStorageFull:   f.shareStorageFull.Load(),
	}
}
