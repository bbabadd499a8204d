package broker

// SetDeliveryPermit stands in for the permission every delivery asks
// (deliveries.go permit) with f, which decides for a client id, a route
// (append, latest, queue, broadcast, shared, retained) and a topic; nil
// gives the decision back to the acl hook. Each call wakes every delivery a
// refusal stalled, as a grant changing while the broker runs must.
func (b *Broker) SetDeliveryPermit(f func(clientID, route, topic string) bool) {
	if f == nil {
		b.permitTest.Store(nil)
	} else {
		b.permitTest.Store(&f)
	}
	b.permissionsChanged()
}

// StoredPosition stores every session's positions now and returns the one
// the client holds on an append channel.
func (b *Broker) StoredPosition(channel, clientID string) (uint64, bool) {
	b.flushPositions(true)
	ch := b.channels[channel]
	if ch == nil || ch.log == nil {
		return 0, false
	}
	p, ok, err := ch.log.Position("mqtt:" + clientID)
	if err != nil || !ok {
		return 0, false
	}
	return p.Offset, true
}

// AuthPenaltyAddresses is how many addresses have failed authentication
// recently (authpenalty.go).
func (b *Broker) AuthPenaltyAddresses() int { return b.penalties.size() }
