package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/brood-dev/brood/internal/routetls"
)

// The node configs authenticate routes by certificate (mutual TLS) with
// files `brood route-tls` generates at set-up (docs/security.md, "No usable
// shared secret ships"), so none ships in deploy/. The tests generate them
// once per test binary with one CA, as `brood route-tls` would, and run each
// config that names them with its paths moved there.

// testRouteTLS is the test binary's route TLS directory.
var testRouteTLS struct {
	once   sync.Once
	mu     sync.Mutex
	dir    string
	ca     *routetls.CA
	err    error
	issued map[string]bool
}

// routeTLSHosts are the hosts every test node certificate names: the tests
// run every node on loopback.
var routeTLSHosts = []string{"127.0.0.1", "::1", "localhost"}

// routeTLSDir returns the directory holding the test CA and, for each name,
// its node certificate and key (routetls.CertFile, routetls.KeyFile).
func routeTLSDir(t testing.TB, nodes ...string) string {
	t.Helper()
	r := &testRouteTLS
	r.once.Do(func() {
		if r.dir, r.err = os.MkdirTemp("", "brood-deploy-route-tls-"); r.err != nil {
			return
		}
		if r.ca, r.err = routetls.NewCA(); r.err != nil {
			return
		}
		r.err = os.WriteFile(filepath.Join(r.dir, routetls.CAFile), r.ca.CertPEM(), 0o644)
		r.issued = map[string]bool{}
	})
	if r.err != nil {
		t.Fatalf("the test route CA: %v", r.err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range nodes {
		if r.issued[n] {
			continue
		}
		c, k, err := r.ca.Issue(n, routeTLSHosts)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, routetls.CertFile(n)), c, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, routetls.KeyFile(n)), k, 0o600); err != nil {
			t.Fatal(err)
		}
		r.issued[n] = true
	}
	return r.dir
}

// removeRouteTLS removes the test binary's route TLS directory (TestMain).
func removeRouteTLS() {
	if d := testRouteTLS.dir; d != "" {
		_ = os.RemoveAll(d)
	}
}

var (
	tlsFileRE = regexp.MustCompile(`(?m)^(\s*(?:cert_file|key_file|ca_file)\s*:\s*)"?([^"\s]+)"?`)
	// includeLineRE matches an include line, for rewriting its path.
	includeLineRE = regexp.MustCompile(`(?m)^(\s*include\s+)"?([^"\s;]+)"?`)
)

// withTestRouteTLS returns path when the config names no TLS file, else a
// copy of it in a temporary directory whose TLS files are the test binary's
// (each node certificate generated under its file's name) and whose
// includes name the original files.
func withTestRouteTLS(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !tlsFileRE.Match(data) {
		return path
	}
	var nodes []string
	for _, m := range tlsFileRE.FindAllStringSubmatch(string(data), -1) {
		base := filepath.Base(m[2])
		if n, ok := strings.CutSuffix(base, ".pem"); ok && base != routetls.CAFile && !strings.HasSuffix(n, "-key") {
			nodes = append(nodes, n)
		}
	}
	dir := routeTLSDir(t, nodes...)
	conf := tlsFileRE.ReplaceAllStringFunc(string(data), func(s string) string {
		m := tlsFileRE.FindStringSubmatch(s)
		return m[1] + `"` + filepath.ToSlash(filepath.Join(dir, filepath.Base(m[2]))) + `"`
	})
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// nats-server joins an include to the including file's directory, so
	// the copy names the original relative to itself.
	conf = includeLineRE.ReplaceAllStringFunc(conf, func(s string) string {
		m := includeLineRE.FindStringSubmatch(s)
		rel, err := filepath.Rel(tmp, filepath.Join(abs, m[2]))
		if err != nil {
			t.Fatal(err)
		}
		return m[1] + `"` + filepath.ToSlash(rel) + `"`
	})
	out := filepath.Join(tmp, filepath.Base(path))
	if err := os.WriteFile(out, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
