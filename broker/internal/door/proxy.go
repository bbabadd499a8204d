package door

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
)

// The PROXY protocol, version 2 (the binary header a proxy such as HAProxy
// sends before the client's bytes): what a unix door with proxy_protocol
// reads (docs/configuration.md "`broker.mqtt`"). Only version 2 is read: version 1 is text and
// carries no certificate.

// MaxProxyHeader bounds the part of a header after its 16 fixed bytes (its
// length field): the addresses take at most 216 bytes and a proxy's TLVs a
// few hundred more; a longer header is refused before it is read.
const MaxProxyHeader = 4096

// proxySignature opens every version 2 header.
var proxySignature = []byte("\r\n\r\n\x00\r\nQUIT\n")

// proxyV1 opens a version 1 header (nginx's proxy_protocol on).
var proxyV1 = []byte("PROXY ")

var (
	// ErrProxyV1 is a version 1 header: refused, naming the setting.
	ErrProxyV1 = errors.New("a PROXY protocol version 1 header (text); proxy_protocol reads version 2 only: have the proxy send v2 (HAProxy send-proxy-v2)")
	// ErrNoProxyHeader is a connection whose first bytes are not a header.
	ErrNoProxyHeader = errors.New("no PROXY protocol header: proxy_protocol is set, so every connection must come through the proxy")
)

// The SSL TLV (type 0x20) and what it carries.
const (
	tlvSSL           = 0x20
	tlvSSLVersion    = 0x21
	tlvSSLCN         = 0x22
	sslClientSSL     = 0x01 // the client connected over TLS
	sslClientCert    = 0x02 // it presented a certificate on this connection
	sslClientCertSes = 0x04 // it presented one on the TLS session this connection resumed
)

// ProxyHeader is what a version 2 header says about the connection.
type ProxyHeader struct {
	// Local: the proxy's own connection (a health check), not a client's;
	// it carries no address.
	Local bool
	// Source is the client's address (nil when the header gives none:
	// LOCAL, or an unspecified family).
	Source net.Addr
	// SSL is the SSL TLV, nil when the header has none.
	SSL *ProxySSL
}

// ProxySSL is a header's SSL TLV: how the client reached the proxy.
type ProxySSL struct {
	Client byte   // the PP2_CLIENT_* flags
	Verify uint32 // 0: the client's certificate was verified
	// Version is the TLS version's name ("TLSv1.3"), CN the client
	// certificate's Common Name, as the proxy sent them.
	Version string
	CN      string
}

// Presented reports whether the client presented a certificate to the
// proxy, on this connection or on the TLS session it resumed.
func (s *ProxySSL) Presented() bool {
	return s.Client&sslClientSSL != 0 && s.Client&(sslClientCert|sslClientCertSes) != 0
}

// Verified reports whether the proxy verified the certificate the client
// presented: only then is its CN believed (docs/configuration.md "`broker.mqtt`").
func (s *ProxySSL) Verified() bool { return s.Presented() && s.Verify == 0 }

// ReadProxyHeader reads one version 2 header from r and nothing after it.
// A connection that does not begin with one is refused as soon as its
// first bytes show it (ErrNoProxyHeader, ErrProxyV1), without waiting for
// more.
func ReadProxyHeader(r io.Reader) (*ProxyHeader, error) {
	var fixed [16]byte
	got := 0
	for got < len(fixed) {
		n, err := r.Read(fixed[got:])
		got += n
		if got >= len(proxyV1) && bytes.HasPrefix(fixed[:got], proxyV1) {
			return nil, ErrProxyV1
		}
		if !bytes.HasPrefix(proxySignature, fixed[:min(got, len(proxySignature))]) {
			return nil, ErrNoProxyHeader
		}
		if err != nil && got < len(fixed) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("reading the PROXY header: %w", err)
		}
	}
	version, command := fixed[12]>>4, fixed[12]&0x0F
	if version != 2 {
		return nil, fmt.Errorf("PROXY header version %d; only 2 is read", version)
	}
	if command > 1 {
		return nil, fmt.Errorf("PROXY header command %d; it is 0 (LOCAL) or 1 (PROXY)", command)
	}
	length := int(binary.BigEndian.Uint16(fixed[14:16]))
	// invariant 13: the header's length is judged before its bytes are read.
	if length > MaxProxyHeader {
		return nil, fmt.Errorf("PROXY header of %d bytes past its fixed part; at most %d are read", length, MaxProxyHeader)
	}
	rest := make([]byte, length)
	if _, err := io.ReadFull(r, rest); err != nil {
		return nil, fmt.Errorf("reading the PROXY header: %w", err)
	}
	return parseProxyBody(command == 0, fixed[13], rest)
}

// parseProxyBody reads the addresses and TLVs after the fixed part.
func parseProxyBody(local bool, family byte, body []byte) (*ProxyHeader, error) {
	h := &ProxyHeader{Local: local}
	var addrLen int
	switch family >> 4 {
	case 0: // AF_UNSPEC: no address
	case 1:
		addrLen = 12
	case 2:
		addrLen = 36
	case 3:
		addrLen = 216
	default:
		return nil, fmt.Errorf("PROXY header address family %d is not one of the protocol's", family>>4)
	}
	if len(body) < addrLen {
		return nil, fmt.Errorf("PROXY header of %d bytes is too short for its %d bytes of addresses", len(body), addrLen)
	}
	if !local {
		h.Source = proxySource(family, body[:addrLen])
	}
	tlvs := body[addrLen:]
	for len(tlvs) > 0 {
		typ, value, next, err := nextTLV(tlvs)
		if err != nil {
			return nil, err
		}
		tlvs = next
		if typ != tlvSSL {
			continue
		}
		ssl, err := parseSSLTLV(value)
		if err != nil {
			return nil, err
		}
		h.SSL = ssl
	}
	return h, nil
}

// proxySource is the client's address in a header's address block.
func proxySource(family byte, a []byte) net.Addr {
	stream := family&0x0F != 2 // DGRAM: 2; UNSPEC and STREAM are read as stream
	switch family >> 4 {
	case 1, 2:
		n := 4
		if family>>4 == 2 {
			n = 16
		}
		ip, _ := netip.AddrFromSlice(a[:n])
		port := binary.BigEndian.Uint16(a[2*n:])
		ap := netip.AddrPortFrom(ip, port)
		if !stream {
			return net.UDPAddrFromAddrPort(ap)
		}
		return net.TCPAddrFromAddrPort(ap)
	case 3:
		name := a[:108]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		return &net.UnixAddr{Name: string(name), Net: "unix"}
	}
	return nil
}

// nextTLV splits one TLV off b.
func nextTLV(b []byte) (typ byte, value, rest []byte, err error) {
	if len(b) < 3 {
		return 0, nil, nil, fmt.Errorf("PROXY header TLV cut short: %d bytes left", len(b))
	}
	n := int(binary.BigEndian.Uint16(b[1:3]))
	if len(b) < 3+n {
		return 0, nil, nil, fmt.Errorf("PROXY header TLV 0x%02X of %d bytes has %d", b[0], n, len(b)-3)
	}
	return b[0], b[3 : 3+n], b[3+n:], nil
}

// parseSSLTLV reads the SSL TLV: client flags, verify result, sub-TLVs.
func parseSSLTLV(v []byte) (*ProxySSL, error) {
	if len(v) < 5 {
		return nil, fmt.Errorf("PROXY header SSL TLV of %d bytes; it has at least 5", len(v))
	}
	s := &ProxySSL{Client: v[0], Verify: binary.BigEndian.Uint32(v[1:5])}
	sub := v[5:]
	for len(sub) > 0 {
		typ, value, next, err := nextTLV(sub)
		if err != nil {
			return nil, err
		}
		sub = next
		switch typ {
		case tlvSSLVersion:
			s.Version = string(value)
		case tlvSSLCN:
			s.CN = string(value)
		}
	}
	return s, nil
}
