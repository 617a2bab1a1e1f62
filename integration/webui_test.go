package integration

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDevServesTheWebView: `brood dev --ui ADDR` serves the page and its tree
// stream, which shows a run made with `brood run`.
func TestDevServesTheWebView(t *testing.T) {
	d := startDev(t, "--ui", "127.0.0.1:0")
	if d.uiURL == "" {
		t.Fatalf("brood dev --ui printed no web view address: %q", d.stdout)
	}
	resp, err := http.Get(d.uiURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `src="/static/app.js"`) {
		t.Fatalf("GET %s: %d\n%s", d.uiURL, resp.StatusCode, page)
	}
	run := exec.Command(broodBin, "run", "--nats", d.natsURL, "--provider", "spawn", "say ok")
	run.Dir = t.TempDir()
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("brood run: %v\n%s", err, out)
	}
	child := strings.TrimSpace(strings.TrimPrefix(strings.Split(string(out), "\n")[0], "child "))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(d.uiURL, "/")+"/api/tree", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The tree, then changed nodes, until the run's child shows completed.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"id":"`+child+`"`) && strings.Contains(line, `"stopReason":"completed"`) {
			return
		}
	}
	t.Fatalf("the tree stream never showed %s completed (%v)", child, sc.Err())
}
