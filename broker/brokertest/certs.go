package brokertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// PKI is a certificate authority made for one test with crypto/x509: its
// certificates are written as PEM files into the test's directory and
// never kept anywhere else.
type PKI struct {
	t      testing.TB
	dir    string
	name   string
	key    *ecdsa.PrivateKey
	cert   *x509.Certificate
	CAFile string // the CA certificate, PEM
	serial atomic.Int64
}

// NewPKI makes a CA named name whose files go in dir.
func NewPKI(t testing.TB, dir, name string) *PKI {
	t.Helper()
	p := &PKI{t: t, dir: dir, name: name, key: newKey(t)}
	p.serial.Store(time.Now().UnixNano() & 0xFFFFFFFF)
	tmpl := &x509.Certificate{
		SerialNumber:          p.nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	if p.cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.CAFile = p.write(name+"-ca.pem", "CERTIFICATE", der)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *PKI) nextSerial() *big.Int { return big.NewInt(p.serial.Add(1)) }

func (p *PKI) write(name, typ string, der []byte) string {
	p.t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// Issued is a certificate the PKI issued and its key, as PEM files.
type Issued struct {
	CertFile, KeyFile string
	Serial            *big.Int
	Cert              *x509.Certificate
}

// TLSCertificate is the certificate and key for a Go client or server.
func (i Issued) TLSCertificate(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(i.CertFile, i.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Server issues a server certificate for localhost and 127.0.0.1, its
// files named after file.
func (p *PKI) Server(file string) Issued {
	p.t.Helper()
	return p.issue(file, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// Client issues a client certificate with Common Name cn ("" for none)
// and DNS names dns, its files named after file.
func (p *PKI) Client(file, cn string, dns ...string) Issued {
	p.t.Helper()
	return p.issue(file, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *PKI) issue(file string, tmpl *x509.Certificate) Issued {
	p.t.Helper()
	key := newKey(p.t)
	tmpl.SerialNumber = p.nextSerial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		p.t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return Issued{CertFile: p.write(file+".pem", "CERTIFICATE", der), KeyFile: p.write(file+"-key.pem", "PRIVATE KEY", keyDER),
		Serial: tmpl.SerialNumber, Cert: cert}
}

// Pool is a pool holding the CA, for a client verifying a server.
func (p *PKI) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.cert)
	return pool
}
