package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRouteTLSVerb: `brood route-tls` writes the set deploy/README.md's
// set-up names, refuses to overwrite it (INVALID_ARGUMENT), and --keep
// leaves it (issue 29, item 2).
func TestRouteTLSVerb(t *testing.T) {
	c := &cli{t: t}
	dir := filepath.Join(t.TempDir(), "tls")
	args := []string{"route-tls", "--dir", dir, "--host", "127.0.0.1", "--node", "brood-nats-1", "--node", "brood-nats-2"}
	o := c.runBare(args...)
	if o.code != 0 || !strings.Contains(o.out, "route TLS for 2 nodes") {
		t.Fatalf("exit %d, stdout %q, stderr %q", o.code, o.out, o.err)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "brood-nats-1.pem", "brood-nats-1-key.pem", "brood-nats-2.pem", "brood-nats-2-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if o := c.runBare(args...); o.code == 0 || !strings.Contains(o.err, "INVALID_ARGUMENT") || !strings.Contains(o.err, "already holds") {
		t.Fatalf("a second run: exit %d, stderr %q", o.code, o.err)
	}
	if o := c.runBare(append(args, "--keep")...); o.code != 0 {
		t.Fatalf("a second run with --keep: exit %d, stderr %q", o.code, o.err)
	}
}
