package door_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"

	"saguin.dev/broker/brokertest"
	"saguin.dev/broker/internal/door"
)

var (
	client4 = netip.MustParseAddrPort("203.0.113.7:51515")
	proxy4  = netip.MustParseAddrPort("192.0.2.1:8883")
	client6 = netip.MustParseAddrPort("[2001:db8::7]:40000")
	proxy6  = netip.MustParseAddrPort("[2001:db8::1]:8883")
)

// A header with an SSL TLV whose flags say TLS and a certificate, and whose
// verify result is 0, gives the client's address and its CN; the bytes
// after the header are left for the protocol.
func TestProxyHeaderGivesTheVerifiedCN(t *testing.T) {
	for _, c := range []struct{ src, dst netip.AddrPort }{{client4, proxy4}, {client6, proxy6}} {
		hdr := brokertest.ProxyV2(c.src, c.dst, &brokertest.ProxySSL{Client: 0x01 | 0x02, Verify: 0, CN: "gateway-7"})
		r := bytes.NewReader(append(hdr, 0x10, 0x0C))
		h, err := door.ReadProxyHeader(r)
		if err != nil {
			t.Fatal(err)
		}
		if h.Local || h.Source.String() != net.TCPAddrFromAddrPort(c.src).String() {
			t.Errorf("source %v (local %v), want %v", h.Source, h.Local, c.src)
		}
		if h.SSL == nil || !h.SSL.Verified() || h.SSL.CN != "gateway-7" || h.SSL.Version != "TLSv1.3" {
			t.Errorf("SSL TLV %+v, want a verified gateway-7", h.SSL)
		}
		if rest, _ := io.ReadAll(r); !bytes.Equal(rest, []byte{0x10, 0x0C}) {
			t.Errorf("the header reader took the client's bytes: %d left", len(rest))
		}
	}
}

// The CN is believed only with TLS, a certificate and verify 0: each one
// missing leaves the name unbelieved.
func TestProxyHeaderCNBelievedOnlyWhenVerified(t *testing.T) {
	for _, c := range []struct {
		name      string
		ssl       brokertest.ProxySSL
		presented bool
		verified  bool
	}{
		{"verified on this connection", brokertest.ProxySSL{Client: 0x03, CN: "a"}, true, true},
		{"verified on the resumed session", brokertest.ProxySSL{Client: 0x05, CN: "a"}, true, true},
		{"verify failed", brokertest.ProxySSL{Client: 0x03, Verify: 20, CN: "a"}, true, false},
		{"no certificate", brokertest.ProxySSL{Client: 0x01, CN: "a"}, false, false},
		{"not TLS", brokertest.ProxySSL{Client: 0x02, CN: "a"}, false, false},
	} {
		h, err := door.ReadProxyHeader(bytes.NewReader(brokertest.ProxyV2(client4, proxy4, &c.ssl)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if h.SSL.Presented() != c.presented || h.SSL.Verified() != c.verified {
			t.Errorf("%s: presented %v verified %v, want %v %v", c.name, h.SSL.Presented(), h.SSL.Verified(), c.presented, c.verified)
		}
	}
}

// What is not a v2 header is refused as soon as its first bytes show it:
// an MQTT CONNECT (the client skipped the proxy), a v1 text header
// (refused by name), a LOCAL header is accepted with no address, and a
// length past the bound or cut short fails.
func TestProxyHeaderRefusals(t *testing.T) {
	stalled := func(b []byte) io.Reader { return io.MultiReader(bytes.NewReader(b), blockReader{}) }
	if _, err := door.ReadProxyHeader(stalled([]byte{0x10, 0x0C, 0, 4, 'M', 'Q'})); !errors.Is(err, door.ErrNoProxyHeader) {
		t.Errorf("an MQTT CONNECT: %v, want ErrNoProxyHeader", err)
	}
	if _, err := door.ReadProxyHeader(stalled([]byte("PROXY TCP4 1.2.3.4"))); !errors.Is(err, door.ErrProxyV1) {
		t.Errorf("a v1 header: %v, want ErrProxyV1", err)
	}
	h, err := door.ReadProxyHeader(bytes.NewReader(brokertest.ProxyV2Local()))
	if err != nil || !h.Local || h.Source != nil {
		t.Errorf("LOCAL: %+v %v", h, err)
	}
	big := brokertest.ProxyV2(client4, proxy4, &brokertest.ProxySSL{Client: 3, CN: strings.Repeat("x", door.MaxProxyHeader)})
	if _, err := door.ReadProxyHeader(stalled(big[:16])); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("a header past MaxProxyHeader: %v", err)
	}
	whole := brokertest.ProxyV2(client4, proxy4, &brokertest.ProxySSL{Client: 3, CN: "a"})
	if _, err := door.ReadProxyHeader(bytes.NewReader(whole[:len(whole)-1])); err == nil {
		t.Error("a header cut short was read")
	}
	bad := append([]byte(nil), whole...)
	bad[len(bad)-2] = 0xFF // the CN sub-TLV's length past the SSL TLV's end
	bad[len(bad)-3] = 0xFF
	if _, err := door.ReadProxyHeader(bytes.NewReader(bad)); err == nil {
		t.Error("a TLV longer than its header was read")
	}
}

// blockReader never returns: a client that stopped sending. A reader that
// waited for more would hang the test.
type blockReader struct{}

func (blockReader) Read([]byte) (int, error) { select {} }

// FuzzReadProxyHeader feeds arbitrary bytes to the header reader: it
// never panics, never reads past what the header's length says, and a
// header it accepts has a CN only inside an SSL TLV.
func FuzzReadProxyHeader(f *testing.F) {
	f.Add(brokertest.ProxyV2(client4, proxy4, &brokertest.ProxySSL{Client: 3, CN: "gateway"}))
	f.Add(brokertest.ProxyV2(client6, proxy6, nil))
	f.Add(brokertest.ProxyV2Local())
	f.Add([]byte("PROXY TCP4 203.0.113.7 192.0.2.1 51515 8883\r\n"))
	f.Add([]byte{0x10, 0x0C, 0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 60, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		h, err := door.ReadProxyHeader(r)
		if err != nil {
			return
		}
		used := len(b) - r.Len()
		if used < 16 || used > 16+door.MaxProxyHeader {
			t.Fatalf("an accepted header of %d bytes", used)
		}
		if h.Local && h.Source != nil {
			t.Fatal("a LOCAL header gave a client address")
		}
	})
}
