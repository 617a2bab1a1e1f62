package acpagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/internal/testutil/stack"
	"github.com/brood-dev/brood/pkg/tracecontext"
	acpagent "github.com/brood-dev/brood/services/acp-agent"
)

// TestTheTreesTraceContinuesThroughTheACPHop (issue 37, item 7): the ACP
// bridge puts the W3C `traceparent` of a child's turn in the `_meta` of its
// ACP requests; `brood acp-agent` continues that trace: the span of its
// session/prompt is a child of the bridged turn's span, and the requests
// its agent makes for the turn (list_agents to the coordinators) are in the
// same trace, with an in-memory span exporter standing for the collector.
// Before, the agent's spans began a trace of their own.
func TestTheTreesTraceContinuesThroughTheACPHop(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		_ = tp.Shutdown(context.Background())
	})
	s := stack.New(t)
	s.AddCoordinator()
	conn := serve(t, s, acpagent.DelegationTools("spawn"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The bridged child's turn, as the ACP bridge's host runs it.
	tctx, turn := tp.Tracer("test").Start(ctx, "turn of the bridged child")
	ns, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: t.TempDir(), McpServers: []acp.McpServer{}, Meta: tracecontext.InjectMeta(tctx, nil)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: ns.SessionId, Prompt: []acp.ContentBlock{acp.TextBlock("call list_agents {}\nsay done")},
		Meta: tracecontext.InjectMeta(tctx, map[string]any{"zed.dev/other": true})})
	if err != nil || r.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt: %+v, %v", r, err)
	}
	turn.End()
	tree := turn.SpanContext().TraceID()

	var prompt, listing sdktrace.ReadOnlySpan
	var names []string
	for _, sp := range exp.GetSpans().Snapshots() {
		names = append(names, sp.Name()+" "+sp.SpanContext().TraceID().String())
		switch {
		case sp.Name() == "acp session/prompt":
			prompt = sp
		case sp.SpanKind() == trace.SpanKindClient && strings.HasPrefix(sp.Name(), "coord children"):
			listing = sp
		}
	}
	switch {
	case prompt == nil || listing == nil:
		t.Fatalf("no span of the agent's session/prompt or of its list_agents request among %v", names)
	case prompt.SpanContext().TraceID() != tree || prompt.Parent().SpanID() != turn.SpanContext().SpanID():
		t.Fatalf("the agent's session/prompt span is in trace %s under %s; want the tree's trace %s, under the bridged turn's span %s",
			prompt.SpanContext().TraceID(), prompt.Parent().SpanID(), tree, turn.SpanContext().SpanID())
	case listing.SpanContext().TraceID() != tree:
		t.Fatalf("the agent's request %q is in trace %s; want the tree's trace %s", listing.Name(), listing.SpanContext().TraceID(), tree)
	}
	for _, sp := range exp.GetSpans().Snapshots() {
		if sp.Name() == "acp session/new" && sp.SpanContext().TraceID() != tree {
			t.Fatalf("the agent's session/new span is in trace %s; want %s", sp.SpanContext().TraceID(), tree)
		}
	}
}
