package broker

import (
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// A CONNECT's claim is released by its own timeout if its CONNACK never
// comes (claimForConnect). A connection that ends within that timeout takes
// the claim again for its teardown; the CONNECT's timer firing then must not
// release the teardown's holding, or a new connection of the id registers
// in the middle of it (invariant 17).
func TestInvariant17_AClaimsTimeoutReleasesOnlyItsOwnHolding(t *testing.T) {
	var c idClaims
	cl := &mqtt.Client{ID: "device"}
	connect := c.acquire(cl.ID, cl)
	if !c.release(cl.ID, cl) {
		t.Fatal("the CONNECT's claim was not released")
	}
	teardown := c.acquire(cl.ID, cl)
	if teardown == connect {
		t.Fatalf("two holdings numbered alike (%d): a timeout cannot tell them apart", connect)
	}
	if c.releaseTurn(cl.ID, cl, connect) {
		t.Fatal("the CONNECT's timeout released the teardown's holding of the claim")
	}
	if _, held := c.held(cl); !held {
		t.Fatal("the teardown no longer holds the claim")
	}
	if !c.releaseTurn(cl.ID, cl, teardown) {
		t.Fatal("the teardown's own release was refused")
	}
}
