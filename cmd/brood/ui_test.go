package main

import (
	"strings"
	"testing"
)

// brood ui refuses an address beyond loopback without an access token, and
// names what to do; brood dev --ui takes the same rule.
func TestUIBeyondLoopbackNeedsAToken(t *testing.T) {
	c := newCLI(t)
	o := c.fails("INVALID_ARGUMENT", "ui", "--listen", "0.0.0.0:0")
	if !strings.Contains(o.err, "--access-token") {
		t.Fatalf("stderr %q does not say how to fix it", o.err)
	}
	o = c.runBare("dev", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--ui", "0.0.0.0:0")
	if o.code != 1 || !strings.HasPrefix(o.err, "INVALID_ARGUMENT: ") || !strings.Contains(o.err, "--access-token") {
		t.Fatalf("dev --ui beyond loopback: exit %d stderr %q", o.code, o.err)
	}
}
