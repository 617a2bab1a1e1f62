package acpbridge

import (
	"context"
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/brood-dev/brood/internal/agent"
	"github.com/brood-dev/brood/internal/sessionlog"
	"github.com/brood-dev/brood/internal/telemetry"
	"github.com/brood-dev/brood/pkg/protocol"
	"github.com/brood-dev/brood/pkg/provider"
)

// TestTheTurnsTraceGoesInTheRequestsMeta (issue 37, item 7): the bridge
// carries the W3C trace context of the child's turn (its host's turn span)
// in the `_meta` of session/new and of each session/prompt, as the root
// key `traceparent` ACP reserves for it, beside the lineage and the
// prompt's source; a Brood agent behind the hop continues the tree's trace
// from it (services/acp-agent's TestTheTreesTraceContinuesThroughTheACPHop).
func TestTheTurnsTraceGoesInTheRequestsMeta(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(telemetry.Propagator())
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	p, err := NewProvider(AgentConfig{Name: "fake", Command: fakeAgent(t)}, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	h := protocol.SessionHeader{ID: "child-traced", Cwd: t.TempDir(), ParentSession: "parent-1", DelegationDepth: 1}
	log := &memLog{}
	sess, err := p.NewSession(context.Background(), provider.SessionSpec{Header: h, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.(provider.Closer).Close() })
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x0e, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		SpanID: trace.SpanID{0x5a, 1, 2, 3, 4, 5, 6, 7}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for _, prompt := range []string{"meta", "promptmeta"} {
		before := len(log.events())
		if out, ok := sess.OpenTurn(ctx, agent.Input{Content: protocol.Text(prompt), Source: protocol.MessageSource{Kind: protocol.SourceUser}}); !ok {
			t.Fatalf("open turn: %+v", out)
		}
		if out := sess.RunSteps(ctx); out.Err != nil || out.Reason.Kind != protocol.TurnCompleted {
			t.Fatalf("turn %q: %+v", prompt, out)
		}
		text := protocol.PlainText(sessionlog.SelectOutput(log.events()[before:]))
		var meta map[string]any
		if err := json.Unmarshal([]byte(text), &meta); err != nil {
			t.Fatalf("the fake agent's answer to %q is not its _meta: %q", prompt, text)
		}
		if meta["traceparent"] != want {
			t.Errorf("the _meta of %s is %s; want traceparent %s", map[string]string{"meta": "session/new", "promptmeta": "session/prompt"}[prompt], text, want)
		}
		if _, ok := meta[protocol.ACPMetaKey]; !ok {
			t.Errorf("the _meta of the request answering %q lost Brood's own entry: %s", prompt, text)
		}
	}
}
