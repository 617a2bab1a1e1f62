// Package telemetry is what Brood's processes tell an operator about
// themselves: Prometheus metrics (Metrics, served on --metrics ADDR) and
// OpenTelemetry traces whose W3C trace context travels in NATS headers, so
// one delegation tree is one trace tree across processes.
//
// Metrics are per process: each service counts what it does itself (a
// coordinator the runs it admits and the hosts it takes over, a worker the
// runs it settles and the agents it hosts), and a query sums the processes.
// Every method of a nil *Metrics does nothing, so components run without it.
package telemetry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/brood-dev/brood/pkg/protocol"
)

// Namespace prefixes every Brood metric.
const Namespace = "brood"

// Buckets of the histograms, in seconds. Delegations and tool calls run from
// milliseconds (the scripted model) to the 10-minute turn limit; requests
// answer in well under a second; model calls take seconds.
var (
	DelegationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	RequestBuckets    = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	ModelBuckets      = []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300}
)

// Label values that are not names of something.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	// ToolUnknown stands for a tool name the agent does not have (a model's
	// invention), so such names never become label values.
	ToolUnknown = "unknown"
	// Followup routes (brood_followup_accept_duration_seconds{route}).
	RouteResident = "resident"
	RouteCold     = "cold"
	RouteHeld     = "held"
)

// Metrics holds one process's collectors in its own registry. Labels are
// bounded by construction: provider names (deployment configuration), modes,
// stop reasons and error codes (closed sets), endpoints, tool names of the
// agent registry, model ids (configuration); never a session, run or host id.
type Metrics struct {
	reg *prometheus.Registry

	runsStarted      *prometheus.CounterVec
	runsSettled      *prometheus.CounterVec
	delegation       *prometheus.HistogramVec
	delegationStart  *prometheus.HistogramVec
	followupAccept   *prometheus.HistogramVec
	takeovers        *prometheus.CounterVec
	hostLost         *prometheus.CounterVec
	durabilityFailed *prometheus.CounterVec
	requests         *prometheus.CounterVec
	requestDuration  *prometheus.HistogramVec
	repliesRefused   *prometheus.CounterVec
	modelRequests    *prometheus.CounterVec
	modelTokens      *prometheus.CounterVec
	modelUnreported  *prometheus.CounterVec
	modelDuration    *prometheus.HistogramVec
	modelRetries     *prometheus.CounterVec
	toolCalls        *prometheus.CounterVec
	toolDuration     *prometheus.HistogramVec
	acpStarted       *prometheus.CounterVec
	acpStartFailed   *prometheus.CounterVec
	acpExited        *prometheus.CounterVec
	acpLive          *prometheus.GaugeVec

	activations   *sourcedGauge
	runsLive      *sourcedGauge
	hostsLive     *sourcedGauge
	instances     *sourcedGauge
	inboxItems    *sourcedGauge
	inboxSessions *sourcedGauge
}

// NewMetrics returns the metrics of one process, with the Go runtime and
// process collectors and brood_build_info{version}.
func NewMetrics(version string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
		m.reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
		m.reg.MustRegister(h)
		return h
	}
	gauge := func(name, help string, merge func(a, b float64) float64, labels ...string) *sourcedGauge {
		g := newSourcedGauge(prometheus.BuildFQName(Namespace, "", name), help, merge, labels...)
		m.reg.MustRegister(g)
		return g
	}
	m.runsStarted = counter("runs_started_total",
		"Runs whose record was created: one-shot runs and continuable epochs (counted by the coordinator that admitted them).", "provider", "mode")
	m.runsSettled = counter("runs_settled_total",
		"Runs and continuable epochs settled, by the settlement winner (host, or coordinator on HOST_LOST or a failed start); error_code is empty unless the result has one.",
		"provider", "mode", "stop_reason", "error_code")
	m.delegation = histogram("delegation_duration_seconds",
		"Time from a run's admission (one-shot) or an epoch's activation (continuable) to its settlement, observed by the settlement winner.",
		DelegationBuckets, "provider", "mode")
	m.delegationStart = histogram("delegation_start_duration_seconds",
		"Time the coordinator took to answer a start: runs.start until the child is published, continuable.start until its prompt is accepted.",
		RequestBuckets, "provider", "mode")
	m.followupAccept = histogram("followup_accept_duration_seconds",
		"Time the coordinator took to accept a followup (its messageId returned), by route: resident (an activation is live), cold (a resume was started), held (a drain holds it).",
		RequestBuckets, "route")
	m.takeovers = counter("takeovers_total",
		"Sessions whose lease a coordinator took from a host that stopped heartbeating.", "mode")
	m.hostLost = counter("host_lost_total",
		"Runs and epochs settled with errorCode HOST_LOST (their host stopped heartbeating mid-turn).", "provider", "mode")
	m.durabilityFailed = counter("durability_failed_total",
		"Runs and epochs that ended DURABILITY_FAILED: JetStream did not acknowledge an append of their log.", "provider", "mode")
	m.requests = counter("requests_total",
		"Requests answered by this process's endpoints, by error code (empty on success).", "service", "endpoint", "code")
	m.requestDuration = histogram("request_duration_seconds",
		"Time from a request's arrival to its answer, per endpoint.", RequestBuckets, "service", "endpoint")
	m.repliesRefused = counter("replies_refused_total",
		"Requests refused unanswered because their reply subject lies outside the inboxes this process answers (or, on a user's subject, outside that user's inbox prefix): docs/security.md, confused deputy.",
		"service", "reason")
	m.modelRequests = counter("model_requests_total",
		"Model calls by adapter, model id and outcome (ok, error, cancelled).", "adapter", "model", "outcome")
	m.modelTokens = counter("model_tokens_total",
		"Tokens the model reported using, by direction (input, output); an ACP agent's under adapter acp and its provider's name as the model.", "adapter", "model", "direction")
	m.modelUnreported = counter("model_usage_unreported_total",
		"Model requests whose tokens are unknown: no usage reported (a failed or cut request, an ACP agent that sends none); docs/protocol.md §6.6.", "adapter", "model")
	m.modelRetries = counter("model_retries_total",
		"Model requests that failed temporarily and were retried after a pause of the turn, by adapter, model id and status (the HTTP status, or transport for a failure without one: a connection reset, an attempt's timeout).",
		"adapter", "model", "status")
	m.modelDuration = histogram("model_request_duration_seconds",
		"Time of one model call, request to complete answer.", ModelBuckets, "adapter", "model")
	m.toolCalls = counter("tool_calls_total",
		"Tool calls run by agents, by tool and outcome (ok, error).", "tool", "outcome")
	m.toolDuration = histogram("tool_call_duration_seconds",
		"Time of one tool call (a subagent call lasts its child's whole run).", DelegationBuckets, "tool")
	m.acpStarted = counter("acp_agent_processes_started_total", "ACP agent processes started by the bridge.", "provider")
	m.acpStartFailed = counter("acp_agent_process_start_failures_total", "ACP agent processes that could not be started.", "provider")
	m.acpExited = counter("acp_agent_processes_exited_total", "ACP agent processes that exited (torn down or on their own).", "provider")
	m.acpLive = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "acp_agent_processes",
		Help: "ACP agent processes alive now."}, []string{"provider"})
	m.reg.MustRegister(m.acpLive)
	for _, mode := range []string{protocol.ModeOneShot, protocol.ModeContinuable} {
		m.takeovers.WithLabelValues(mode) // 0 until the first takeover (Known)
	}

	m.activations = gauge("activations_live", "Continuable activations resident in this process's hosts.", sum, "provider")
	m.runsLive = gauge("runs_live", "One-shot runs hosted by this process now.", sum, "provider")
	m.hostsLive = gauge("hosts_live",
		"Hosts heartbeating within the host expiry, as this process's coordinator sees them (take max over coordinators, not sum).", maxOf, "kind")
	m.instances = gauge("provider_instances",
		"Live, non-draining instances of each provider, as this process's coordinator sees them (take max over coordinators).", maxOf, "provider")
	m.inboxItems = gauge("inbox_pending_items",
		"Accepted inbox items not yet claimed, over every session (every scope's inbox stream; take max over coordinators).", maxOf)
	m.inboxSessions = gauge("inbox_sessions_pending",
		"Sessions with at least one pending inbox item (take max over coordinators).", maxOf)

	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
		Help: "Always 1; version is Brood's."}, []string{"version"})
	build.WithLabelValues(version).Set(1)
	m.reg.MustRegister(build,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the process's registry (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Registry: m.reg})
}

// RunStarted counts a run or epoch whose record was created.
func (m *Metrics) RunStarted(provider, mode string) {
	if m == nil {
		return
	}
	m.runsStarted.WithLabelValues(provider, mode).Inc()
}

// StartAnswered observes how long a start took to answer.
func (m *Metrics) StartAnswered(provider, mode string, d time.Duration) {
	if m == nil {
		return
	}
	m.delegationStart.WithLabelValues(provider, mode).Observe(d.Seconds())
}

// RunSettled counts a settlement won by this process and observes the
// delegation's duration d (not observed when d <= 0: unknown). HOST_LOST and
// DURABILITY_FAILED results count in their own counters too.
func (m *Metrics) RunSettled(provider, mode string, res protocol.SubagentResult, d time.Duration) {
	if m == nil {
		return
	}
	m.runsSettled.WithLabelValues(provider, mode, string(res.StopReason), string(res.ErrorCode)).Inc()
	if d > 0 {
		m.delegation.WithLabelValues(provider, mode).Observe(d.Seconds())
	}
	switch res.ErrorCode {
	case protocol.CodeHostLost:
		m.hostLost.WithLabelValues(provider, mode).Inc()
	case protocol.CodeDurabilityFailed:
		m.durabilityFailed.WithLabelValues(provider, mode).Inc()
	}
}

// FollowupAccepted observes a followup's accept latency on route.
func (m *Metrics) FollowupAccepted(route string, d time.Duration) {
	if m == nil {
		return
	}
	m.followupAccept.WithLabelValues(route).Observe(d.Seconds())
}

// Known creates, at 0, the failure series of a process's service and
// providers that its first failure would create (alerts on them see 0, not
// "no data", until then: issue 37, item 8): brood_replies_refused_total
// for service and each of refusedReasons, brood_host_lost_total and
// brood_durability_failed_total for each provider in both modes, and, for
// each of acpProviders, brood_acp_agent_process_start_failures_total. The
// counters of takeovers start at 0 in NewMetrics.
func (m *Metrics) Known(service string, refusedReasons, providers, acpProviders []string) {
	if m == nil {
		return
	}
	for _, r := range refusedReasons {
		m.repliesRefused.WithLabelValues(service, r)
	}
	for _, p := range providers {
		for _, mode := range []string{protocol.ModeOneShot, protocol.ModeContinuable} {
			m.hostLost.WithLabelValues(p, mode)
			m.durabilityFailed.WithLabelValues(p, mode)
		}
	}
	for _, p := range acpProviders {
		m.acpStartFailed.WithLabelValues(p)
	}
}

// TakeOver counts a lease taken from a dead host.
func (m *Metrics) TakeOver(mode string) {
	if m == nil {
		return
	}
	m.takeovers.WithLabelValues(mode).Inc()
}

// Request counts an answered request and observes its duration; err's code
// (empty for nil) is the code label.
func (m *Metrics) Request(service, endpoint string, d time.Duration, err error) {
	if m == nil {
		return
	}
	code := ""
	if err != nil {
		code = string(protocol.AsError(err).Code)
	}
	m.requests.WithLabelValues(service, endpoint, code).Inc()
	m.requestDuration.WithLabelValues(service, endpoint).Observe(d.Seconds())
}

// ReplyRefused counts a request service refused, unanswered, for its reply
// subject (reason: rpc.ReplyOutsideInboxes or rpc.ReplyOutsideUserInbox).
func (m *Metrics) ReplyRefused(service, reason string) {
	if m == nil {
		return
	}
	m.repliesRefused.WithLabelValues(service, reason).Inc()
}

// ModelCall counts one model call and the tokens usage reports (nil: none).
func (m *Metrics) ModelCall(adapter, model, outcome string, d time.Duration, usage *protocol.Usage) {
	if m == nil {
		return
	}
	m.modelRequests.WithLabelValues(adapter, model, outcome).Inc()
	m.modelDuration.WithLabelValues(adapter, model).Observe(d.Seconds())
	m.tokens(adapter, model, usage)
}

// StatusTransport is the status label of a model retry after a failure
// without an HTTP status (a connection reset, an attempt's timeout).
const StatusTransport = "transport"

// ModelRetry counts a model request that failed temporarily and will be
// retried: status is the HTTP status (429, 503), 0 for a failure without
// one (labelled StatusTransport).
func (m *Metrics) ModelRetry(adapter, model string, status int) {
	if m == nil {
		return
	}
	label := StatusTransport
	if status > 0 {
		label = strconv.Itoa(status)
	}
	m.modelRetries.WithLabelValues(adapter, model, label).Inc()
}

// tokens counts a request's reported tokens, or an unreported request
// (usage nil or unknown).
func (m *Metrics) tokens(adapter, model string, usage *protocol.Usage) {
	if usage == nil || usage.Unknown {
		m.modelUnreported.WithLabelValues(adapter, model).Inc()
		return
	}
	m.modelTokens.WithLabelValues(adapter, model, "input").Add(float64(usage.InputTokens))
	m.modelTokens.WithLabelValues(adapter, model, "output").Add(float64(usage.OutputTokens))
}

// AdapterACP is the adapter label of an ACP agent's tokens.
const AdapterACP = "acp"

// ACPTurnUsage counts an ACP child's turn (one model request, the agent
// playing the model) under adapter acp and model provider, the ACP
// provider's configured name (a bounded label): its reported tokens, or
// an unreported request when the agent sent none (usage nil or unknown).
func (m *Metrics) ACPTurnUsage(provider string, usage *protocol.Usage) {
	if m == nil {
		return
	}
	m.tokens(AdapterACP, provider, usage)
}

// ToolCall counts one tool call (tool: a registry name or ToolUnknown).
func (m *Metrics) ToolCall(tool string, isError bool, d time.Duration) {
	if m == nil {
		return
	}
	outcome := OutcomeOK
	if isError {
		outcome = OutcomeError
	}
	m.toolCalls.WithLabelValues(tool, outcome).Inc()
	m.toolDuration.WithLabelValues(tool).Observe(d.Seconds())
}

// ACPStarted counts an ACP agent process that started and returns the func
// to call once it exited.
func (m *Metrics) ACPStarted(provider string) (exited func()) {
	if m == nil {
		return func() {}
	}
	m.acpStarted.WithLabelValues(provider).Inc()
	m.acpLive.WithLabelValues(provider).Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.acpLive.WithLabelValues(provider).Dec()
			m.acpExited.WithLabelValues(provider).Inc()
		})
	}
}

// ACPStartFailed counts an ACP agent process that could not be started.
func (m *Metrics) ACPStartFailed(provider string) {
	if m == nil {
		return
	}
	m.acpStartFailed.WithLabelValues(provider).Inc()
}

// GaugeSource reports a gauge's current values at scrape time: add(value,
// label values...) once per label set. It runs on the scraping goroutine:
// keep it short, and bound any I/O.
type GaugeSource func(add func(v float64, labels ...string))

// HostGauges registers a host's sources of brood_activations_live{provider}
// and brood_runs_live{provider}; call the returned func when it stops.
func (m *Metrics) HostGauges(activations, runs GaugeSource) (unregister func()) {
	if m == nil {
		return func() {}
	}
	a, r := m.activations.add(activations), m.runsLive.add(runs)
	return func() { a(); r() }
}

// CoordinatorGauges registers a coordinator's sources of
// brood_hosts_live{kind}, brood_provider_instances{provider} and the inbox
// depth (inbox(items, sessions)); call the returned func when it stops.
func (m *Metrics) CoordinatorGauges(hosts, instances GaugeSource, inbox func() (items, sessions float64, ok bool)) (unregister func()) {
	if m == nil {
		return func() {}
	}
	var (
		mu              sync.Mutex
		items, sessions float64
		ok              bool
		readAt          time.Time
	)
	// One read of the stream serves both inbox gauges of a scrape.
	read := func() (float64, float64, bool) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(readAt) > time.Second {
			items, sessions, ok = inbox()
			readAt = time.Now()
		}
		return items, sessions, ok
	}
	u := []func(){m.hostsLive.add(hosts), m.instances.add(instances)}
	if inbox == nil {
		return func() { u[0](); u[1]() }
	}
	u = append(u,
		m.inboxItems.add(func(add func(float64, ...string)) {
			if n, _, ok := read(); ok {
				add(n)
			}
		}),
		m.inboxSessions.add(func(add func(float64, ...string)) {
			if _, n, ok := read(); ok {
				add(n)
			}
		}),
	)
	return func() {
		for _, f := range u {
			f()
		}
	}
}

func sum(a, b float64) float64 { return a + b }

func maxOf(a, b float64) float64 { return max(a, b) }

// sourcedGauge is a gauge family whose values come from the sources
// registered by this process's components at scrape time; values of one
// label set from several sources (two hosts of one provider in a process)
// are merged with merge.
type sourcedGauge struct {
	desc  *prometheus.Desc
	merge func(a, b float64) float64

	mu      sync.Mutex
	next    int
	sources map[int]GaugeSource
}

func newSourcedGauge(name, help string, merge func(a, b float64) float64, labels ...string) *sourcedGauge {
	return &sourcedGauge{desc: prometheus.NewDesc(name, help, labels, nil), merge: merge, sources: map[int]GaugeSource{}}
}

func (g *sourcedGauge) add(s GaugeSource) func() {
	if s == nil {
		return func() {}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	id := g.next
	g.next++
	g.sources[id] = s
	return func() {
		g.mu.Lock()
		delete(g.sources, id)
		g.mu.Unlock()
	}
}

func (g *sourcedGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *sourcedGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	srcs := make([]GaugeSource, 0, len(g.sources))
	for _, s := range g.sources {
		srcs = append(srcs, s)
	}
	g.mu.Unlock()
	type point struct {
		labels []string
		v      float64
	}
	points := map[string]*point{}
	var order []string
	for _, s := range srcs {
		s(func(v float64, labels ...string) {
			key := strings.Join(labels, "\xff")
			if p, ok := points[key]; ok {
				p.v = g.merge(p.v, v)
				return
			}
			points[key] = &point{labels: labels, v: v}
			order = append(order, key)
		})
	}
	for _, k := range order {
		p := points[k]
		if m, err := prometheus.NewConstMetric(g.desc, prometheus.GaugeValue, p.v, p.labels...); err == nil {
			ch <- m
		}
	}
}

// MetricsServer serves /metrics of one process (--metrics ADDR).
type MetricsServer struct {
	ln  net.Listener
	srv *http.Server
}

// ListenMetrics listens on addr (host:port; port 0 picks one) for scrapes of
// m's registry on /metrics. It fails at once, naming the address, when addr
// cannot be listened on.
func ListenMetrics(addr string, m *Metrics) (*MetricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument,
			"--metrics: cannot listen on %s: %v; stop what uses it or choose another address (port 0 picks a free one)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("Brood metrics: /metrics\n"))
	})
	return &MetricsServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// Addr is the address the server listens on.
func (s *MetricsServer) Addr() string { return s.ln.Addr().String() }

// Close stops listening (for a process that fails before it serves).
func (s *MetricsServer) Close() { _ = s.srv.Close(); _ = s.ln.Close() }

// Run serves scrapes until ctx is done, then shuts down (a stop is not an error).
func (s *MetricsServer) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		_ = s.srv.Close()
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}
