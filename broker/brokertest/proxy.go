package brokertest

import (
	"encoding/binary"
	"net/netip"
)

// ProxySSL is the SSL TLV a test's PROXY v2 header carries.
type ProxySSL struct {
	Client byte   // PP2_CLIENT_* flags: 0x01 TLS, 0x02 certificate on this connection, 0x04 on the session
	Verify uint32 // 0: the proxy verified the client's certificate
	CN     string // "" sends no CN sub-TLV
}

// ProxyV2 encodes a PROXY protocol v2 header, as a proxy sends it before
// the client's bytes: command PROXY, TCP over IPv4 or IPv6 from src to
// dst, and the SSL TLV when ssl is not nil.
func ProxyV2(src, dst netip.AddrPort, ssl *ProxySSL) []byte {
	var body []byte
	family := byte(0x11) // AF_INET, STREAM
	if src.Addr().Is6() {
		family = 0x21 // AF_INET6, STREAM
	}
	body = append(body, src.Addr().AsSlice()...)
	body = append(body, dst.Addr().AsSlice()...)
	body = binary.BigEndian.AppendUint16(body, src.Port())
	body = binary.BigEndian.AppendUint16(body, dst.Port())
	if ssl != nil {
		v := []byte{ssl.Client}
		v = binary.BigEndian.AppendUint32(v, ssl.Verify)
		v = appendTLV(v, 0x21, []byte("TLSv1.3"))
		if ssl.CN != "" {
			v = appendTLV(v, 0x22, []byte(ssl.CN))
		}
		body = appendTLV(body, 0x20, v)
	}
	return proxyV2Frame(0x21, family, body)
}

// ProxyV2Local is a v2 header with command LOCAL: the proxy's own
// connection (a health check).
func ProxyV2Local() []byte { return proxyV2Frame(0x20, 0x00, nil) }

func proxyV2Frame(versionCommand, family byte, body []byte) []byte {
	h := []byte("\r\n\r\n\x00\r\nQUIT\n")
	h = append(h, versionCommand, family)
	h = binary.BigEndian.AppendUint16(h, uint16(len(body)))
	return append(h, body...)
}

func appendTLV(b []byte, typ byte, v []byte) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}
