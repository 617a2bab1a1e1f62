package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/brood-dev/brood/internal/embedded"
	"github.com/brood-dev/brood/internal/testutil"
)

// TestCollectorServesMetrics: `brood collector --metrics ADDR` serves the
// process's Prometheus metrics on http://ADDR/metrics, as every other
// service does and as deploy/k8s and compose scrape every pod (issue 37,
// item 8).
func TestCollectorServesMetrics(t *testing.T) {
	c := newCLI(t)
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var body string
	o := c.serveDuring(t, "collector serving", func() {
		testutil.Eventually(t, 20*time.Second, func() bool {
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			body = string(b)
			return err == nil && resp.StatusCode == http.StatusOK
		}, "the collector serves /metrics on %s", addr)
	}, "collector", "--metrics", addr, "--nats", c.url)
	if o.code != 0 || !strings.Contains(body, "brood_build_info") {
		t.Fatalf("collector exit %d, stderr %q; /metrics:\n%s", o.code, o.err, body)
	}
}
