package broker

// PeerView is what a connection's door knew of its client (peerIdentity),
// for tests outside the package.
type PeerView struct {
	Door         string // the door's name (listener=)
	Name, From   string
	Certificate  bool
	Proxied      bool
	VerifyResult uint32
	Client       string // the client's address ("" when none is known)
}

// PeerOf is the identity of the client connected as id; false when no such
// client is connected.
func PeerOf(b *Broker, id string) (PeerView, bool) {
	cl, ok := b.mqtt.Clients.Get(id)
	if !ok || cl.Closed() {
		return PeerView{}, false
	}
	cc, ok := cl.Net.Conn.(*clientConn)
	if !ok {
		return PeerView{}, false
	}
	p := cc.peer()
	v := PeerView{Name: p.name, From: p.from, Certificate: p.certificate, Proxied: p.proxied, VerifyResult: p.verifyResult}
	if p.door != nil {
		v.Door = p.door.Name
	}
	if p.client != nil {
		v.Client = p.client.String()
	}
	return v, true
}
