package config

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
)

// maxPEMFile bounds how much of a certificate, key or CA file is read
// (invariant 13); a real bundle is a few KiB.
const maxPEMFile = 1 << 20

// tlsBlock reads a door's tls: block (docs/configuration.md "`broker.mqtt`"). Every named file is
// opened and parsed now, all of them, so a bad certificate stops the broker
// before any port opens and every bad file is reported at once.
func (l *loader) tlsBlock(v val, doorID string) *TLS {
	t := &TLS{MinVersion: tls.VersionTLS12}
	m, ok := l.mapOf(v)
	if !ok {
		return t
	}
	var certV, keyV val
	certOK, keyOK := false, false
	if kv, has := m.get("cert_file"); has {
		if s, good := l.absPath(kv, "the PEM certificate (leaf first, then its chain, without the root)"); good {
			t.CertFile, certV, certOK = s, kv, true
		}
	} else {
		m.missing("cert_file", "a tls block needs cert_file and key_file (absolute paths to PEM files)")
	}
	if kv, has := m.get("key_file"); has {
		if s, good := l.absPath(kv, "the PEM private key"); good {
			t.KeyFile, keyV, keyOK = s, kv, true
		}
	} else {
		m.missing("key_file", "a tls block needs cert_file and key_file (absolute paths to PEM files)")
	}
	if kv, has := m.get("client_ca_file"); has {
		if s, good := l.absPath(kv, "the PEM CA bundle client certificates are verified against"); good {
			t.ClientCAFile = s
			l.checkCAFile(kv, s, doorID)
			t.RequireCertificate = true
		}
	}
	if kv, has := m.get("require_certificate"); has {
		if b, good := l.boolean(kv); good {
			if !m.has("client_ca_file") {
				l.add(kv, "require_certificate needs tls.client_ca_file to verify certificates against; add client_ca_file, or remove require_certificate")
			} else {
				t.RequireCertificate = b
			}
		}
	}
	if kv, has := m.get("min_version"); has {
		if s, good := l.scalar(kv, `"1.2" or "1.3"`); good {
			switch s {
			case "1.2":
				t.MinVersion = tls.VersionTLS12
			case "1.3":
				t.MinVersion = tls.VersionTLS13
			default:
				l.add(kv, `it is "1.2" (the default) or "1.3"; nothing below TLS 1.2 is offered`)
			}
		}
	}
	m.finish("cert_file", "key_file", "client_ca_file", "require_certificate", "min_version")
	if certOK && keyOK {
		l.checkKeyPair(certV, keyV, t.CertFile, t.KeyFile, doorID)
	}
	return t
}

func (l *loader) readPEM(v val, path, doorID, what string) ([]byte, bool) {
	f, err := os.Open(path)
	if err != nil {
		l.add(v, "%s cannot open its %s: %v", doorID, what, unwrapPath(err))
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		l.add(v, "%s cannot read its %s: %v", doorID, what, unwrapPath(err))
		return nil, false
	}
	if len(data) > maxPEMFile {
		l.add(v, "%s: the %s is larger than %s; it is not a PEM file", doorID, what, FormatBytes(maxPEMFile))
		return nil, false
	}
	return data, true
}

func (l *loader) checkKeyPair(certV, keyV val, certPath, keyPath, doorID string) {
	cert, okC := l.readPEM(certV, certPath, doorID, "certificate")
	key, okK := l.readPEM(keyV, keyPath, doorID, "private key")
	if !okC || !okK {
		return
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		l.add(certV, "%s: the certificate and key do not load as a pair: %v", doorID, err)
	}
}

func (l *loader) checkCAFile(v val, path, doorID string) {
	data, ok := l.readPEM(v, path, doorID, "client CA bundle")
	if !ok {
		return
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		l.add(v, "%s: the client CA file holds no PEM certificate", doorID)
	}
}
