package broker

import (
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// claimTimeout bounds how long a CONNECT can hold its client id's claim
// without reaching OnSessionEstablished: the CONNACK write is bounded by
// limits.write_timeout, so past this the write has failed and the claim is
// released for it.
const claimTimeout = 15 * time.Second

// idClaims serialises, per client id, a CONNECT taking the session over and
// the teardown of an earlier connection of that id (invariant 17). The
// substrate tears a connection down by client id — it unsubscribes "the
// client" and deletes the id's entry from its table — so a teardown running
// late, after a new connection of the same id registered, would unregister
// the new one: it stays connected and is served nothing. With the claim, a
// teardown either finishes before the new connection registers, or sees the
// new connection in the table and leaves everything alone.
type idClaims struct {
	mu sync.Mutex
	m  map[string]*idClaim // bounded by concurrent CONNECTs and teardowns
}

type idClaim struct {
	sem     chan struct{}
	waiters int
	holder  *mqtt.Client
}

func (c *idClaims) acquire(id string, holder *mqtt.Client) {
	c.mu.Lock()
	if c.m == nil {
		c.m = make(map[string]*idClaim)
	}
	cl := c.m[id]
	if cl == nil {
		cl = &idClaim{sem: make(chan struct{}, 1)}
		c.m[id] = cl
	}
	cl.waiters++
	c.mu.Unlock()
	cl.sem <- struct{}{}
	c.mu.Lock()
	cl.holder = holder
	c.mu.Unlock()
}

// release gives the claim back if holder still holds it; it reports whether
// it did (a timed-out claim may already have been released).
func (c *idClaims) release(id string, holder *mqtt.Client) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.m[id]
	if cl == nil || cl.holder != holder {
		return false
	}
	cl.holder = nil
	cl.waiters--
	if cl.waiters == 0 {
		delete(c.m, id)
	}
	<-cl.sem
	return true
}

// claimForConnect takes the id's claim for a connection passing CONNECT; it
// is given back in OnSessionEstablished, after the substrate registered the
// connection and wrote the CONNACK, or after claimTimeout if that never
// comes (a failed CONNACK write ends the connection without that hook).
func (b *Broker) claimForConnect(cl *mqtt.Client) {
	b.claims.acquire(cl.ID, cl)
	time.AfterFunc(claimTimeout, func() { b.claims.release(cl.ID, cl) })
}

// teardown replaces the substrate's own end-of-connection cleanup for a
// session that ends with its connection. It runs under the id's claim and
// touches the substrate's table only while the entry is still this
// connection. It returns with the connection marked so that the substrate's
// cleanup, which follows OnDisconnect, does nothing.
func (b *Broker) teardown(cl *mqtt.Client, expire bool) {
	if !expire {
		return
	}
	b.claims.acquire(cl.ID, cl)
	defer b.claims.release(cl.ID, cl)
	if cur, ok := b.mqtt.Clients.Get(cl.ID); ok && cur == cl && !cl.IsTakenOver() {
		cl.ClearInflights()
		b.mqtt.UnsubscribeClient(cl)
		b.mqtt.Clients.Delete(cl.ID)
	}
	// The substrate decides "ends with its connection" from these two
	// fields after OnDisconnect returns; the session is ended here instead.
	if cl.Properties.ProtocolVersion == 5 {
		cl.Properties.Props.SessionExpiryInterval = 1
		cl.Properties.Props.SessionExpiryIntervalFlag = true
	} else {
		cl.Properties.Clean = false
	}
}
