package routetls

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestGenerateWritesACompleteSetOnce: the CA and one certificate per node,
// keys 0600, each certificate verifying against the CA for both ends of a
// route under its node name and every host; a second run is refused, or
// left alone with keep; another CA's certificate does not verify.
func TestGenerateWritesACompleteSetOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	nodes := []string{"n1", "n2"}
	if err := Generate(dir, nodes, []string{"127.0.0.1", "nats.example"}, false); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.pem holds no certificate")
	}
	for _, f := range []string{CAKeyFile, KeyFile("n1"), KeyFile("n2")} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", f, err, st.Mode())
		}
	}
	for _, n := range nodes {
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile(n)), filepath.Join(dir, KeyFile(n)))
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{n, "127.0.0.1", "nats.example"} {
			for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
					t.Errorf("%s as %s for %v: %v", n, name, usage, err)
				}
			}
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "elsewhere.example"}); err == nil {
			t.Errorf("%s verifies for a name it was not given", n)
		}
	}
	if err := Generate(dir, nodes, nil, false); !errors.Is(err, ErrExists) {
		t.Fatalf("a second run: %v, want ErrExists", err)
	}
	if err := Generate(dir, nodes, nil, true); err != nil {
		t.Fatalf("a second run with keep: %v", err)
	}
	if err := Generate(dir, []string{"n3"}, nil, true); err == nil {
		t.Fatal("keep with a node the set lacks: nil error")
	}
	other, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := other.Issue("n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(c)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "n1"}); err == nil {
		t.Error("another CA's certificate verifies against this CA")
	}
	for _, bad := range []string{"", "ca", "a/b", ".."} {
		if err := Generate(t.TempDir(), []string{bad}, nil, false); err == nil {
			t.Errorf("node name %q accepted", bad)
		}
	}
}
