package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/pkg/protocol"
)

// scrape reads url's metrics in the Prometheus text format.
func scrape(t *testing.T, url string) (telemetry.Families, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	f, err := telemetry.ParseText(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the scrape of %s does not parse: %v", url, err)
	}
	return f, string(body)
}

// wantSample checks sum(name{labels}) == v; absent counts as 0.
func wantSample(t *testing.T, f telemetry.Families, v float64, name string, labels ...string) {
	t.Helper()
	if got, ok := f.Sum(name, labels...); (!ok && v != 0) || got != v {
		t.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, v)
	}
}

// TestDevMetricsCountARun is issue 11's acceptance: `brood dev --metrics
// ADDR`, then one `brood run`: the scrape shows the run started and settled
// under its provider and stop reason, with a delegation latency observation,
// and the fleet it ran on; `nats micro stats` (the $SRV.STATS answer) counts
// the same requests, their error and their time.
func TestDevMetricsCountARun(t *testing.T) {
	d := startDev(t, "--metrics", "127.0.0.1:0")
	if d.metricsURL == "" {
		t.Fatalf("brood dev --metrics printed no metrics address: %q", d.stdout)
	}
	run := exec.Command(broodBin, "run", "--nats", d.natsURL, "--provider", "spawn", "call list_dir {}\nsay ok")
	run.Dir = t.TempDir()
	out, err := run.Output()
	if err != nil || string(out) != "ok\n" {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("brood run: %q, %v\nstderr: %s", out, err, stderr)
	}
	// The run's settlement is counted before its result is published, and
	// the host's lease release follows: wait until nothing runs.
	var (
		f    telemetry.Families
		text string
	)
	testutil.Eventually(t, 10*time.Second, func() bool {
		f, text = scrape(t, d.metricsURL)
		n, _ := f.Sum("brood_runs_live")
		return n == 0
	}, "no run live after the result")
	one := []string{"provider", "spawn", "mode", protocol.ModeOneShot}
	wantSample(t, f, 1, "brood_runs_started_total", one...)
	wantSample(t, f, 1, "brood_runs_settled_total", append(one, "stop_reason", "completed", "error_code", "")...)
	wantSample(t, f, 1, "brood_delegation_duration_seconds_count", one...)
	if sum, _ := f.Sum("brood_delegation_duration_seconds_sum", one...); sum <= 0 || sum > 30 {
		t.Errorf("delegation took %vs by the histogram", sum)
	}
	wantSample(t, f, 1, "brood_delegation_start_duration_seconds_count", one...)
	wantSample(t, f, 1, "brood_requests_total", "service", "coordinator", "endpoint", protocol.EpRunsStart, "code", "")
	wantSample(t, f, 1, "brood_requests_total", "service", "provider", "endpoint", protocol.OpProviderStart, "code", "")
	wantSample(t, f, 2, "brood_model_requests_total", "adapter", "scripted", "outcome", "ok")
	wantSample(t, f, 1, "brood_tool_calls_total", "tool", "list_dir", "outcome", "ok")
	wantSample(t, f, 0, "brood_runs_settled_total", "stop_reason", "error")
	wantSample(t, f, 3, "brood_hosts_live", "kind", "worker") // spawn, fork, acp
	wantSample(t, f, 1, "brood_hosts_live", "kind", "coordinator")
	wantSample(t, f, 1, "brood_provider_instances", "provider", "spawn")
	wantSample(t, f, 0, "brood_inbox_pending_items")
	wantSample(t, f, 1, "brood_build_info")
	// The failure series alerts watch exist at 0 before their first event,
	// so an alert sees 0, not "no data" (issue 37, item 8).
	for _, z := range [][]string{
		{"brood_takeovers_total", "mode", protocol.ModeOneShot},
		{"brood_takeovers_total", "mode", protocol.ModeContinuable},
		{"brood_host_lost_total", "provider", "spawn", "mode", protocol.ModeOneShot},
		{"brood_durability_failed_total", "provider", "spawn", "mode", protocol.ModeContinuable},
		{"brood_replies_refused_total", "service", "coordinator", "reason", "outside_inboxes"},
		{"brood_replies_refused_total", "service", "worker", "reason", "outside_user_inbox"},
		{"brood_acp_agent_process_start_failures_total"},
	} {
		if v, ok := f.Sum(z[0], z[1:]...); !ok || v != 0 {
			t.Errorf("%s%v = %v (present %v), want present at 0", z[0], z[1:], v, ok)
		}
	}

	// A refused start counts under its code, in the metrics and in `nats
	// micro stats` alike, which count every request and its time too.
	bad := exec.Command(broodBin, "run", "--nats", d.natsURL, "--provider", "nope", "say x")
	bad.Dir = t.TempDir()
	if out, err := bad.CombinedOutput(); err == nil || !strings.HasPrefix(string(out), "NO_PROVIDER") {
		t.Fatalf("run on an unknown provider: %v %s", err, out)
	}
	f, text = scrape(t, d.metricsURL)
	wantSample(t, f, 1, "brood_requests_total", "service", "coordinator", "endpoint", protocol.EpRunsStart, "code", "NO_PROVIDER")
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg, err := nc.Request("$SRV.STATS."+protocol.CoordinatorService, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	var ep *micro.EndpointStats
	for _, e := range stats.Endpoints {
		if strings.HasSuffix(e.Subject, "."+protocol.EpRunsStart) {
			ep = e
		}
	}
	sum, _ := f.Sum("brood_request_duration_seconds_sum", "service", "coordinator", "endpoint", protocol.EpRunsStart)
	if ep == nil || ep.NumRequests != 2 || ep.NumErrors != 1 || ep.ProcessingTime <= 0 ||
		ep.ProcessingTime.Seconds() < sum/2 || ep.ProcessingTime.Seconds() > 2*sum+0.5 {
		t.Errorf("micro stats of runs.start: %+v; the metrics measured %.6fs", ep, sum)
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
}
