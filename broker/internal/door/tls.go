package door

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"saguin.dev/broker/config"
)

// MaxPEMFile bounds what is read of a certificate, key or CA file
// (invariant 13): a real bundle is a few KiB.
const MaxPEMFile = 1 << 20

// MaxClientChain bounds the certificates a client's chain may hold; a
// longer one fails the handshake before any of it is verified. (Its bytes
// are bounded by crypto/tls, which refuses a handshake message past its
// own limit before parsing it.)
const MaxClientChain = 8

// Certificates are a TLS door's certificate, key and client CA: what each
// new connection is served. A reload replaces them whole (Load, then
// Apply), and a connection keeps what it was served at its accept.
type Certificates struct {
	door  string // the door's id, for errors: broker.mqtt.listen.tcp[fleet]
	files config.TLS
	cur   atomic.Pointer[Loaded]
}

// Loaded is one reading of a door's TLS files, ready to serve.
type Loaded struct {
	cfg  *tls.Config
	held Held
}

// Held says what a TLS door serves (the lines a start and a reload log).
type Held struct {
	NotAfter time.Time // the leaf certificate's expiry
	Serial   string    // the leaf's serial number, hex
	// ClientCA is the client CA file and how many certificates it holds,
	// or "none" when client certificates are not asked for.
	ClientCA string
	// ClientCertificates is "required", "accepted" (verified when given)
	// or "none".
	ClientCertificates string
}

// LoadCertificates reads a door's tls block's files (docs/configuration.md "`broker.mqtt`"): an
// error names the door and the file at fault.
func LoadCertificates(doorID string, files config.TLS) (*Certificates, error) {
	c := &Certificates{door: doorID, files: files}
	l, err := c.Load()
	if err != nil {
		return nil, err
	}
	c.cur.Store(l)
	return c, nil
}

// Door is the id of the door these certificates serve.
func (c *Certificates) Door() string { return c.door }

// Files are the door's tls block, as read at start.
func (c *Certificates) Files() config.TLS { return c.files }

// Load reads the door's files again without serving them: a reload's
// first half (docs/operations.md "Signals" item 4: all doors are read before any is
// changed).
func (c *Certificates) Load() (*Loaded, error) {
	certPEM, err := readPEM(c.files.CertFile)
	if err != nil {
		return nil, c.fileError("cert_file", c.files.CertFile, err)
	}
	leaf, err := firstCertificate(certPEM)
	if err != nil {
		return nil, c.fileError("cert_file", c.files.CertFile, err)
	}
	keyPEM, err := readPEM(c.files.KeyFile)
	if err != nil {
		return nil, c.fileError("key_file", c.files.KeyFile, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The certificate parsed above, so the key is what is wrong:
		// unreadable, or not the leaf's.
		return nil, c.fileError("key_file", c.files.KeyFile,
			fmt.Errorf("%v (it must hold the private key of the first certificate in %s)", err, c.files.CertFile))
	}
	cfg := &tls.Config{MinVersion: c.files.MinVersion, Certificates: []tls.Certificate{pair}}
	held := Held{NotAfter: leaf.NotAfter, Serial: leaf.SerialNumber.Text(16), ClientCA: "none", ClientCertificates: "none"}
	if c.files.ClientCAFile != "" {
		caPEM, err := readPEM(c.files.ClientCAFile)
		if err != nil {
			return nil, c.fileError("client_ca_file", c.files.ClientCAFile, err)
		}
		pool, n, err := certPool(caPEM)
		if err != nil {
			return nil, c.fileError("client_ca_file", c.files.ClientCAFile, err)
		}
		// docs/security.md "1. Certificates": with a client CA, a certificate is asked for;
		// required unless require_certificate is false, and verified when
		// given either way. The verification is ours (VerifyConnection),
		// so that the chain's length is bounded before it is verified.
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequestClientCert
		held.ClientCertificates = "accepted"
		if c.files.RequireCertificate {
			cfg.ClientAuth = tls.RequireAnyClientCert
			held.ClientCertificates = "required"
		}
		cfg.VerifyConnection = verifyClientChain(pool)
		held.ClientCA = fmt.Sprintf("%s (%d certificates)", c.files.ClientCAFile, n)
	}
	return &Loaded{cfg: cfg, held: held}, nil
}

// Apply serves l to every connection accepted from now on.
func (c *Certificates) Apply(l *Loaded) { c.cur.Store(l) }

// Held is what the door serves now.
func (c *Certificates) Held() Held { return c.cur.Load().held }

// Held is what l would serve.
func (l *Loaded) Held() Held { return l.held }

// serverConfig is the configuration a connection accepted now is served.
func (c *Certificates) serverConfig() *tls.Config { return c.cur.Load().cfg }

func (c *Certificates) fileError(key, path string, err error) error {
	return fmt.Errorf("%s: tls.%s %s: %w", c.door, key, path, err)
}

// readPEM reads at most MaxPEMFile bytes of path.
func readPEM(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, unwrapPath(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPEMFile+1))
	if err != nil {
		return nil, unwrapPath(err)
	}
	if len(data) > MaxPEMFile {
		return nil, fmt.Errorf("larger than %d bytes; it is not a PEM file", MaxPEMFile)
	}
	return data, nil
}

// unwrapPath drops the path an *fs.PathError repeats: the caller names it.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// firstCertificate parses the first certificate of a PEM file: the leaf.
func firstCertificate(data []byte) (*x509.Certificate, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("holds no PEM certificate; it is the server's certificate, leaf first, then its chain")
		}
		if b.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("its first certificate does not parse: %v", err)
			}
			return c, nil
		}
	}
}

// certPool reads every certificate of a CA bundle.
func certPool(data []byte) (*x509.CertPool, int, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, 0, fmt.Errorf("certificate %d does not parse: %v", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, 0, errors.New("holds no PEM certificate; it is the CA bundle client certificates are verified against")
	}
	return pool, n, nil
}

// verifyClientChain verifies a client's certificate against roots, as
// crypto/tls would with RequireAndVerifyClientCert, after checking the
// chain's length (MaxClientChain). No certificate passes: whether one is
// required is the ClientAuth's to say. No revocation is checked (docs/security.md "1. Certificates").
func verifyClientChain(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		certs := cs.PeerCertificates
		if len(certs) == 0 {
			return nil
		}
		// invariant 13: the chain is counted before any of it is verified.
		if len(certs) > MaxClientChain {
			return fmt.Errorf("the client's certificate chain holds %d certificates; at most %d are accepted", len(certs), MaxClientChain)
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err
	}
}

// CertificateName is the name a client certificate gives (docs/security.md "1. Certificates"): its Common Name, else its first DNS name; "" names nobody. It is
// returned as presented: refusing control characters is the caller's.
func CertificateName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return ""
}
