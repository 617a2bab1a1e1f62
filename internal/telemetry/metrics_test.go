package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/brood-dev/brood/pkg/protocol"
)

func gather(t *testing.T, m *Metrics) Families {
	t.Helper()
	f, err := m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func want(t *testing.T, f Families, v float64, name string, labels ...string) {
	t.Helper()
	got, ok := f.Sum(name, labels...)
	if !ok || got != v {
		t.Errorf("%s%v = %v (found %v), want %v", name, labels, got, ok, v)
	}
}

// A nil *Metrics is how components run without metrics: every method is a
// no-op.
func TestNilMetricsDoNothing(t *testing.T) {
	var m *Metrics
	m.RunStarted("spawn", protocol.ModeOneShot)
	m.StartAnswered("spawn", protocol.ModeOneShot, time.Second)
	m.RunSettled("spawn", protocol.ModeOneShot, protocol.SubagentResult{StopReason: protocol.StopCompleted}, time.Second)
	m.FollowupAccepted(RouteCold, time.Second)
	m.TakeOver(protocol.ModeOneShot)
	m.Request("coordinator", "runs.start", time.Second, nil)
	m.ModelCall("scripted", "scripted", OutcomeOK, time.Second, &protocol.Usage{InputTokens: 1})
	m.ToolCall("read_file", false, time.Second)
	m.ACPStarted("acp")()
	m.ACPStartFailed("acp")
	m.HostGauges(nil, nil)()
	m.CoordinatorGauges(nil, nil, nil)()
}

func TestSettlementsAreCountedByOutcome(t *testing.T) {
	m := NewMetrics("test")
	m.RunStarted("spawn", protocol.ModeOneShot)
	m.RunStarted("spawn", protocol.ModeOneShot)
	m.RunStarted("acp", protocol.ModeContinuable)
	m.RunSettled("spawn", protocol.ModeOneShot, protocol.SubagentResult{StopReason: protocol.StopCompleted}, 30*time.Millisecond)
	m.RunSettled("spawn", protocol.ModeOneShot, protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeHostLost}, 2*time.Second)
	m.RunSettled("acp", protocol.ModeContinuable, protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeDurabilityFailed}, 0)
	m.TakeOver(protocol.ModeOneShot)
	f := gather(t, m)

	want(t, f, 2, "brood_runs_started_total", "provider", "spawn", "mode", "one-shot")
	want(t, f, 1, "brood_runs_settled_total", "provider", "spawn", "stop_reason", "completed", "error_code", "")
	want(t, f, 1, "brood_runs_settled_total", "provider", "spawn", "stop_reason", "error", "error_code", "HOST_LOST")
	want(t, f, 1, "brood_host_lost_total", "provider", "spawn", "mode", "one-shot")
	want(t, f, 1, "brood_durability_failed_total", "provider", "acp", "mode", "continuable")
	want(t, f, 1, "brood_takeovers_total", "mode", "one-shot")
	// A duration of 0 is unknown: not observed.
	want(t, f, 2, "brood_delegation_duration_seconds_count", "provider", "spawn")
	if _, ok := f.Sum("brood_delegation_duration_seconds_count", "provider", "acp"); ok {
		t.Error("an unknown duration was observed")
	}
	want(t, f, 2.03, "brood_delegation_duration_seconds_sum", "provider", "spawn")
	want(t, f, 1, "brood_build_info", "version", "test")
}

func TestModelToolAndACPCounts(t *testing.T) {
	m := NewMetrics("test")
	m.ModelCall("openai", "deepseek-chat", OutcomeOK, time.Second, &protocol.Usage{InputTokens: 120, OutputTokens: 41})
	m.ModelCall("openai", "deepseek-chat", OutcomeError, time.Second, nil)
	m.ModelRetry("openai", "deepseek-chat", 429)
	m.ModelRetry("openai", "deepseek-chat", 429)
	m.ModelRetry("openai", "deepseek-chat", 0)
	m.ToolCall("read_file", false, time.Millisecond)
	m.ToolCall(ToolUnknown, true, 0)
	exited := m.ACPStarted("codex")
	m.ACPStarted("codex")
	m.ACPStartFailed("codex")
	m.ACPTurnUsage("codex", &protocol.Usage{InputTokens: 9, OutputTokens: 2})
	m.ACPTurnUsage("codex", &protocol.Usage{Unknown: true})
	f := gather(t, m)
	want(t, f, 1, "brood_model_usage_unreported_total", "adapter", "openai", "model", "deepseek-chat")
	want(t, f, 9, "brood_model_tokens_total", "adapter", "acp", "model", "codex", "direction", "input")
	want(t, f, 2, "brood_model_tokens_total", "adapter", "acp", "model", "codex", "direction", "output")
	want(t, f, 1, "brood_model_usage_unreported_total", "adapter", "acp", "model", "codex")
	want(t, f, 2, "brood_model_requests_total", "model", "deepseek-chat")
	want(t, f, 1, "brood_model_requests_total", "outcome", "error")
	want(t, f, 120, "brood_model_tokens_total", "adapter", "openai", "direction", "input")
	want(t, f, 41, "brood_model_tokens_total", "adapter", "openai", "direction", "output")
	want(t, f, 2, "brood_model_request_duration_seconds_count", "adapter", "openai")
	want(t, f, 2, "brood_model_retries_total", "adapter", "openai", "model", "deepseek-chat", "status", "429")
	want(t, f, 1, "brood_model_retries_total", "adapter", "openai", "model", "deepseek-chat", "status", StatusTransport)
	want(t, f, 1, "brood_tool_calls_total", "tool", "read_file", "outcome", "ok")
	want(t, f, 1, "brood_tool_calls_total", "tool", "unknown", "outcome", "error")
	want(t, f, 2, "brood_acp_agent_processes", "provider", "codex")
	exited()
	exited() // once only
	f = gather(t, m)
	want(t, f, 1, "brood_acp_agent_processes", "provider", "codex")
	want(t, f, 1, "brood_acp_agent_processes_exited_total", "provider", "codex")
	want(t, f, 2, "brood_acp_agent_processes_started_total", "provider", "codex")
	want(t, f, 1, "brood_acp_agent_process_start_failures_total", "provider", "codex")
}

// Gauges come from the sources of the process's components: hosts' values
// add up, coordinators' (who see the same fleet) take the max, and a
// stopped component's source is gone.
func TestSourcedGauges(t *testing.T) {
	m := NewMetrics("test")
	host := func(n float64) GaugeSource {
		return func(add func(float64, ...string)) { add(n, "spawn") }
	}
	u1 := m.HostGauges(host(2), host(1))
	u2 := m.HostGauges(host(3), host(0))
	hosts := func(n float64) GaugeSource {
		return func(add func(float64, ...string)) { add(n, protocol.HostWorker) }
	}
	inbox := func(items, sessions float64) func() (float64, float64, bool) {
		return func() (float64, float64, bool) { return items, sessions, true }
	}
	c1 := m.CoordinatorGauges(hosts(3), nil, inbox(7, 2))
	c2 := m.CoordinatorGauges(hosts(2), nil, inbox(5, 1))
	f := gather(t, m)
	want(t, f, 5, "brood_activations_live", "provider", "spawn")
	want(t, f, 1, "brood_runs_live", "provider", "spawn")
	want(t, f, 3, "brood_hosts_live", "kind", "worker")
	want(t, f, 7, "brood_inbox_pending_items")
	want(t, f, 2, "brood_inbox_sessions_pending")
	u1()
	c1()
	f = gather(t, m)
	want(t, f, 3, "brood_activations_live", "provider", "spawn")
	want(t, f, 2, "brood_hosts_live", "kind", "worker")
	want(t, f, 5, "brood_inbox_pending_items")
	u2()
	c2()
	f = gather(t, m)
	if _, ok := f.Sum("brood_activations_live"); ok {
		t.Error("a stopped host's gauge is still reported")
	}
}

func (m *Metrics) touchAll() {
	m.RunStarted("spawn", protocol.ModeOneShot)
	m.StartAnswered("spawn", protocol.ModeOneShot, time.Millisecond)
	m.RunSettled("spawn", protocol.ModeOneShot, protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeHostLost}, time.Second)
	m.RunSettled("spawn", protocol.ModeOneShot, protocol.SubagentResult{StopReason: protocol.StopError, ErrorCode: protocol.CodeDurabilityFailed}, time.Second)
	m.FollowupAccepted(RouteResident, time.Millisecond)
	m.TakeOver(protocol.ModeOneShot)
	m.Request("coordinator", "runs.start", time.Millisecond, nil)
	m.ReplyRefused("coordinator", "outside_user_inbox")
	m.ModelCall("scripted", "scripted", OutcomeOK, time.Millisecond, &protocol.Usage{InputTokens: 1, OutputTokens: 1})
	m.ToolCall("read_file", false, time.Millisecond)
	m.ACPStarted("acp")
	m.ACPStartFailed("acp")
	m.HostGauges(func(add func(float64, ...string)) { add(1, "spawn") }, func(add func(float64, ...string)) { add(1, "spawn") })
	m.CoordinatorGauges(func(add func(float64, ...string)) { add(1, "worker") }, func(add func(float64, ...string)) { add(1, "spawn") },
		func() (float64, float64, bool) { return 1, 1, true })
}

// Every family follows the Prometheus conventions promlint checks (units in
// names, _total counters, base units), carries help, and its labels are of
// bounded sets: never an id.
var boundedLabels = map[string]bool{
	"provider": true, "mode": true, "stop_reason": true, "error_code": true, "route": true, "service": true,
	"endpoint": true, "code": true, "adapter": true, "model": true, "outcome": true, "direction": true,
	"tool": true, "kind": true, "version": true, "reason": true,
}

func TestMetricNamesFollowConventions(t *testing.T) {
	m := NewMetrics("test")
	m.touchAll()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(fams).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	var brood []string
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "brood_") {
			continue
		}
		brood = append(brood, f.GetName())
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(f.GetName(), "_total") {
			t.Errorf("counter %s does not end in _total", f.GetName())
		}
		if f.GetType() == dto.MetricType_HISTOGRAM && !strings.HasSuffix(f.GetName(), "_seconds") {
			t.Errorf("histogram %s does not name its unit", f.GetName())
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if !boundedLabels[l.GetName()] {
					t.Errorf("%s has label %s, not one of the bounded sets", f.GetName(), l.GetName())
				}
			}
		}
	}
	sort.Strings(brood)
	if len(brood) < 25 {
		t.Errorf("only %d brood families: %v", len(brood), brood)
	}
}

func TestMetricsServer(t *testing.T) {
	m := NewMetrics("test")
	m.RunStarted("spawn", protocol.ModeOneShot)
	srv, err := ListenMetrics("127.0.0.1:0", m)
	if err != nil {
		t.Fatal(err)
	}
	// A second server on the same address fails at once, naming it.
	if _, err := ListenMetrics(srv.Addr(), m); err == nil || !strings.Contains(err.Error(), srv.Addr()) ||
		protocol.CodeOf(err) != protocol.CodeInvalidArgument {
		t.Fatalf("listen on a busy address: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	f, err := ParseText(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("scrape does not parse: %v\n%s", err, body)
	}
	want(t, f, 1, "brood_runs_started_total", "provider", "spawn")
	if _, ok := f.Sum("go_goroutines"); !ok {
		t.Error("no Go runtime metrics")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if c, err := net.Dial("tcp", srv.Addr()); err == nil {
		c.Close()
		t.Error("still listening after the stop")
	}
}
