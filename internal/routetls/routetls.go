// Package routetls generates what the nats-server nodes of a deployment
// authenticate their routes with: a private certificate authority and, per
// node, a certificate and key it presents both as a route server and as a
// route client (mutual TLS). Nothing of it ships in deploy/: every
// deployment generates its own at set-up (`brood route-tls`;
// docs/security.md, "No usable shared secret ships").
package routetls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Validity is how long the generated certificates are valid: 5 years.
const Validity = 5 * 365 * 24 * time.Hour

// File names in a route TLS directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// CertFile and KeyFile are the names of node's certificate and key.
func CertFile(node string) string { return node + ".pem" }

// KeyFile is the name of node's key file.
func KeyFile(node string) string { return node + "-key.pem" }

// CA is a route certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	der  []byte
}

// NewCA makes a fresh CA (ECDSA P-256) valid for Validity.
func NewCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"Brood"}, CommonName: "Brood NATS route CA " + serial.Text(16)[:8]},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, der: der}, nil
}

// Issue returns the PEM certificate and key of node, signed by ca, for both
// server and client authentication, naming node and every host (an IP
// address or a DNS name) as its subject alternative names.
func (ca *CA) Issue(node string, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"Brood"}, CommonName: node},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range append([]string{node}, hosts...) {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// CertPEM is the CA's certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// KeyPEM is the CA's key, PEM-encoded.
func (ca *CA) KeyPEM() ([]byte, error) {
	kder, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// ErrExists is returned by Generate when dir already holds a CA.
var ErrExists = errors.New("the directory already holds a route CA")

// Generate writes a fresh CA (CAFile, and CAKeyFile to issue more nodes
// later) and, for each node, CertFile(node) and KeyFile(node) naming node
// and hosts, into dir (created 0700; keys 0600, certificates 0644). A dir
// that already holds CAFile is left alone: ErrExists, unless every file is
// there and keep is set, then nil (a set-up step run again).
func Generate(dir string, nodes, hosts []string, keep bool) error {
	if len(nodes) == 0 {
		return errors.New("name at least one node")
	}
	for _, n := range nodes {
		if n == "" || strings.ContainsAny(n, `/\`) || n == "." || n == ".." || n == "ca" {
			return fmt.Errorf("node name %q must be a file name other than ca", n)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, CAFile)); err == nil {
		if !keep {
			return fmt.Errorf("%s: %w (remove it to generate new ones)", dir, ErrExists)
		}
		for _, n := range nodes {
			for _, f := range []string{CertFile(n), KeyFile(n)} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					return fmt.Errorf("%s holds a route CA but not %s: %w", dir, f, err)
				}
			}
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := NewCA()
	if err != nil {
		return err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	files := []genFile{{CAKeyFile, caKey, 0o600}}
	for _, n := range nodes {
		c, k, err := ca.Issue(n, hosts)
		if err != nil {
			return err
		}
		files = append(files, genFile{KeyFile(n), k, 0o600}, genFile{CertFile(n), c, 0o644})
	}
	// The CA's certificate last: its presence says the set is complete.
	files = append(files, genFile{CAFile, ca.CertPEM(), 0o644})
	for _, f := range files {
		if err := writeNew(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// genFile is one file Generate writes.
type genFile struct {
	name string
	data []byte
	mode os.FileMode
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}
