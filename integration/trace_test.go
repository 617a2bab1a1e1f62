package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/protocol"
)

// recordSpans installs an in-memory span recorder as the global tracer
// provider for the test (the services of a test stack use the global one,
// as Brood's processes do) and restores the previous one afterwards.
func recordSpans(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(context.Background())
	})
	return rec, tp
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// describe is one span as the test names it: "name (kind)".
func describe(s sdktrace.ReadOnlySpan) string {
	return fmt.Sprintf("%s (%s)", s.Name(), s.SpanKind())
}

// TestNestedDelegationIsOneTrace: a parent's span, a one-shot child on
// spawn, and that child's own child through the subagent tool are one trace
// whose tree is parent → coordinator → worker → run → model, and run → tool
// subagent → coordinator → worker → child run → model: the W3C trace context
// travels in the NATS headers of every request (issue 11, acceptance).
func TestNestedDelegationIsOneTrace(t *testing.T) {
	rec, tp := recordSpans(t)
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()

	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	prompt := `call subagent {"description":"grandchild","prompt":"say from the grandchild"}` + "\nsay done"
	run, err := s.Client.StartRun(ctx, protocol.RunStartRequest{Parent: root.Ref(), Provider: "spawn", Prompt: protocol.Text(prompt), Options: protocol.StartOptions{}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run.Result(ctx)
	if err != nil || res.StopReason != protocol.StopCompleted || protocol.PlainText(res.Output) != "done" {
		t.Fatalf("result %+v, %v", res, err)
	}
	parent.End()
	traceID := parent.SpanContext().TraceID()

	// Runs end their spans once they left their host, just after the result.
	var spans map[trace.SpanID]sdktrace.ReadOnlySpan
	var runs []sdktrace.ReadOnlySpan
	testutil.Eventually(t, 10*time.Second, func() bool {
		spans, runs = map[trace.SpanID]sdktrace.ReadOnlySpan{}, nil
		for _, sp := range rec.Ended() {
			if sp.SpanContext().TraceID() != traceID {
				continue
			}
			spans[sp.SpanContext().SpanID()] = sp
			if sp.Name() == "run spawn" {
				runs = append(runs, sp)
			}
		}
		return len(runs) == 2
	}, "both runs' spans ended in the parent's trace")

	var child, grandchild sdktrace.ReadOnlySpan
	for _, r := range runs {
		switch attr(r, telemetry.AttrSession) {
		case run.ChildID:
			child = r
		default:
			grandchild = r
		}
	}
	if child == nil || grandchild == nil || attr(grandchild, telemetry.AttrParent) != run.ChildID {
		t.Fatalf("run spans: child %v grandchild %v", child, grandchild)
	}
	if attr(child, telemetry.AttrStopReason) != "completed" || attr(child, telemetry.AttrRun) != run.RunID {
		t.Errorf("child run span attributes: %v", child.Attributes())
	}

	// Walk up from the grandchild's run to the test's span.
	var chain []string
	for sp := grandchild; ; {
		chain = append(chain, describe(sp))
		p, ok := spans[sp.Parent().SpanID()]
		if !sp.Parent().IsValid() || !ok {
			break
		}
		sp = p
	}
	want := []string{
		"run spawn (internal)",                                           // the grandchild
		"provider spawn.start (server)", "provider spawn.start (client)", // worker ← coordinator
		"coord runs.start (server)", "coord runs.start (client)", // coordinator ← the subagent tool's request
		"tool subagent (internal)",
		"run spawn (internal)", // the child
		"provider spawn.start (server)", "provider spawn.start (client)",
		"coord runs.start (server)", "coord runs.start (client)", // coordinator ← the test's client
		"parent (internal)",
	}
	if strings.Join(chain, " ← ") != strings.Join(want, " ← ") {
		t.Fatalf("span chain from the grandchild up:\n  %s\nwant\n  %s", strings.Join(chain, "\n  "), strings.Join(want, "\n  "))
	}

	// Each run's model calls are its children: the child asked twice (the
	// subagent call, then "done"), the grandchild once.
	models := map[trace.SpanID]int{}
	for _, sp := range spans {
		if sp.Name() == "chat scripted" && sp.SpanKind() == trace.SpanKindClient {
			models[sp.Parent().SpanID()]++
			if attr(sp, telemetry.AttrGenAISystem) != "scripted" {
				t.Errorf("model span attributes: %v", sp.Attributes())
			}
		}
	}
	if models[child.SpanContext().SpanID()] != 2 || models[grandchild.SpanContext().SpanID()] != 1 {
		t.Errorf("model spans per run: child %d, grandchild %d; want 2 and 1", models[child.SpanContext().SpanID()], models[grandchild.SpanContext().SpanID()])
	}
	// The subagent tool call belongs to the child's run.
	for _, sp := range spans {
		if sp.Name() == "tool subagent" && sp.Parent().SpanID() != child.SpanContext().SpanID() {
			t.Errorf("tool subagent's parent is %v, not the child's run", sp.Parent().SpanID())
		}
	}
}

// collector is a fake OTLP/HTTP trace receiver: it keeps every span it is sent,
// with its service's name.
type collector struct {
	mu    sync.Mutex
	spans []collected
	url   string
}

type collected struct {
	service string
	span    *tracepb.Span
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					c.spans = append(c.spans, collected{service, sp})
				}
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

func (c *collector) all() []collected {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]collected(nil), c.spans...)
}

// TestOTLPExportFromEnvironment: with the standard OTEL_* variables set,
// `brood dev` and the `brood run` client export their spans over OTLP/HTTP,
// and the run's spans in brood dev continue the CLI's trace.
func TestOTLPExportFromEnvironment(t *testing.T) {
	c := startCollector(t)
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + c.url, "OTEL_BSP_SCHEDULE_DELAY=100"}
	d := startDevEnv(t, env)
	run := exec.Command(broodBin, "run", "--nats", d.natsURL, "--provider", "spawn", "say ok")
	run.Dir = t.TempDir()
	run.Env = append(os.Environ(), env...)
	if out, err := run.Output(); err != nil || string(out) != "ok\n" {
		t.Fatalf("brood run: %q, %v", out, err)
	}
	var cli, runSpan collected
	testutil.Eventually(t, 15*time.Second, func() bool {
		cli, runSpan = collected{}, collected{}
		for _, s := range c.all() {
			switch {
			case s.span.GetName() == "brood run":
				cli = s
			case s.span.GetName() == "run spawn":
				runSpan = s
			}
		}
		return cli.span != nil && runSpan.span != nil
	}, "the collector received the CLI's span and the run's")
	if cli.service != "brood" || runSpan.service != "brood-dev" {
		t.Fatalf("services: cli %q, run %q", cli.service, runSpan.service)
	}
	if string(cli.span.GetTraceId()) != string(runSpan.span.GetTraceId()) {
		t.Fatal("the run's span is not in the CLI's trace")
	}
	if len(cli.span.GetParentSpanId()) != 0 {
		t.Fatal("the CLI's span has a parent: it should be the trace's root")
	}
}

// TestFollowupTurnIsInTheFollowupsTrace: a continuable child's turns
// continue the trace of the request that accepted their message (the start's
// prompt, then a followup, through the trace context its inbox item
// carries), each linked to the epoch's span.
func TestFollowupTurnIsInTheFollowupsTrace(t *testing.T) {
	rec, tp := recordSpans(t)
	s := stack.New(t)
	s.AddCoordinator()
	s.AddSpawnWorker()
	root := s.Root()
	tracer := tp.Tracer("test")

	sctx, starter := tracer.Start(context.Background(), "starter")
	start, err := s.Client.StartContinuable(sctx, protocol.ContinuableStartRequest{
		Provider: "spawn", Parent: root.Ref(), Label: "traced", Prompt: protocol.Text("sleep 500ms\nsay one")})
	starter.End()
	if err != nil {
		t.Fatal(err)
	}
	ref := root.Ref()
	fctx, follower := tracer.Start(context.Background(), "follower")
	if _, err := s.Client.Followup(fctx, protocol.FollowupRequest{
		ChildID: start.ChildID, Authority: protocol.Authority{Parent: &ref}, Message: protocol.Text("say two")}); err != nil {
		t.Fatal(err)
	}
	follower.End()

	spans := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var turns []sdktrace.ReadOnlySpan
	testutil.Eventually(t, 15*time.Second, func() bool {
		turns = nil
		for _, sp := range rec.Ended() {
			spans[sp.SpanContext().SpanID()] = sp
			if sp.Name() == "turn" && (sp.SpanContext().TraceID() == starter.SpanContext().TraceID() || sp.SpanContext().TraceID() == follower.SpanContext().TraceID()) {
				turns = append(turns, sp)
			}
		}
		for _, turn := range turns {
			for _, l := range turn.Links() {
				if _, ok := spans[l.SpanContext.SpanID()]; !ok {
					return false // the epoch ends a moment after its last turn
				}
			}
		}
		return len(turns) == 2
	}, "both turns' spans and the epoch's ended")
	// up walks from sp to its trace's root, naming each span.
	up := func(sp sdktrace.ReadOnlySpan) []string {
		var chain []string
		for {
			chain = append(chain, describe(sp))
			p, ok := spans[sp.Parent().SpanID()]
			if !ok {
				return chain
			}
			sp = p
		}
	}
	for _, turn := range turns {
		var want []string
		switch turn.SpanContext().TraceID() {
		case starter.SpanContext().TraceID():
			want = []string{"turn (internal)", "coord continuable.start (server)", "coord continuable.start (client)", "starter (internal)"}
		default:
			want = []string{"turn (internal)", "coord continuable.followup (server)", "coord continuable.followup (client)", "follower (internal)"}
		}
		if got := up(turn); strings.Join(got, " ← ") != strings.Join(want, " ← ") {
			t.Errorf("turn %s: chain\n  %s\nwant\n  %s", attr(turn, telemetry.AttrTurn), strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		// The link leads to the epoch's span, in the starter's trace.
		links := turn.Links()
		if len(links) != 1 {
			t.Fatalf("turn %s has %d links", attr(turn, telemetry.AttrTurn), len(links))
		}
		epoch, ok := spans[links[0].SpanContext.SpanID()]
		if !ok || epoch.Name() != "run spawn" || attr(epoch, telemetry.AttrMode) != protocol.ModeContinuable ||
			epoch.SpanContext().TraceID() != starter.SpanContext().TraceID() {
			t.Errorf("turn %s links %v, not the epoch's span", attr(turn, telemetry.AttrTurn), links[0].SpanContext)
		}
	}
}
